//! Running an engine for a recipe, the way a person would babysit it, so nobody has
//! to: [`Instance::start`] launches exactly the rendered command under a supervisor
//! task and returns its handle; [`Instance::ready`] waits until it answers,
//! [`Instance::stop`] stops it, [`Instance::run_until`] serves until a signal.
//!
//! - `supervise`: the supervisor (OOM fallback at start-up, restarts with backoff,
//!   replacing a running instance).
//! - `floor`: the host-memory floor the supervisor keeps (`memory.host_floor`).
//! - [`preflight`]: the memory a recipe's fraction is checked against before a start.
//! - `ready`: what "ready" means, the only readiness check in sous.
//! - `process`: one engine process, and the only stop sequence in sous.
//! - [`instance`]: the record of a running instance (`instance.json`) and what
//!   `--replace` does with it.
//! - [`starts`]: every start that became ready (`starts.jsonl`), kept after the
//!   instance stops.
//! - [`logscan`]: what the engine's output says (OOM, KV capacity).
//! - `error`: [`ServeError`].
//!
//! Not here: building the model (the `sous` library's pipeline) or drawing anything
//! (the supervisor reports through a [`Reporter`]).

mod error;
mod floor;
pub mod instance;
pub mod logscan;
pub mod preflight;
mod process;
mod ready;
pub mod starts;
mod supervise;

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use error::ServeError;
pub use floor::check as check_host_floor;
pub use instance::InstanceState;
pub use logscan::Capacity;
pub use ready::{HEALTH_PATH, health_timeout};

use crate::device::DeviceMemory;
use crate::launch::RenderContext;
use crate::recipe::Recipe;
use crate::reporter::Reporter;

/// What the supervisor is given.
struct Launched {
    recipe: Recipe,
    ctx: RenderContext,
    recipe_hash: String,
    replacing: Option<InstanceState>,
    reporter: Arc<dyn Reporter>,
    prepared: Prepared,
}

/// What the caller learned before the start, for the supervisor.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    /// The KV tokens `sous plan` predicts: the ready line shows the prediction beside
    /// the engine's own figure, and a difference is a warning.
    pub planned_kv_tokens: Option<u64>,
    /// The GPUs the engine will use, as their driver reports them now (none for the
    /// native engine, or where no driver answers): the memory fraction is checked
    /// against them before the launch ([`crate::device`]), and on unified memory the
    /// host's memory is watched as with `memory.host_floor`.
    pub devices: Vec<DeviceMemory>,
    /// The build's phases (pull, quantize), reported before the engine's own in the
    /// first start's phases.
    pub build_phases: Vec<logscan::PhaseTime>,
}

/// An instance that answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Ready {
    /// Its base URL.
    pub url: String,
    /// Seconds from the last launch to readiness.
    pub seconds: f64,
    /// The phases of that start the engine reported, in order.
    pub phases: Vec<logscan::PhaseTime>,
    /// The memory fraction it runs with.
    pub utilization: Option<f64>,
    /// The KV capacity the engine reported at start-up.
    pub capacity: Option<Capacity>,
    /// What the kept compile caches held when that start began (`None` where none
    /// are kept: the native engine).
    pub compile_cache: Option<crate::launch::caches::Contents>,
}

/// The handle of a supervised instance. Dropping it stops the instance (SIGKILL to
/// the engine's group if the runtime ends first).
pub struct Instance {
    stop: Option<oneshot::Sender<()>>,
    ready_rx: Option<oneshot::Receiver<Ready>>,
    ready: Option<Ready>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Instance {
    /// Starts the supervisor of `recipe`'s engine on the current tokio runtime and
    /// returns at once. `recipe_hash` goes into the instance record; with
    /// `replacing`, another instance of the recipe still serves: the new engine
    /// starts beside it (on the same port when both engines allow it, see
    /// [`instance`]) and the old one is stopped once the new one is ready. If the new
    /// one fails to start, the old one goes on serving. `prepared` is what the caller
    /// learned before ([`Prepared`]).
    pub fn start(
        recipe: &Recipe,
        ctx: &RenderContext,
        recipe_hash: &str,
        replacing: Option<InstanceState>,
        reporter: Arc<dyn Reporter>,
        prepared: Prepared,
    ) -> Instance {
        let (stop, stop_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let job = Launched {
            recipe: recipe.clone(),
            ctx: ctx.clone(),
            recipe_hash: recipe_hash.to_owned(),
            replacing,
            reporter,
            prepared,
        };
        let task = tokio::spawn(supervise::supervise(job, stop_rx, ready_tx));
        Instance {
            stop: Some(stop),
            ready_rx: Some(ready_rx),
            ready: None,
            task: Some(task),
        }
    }

    /// Waits until the engine answers; the error that ended the supervisor when it
    /// never did.
    pub async fn ready(&mut self) -> Result<&Ready, ServeError> {
        if let Some(rx) = self.ready_rx.take() {
            match rx.await {
                Ok(ready) => self.ready = Some(ready),
                Err(_) => {
                    self.finish().await?;
                    return Err(ServeError::StoppedBeforeReady);
                }
            }
        }
        self.ready.as_ref().ok_or(ServeError::StoppedBeforeReady)
    }

    /// Waits for the supervisor to end on its own: `Ok` once stopped, or the error
    /// that ended it (the engine never became ready, or crashed too often).
    pub async fn finish(&mut self) -> Result<(), ServeError> {
        match self.task.take() {
            None => Ok(()),
            Some(task) => match task.await {
                Ok(result) => result,
                Err(e) => Err(ServeError::Supervisor(e.to_string())),
            },
        }
    }

    /// Stops the engine (SIGTERM, `server.stop_grace`, SIGKILL) and waits for the
    /// supervisor to end.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.finish().await
    }

    /// Serves until `shutdown` resolves (then stops as [`Instance::stop`] does) or the
    /// supervisor ends on its own.
    pub async fn run_until(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        tokio::select! {
            ended = &mut task => match ended {
                Ok(result) => result,
                Err(e) => Err(ServeError::Supervisor(e.to_string())),
            },
            _ = shutdown => {
                self.task = Some(task);
                self.stop().await
            }
        }
    }
}

//! Running an engine for a recipe, the way a person would babysit it, so nobody has to:
//! launch exactly the rendered command, wait for readiness, fall back to a lower
//! memory fraction when it dies of OOM at start-up, restart it with backoff when it
//! crashes later, and stop it (and everything it forked) on SIGINT/SIGTERM.
//!
//! Readiness follows shared/reference/engines.md §2, §7, §8: a refused connection or a
//! 503 means "still starting" while the process lives; `/health` 200 plus the served
//! name in `/v1/models` means ready.

pub mod instance;
pub mod logscan;
mod process;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::launch::{self, Arg, Launch, RenderContext, RenderError};
use crate::recipe::{EngineKind, RESTART_WINDOW, Recipe};
pub use instance::InstanceState;
pub use logscan::Capacity;

/// Something worth telling the user while an engine runs.
#[derive(Debug, Clone)]
pub enum Event {
    /// A launch begins.
    Launching {
        /// 1 for the first launch, then each restart or fallback.
        attempt: u32,
        /// The memory fraction of this launch.
        utilization: Option<f64>,
        /// Where the engine's output is logged.
        log: PathBuf,
    },
    /// A line of the engine's output.
    Output(String),
    /// The engine ran out of memory at start-up; trying a lower fraction.
    OomFallback {
        /// The fraction that failed.
        failed: Option<f64>,
        /// The next one.
        next: f64,
    },
    /// Ready to serve.
    Ready {
        /// Base URL.
        url: String,
        /// Seconds from launch to ready.
        seconds: f64,
        /// The memory fraction it runs with.
        utilization: Option<f64>,
        /// KV capacity from the engine's log.
        capacity: Option<Capacity>,
    },
    /// The engine crashed after being ready; it will be restarted.
    Restarting {
        /// Its exit code.
        code: i32,
        /// Wait before the restart.
        after: Duration,
        /// Restarts left in the window.
        left: u32,
    },
    /// The instance this one replaces was stopped, after this one became ready.
    Replaced {
        /// The pid of the `sous serve` that ran it.
        sous_pid: u32,
        /// How long stopping it took.
        seconds: f64,
    },
    /// Stopping on request.
    Stopping,
}

/// How a supervised engine ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped on request (SIGINT/SIGTERM to sous).
    Stopped,
    /// Crashed more than `engine.restarts` times in the window: its last exit code.
    GaveUp(i32),
}

/// Why an engine could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The recipe cannot be rendered.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The engine's program could not be started.
    #[error("cannot start `{program}`")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// An environment variable the launch needs is not set.
    #[error("environment variable `{0}` is not set (the recipe's `server.api_key_env` names it)")]
    MissingEnv(String),
    /// Out of memory at every fraction of `memory.oom_fallback`.
    #[error("the engine ran out of memory at start-up with every memory fraction tried ({tried}): {message}")]
    OomExhausted {
        /// The fractions tried.
        tried: String,
        /// The engine's own message.
        message: String,
    },
    /// The engine exited before it was ready.
    #[error("the engine exited with code {code} before it was ready; last lines:\n{tail}")]
    ExitedEarly {
        /// Its exit code.
        code: i32,
        /// Its last lines of output.
        tail: String,
    },
    /// Something already listens on the recipe's port.
    #[error("port {0} is already in use")]
    PortInUse(u16),
    /// Not ready in time.
    #[error("the engine was not ready after {0:?} (`server.startup_timeout`)")]
    StartupTimeout(Duration),
    /// The instance record could not be written.
    #[error(transparent)]
    State(#[from] instance::InstanceError),
    /// A state file could not be written.
    #[error("{action} `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl ServeError {
    /// The exit code `sous serve` gives for this error: the engine's own when it has one.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            ServeError::ExitedEarly { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A next step.
    pub fn hint(&self) -> Option<String> {
        match self {
            ServeError::Spawn { .. } => Some(
                "install the engine, or set `engine.executable` (host) or `engine.runtime` and `engine.image` (container)".into(),
            ),
            ServeError::OomExhausted { .. } => Some(
                "lower `memory.gpu_utilization` or add values to `memory.oom_fallback`; a smaller `serving.max_model_len` or `serving.max_num_seqs` also needs less memory".into(),
            ),
            ServeError::StartupTimeout(_) => Some("raise `server.startup_timeout`, and read the engine log".into()),
            ServeError::MissingEnv(var) => Some(format!("export {var}=... before `sous serve`")),
            ServeError::PortInUse(_) => Some(
                "set another `server.port` (or `--set server.port=N`), or stop what listens there".into(),
            ),
            _ => None,
        }
    }
}

/// Runs `recipe`'s engine until `shutdown` resolves or it gives up.
///
/// With `replacing`, another instance of the recipe still serves: the new engine
/// starts beside it (on the same port when both engines allow it, see [`instance`]),
/// and the old one is stopped once the new one is ready. If the new one fails to
/// start, the old one goes on serving.
pub async fn run(
    recipe: &Recipe,
    ctx: &RenderContext,
    recipe_hash: &str,
    replacing: Option<InstanceState>,
    on_event: Arc<dyn Fn(Event) + Send + Sync>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Outcome, ServeError> {
    let mut replacing = replacing;
    let sharing = replacing
        .as_ref()
        .is_some_and(|old| old.port == Some(recipe.server.port));
    let (host, port) = (recipe.server.connect_host(), recipe.server.port);
    // vLLM and the native engine bind with SO_REUSEPORT: a second server on a port in
    // use would start and share its connections instead of failing.
    if !sharing
        && let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
    {
        return Err(ServeError::PortInUse(port));
    }
    tokio::pin!(shutdown);
    let io = |action: &'static str, path: PathBuf| move |source| ServeError::Io { action, path, source };
    std::fs::create_dir_all(&ctx.instance_dir).map_err(io("creating", ctx.instance_dir.clone()))?;
    let log_path = ctx.instance_dir.join("engine.log");
    let fractions: Vec<Option<f64>> = std::iter::once(recipe.memory.gpu_utilization)
        .chain(recipe.memory.oom_fallback.iter().copied().map(Some))
        .collect();
    let mut fraction = 0;
    let mut attempt = 0;
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    loop {
        attempt += 1;
        let utilization = fractions[fraction];
        let mut current = recipe.clone();
        current.memory.gpu_utilization = utilization;
        let launch = launch::render(&current, ctx)?;
        write_files(&launch)?;
        let (argv, env) = resolve(&launch)?;
        on_event(Event::Launching {
            attempt,
            utilization,
            log: log_path.clone(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let mut engine = process::spawn(&argv, &env, tx).map_err(|source| ServeError::Spawn {
            program: argv.first().cloned().unwrap_or_default(),
            source,
        })?;
        let watch = Arc::new(Mutex::new(Watch::default()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("opening", log_path.clone()))?;
        let pump = tokio::spawn(pump(rx, log, recipe.engine.kind, watch.clone(), on_event.clone()));
        let started = Instant::now();
        // While the old instance listens on the same port, a request there may reach
        // either: readiness also needs the new engine's own listening socket.
        let own_group = (sharing && replacing.is_some()).then(|| engine.pgid()).flatten();

        // Start-up: ready, dead, too slow, or asked to stop.
        let ready = tokio::select! {
            code = engine.wait() => Err(code),
            ready = wait_ready(recipe, own_group) => Ok(ready),
            _ = tokio::time::sleep(recipe.server.startup_timeout) => {
                engine.stop(recipe.server.stop_grace).await;
                return Err(ServeError::StartupTimeout(recipe.server.startup_timeout));
            }
            _ = &mut shutdown => {
                on_event(Event::Stopping);
                engine.stop(recipe.server.stop_grace).await;
                return Ok(Outcome::Stopped);
            }
        };
        match ready {
            Err(code) => {
                let _ = pump.await;
                let seen = watch.lock().map(|w| w.clone()).unwrap_or_default();
                // The native engine's start-up refusals carry their own numbers and
                // hint; only a configured fallback list makes them a retry.
                let fallback =
                    recipe.engine.kind != EngineKind::Native || !recipe.memory.oom_fallback.is_empty();
                if let Some(message) = seen.oom.filter(|_| fallback) {
                    if fraction + 1 < fractions.len() {
                        fraction += 1;
                        if let Some(next) = fractions[fraction] {
                            on_event(Event::OomFallback {
                                failed: utilization,
                                next,
                            });
                        }
                        continue;
                    }
                    let tried = fractions
                        .iter()
                        .map(|f| f.map_or("the engine's default".to_owned(), |f| f.to_string()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(ServeError::OomExhausted { tried, message });
                }
                return Err(ServeError::ExitedEarly {
                    code,
                    tail: seen.tail.iter().cloned().collect::<Vec<_>>().join("\n"),
                });
            }
            Ok(url) => {
                let capacity = watch.lock().ok().and_then(|w| w.capacity.clone());
                on_event(Event::Ready {
                    url: url.clone(),
                    seconds: started.elapsed().as_secs_f64(),
                    utilization,
                    capacity,
                });
                let state = InstanceState {
                    name: recipe.name.clone(),
                    sous_pid: std::process::id(),
                    sous_started: instance::process_start(std::process::id()),
                    engine_pid: engine.pid(),
                    engine: Some(recipe.engine.kind),
                    runtime: Some(recipe.engine.runtime),
                    port: Some(recipe.server.port),
                    url,
                    recipe_hash: recipe_hash.to_owned(),
                    utilization,
                    stop_grace_ms: Some(recipe.server.stop_grace.as_millis() as u64),
                };
                instance::write(&ctx.instance_dir, &state)?;
                if let Some(old) = replacing.take() {
                    let took = old.stop(old.grace()).await;
                    on_event(Event::Replaced {
                        sous_pid: old.sous_pid,
                        seconds: took.as_secs_f64(),
                    });
                }
            }
        }

        // Serving: until it crashes or sous is asked to stop.
        let code = tokio::select! {
            code = engine.wait() => code,
            _ = &mut shutdown => {
                on_event(Event::Stopping);
                engine.stop(recipe.server.stop_grace).await;
                instance::remove_own(&ctx.instance_dir);
                return Ok(Outcome::Stopped);
            }
        };
        engine.kill_group();
        let _ = pump.await;
        instance::remove_own(&ctx.instance_dir);
        let now = Instant::now();
        crashes.push_back(now);
        while crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > RESTART_WINDOW)
        {
            crashes.pop_front();
        }
        let used = crashes.len() as u32;
        if used > recipe.engine.restarts {
            return Ok(Outcome::GaveUp(code));
        }
        let after = Duration::from_secs(1 << (used - 1).min(6));
        on_event(Event::Restarting {
            code,
            after,
            left: recipe.engine.restarts - used,
        });
        tokio::select! {
            _ = tokio::time::sleep(after) => {}
            _ = &mut shutdown => {
                on_event(Event::Stopping);
                return Ok(Outcome::Stopped);
            }
        }
    }
}

/// What the output has shown so far.
#[derive(Debug, Clone, Default)]
struct Watch {
    oom: Option<String>,
    capacity: Option<Capacity>,
    tail: VecDeque<String>,
}

async fn pump(
    mut rx: mpsc::UnboundedReceiver<String>,
    mut log: std::fs::File,
    kind: EngineKind,
    watch: Arc<Mutex<Watch>>,
    on_event: Arc<dyn Fn(Event) + Send + Sync>,
) {
    use std::io::Write;
    while let Some(line) = rx.recv().await {
        let _ = writeln!(log, "{line}");
        if let Ok(mut w) = watch.lock() {
            if w.oom.is_none() && logscan::is_oom(&line) {
                w.oom = Some(line.trim().to_owned());
            }
            if let Some(c) = logscan::capacity(kind, &line) {
                w.capacity = Some(c);
            }
            w.tail.push_back(line.clone());
            if w.tail.len() > 20 {
                w.tail.pop_front();
            }
        }
        on_event(Event::Output(line));
    }
}

fn write_files(launch: &Launch) -> Result<(), ServeError> {
    for file in &launch.files {
        if let Some(dir) = file.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ServeError::Io {
                action: "creating",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&file.path, &file.contents).map_err(|source| ServeError::Io {
            action: "writing",
            path: file.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Environment variables for a process.
type EnvPairs = Vec<(String, String)>;

/// The argv and environment with secrets read from sous's environment.
fn resolve(launch: &Launch) -> Result<(Vec<String>, EnvPairs), ServeError> {
    let value = |arg: &Arg| match arg {
        Arg::Lit(s) => Ok(s.clone()),
        Arg::FromEnv(var) => std::env::var(var).map_err(|_| ServeError::MissingEnv(var.clone())),
    };
    let argv = launch.argv.iter().map(value).collect::<Result<_, _>>()?;
    let env = launch
        .env
        .iter()
        .map(|(k, v)| value(v).map(|v| (k.clone(), v)))
        .collect::<Result<_, _>>()?;
    Ok((argv, env))
}

/// Polls until `/health` answers 200 and `/v1/models` lists the served model; with
/// `own_group`, also until a process of that group listens on the recipe's port.
async fn wait_ready(recipe: &Recipe, own_group: Option<i32>) -> String {
    let url = recipe.server.local_url();
    // SGLang's /health runs a one-token generation and may take up to 20 s to answer.
    let timeout = if recipe.engine.kind == EngineKind::Sglang {
        25
    } else {
        5
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(timeout))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    // trtllm-serve before 1.3 reports the model path or its last component.
    let arg = recipe.model.engine_arg();
    let names = [
        recipe.model.served_name.as_str(),
        arg,
        arg.rsplit('/').next().unwrap_or(arg),
    ];
    loop {
        if let Some(pgid) = own_group
            && !instance::group_listens(pgid, recipe.server.port)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let healthy = client
            .get(format!("{url}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if healthy {
            let mut request = client.get(format!("{url}/v1/models"));
            if let Some(key) = recipe
                .server
                .api_key_env
                .as_deref()
                .and_then(|v| std::env::var(v).ok())
            {
                request = request.bearer_auth(key);
            }
            if let Ok(response) = request.send().await
                && let Ok(body) = response.json::<serde_json::Value>().await
                && body["data"].as_array().is_some_and(|models| {
                    models
                        .iter()
                        .any(|m| m["id"].as_str().is_some_and(|id| names.contains(&id)))
                })
            {
                return url;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

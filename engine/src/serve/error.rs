//! Why an engine could not be served, and what each failure means for the exit code:
//! an engine that exited on its own passes its code through, everything else is the
//! recipe's or the machine's to fix.

use std::path::PathBuf;
use std::time::Duration;

use super::instance::InstanceError;
use crate::diagnose::{Class, Diagnose};
use crate::launch::RenderError;

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
    /// The host's memory cannot be read, and `memory.host_floor` needs it.
    #[error(transparent)]
    Host(crate::host::HostError),
    /// `memory.host_floor` cannot hold on this machine.
    #[error(
        "`memory.host_floor` is {}, and this machine has {} of memory, {} of it available now",
        crate::size::gib(*floor),
        crate::size::gib(*total),
        crate::size::gib(*available)
    )]
    HostFloor {
        /// The floor.
        floor: u64,
        /// `MemTotal`.
        total: u64,
        /// `MemAvailable`.
        available: u64,
        /// The page cache.
        cached: u64,
    },
    /// No memory fraction of the recipe's asks for no more memory than can be had now
    /// (the GPU's free memory for vLLM, the host's available memory for the native
    /// engine).
    #[error("every memory fraction asks for more memory than is {}: {asked}; {}", pool.free_word(), pool.describe())]
    NoFractionFits {
        /// The fractions and what each asks for.
        asked: String,
        /// The memory they were checked against.
        pool: Box<crate::device::Pool>,
    },
    /// The host's memory fell below `memory.host_floor` at every fraction.
    #[error("stopped the engine at every memory fraction tried ({tried}): {crossing}")]
    FloorExhausted {
        /// The fractions tried.
        tried: String,
        /// The last crossing, described.
        crossing: String,
    },
    /// The engine exited before it was ready.
    #[error("the engine exited with code {code} before it was ready; last lines:\n{tail}")]
    ExitedEarly {
        /// Its exit code.
        code: i32,
        /// Its last lines of output.
        tail: String,
    },
    /// The engine crashed more often than `engine.restarts` allows.
    #[error(
        "the engine crashed more than {restarts} times in 10 minutes; giving up with its exit code {code}"
    )]
    GaveUp {
        /// The recipe's `engine.restarts`.
        restarts: u32,
        /// The last exit code.
        code: i32,
        /// The engine's log.
        log: PathBuf,
    },
    /// The instance was stopped before it was ready.
    #[error("the engine was stopped before it was ready")]
    StoppedBeforeReady,
    /// Something already listens on the recipe's port.
    #[error("port {0} is already in use")]
    PortInUse(u16),
    /// Not ready in time.
    #[error("the engine was not ready after {0:?} (`server.startup_timeout`)")]
    StartupTimeout(Duration),
    /// The instance record could not be written.
    #[error(transparent)]
    State(#[from] InstanceError),
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
    /// The supervising task failed (a bug).
    #[error("the engine's supervisor failed: {0}")]
    Supervisor(String),
}

impl Diagnose for ServeError {
    /// An engine that exited passes its own code through; the supervisor failing is
    /// sous's fault; the rest is the recipe's or the machine's.
    fn class(&self) -> Class {
        match self {
            ServeError::ExitedEarly { code, .. } | ServeError::GaveUp { code, .. } => Class::Engine(*code),
            ServeError::Render(e) => e.class(),
            ServeError::State(e) => e.class(),
            ServeError::Supervisor(_) => Class::Internal,
            _ => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            ServeError::Render(e) => e.hint(),
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
            ServeError::GaveUp { log, .. } => Some(format!("read {}", log.display())),
            ServeError::Host(e) => e.hint(),
            ServeError::HostFloor {
                floor, total, cached, ..
            } => Some(if floor >= total {
                "`memory.host_floor` is memory to keep free, not the machine's size: give a few GiB (`8GiB`)".into()
            } else {
                format!(
                    "free memory first (the page cache holds {}: `{}`), or lower `memory.host_floor`",
                    crate::size::gib(*cached),
                    crate::host::DROP_CACHES
                )
            }),
            ServeError::NoFractionFits { pool, .. } => {
                let lower = "lower `memory.gpu_utilization` or add a lower value to `memory.oom_fallback`";
                Some(match pool.page_cache_bytes {
                    Some(cached) => format!(
                        "{lower}; or free memory first (the page cache holds {}: `{}`)",
                        crate::size::gib(cached),
                        crate::host::DROP_CACHES
                    ),
                    None => format!(
                        "{lower}; or stop what holds the GPU's memory ({} of it is in use: `nvidia-smi` lists the processes)",
                        crate::size::gib(pool.total_bytes.saturating_sub(pool.available_bytes))
                    ),
                })
            }
            ServeError::FloorExhausted { .. } => Some(
                "lower `memory.gpu_utilization` or add values to `memory.oom_fallback`; a smaller `serving.max_model_len` or `serving.max_num_seqs` also needs less memory; or lower `memory.host_floor` if the host can spare it".into(),
            ),
            _ => None,
        }
    }
}

//! What `sous serve` records about the instance it runs (`<state>/<name>/instance.json`)
//! and what `sous serve --replace` does with that record: tell whether the instance is
//! still alive (the pid *and* its start time, so that a recycled pid is not mistaken
//! for it), whether it is healthy, whether a new instance can run beside it while it
//! starts, and stop it.
//!
//! Running both at once on the same port relies on `SO_REUSEPORT`: vLLM sets it on the
//! socket it binds before loading the model (`vllm/entrypoints/openai/api_server.py`
//! `create_server_socket`), and so does the native engine. SGLang (uvicorn binds with
//! `SO_REUSEADDR` only), trtllm-serve (a plain `bind` in
//! `tensorrt_llm/commands/serve.py` `launch_server`) and a container's published port
//! cannot share a port, so those are stopped before the new one starts.
//!
//! The process-table reads use the `procfs` crate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::process::terminate;
use crate::diagnose::{Class, Diagnose};
use crate::recipe::{EngineKind, Recipe, Runtime};

/// The file name of the record in an instance directory.
pub const FILE: &str = "instance.json";

/// What `sous serve` records about a ready instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceState {
    /// The recipe's name.
    pub name: String,
    /// The pid of the `sous serve` supervising it.
    pub sous_pid: u32,
    /// That process's start time (clock ticks after boot, `/proc/PID/stat` field 22).
    #[serde(default)]
    pub sous_started: Option<u64>,
    /// The engine's pid (it leads its own process group).
    pub engine_pid: Option<u32>,
    /// The engine.
    #[serde(default)]
    pub engine: Option<EngineKind>,
    /// Host or container.
    #[serde(default)]
    pub runtime: Option<Runtime>,
    /// The port it listens on.
    #[serde(default)]
    pub port: Option<u16>,
    /// Base URL.
    pub url: String,
    /// Hash of the resolved recipe.
    pub recipe_hash: String,
    /// The memory fraction in use.
    pub utilization: Option<f64>,
    /// Its recipe's `server.stop_grace`, in milliseconds.
    #[serde(default)]
    pub stop_grace_ms: Option<u64>,
    /// The recipe's model as its file names it: `org/name`, `org/name@revision`, or a
    /// local directory.
    #[serde(default)]
    pub model: Option<String>,
    /// The directory the engine serves (a Hub snapshot, a quantized checkpoint); `None`
    /// when the engine was given a repository id and reads the Hub cache itself.
    #[serde(default)]
    pub weights: Option<PathBuf>,
    /// The phases of its start the engine reported (`Loading weights took ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<super::logscan::PhaseTime>,
    /// When it became ready, in seconds since the Unix epoch.
    #[serde(default)]
    pub ready_unix: Option<u64>,
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Reading or writing the file failed.
    #[error("{action} `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a record sous wrote.
    #[error("`{}` is not an instance record sous can read: {source}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

impl Diagnose for InstanceError {
    /// The state directory is the user's (permissions, a full disk, a damaged file).
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            InstanceError::Corrupt { path, .. } => Some(format!(
                "remove {} if no `sous serve` of this recipe runs; the next one writes it again",
                path.display()
            )),
            InstanceError::Io { .. } => None,
        }
    }
}

impl InstanceState {
    /// Whether the `sous serve` that wrote this record is still running: its pid exists
    /// and started when the record says.
    pub fn alive(&self) -> bool {
        let started = process_start(self.sous_pid);
        started.is_some() && (self.sous_started.is_none() || started == self.sous_started)
    }

    /// The grace period its engine gets to stop (30 s when the record predates it).
    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.stop_grace_ms.unwrap_or(30_000))
    }

    /// Whether `/health` answers 200 now.
    pub async fn healthy(&self) -> bool {
        let Ok(client) = reqwest::Client::builder().timeout(Duration::from_secs(5)).build() else {
            return false;
        };
        client
            .get(format!("{}/health", self.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// Stops the instance the way Ctrl-C would: SIGTERM to its `sous serve`, which
    /// stops the engine within its grace period. If it is still there after `grace`
    /// plus a margin, SIGKILL to the engine's process group and to sous. Returns how
    /// long it took.
    pub async fn stop(&self, grace: Duration) -> Duration {
        let started = Instant::now();
        if !self.alive() {
            return started.elapsed();
        }
        let sous = Pid::from_raw(self.sous_pid as i32);
        let gone = || async {
            while self.alive() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let killed = terminate(
            || {
                let _ = kill(sous, Signal::SIGTERM);
            },
            gone(),
            grace + Duration::from_secs(5),
            || {
                if let Some(engine) = self.engine_pid {
                    let _ = killpg(Pid::from_raw(engine as i32), Signal::SIGKILL);
                }
                let _ = kill(sous, Signal::SIGKILL);
            },
        )
        .await
        .is_none();
        if killed {
            let _ = tokio::time::timeout(Duration::from_secs(5), gone()).await;
        }
        started.elapsed()
    }
}

/// The record in `instance_dir`, if there is one.
pub fn read(instance_dir: &Path) -> Result<Option<InstanceState>, InstanceError> {
    let path = instance_dir.join(FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(InstanceError::Io {
                action: "reading",
                path,
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| InstanceError::Corrupt { path, source })
}

/// The record of the instance still running in `instance_dir`: `None` when there is no
/// record or its `sous serve` is gone (a crash or SIGKILL leaves the file behind).
pub fn read_live(instance_dir: &Path) -> Result<Option<InstanceState>, InstanceError> {
    Ok(read(instance_dir)?.filter(InstanceState::alive))
}

/// Writes the record atomically ([`crate::atomic::write_file`]), so a reader never
/// sees half of it.
pub fn write(instance_dir: &Path, state: &InstanceState) -> Result<(), InstanceError> {
    let path = instance_dir.join(FILE);
    let json = serde_json::to_vec_pretty(state).map_err(|source| InstanceError::Corrupt {
        path: path.clone(),
        source,
    })?;
    crate::atomic::write_file(&path, &json).map_err(|source| InstanceError::Io {
        action: "writing",
        path,
        source,
    })
}

/// Removes the record if this process wrote it: an instance being replaced must not
/// remove the record of the one replacing it.
pub fn remove_own(instance_dir: &Path) {
    if let Ok(Some(state)) = read(instance_dir)
        && state.sous_pid == std::process::id()
    {
        let _ = std::fs::remove_file(instance_dir.join(FILE));
    }
}

/// A process's start time in clock ticks after boot, `None` when it does not exist.
pub fn process_start(pid: u32) -> Option<u64> {
    let pid = i32::try_from(pid).ok()?;
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    // A zombie has exited; it only waits for its parent to read its status.
    (stat.state != 'Z').then_some(stat.starttime)
}

/// Whether a process of process group `pgid` listens on TCP `port` (IPv4 or IPv6). This
/// tells a new engine's readiness apart from the old one's while both share the port:
/// a request to the port may be answered by either.
pub fn group_listens(pgid: i32, port: u16) -> bool {
    let Ok(processes) = procfs::process::all_processes() else {
        return false;
    };
    for process in processes.flatten() {
        if !process.stat().is_ok_and(|s| s.pgrp == pgid) {
            continue;
        }
        let Ok(fds) = process.fd() else { continue };
        let sockets: Vec<u64> = fds
            .flatten()
            .filter_map(|fd| match fd.target {
                procfs::process::FDTarget::Socket(inode) => Some(inode),
                _ => None,
            })
            .collect();
        if sockets.is_empty() {
            continue;
        }
        let tables = [process.tcp(), process.tcp6()];
        let listens = tables.into_iter().flatten().flatten().any(|entry| {
            entry.state == procfs::net::TcpState::Listen
                && entry.local_address.port() == port
                && sockets.contains(&entry.inode)
        });
        if listens {
            return true;
        }
    }
    false
}

/// Whether a new instance of `recipe` can start while `old` still serves; the reason
/// when it cannot.
pub fn can_overlap(old: &InstanceState, recipe: &Recipe) -> Result<(), String> {
    let new_kind = recipe.engine.kind;
    let old_kind = old.engine.unwrap_or(new_kind);
    if old.port == Some(recipe.server.port) {
        let shares = |kind: EngineKind, runtime: Runtime| {
            runtime == Runtime::Host && matches!(kind, EngineKind::Vllm | EngineKind::Native)
        };
        let old_runtime = old.runtime.unwrap_or(Runtime::Host);
        for (kind, runtime) in [(old_kind, old_runtime), (new_kind, recipe.engine.runtime)] {
            if !shares(kind, runtime) {
                let who = if runtime == Runtime::Host {
                    format!("{} binds it without SO_REUSEPORT", kind.display_name())
                } else {
                    "a container's published port cannot be shared".to_owned()
                };
                return Err(format!(
                    "both instances need port {}, and {who}",
                    recipe.server.port
                ));
            }
        }
    }
    let gpu = |kind: EngineKind| kind != EngineKind::Native;
    if gpu(old_kind) && gpu(new_kind) {
        // vLLM's fraction is of the whole GPU; an unset one is the engine's default,
        // 0.9 for vLLM and TensorRT-LLM (SGLang picks its own, of the same order).
        let old_fraction = old.utilization.unwrap_or(0.9);
        let new_fraction = recipe.memory.gpu_utilization.unwrap_or(0.9);
        if old_fraction + new_fraction > 1.0 {
            return Err(format!(
                "the running instance holds {old_fraction} of the GPU memory and the new one asks for {new_fraction}"
            ));
        }
    }
    if old_kind == EngineKind::Native && new_kind == EngineKind::Native {
        // The new instance is taken to need what the old one uses now.
        let rss = old
            .engine_pid
            .and_then(|pid| procfs::process::Process::new(pid as i32).ok())
            .and_then(|p| p.status().ok())
            .and_then(|s| s.vmrss)
            .map_or(0, |kib| kib * 1024);
        let available = {
            use procfs::Current;
            procfs::Meminfo::current()
                .ok()
                .and_then(|m| m.mem_available)
                .unwrap_or(0)
        };
        if rss + rss / 10 > available {
            return Err(format!(
                "the running instance uses {} MiB of memory and only {} MiB are available",
                rss >> 20,
                available >> 20
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: u32) -> InstanceState {
        InstanceState {
            name: "r".into(),
            sous_pid: pid,
            sous_started: process_start(pid),
            engine_pid: None,
            engine: Some(EngineKind::Vllm),
            runtime: Some(Runtime::Host),
            port: Some(8000),
            url: "http://127.0.0.1:8000".into(),
            recipe_hash: "h".into(),
            utilization: Some(0.4),
            stop_grace_ms: None,
            model: Some("org/name".into()),
            weights: None,
            phases: Vec::new(),
            ready_unix: Some(1),
        }
    }

    #[test]
    fn this_process_is_alive_and_a_recycled_pid_is_not() {
        let me = state(std::process::id());
        assert!(me.alive());
        let recycled = InstanceState {
            sous_started: me.sous_started.map(|t| t + 1),
            ..me
        };
        assert!(!recycled.alive());
        assert!(!state(u32::MAX / 2).alive());
    }

    #[test]
    fn the_record_round_trips_and_only_its_writer_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()).expect("read"), None);
        let mine = state(std::process::id());
        write(dir.path(), &mine).expect("write");
        assert_eq!(read_live(dir.path()).expect("read"), Some(mine.clone()));
        let other = InstanceState {
            sous_pid: 1,
            ..mine.clone()
        };
        write(dir.path(), &other).expect("write");
        remove_own(dir.path());
        assert_eq!(read(dir.path()).expect("read"), Some(other));
        write(dir.path(), &mine).expect("write");
        remove_own(dir.path());
        assert_eq!(read(dir.path()).expect("read"), None);
        std::fs::write(dir.path().join(FILE), "{").expect("write");
        assert!(matches!(read(dir.path()), Err(InstanceError::Corrupt { .. })));
    }

    #[test]
    fn a_listening_socket_is_found_in_its_process_group() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let pgid = nix::unistd::getpgrp().as_raw();
        assert!(group_listens(pgid, port));
        drop(listener);
        assert!(!group_listens(pgid, port));
    }
}

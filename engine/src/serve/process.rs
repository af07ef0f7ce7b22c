//! One engine process: spawned in its own process group (so a stop reaches the
//! workers vLLM and SGLang fork), told to die with sous (`PR_SET_PDEATHSIG`), its
//! output read line by line, and stopped with SIGTERM, a grace period, then SIGKILL.
//!
//! [`terminate`] is that stop sequence, the only one in sous: the supervisor stops
//! its engine with it, and `--replace` stops another `sous serve` with it.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A running engine.
pub struct EngineProcess {
    child: Child,
    pgid: Option<i32>,
}

/// Starts `argv` with `env` added to sous's environment; every output line (stdout
/// and stderr) is sent on `lines`.
pub fn spawn(
    argv: &[String],
    env: &[(String, String)],
    lines: mpsc::UnboundedSender<String>,
) -> std::io::Result<EngineProcess> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command line"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn()?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    if let Some(out) = child.stdout.take() {
        forward(out, lines.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward(err, lines);
    }
    Ok(EngineProcess { child, pgid })
}

/// The engine gets SIGTERM if sous dies, whatever kills it (even SIGKILL), so no
/// engine outlives the `sous serve` that started it.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // prctl(2), which is async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from));
    }
}

fn forward(stream: impl tokio::io::AsyncRead + Unpin + Send + 'static, lines: mpsc::UnboundedSender<String>) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
}

impl EngineProcess {
    /// The engine's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The engine's process group (its pid).
    pub fn pgid(&self) -> Option<i32> {
        self.pgid
    }

    /// Waits for the engine to exit; its exit code, or 128 + the signal that ended it.
    pub async fn wait(&mut self) -> i32 {
        match self.child.wait().await {
            Ok(status) => exit_code(status),
            Err(_) => 1,
        }
    }

    /// SIGTERM to the whole process group, `grace` to exit, then SIGKILL. Returns the
    /// exit code.
    pub async fn stop(&mut self, grace: Duration) -> i32 {
        let pgid = self.pgid;
        let signal = |signal| {
            if let Some(pgid) = pgid {
                let _ = killpg(Pid::from_raw(pgid), signal);
            }
        };
        let exited = terminate(
            || signal(Signal::SIGTERM),
            self.child.wait(),
            grace,
            || signal(Signal::SIGKILL),
        )
        .await;
        match exited {
            // Workers it forked may outlive it.
            Some(Ok(status)) => {
                self.kill_group();
                exit_code(status)
            }
            _ => {
                let _ = self.child.kill().await;
                self.wait().await
            }
        }
    }

    /// SIGKILL to whatever is left of the process group.
    pub fn kill_group(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// How sous stops a process: `term` (SIGTERM to it or its group), up to `grace` for
/// `exited` to resolve, then `kill` (SIGKILL). Returns what `exited` gave, or `None`
/// when the process had to be killed.
pub(crate) async fn terminate<T>(
    term: impl FnOnce(),
    exited: impl std::future::Future<Output = T>,
    grace: Duration,
    kill: impl FnOnce(),
) -> Option<T> {
    term();
    match tokio::time::timeout(grace, exited).await {
        Ok(value) => Some(value),
        Err(_) => {
            kill();
            None
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

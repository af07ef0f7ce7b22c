//! Finding programs on `PATH` and running them with a time limit: the only way
//! `sous doctor` learns about the tools around it, so that a test can stand in for
//! any of them with a script earlier on `PATH`.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The `PATH` the probes search, fixed once per examination.
#[derive(Debug, Clone, Default)]
pub struct SearchPath(Option<OsString>);

impl SearchPath {
    /// The process's own `PATH`.
    pub fn from_env() -> SearchPath {
        SearchPath(sous_engine::env::PATH.get_os())
    }

    /// A given `PATH` value (tests).
    pub fn new(path: impl Into<OsString>) -> SearchPath {
        SearchPath(Some(path.into()))
    }

    /// Where `program` is: itself when it names a path (`/opt/venv/bin/vllm`), else
    /// the first executable file of that name in a `PATH` directory, as a shell
    /// finds it.
    pub fn which(&self, program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            let path = PathBuf::from(program);
            return is_executable(&path).then_some(path);
        }
        let dirs = self.0.as_ref()?;
        std::env::split_paths(dirs)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(program))
            .find(|candidate| is_executable(candidate))
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What a finished program said.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl Output {
    /// Whether it exited with 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The last non-empty line of stderr (else stdout): what a failing tool said last,
    /// usually the reason.
    pub fn last_words(&self) -> String {
        let last = |text: &str| {
            text.lines()
                .map(str::trim)
                .rfind(|l| !l.is_empty())
                .map(str::to_owned)
        };
        last(&self.stderr)
            .or_else(|| last(&self.stdout))
            .unwrap_or_default()
    }

    /// `exit 1: <last words>`, or `killed by a signal`.
    pub fn failure(&self) -> String {
        let status = match self.code {
            Some(code) => format!("exit {code}"),
            None => "killed by a signal".to_owned(),
        };
        let words = self.last_words();
        if words.is_empty() {
            status
        } else {
            format!("{status}: {words}")
        }
    }
}

/// Why a program gave no output.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// It could not be started.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        source: std::io::Error,
    },
    /// It ran past the limit and was killed.
    #[error("{program} did not answer within {} s", limit.as_secs())]
    TimedOut {
        /// The program.
        program: String,
        /// The limit.
        limit: Duration,
    },
}

/// Runs `program args` with no input, for at most `limit`; a program still running
/// then is killed.
pub async fn run(program: &Path, args: &[&str], limit: Duration) -> Result<Output, RunError> {
    let name = program.display().to_string();
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().map_err(|source| RunError::Spawn {
        program: name.clone(),
        source,
    })?;
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => Ok(Output {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }),
        Ok(Err(source)) => Err(RunError::Spawn {
            program: name,
            source,
        }),
        Err(_) => Err(RunError::TimedOut { program: name, limit }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[test]
    fn which_finds_executables_only_and_in_path_order() {
        let first = tempfile::tempdir().expect("tempdir");
        let second = tempfile::tempdir().expect("tempdir");
        std::fs::write(first.path().join("tool"), "not executable").expect("write");
        let found = script(second.path(), "tool", "exit 0");
        let path = std::env::join_paths([first.path(), second.path()]).expect("join");
        let search = SearchPath::new(path);
        assert_eq!(search.which("tool"), Some(found.clone()));
        assert_eq!(search.which("absent"), None);
        assert_eq!(search.which(found.to_str().expect("utf-8")), Some(found));
        assert_eq!(SearchPath::default().which("sh"), None);
    }

    #[tokio::test]
    async fn run_reports_output_failure_and_time_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = script(dir.path(), "ok", "echo line one; echo 1.2.3");
        let out = run(&ok, &[], Duration::from_secs(10)).await.expect("runs");
        assert!(out.success());
        assert_eq!(out.stdout, "line one\n1.2.3\n");
        let bad = script(dir.path(), "bad", "echo 'something broke' >&2; exit 3");
        let out = run(&bad, &[], Duration::from_secs(10)).await.expect("runs");
        assert_eq!(out.failure(), "exit 3: something broke");
        let slow = script(dir.path(), "slow", "exec sleep 30");
        let started = std::time::Instant::now();
        let err = run(&slow, &[], Duration::from_millis(300))
            .await
            .expect_err("times out");
        assert!(matches!(err, RunError::TimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}

//! Passive analysis of vLLM's periodic stats lines: the figures of the Titan field report
//! (throughput per number of running requests, per-instance peaks, the cluster sum aligned
//! per minute and its percentiles, the prompt:generation ratio), rebuilt from the logs a
//! production server left behind. Reading the files and rendering are here too; parsing
//! command-line flags is not (that is `commands/`), nor is anything that talks to a server.
//!
//! Not handled: several engines (data parallelism) logging separately into one file are
//! read as samples of one instance; merge them upstream or use the aggregated line.
//!
//! The parts: [`parse`] reads a log's lines (what vLLM writes, and the prefixes logging
//! tools add), [`analyze`] computes the figures, [`report`] is their shape (the JSON),
//! [`render`] the terminal text, [`time`] places vLLM's year-less timestamps.

mod analyze;
pub mod chart;
pub mod compare;
mod parse;
mod render;
pub mod report;
mod spec;
#[cfg(test)]
mod testing;
mod time;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sous_engine::diagnose::{Class, Diagnose, user_unless};

use crate::bench::window::Window;

pub use analyze::analyze;
pub use time::LogTime;

/// A gap longer than this between samples is idle time, by default: vLLM logs every 10 s,
/// so 15 s leaves room for a late log line without hiding a skipped one.
pub const DEFAULT_IDLE_GAP_S: u32 = 15;
/// vLLM's default `VLLM_LOG_STATS_INTERVAL`.
pub const DEFAULT_LOG_INTERVAL_S: u32 = 10;
/// The Titan report counts the minutes above 1,000 tok/s.
pub const DEFAULT_THRESHOLD_TOK_S: f64 = 1000.0;
/// The Titan report lists the eight largest bursts.
pub const DEFAULT_TOP_K: usize = 8;

/// One log to read: one instance of the server.
#[derive(Debug, Clone)]
pub struct LogInput {
    /// The instance's label in the report.
    pub name: String,
    /// The log's text.
    pub text: String,
}

impl LogInput {
    /// A log already in memory.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> LogInput {
        LogInput {
            name: name.into(),
            text: text.into(),
        }
    }

    /// Reads a log file, labelled `label` or else by its file stem. Bytes that are not
    /// UTF-8 are replaced rather than refused: a log cut mid-character is still a log.
    pub fn read(path: &Path, label: Option<&str>) -> Result<LogInput, LogsError> {
        let bytes = std::fs::read(path).map_err(|source| LogsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let name = match label {
            Some(label) => label.to_owned(),
            None => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
        };
        Ok(LogInput::new(name, String::from_utf8_lossy(&bytes)))
    }
}

/// How to read the logs and summarise them.
#[derive(Debug, Clone)]
pub struct LogsOptions {
    /// The year of each file's first timestamp (vLLM's timestamps have none).
    pub year: i32,
    /// Consecutive samples further apart than this (seconds) bound an idle gap.
    pub idle_gap_s: u32,
    /// vLLM's logging interval (`VLLM_LOG_STATS_INTERVAL`), in seconds.
    pub log_interval_s: u32,
    /// Cluster minutes above this many generated tokens per second are counted.
    pub threshold_tok_s: f64,
    /// How many of the largest cluster minutes to list.
    pub top_k: usize,
    /// `--since`/`--until`; relative times count back from the latest sample of all logs.
    pub window: Window,
    /// `--after-restart`: each log that restarted is read from a restart on.
    pub after_restart: Option<AfterRestart>,
}

/// Which restart `--after-restart` starts each log's window at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRestart {
    /// The last one in the log.
    Last,
    /// The n-th one (from 1), in the order of the log.
    Nth(usize),
}

impl std::fmt::Display for AfterRestart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AfterRestart::Last => f.write_str("last"),
            AfterRestart::Nth(n) => write!(f, "{n}"),
        }
    }
}

impl Default for LogsOptions {
    /// The current year and the Titan report's choices.
    fn default() -> LogsOptions {
        LogsOptions {
            year: current_year(),
            idle_gap_s: DEFAULT_IDLE_GAP_S,
            log_interval_s: DEFAULT_LOG_INTERVAL_S,
            threshold_tok_s: DEFAULT_THRESHOLD_TOK_S,
            top_k: DEFAULT_TOP_K,
            window: Window::default(),
            after_restart: None,
        }
    }
}

/// The current year by the system clock (UTC).
pub fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let (year, _, _) = time::civil_from_days(secs.div_euclid(86_400));
    i32::try_from(year).unwrap_or(i32::MAX)
}

/// Why the logs cannot be analysed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// A log file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// No log was given.
    #[error("no log files given")]
    NoInputs,
    /// Two logs carry the same label.
    #[error("two logs are named `{name}`")]
    DuplicateName {
        /// The label.
        name: String,
    },
    /// A log holds no stats line that could be read.
    #[error("{name}: no vLLM stats lines among its {lines} lines ({malformed} malformed)")]
    NoSamples {
        /// The instance.
        name: String,
        /// How many lines it has.
        lines: usize,
        /// How many looked like stats lines but did not parse.
        malformed: usize,
    },
    /// `--since`/`--until` do not make a window.
    #[error("{0}")]
    Window(String),
    /// A log has no stats line in the window.
    #[error("{name}: none of its {samples} stats lines falls in the window ({window})")]
    EmptyWindow {
        /// The instance.
        name: String,
        /// Its stats lines in all.
        samples: usize,
        /// The window, as text.
        window: String,
        /// Its first and last sample.
        span: (LogTime, LogTime),
    },
    /// `--after-restart N` names a restart a log does not have.
    #[error("{name}: --after-restart {wanted} asks for restart {wanted}, but the log has {found}")]
    NoSuchRestart {
        /// The instance.
        name: String,
        /// The restart asked for.
        wanted: usize,
        /// How many it has.
        found: usize,
    },
    /// A built-in pattern does not compile: a bug in sous.
    #[error("internal error: a built-in log pattern does not compile: {0}")]
    Pattern(#[from] regex::Error),
}

impl Diagnose for LogsError {
    /// Only a built-in pattern that does not compile is sous's fault.
    fn class(&self) -> Class {
        user_unless(matches!(self, LogsError::Pattern(_)))
    }

    fn hint(&self) -> Option<String> {
        match self {
            LogsError::DuplicateName { .. } => {
                Some("files with the same name in different directories need distinct labels".into())
            }
            LogsError::EmptyWindow { span, .. } => Some(format!(
                "its stats lines run from {} to {}; relative times count back from the latest \
                 line of all the logs",
                span.0, span.1
            )),
            LogsError::NoSuchRestart { .. } => Some(
                "`--after-restart` alone starts at each log's last restart; the report lists \
                 each log's restarts"
                    .into(),
            ),
            LogsError::NoSamples { .. } => Some(
                "vLLM logs `Engine 000: Avg prompt throughput: ...` every 10 s while it serves; \
                 check that this is the server's log and that it ran without --disable-log-stats"
                    .into(),
            ),
            _ => None,
        }
    }
}

/// A finite number as the engines print it (`12.5`), for the stats lines and the
/// speculative-decoding lines alike.
fn parse_rate(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A percentage as the engines print it (`45.2%`), as printed (not divided by 100).
fn parse_percent(value: &str) -> Option<f64> {
    parse_rate(value.strip_suffix('%')?)
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn inputs_are_checked() {
        assert!(matches!(analyze(&[], &options()), Err(LogsError::NoInputs)));
        let text = line("09-06 10:00:00", 1.0, 1);
        let twice = [LogInput::new("a", text.clone()), LogInput::new("a", text)];
        assert!(matches!(
            analyze(&twice, &options()),
            Err(LogsError::DuplicateName { name }) if name == "a"
        ));
        let empty = [LogInput::new(
            "quiet",
            "INFO: nothing\n(APIServer pid=1) INFO 09-06 10:00:00 [loggers.py:1] Engine 000: Avg",
        )];
        let err = analyze(&empty, &options()).expect_err("no samples");
        assert!(
            matches!(
                err,
                LogsError::NoSamples {
                    lines: 2,
                    malformed: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.hint().is_some() && !err.is_internal());
        let missing = Path::new(FIXTURES).join("instance-9.log");
        let err = LogInput::read(&missing, None).expect_err("missing");
        assert!(err.to_string().contains("instance-9.log"), "{err}");
        assert_eq!(
            LogInput::read(&Path::new(FIXTURES).join("instance-0.log"), Some("gpu0"))
                .expect("read")
                .name,
            "gpu0"
        );
    }
}

//! Passive analysis of vLLM's periodic stats lines: the figures of the Titan field report
//! (throughput per number of running requests, per-instance peaks, the cluster sum aligned
//! per minute and its percentiles, the prompt:generation ratio), rebuilt from the logs a
//! production server left behind. Reading the files and rendering are here too; parsing
//! command-line flags is not (that is `commands/`), nor is anything that talks to a server.
//!
//! # What is read
//!
//! `LoggingStatLogger.log` in vLLM's `vllm/v1/metrics/loggers.py` logs one line per engine
//! every `VLLM_LOG_STATS_INTERVAL` seconds (10 by default), at INFO only while the engine
//! is not idle (at DEBUG otherwise, so the lines simply stop). Three shapes are accepted,
//! matched on the message, wherever it starts in the line, so that `docker logs -t`,
//! `kubectl logs --prefix` and similar prefixes do not matter (ANSI colour codes are
//! removed first):
//!
//! - the list-based form (0.22 to 0.33; parts joined by `", "`, optional ones only when
//!   non-zero):
//!   `Engine 000: Avg prompt throughput: 79.4 tokens/s, Avg generation throughput: 1.4
//!   tokens/s, Running: 1 reqs, Waiting: 0 reqs[, Deferred: N reqs][, KV fetch: ...]
//!   [, Preemptions: N], GPU KV cache usage: 1.9%[, Prefix cache hit rate: 0.0%]
//!   [, Corrupted: N reqs][, External prefix cache hit rate: ...][, MM cache hit rate: ...]`
//!   (the device word is `GPU`, `CPU`, `XPU`...);
//! - 0.10.2, the same as one format string that always ends with the prefix hit rate;
//! - the V0 engine (`vllm/engine/metrics.py`): `Avg prompt throughput: ..., Avg generation
//!   throughput: ..., Running: N reqs, Swapped: N reqs, Pending: N reqs, GPU KV cache
//!   usage: ...%, CPU KV cache usage: ...%.`
//!
//! The time is taken from vLLM's log prefix, `LEVEL MM-DD HH:MM:SS [file.py:line]`, which
//! has no year: the year comes from [`LogsOptions::year`], and within one file a jump
//! backwards by more than four weeks is read as the turn of a year. Times are naive (the
//! server's local clock, counted as if it were UTC); only differences and minutes matter.
//! A line that looks like a stats line but does not parse completely (truncated by a
//! crash or a log rotation, or without a timestamp) is counted as malformed and skipped.
//!
//! # What is computed
//!
//! Each input is one instance. A restart (the `(APIServer pid=N)` changing between stats
//! lines, or vLLM's start-up lines appearing after a stats line) is recorded, and the
//! instance goes on. Per instance: the samples, their span, the idle gaps (consecutive
//! samples more than [`LogsOptions::idle_gap_s`] apart; each counts as idle for its length
//! minus one logging interval, since the later sample still covers the interval before
//! it), the curve of mean and maximum generation throughput per `Running` value (and that
//! mean divided by `Running`: the throughput one request saw), the peak sample, the mean
//! throughputs over active samples (any request running or any token processed) and the
//! prompt:generation ratio (the sum of prompt throughput over the sum of generation
//! throughput, over all samples: a ratio of token counts, since every sample covers the
//! same interval).
//!
//! The cluster aligns instances per wall-clock minute (the timestamp truncated to the
//! minute): an instance's value for a minute is the maximum of its samples in it (0 when
//! it has none), and the cluster's value is the sum over instances. The minutes are
//! summarised twice, over the minutes in which every instance logged at least one sample
//! ("simultaneous activity on all GPUs") and over those in which any did: count, mean,
//! P50/P95/P99, maximum, the minutes above a threshold and the largest minutes.
//! Percentiles interpolate linearly between closest ranks, as numpy's default: for `n`
//! sorted values the rank of `p` is `p / 100 × (n − 1)`.
//!
//! Not handled: several engines (data parallelism) logging separately into one file are
//! read as samples of one instance; merge them upstream or use the aggregated line.

// Until `sous bench logs` calls into this module, the binary uses none of it.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde::{Serialize, Serializer};

/// A gap longer than this between samples is idle time, by default: vLLM logs every 10 s,
/// so 15 s leaves room for a late log line without hiding a skipped one.
pub const DEFAULT_IDLE_GAP_S: u32 = 15;
/// vLLM's default `VLLM_LOG_STATS_INTERVAL`.
pub const DEFAULT_LOG_INTERVAL_S: u32 = 10;
/// The Titan report counts the minutes above 1,000 tok/s.
pub const DEFAULT_THRESHOLD_TOK_S: f64 = 1000.0;
/// The Titan report lists the eight largest bursts.
pub const DEFAULT_TOP_K: usize = 8;

/// A backwards jump larger than this is the turn of a year, not a clock correction.
const ROLLOVER_S: i64 = 28 * 86_400;
/// How many malformed line numbers an instance report lists.
const MALFORMED_EXAMPLES: usize = 10;

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
        }
    }
}

/// The current year by the system clock (UTC).
pub fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let (year, _, _) = civil_from_days(secs.div_euclid(86_400));
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
    /// A built-in pattern does not compile: a bug in sous.
    #[error("internal error: a built-in log pattern does not compile: {0}")]
    Pattern(#[from] regex::Error),
}

impl LogsError {
    /// What the user can do about it, when there is something.
    pub fn hint(&self) -> Option<String> {
        match self {
            LogsError::DuplicateName { .. } => {
                Some("files with the same name in different directories need distinct labels".into())
            }
            LogsError::NoSamples { .. } => Some(
                "vLLM logs `Engine 000: Avg prompt throughput: ...` every 10 s while it serves; \
                 check that this is the server's log and that it ran without --disable-log-stats"
                    .into(),
            ),
            _ => None,
        }
    }

    /// Whether this is sous's fault rather than the input's.
    pub fn is_internal(&self) -> bool {
        matches!(self, LogsError::Pattern(_))
    }
}

/// A time from a log, in seconds since 1970-01-01 00:00:00 of the server's own clock.
/// Serialized as `YYYY-MM-DDTHH:MM:SS` (no zone: the log does not say which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogTime(pub i64);

impl LogTime {
    fn parts(self) -> (i64, u32, u32, i64, i64, i64) {
        let (y, m, d) = civil_from_days(self.0.div_euclid(86_400));
        let s = self.0.rem_euclid(86_400);
        (y, m, d, s / 3600, s % 3600 / 60, s % 60)
    }

    /// `YYYY-MM-DD HH:MM`, for minutes.
    fn minute_text(self) -> String {
        let (y, mo, d, h, mi, _) = self.parts();
        format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}")
    }
}

impl fmt::Display for LogTime {
    /// `YYYY-MM-DD HH:MM:SS`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d, h, mi, s) = self.parts();
        write!(f, "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
    }
}

impl Serialize for LogTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (y, mo, d, h, mi, s) = self.parts();
        serializer.collect_str(&format_args!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}"))
    }
}

/// Everything `sous bench logs` reports.
#[derive(Debug, Clone, Serialize)]
pub struct LogsReport {
    /// The year assumed for each file's first timestamp.
    pub year: i32,
    /// The idle-gap threshold used, in seconds.
    pub idle_gap_s: u32,
    /// The logging interval assumed, in seconds.
    pub log_interval_s: u32,
    /// One per input, in input order.
    pub instances: Vec<InstanceReport>,
    /// The instances aligned per minute; only with two inputs or more.
    pub cluster: Option<ClusterReport>,
}

/// One instance's figures.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceReport {
    /// Its label.
    pub name: String,
    /// Lines in the log.
    pub lines: usize,
    /// Stats lines read.
    pub samples: usize,
    /// Lines that looked like stats lines but did not parse.
    pub malformed_lines: usize,
    /// The first of those, by line number (1-based).
    pub malformed_examples: Vec<usize>,
    /// Every other line.
    pub other_lines: usize,
    /// The first sample's time.
    pub first: LogTime,
    /// The last sample's time.
    pub last: LogTime,
    /// From the first sample to the last, in seconds.
    pub span_s: i64,
    /// Stretches without stats lines.
    pub idle: IdleGaps,
    /// Where the server started again.
    pub restarts: Vec<Restart>,
    /// Generation throughput per number of running requests, by increasing `running`.
    pub curve: Vec<CurvePoint>,
    /// The sample with the highest generation throughput (the earliest on a tie).
    pub peak: Peak,
    /// Samples with a request running or tokens processed.
    pub active_samples: usize,
    /// Mean prompt throughput over active samples, tokens/s.
    pub mean_prompt_tok_s: f64,
    /// Mean generation throughput over active samples, tokens/s.
    pub mean_generation_tok_s: f64,
    /// Sum of prompt throughput over sum of generation throughput, all samples; none when
    /// nothing was generated.
    pub prompt_generation_ratio: Option<f64>,
    /// The highest KV cache usage logged (the first device named on the line), percent.
    pub max_kv_cache_usage_pct: f64,
    /// The most requests waiting at once.
    pub max_waiting: u32,
    /// Preemptions summed over the samples (logged by the list-based form when non-zero).
    pub preemptions: u64,
}

/// The idle stretches of one instance.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IdleGaps {
    /// How many gaps.
    pub gaps: usize,
    /// Their total length less one logging interval each, in seconds.
    pub idle_s: i64,
    /// The longest distance between two consecutive samples, in seconds.
    pub longest_gap_s: i64,
}

/// A restart of the server within one log.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Restart {
    /// The first sign of it: a start-up line, or the first stats line of the new process.
    pub at: LogTime,
    /// The API server's pid before, when logged.
    pub pid_before: Option<u32>,
    /// And after.
    pub pid_after: Option<u32>,
}

/// One point of the throughput-per-concurrency curve.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CurvePoint {
    /// `Running: N reqs`.
    pub running: u32,
    /// Samples with that many running.
    pub samples: usize,
    /// Their mean generation throughput, tokens/s.
    pub mean_generation_tok_s: f64,
    /// Their highest generation throughput, tokens/s.
    pub max_generation_tok_s: f64,
    /// The mean divided by `running`: what one request saw; none at 0 running.
    pub per_request_tok_s: Option<f64>,
}

/// The sample with the highest generation throughput.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Peak {
    /// When.
    pub at: LogTime,
    /// Generation throughput, tokens/s.
    pub generation_tok_s: f64,
    /// Prompt throughput in the same sample, tokens/s.
    pub prompt_tok_s: f64,
    /// Requests running.
    pub running: u32,
}

/// The instances aligned per minute.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// The instances, in the order of every `contributions` list.
    pub instances: Vec<String>,
    /// The threshold of `above_threshold`, tokens/s.
    pub threshold_tok_s: f64,
    /// Over the minutes in which every instance has a sample.
    pub all_active: ClusterSummary,
    /// Over the minutes in which any instance has a sample.
    pub any_active: ClusterSummary,
}

/// The cluster's per-minute generation throughput over a set of minutes.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSummary {
    /// How many minutes.
    pub minutes: usize,
    /// Their distribution; none when there are no minutes.
    pub distribution: Option<Distribution>,
    /// Minutes above the threshold.
    pub above_threshold: usize,
    /// The largest minutes, largest first (the earliest on a tie).
    pub top: Vec<ClusterMinute>,
}

/// Mean, percentiles and maximum of some values.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Distribution {
    /// Mean.
    pub mean: f64,
    /// Median (linear interpolation).
    pub p50: f64,
    /// 95th percentile (linear interpolation).
    pub p95: f64,
    /// 99th percentile (linear interpolation).
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// One minute of the cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterMinute {
    /// Its start.
    pub minute: LogTime,
    /// The sum of the contributions, tokens/s.
    pub total_tok_s: f64,
    /// Each instance's highest sample in the minute (0 without one), tokens/s.
    pub contributions: Vec<f64>,
}

/// Reads every log and computes the report.
pub fn analyze(inputs: &[LogInput], options: &LogsOptions) -> Result<LogsReport, LogsError> {
    if inputs.is_empty() {
        return Err(LogsError::NoInputs);
    }
    let mut names = BTreeSet::new();
    for input in inputs {
        if !names.insert(input.name.as_str()) {
            return Err(LogsError::DuplicateName {
                name: input.name.clone(),
            });
        }
    }
    let patterns = Patterns::new()?;
    let mut instances = Vec::with_capacity(inputs.len());
    let mut minute_maps = Vec::with_capacity(inputs.len());
    for input in inputs {
        let parsed = parse_log(&input.text, options.year, &patterns);
        let (report, minutes) = summarise(&input.name, &parsed, options)?;
        instances.push(report);
        minute_maps.push(minutes);
    }
    let cluster = (inputs.len() > 1).then(|| {
        cluster(
            instances.iter().map(|i| i.name.clone()).collect(),
            &minute_maps,
            options,
        )
    });
    Ok(LogsReport {
        year: options.year,
        idle_gap_s: options.idle_gap_s,
        log_interval_s: options.log_interval_s,
        instances,
        cluster,
    })
}

// ---------------------------------------------------------------------------------------
// Parsing

/// The compiled patterns; built once per [`analyze`].
struct Patterns {
    ansi: Regex,
    header: Regex,
    stats: Regex,
    kv_fetch: Regex,
}

impl Patterns {
    fn new() -> Result<Patterns, regex::Error> {
        Ok(Patterns {
            // CSI sequences (colours, cursor moves): ESC [ parameters intermediates final.
            ansi: Regex::new(r"\x1b\[[0-?]*[ -/]*[@-~]")?,
            // vLLM's `_FORMAT`, "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
            // %(message)s" with `_DATE_FORMAT` "%m-%d %H:%M:%S" (`vllm/logger.py`), after
            // the `(APIServer pid=N) ` vLLM writes before every line of its processes;
            // V0 had no `[`.
            header: Regex::new(
                r"(?:\([A-Za-z_][\w.-]* pid=(?P<pid>\d+)\)\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<mo>\d{2})-(?P<d>\d{2}) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:[.,]\d+)?\s+\[?(?P<src>[^\]\s]+)\]\s?(?P<msg>.*)$",
            )?,
            stats: Regex::new(
                r"Avg prompt throughput: (?P<prompt>\d+(?:\.\d+)?) tokens/s, Avg generation throughput: (?P<gen>\d+(?:\.\d+)?) tokens/s, Running: (?P<running>\d+) reqs(?P<tail>.*)$",
            )?,
            kv_fetch: Regex::new(r"^KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting")?,
        })
    }
}

/// One stats line.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at: i64,
    pid: Option<u32>,
    prompt: f64,
    generation: f64,
    running: u32,
    waiting: u32,
    kv_usage: f64,
    preemptions: u64,
}

/// What a stats message holds besides its time.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stats {
    prompt: f64,
    generation: f64,
    running: u32,
    waiting: u32,
    kv_usage: f64,
    preemptions: u64,
}

/// One log, read.
#[derive(Debug, Default)]
struct ParsedLog {
    lines: usize,
    samples: Vec<Sample>,
    malformed: Vec<usize>,
    restarts: Vec<Restart>,
}

/// Places `MM-DD HH:MM:SS` on a timeline that starts in a given year and moves to the
/// next year when the time jumps backwards by more than [`ROLLOVER_S`].
struct Timeline {
    year: i64,
    latest: Option<i64>,
}

impl Timeline {
    fn place(&mut self, month: u32, day: u32, secs_of_day: i64) -> Option<i64> {
        let mut at = epoch_s(self.year, month, day, secs_of_day);
        if let (Some(latest), Some(t)) = (self.latest, at)
            && latest - t > ROLLOVER_S
        {
            self.year += 1;
            at = epoch_s(self.year, month, day, secs_of_day);
        }
        // A date that does not exist (02-29 in a common year) is not a time.
        let at = at?;
        self.latest = Some(self.latest.map_or(at, |l| l.max(at)));
        Some(at)
    }
}

/// Reads one log's lines: stats samples, malformed stats lines, restarts.
fn parse_log(text: &str, year: i32, patterns: &Patterns) -> ParsedLog {
    let mut log = ParsedLog::default();
    let mut timeline = Timeline {
        year: i64::from(year),
        latest: None,
    };
    // A start-up line seen after a sample: the time of the first one, until the next
    // sample confirms the restart.
    let mut pending_restart: Option<i64> = None;
    // The API server's pid on the latest stats line that named one.
    let mut last_pid: Option<u32> = None;
    for (index, raw) in text.lines().enumerate() {
        log.lines += 1;
        let line: Cow<'_, str> = if raw.contains('\x1b') {
            patterns.ansi.replace_all(raw, "")
        } else {
            Cow::Borrowed(raw)
        };
        let line = line.trim_end();
        let header = patterns.header.captures(line);
        let at = header.as_ref().and_then(|h| {
            let num = |name: &str| h.name(name).and_then(|m| m.as_str().parse::<u32>().ok());
            let (mo, d, hh, mi, s) = (num("mo")?, num("d")?, num("h")?, num("mi")?, num("s")?);
            if hh > 23 || mi > 59 || s > 60 {
                return None;
            }
            timeline.place(mo, d, i64::from(hh) * 3600 + i64::from(mi) * 60 + i64::from(s))
        });
        let message = header
            .as_ref()
            .and_then(|h| h.name("msg"))
            .map_or(line, |m| m.as_str());
        let source = header
            .as_ref()
            .and_then(|h| h.name("src"))
            .map_or("", |m| m.as_str());
        let pid = header
            .as_ref()
            .and_then(|h| h.name("pid"))
            .and_then(|m| m.as_str().parse::<u32>().ok());

        if is_stats_message(message, source) {
            match (at, parse_stats(message, patterns)) {
                (Some(at), Some(stats)) => {
                    let previous_pid = last_pid;
                    if let Some(started) = pending_restart.take() {
                        log.restarts.push(Restart {
                            at: LogTime(started),
                            pid_before: previous_pid,
                            pid_after: pid,
                        });
                    } else if let (Some(before), Some(after)) = (previous_pid, pid)
                        && before != after
                    {
                        log.restarts.push(Restart {
                            at: LogTime(at),
                            pid_before: Some(before),
                            pid_after: Some(after),
                        });
                    }
                    last_pid = pid.or(last_pid);
                    log.samples.push(Sample {
                        at,
                        pid,
                        prompt: stats.prompt,
                        generation: stats.generation,
                        running: stats.running,
                        waiting: stats.waiting,
                        kv_usage: stats.kv_usage,
                        preemptions: stats.preemptions,
                    });
                }
                _ => log.malformed.push(index + 1),
            }
        } else if let Some(at) = at
            && is_startup_message(message)
            && !log.samples.is_empty()
            && pending_restart.is_none()
        {
            pending_restart = Some(at);
        }
    }
    if let Some(started) = pending_restart {
        // It started again but logged nothing before the file ends.
        log.restarts.push(Restart {
            at: LogTime(started),
            pid_before: last_pid,
            pid_after: None,
        });
    }
    log
}

/// Whether a message is (or was meant to be) a periodic stats line: it names the prompt
/// throughput, or it is `loggers.py` starting `Engine NNN:` and was cut before that.
fn is_stats_message(message: &str, source: &str) -> bool {
    message.contains("Avg prompt throughput")
        || (source.starts_with("loggers.py")
            && (message.starts_with("Engine ") || message.contains(" Engines Aggregated")))
}

/// Lines vLLM's API server logs once per start: the non-default arguments (0.10 and
/// later, `vllm/entrypoints/utils.py`), its version (0.10.2) and the listening address.
fn is_startup_message(message: &str) -> bool {
    message.starts_with("non-default args:")
        || message.starts_with("vLLM API server version")
        || message.starts_with("Starting vLLM API server")
        || message.starts_with("Starting vLLM server on")
}

/// Parses a stats message completely, or not at all: every part after `Running` must be
/// a whole `Key: value`, a queue count and a KV cache usage must be among them, and a
/// known key must carry its known kind of value, so that a line cut anywhere is refused.
fn parse_stats(message: &str, patterns: &Patterns) -> Option<Stats> {
    let caps = patterns.stats.captures(message)?;
    let prompt = parse_rate(caps.name("prompt")?.as_str())?;
    let generation = parse_rate(caps.name("gen")?.as_str())?;
    let running = caps.name("running")?.as_str().parse::<u32>().ok()?;
    let tail = caps.name("tail")?.as_str();
    // V0 ends its message with a full stop.
    let mut rest = tail.strip_suffix('.').unwrap_or(tail);
    let mut waiting = None;
    let mut kv_usage = None;
    let mut preemptions = 0u64;
    while !rest.is_empty() {
        rest = rest.strip_prefix(", ")?;
        // The one part with commas inside (0.33 `KV fetch`).
        if let Some(m) = patterns.kv_fetch.find(rest) {
            rest = &rest[m.end()..];
            continue;
        }
        let (part, next) = match rest.find(", ") {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        rest = next;
        let (key, value) = part.split_once(": ")?;
        match key {
            "Waiting" | "Pending" => waiting = Some(parse_reqs(value)?),
            "Swapped" | "Deferred" | "Corrupted" => {
                parse_reqs(value)?;
            }
            "Preemptions" => preemptions = value.parse::<u64>().ok()?,
            "Prefix cache hit rate" | "External prefix cache hit rate" | "MM cache hit rate" => {
                parse_percent(value)?;
            }
            _ if key.ends_with(" KV cache usage") => {
                let usage = parse_percent(value)?;
                // V0 names the GPU first and the CPU swap space second.
                kv_usage.get_or_insert(usage);
            }
            // A part a later vLLM added: accepted if whole.
            _ if key.starts_with(|c: char| c.is_ascii_uppercase()) && !value.trim().is_empty() => {}
            _ => return None,
        }
    }
    Some(Stats {
        prompt,
        generation,
        running,
        waiting: waiting?,
        kv_usage: kv_usage?,
        preemptions,
    })
}

fn parse_rate(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

fn parse_reqs(value: &str) -> Option<u32> {
    value.strip_suffix(" reqs")?.parse().ok()
}

fn parse_percent(value: &str) -> Option<f64> {
    parse_rate(value.strip_suffix('%')?)
}

// ---------------------------------------------------------------------------------------
// Per instance

/// One instance's report and its per-minute maxima (minute index → tokens/s).
fn summarise(
    name: &str,
    log: &ParsedLog,
    options: &LogsOptions,
) -> Result<(InstanceReport, BTreeMap<i64, f64>), LogsError> {
    let samples = &log.samples;
    let (Some(first_sample), Some(last_sample)) = (samples.first(), samples.last()) else {
        return Err(LogsError::NoSamples {
            name: name.to_owned(),
            lines: log.lines,
            malformed: log.malformed.len(),
        });
    };
    let first = samples.iter().map(|s| s.at).min().unwrap_or(first_sample.at);
    let last = samples.iter().map(|s| s.at).max().unwrap_or(last_sample.at);

    let gap_limit = i64::from(options.idle_gap_s);
    let interval = i64::from(options.log_interval_s);
    let mut idle = IdleGaps {
        gaps: 0,
        idle_s: 0,
        longest_gap_s: 0,
    };
    for pair in samples.windows(2) {
        let gap = (pair[1].at - pair[0].at).max(0);
        idle.longest_gap_s = idle.longest_gap_s.max(gap);
        if gap > gap_limit {
            idle.gaps += 1;
            idle.idle_s += (gap - interval).max(0);
        }
    }

    // running → (samples, sum, max)
    let mut by_running: BTreeMap<u32, (usize, f64, f64)> = BTreeMap::new();
    let mut peak = first_sample;
    let mut minutes: BTreeMap<i64, f64> = BTreeMap::new();
    let (mut sum_prompt, mut sum_gen) = (0.0, 0.0);
    let (mut active, mut active_prompt, mut active_gen) = (0usize, 0.0, 0.0);
    for s in samples {
        let entry = by_running.entry(s.running).or_insert((0, 0.0, f64::MIN));
        entry.0 += 1;
        entry.1 += s.generation;
        entry.2 = entry.2.max(s.generation);
        if s.generation > peak.generation {
            peak = s;
        }
        let minute = minutes.entry(s.at.div_euclid(60)).or_insert(s.generation);
        *minute = minute.max(s.generation);
        sum_prompt += s.prompt;
        sum_gen += s.generation;
        if s.running > 0 || s.prompt > 0.0 || s.generation > 0.0 {
            active += 1;
            active_prompt += s.prompt;
            active_gen += s.generation;
        }
    }
    let curve = by_running
        .into_iter()
        .map(|(running, (n, sum, max))| {
            let mean = sum / n as f64;
            CurvePoint {
                running,
                samples: n,
                mean_generation_tok_s: mean,
                max_generation_tok_s: max,
                per_request_tok_s: (running > 0).then(|| mean / f64::from(running)),
            }
        })
        .collect();
    let mean_over_active = |sum: f64| if active == 0 { 0.0 } else { sum / active as f64 };

    let report = InstanceReport {
        name: name.to_owned(),
        lines: log.lines,
        samples: samples.len(),
        malformed_lines: log.malformed.len(),
        malformed_examples: log.malformed.iter().take(MALFORMED_EXAMPLES).copied().collect(),
        other_lines: log.lines - samples.len() - log.malformed.len(),
        first: LogTime(first),
        last: LogTime(last),
        span_s: last - first,
        idle,
        restarts: log.restarts.clone(),
        curve,
        peak: Peak {
            at: LogTime(peak.at),
            generation_tok_s: peak.generation,
            prompt_tok_s: peak.prompt,
            running: peak.running,
        },
        active_samples: active,
        mean_prompt_tok_s: mean_over_active(active_prompt),
        mean_generation_tok_s: mean_over_active(active_gen),
        prompt_generation_ratio: (sum_gen > 0.0).then(|| sum_prompt / sum_gen),
        max_kv_cache_usage_pct: samples.iter().map(|s| s.kv_usage).fold(0.0, f64::max),
        max_waiting: samples.iter().map(|s| s.waiting).max().unwrap_or(0),
        preemptions: samples.iter().map(|s| s.preemptions).sum(),
    };
    Ok((report, minutes))
}

// ---------------------------------------------------------------------------------------
// Cluster

fn cluster(names: Vec<String>, maps: &[BTreeMap<i64, f64>], options: &LogsOptions) -> ClusterReport {
    let all_minutes: BTreeSet<i64> = maps.iter().flat_map(|m| m.keys().copied()).collect();
    let mut any = Vec::with_capacity(all_minutes.len());
    let mut all = Vec::new();
    for minute in all_minutes {
        let contributions: Vec<f64> = maps
            .iter()
            .map(|m| m.get(&minute).copied().unwrap_or(0.0))
            .collect();
        let row = ClusterMinute {
            minute: LogTime(minute * 60),
            total_tok_s: contributions.iter().sum(),
            contributions,
        };
        if maps.iter().all(|m| m.contains_key(&minute)) {
            all.push(row.clone());
        }
        any.push(row);
    }
    ClusterReport {
        instances: names,
        threshold_tok_s: options.threshold_tok_s,
        all_active: summarise_minutes(all, options),
        any_active: summarise_minutes(any, options),
    }
}

fn summarise_minutes(mut minutes: Vec<ClusterMinute>, options: &LogsOptions) -> ClusterSummary {
    let totals: Vec<f64> = minutes.iter().map(|m| m.total_tok_s).collect();
    let count = minutes.len();
    // Largest first; `minutes` is in time order and the sort is stable, so ties keep it.
    minutes.sort_by(|a, b| b.total_tok_s.total_cmp(&a.total_tok_s));
    minutes.truncate(options.top_k);
    ClusterSummary {
        minutes: count,
        distribution: distribution(&totals),
        above_threshold: totals.iter().filter(|&&t| t > options.threshold_tok_s).count(),
        top: minutes,
    }
}

fn distribution(values: &[f64]) -> Option<Distribution> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(Distribution {
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        p50: percentile(&sorted, 50.0)?,
        p95: percentile(&sorted, 95.0)?,
        p99: percentile(&sorted, 99.0)?,
        max: *sorted.last()?,
    })
}

/// numpy's default (`method="linear"`): rank `p / 100 × (n − 1)` in the sorted values,
/// interpolated between its floor and ceiling.
/// numpy's linear percentile of sorted values (the one `sous bench` uses everywhere);
/// none for no values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| crate::bench::stats::percentile(sorted, p))
}

// ---------------------------------------------------------------------------------------
// Civil dates, with chrono.

/// Seconds since 1970-01-01 for a date and a second of the day; none for a date that does
/// not exist.
fn epoch_s(year: i64, month: u32, day: u32, secs_of_day: i64) -> Option<i64> {
    let date = chrono::NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp() + secs_of_day)
}

/// The date `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    use chrono::Datelike;
    let date = chrono::DateTime::from_timestamp(days.saturating_mul(86_400), 0)
        .map_or(chrono::NaiveDate::MIN, |t| t.date_naive());
    (i64::from(date.year()), date.month(), date.day())
}

// ---------------------------------------------------------------------------------------
// Rendering

impl LogsReport {
    /// The report as plain text: per instance its counts and curve, then the cluster.
    pub fn to_table(&self) -> String {
        let mut sections: Vec<String> = Vec::with_capacity(self.instances.len() + 1);
        for instance in &self.instances {
            let mut out = String::new();
            render_instance(&mut out, instance, self.idle_gap_s);
            sections.push(out);
        }
        if let Some(cluster) = &self.cluster {
            let mut out = String::new();
            render_cluster(&mut out, cluster);
            sections.push(out);
        }
        // A blank line between sections.
        sections.join("\n")
    }
}

fn render_instance(out: &mut String, i: &InstanceReport, idle_gap_s: u32) {
    out.push_str(&format!(
        "{}: {} samples from {} to {} ({})\n",
        i.name,
        i.samples,
        i.first,
        i.last,
        duration(i.span_s)
    ));
    out.push_str(&format!(
        "  lines: {} read, {} stats, {} malformed{}, {} other\n",
        i.lines,
        i.samples,
        i.malformed_lines,
        if i.malformed_examples.is_empty() {
            String::new()
        } else {
            let lines: Vec<String> = i.malformed_examples.iter().map(ToString::to_string).collect();
            format!(" (line {})", lines.join(", "))
        },
        i.other_lines
    ));
    out.push_str(&format!(
        "  idle: {} gaps over {idle_gap_s}s, {} idle in all, longest gap {}\n",
        i.idle.gaps,
        duration(i.idle.idle_s),
        duration(i.idle.longest_gap_s)
    ));
    if i.restarts.is_empty() {
        out.push_str("  restarts: none\n");
    } else {
        let list: Vec<String> = i
            .restarts
            .iter()
            .map(|r| match (r.pid_before, r.pid_after) {
                (Some(a), Some(b)) if a != b => format!("at {}, pid {a} -> {b}", r.at),
                _ => format!("at {}", r.at),
            })
            .collect();
        out.push_str(&format!("  restarts: {} ({})\n", list.len(), list.join("; ")));
    }
    let rows: Vec<Vec<String>> = i
        .curve
        .iter()
        .map(|p| {
            vec![
                p.running.to_string(),
                p.samples.to_string(),
                format!("{:.1}", p.mean_generation_tok_s),
                format!("{:.1}", p.max_generation_tok_s),
                p.per_request_tok_s
                    .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
            ]
        })
        .collect();
    table(
        out,
        "  ",
        &[
            "running",
            "samples",
            "mean gen tok/s",
            "max gen tok/s",
            "per request tok/s",
        ],
        &rows,
        false,
    );
    out.push_str(&format!(
        "  peak: {:.1} tok/s generation at {} with {} running\n",
        i.peak.generation_tok_s, i.peak.at, i.peak.running
    ));
    out.push_str(&format!(
        "  active samples: {}, mean prompt {:.1} tok/s, mean generation {:.1} tok/s\n",
        i.active_samples, i.mean_prompt_tok_s, i.mean_generation_tok_s
    ));
    out.push_str(&format!(
        "  prompt:generation {}; max KV cache usage {:.1}%, max waiting {}, preemptions {}\n",
        i.prompt_generation_ratio
            .map_or_else(|| "-".into(), |r| format!("{r:.1}:1")),
        i.max_kv_cache_usage_pct,
        i.max_waiting,
        i.preemptions
    ));
}

fn render_cluster(out: &mut String, c: &ClusterReport) {
    out.push_str(&format!(
        "cluster: {} instances, per minute the highest sample of each, summed (tok/s)\n",
        c.instances.len()
    ));
    let threshold = format!("> {}", c.threshold_tok_s);
    let summary_row = |label: &str, s: &ClusterSummary| {
        let mut row = vec![label.to_owned(), s.minutes.to_string()];
        match &s.distribution {
            Some(d) => row.extend([d.mean, d.p50, d.p95, d.p99, d.max].map(|v| format!("{v:.1}"))),
            None => row.extend(std::iter::repeat_n("-".to_owned(), 5)),
        }
        row.push(s.above_threshold.to_string());
        row
    };
    table(
        out,
        "  ",
        &[
            "minutes with",
            "count",
            "mean",
            "P50",
            "P95",
            "P99",
            "max",
            &threshold,
        ],
        &[
            summary_row("all active", &c.all_active),
            summary_row("any active", &c.any_active),
        ],
        true,
    );
    for (label, summary) in [("all instances", &c.all_active), ("any instance", &c.any_active)] {
        if summary.top.is_empty() {
            continue;
        }
        out.push_str(&format!("  largest minutes with {label} active:\n"));
        let mut header = vec!["minute", "total"];
        header.extend(c.instances.iter().map(String::as_str));
        let rows: Vec<Vec<String>> = summary
            .top
            .iter()
            .map(|m| {
                let mut row = vec![m.minute.minute_text(), format!("{:.1}", m.total_tok_s)];
                row.extend(m.contributions.iter().map(|v| format!("{v:.1}")));
                row
            })
            .collect();
        table(out, "    ", &header, &rows, true);
    }
}

/// Columns right-aligned to their widest cell, the first one left-aligned when it is text.
fn table(out: &mut String, indent: &str, header: &[&str], rows: &[Vec<String>], text_first: bool) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        out.push_str(indent);
        for (n, (cell, w)) in cells.zip(&widths).enumerate() {
            if n == 0 && text_first {
                out.push_str(&format!("{cell:<w$}"));
            } else if n == 0 {
                out.push_str(&format!("{cell:>w$}"));
            } else {
                out.push_str(&format!("  {cell:>w$}"));
            }
        }
        let trimmed = out.trim_end_matches(' ').len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

/// `45s`, `4m40s`, `1h02m`, `5d03h`.
fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vllm-logs/");
    /// `date -u -d 2026-09-06 +%s`.
    const SEP_6_2026: i64 = 1_788_652_800;
    /// `date -u -d 2026-01-01 +%s`.
    const JAN_1_2026: i64 = 1_767_225_600;

    /// 2026-09-06 at hh:mm:ss.
    fn sep6(h: i64, m: i64, s: i64) -> LogTime {
        LogTime(SEP_6_2026 + h * 3600 + m * 60 + s)
    }

    fn options() -> LogsOptions {
        LogsOptions {
            year: 2026,
            ..LogsOptions::default()
        }
    }

    fn fixture(name: &str) -> LogInput {
        LogInput::read(&Path::new(FIXTURES).join(name), None).expect("fixture")
    }

    fn fixtures() -> Vec<LogInput> {
        ["instance-0.log", "instance-1.log", "instance-2.log"]
            .map(fixture)
            .to_vec()
    }

    fn close(actual: f64, expected: f64) {
        assert!((actual - expected).abs() < 1e-9, "{actual} != {expected}");
    }

    /// (running, samples, mean, max, per request) for each curve point.
    fn curve(i: &InstanceReport) -> Vec<(u32, usize, f64, f64, Option<f64>)> {
        i.curve
            .iter()
            .map(|p| {
                (
                    p.running,
                    p.samples,
                    p.mean_generation_tok_s,
                    p.max_generation_tok_s,
                    p.per_request_tok_s,
                )
            })
            .collect()
    }

    fn check_curve(i: &InstanceReport, expected: &[(u32, usize, f64, f64, Option<f64>)]) {
        let actual = curve(i);
        assert_eq!(actual.len(), expected.len(), "{}: {actual:?}", i.name);
        for (a, e) in actual.iter().zip(expected) {
            assert_eq!((a.0, a.1), (e.0, e.1), "{}: {actual:?}", i.name);
            close(a.2, e.2);
            close(a.3, e.3);
            match (a.4, e.4) {
                (Some(a), Some(e)) => close(a, e),
                (a, e) => assert_eq!(a, e),
            }
        }
    }

    /// A 0.33 stats line with a given time, generation throughput and running count.
    fn line(time: &str, generation: f64, running: u32) -> String {
        format!(
            "(APIServer pid=7) INFO {time} [loggers.py:335] Engine 000: Avg prompt throughput: 10.0 \
             tokens/s, Avg generation throughput: {generation:.1} tokens/s, Running: {running} reqs, \
             Waiting: 0 reqs, GPU KV cache usage: 1.0%, Prefix cache hit rate: 50.0%"
        )
    }

    fn one(text: &str, year: i32) -> InstanceReport {
        let options = LogsOptions { year, ..options() };
        let mut report = analyze(&[LogInput::new("x", text)], &options).expect("analyze");
        report.instances.remove(0)
    }

    fn stats(message: &str) -> Option<Stats> {
        parse_stats(message, &Patterns::new().expect("patterns"))
    }

    #[test]
    fn civil_dates_match_date() {
        assert_eq!(epoch_s(1970, 1, 1, 0), Some(0));
        assert_eq!(epoch_s(1969, 12, 31, 0), Some(-86_400));
        // `date -u -d 2000-02-29 +%s` = 951782400.
        assert_eq!(epoch_s(2000, 2, 29, 0), Some(951_782_400));
        assert_eq!(epoch_s(2026, 1, 1, 0), Some(JAN_1_2026));
        assert_eq!(epoch_s(2026, 9, 6, 0), Some(SEP_6_2026));
        assert_eq!(civil_from_days(SEP_6_2026 / 86_400), (2026, 9, 6));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(epoch_s(2026, 2, 29, 0), None);
        assert_eq!(epoch_s(2100, 2, 29, 0), None);
        assert!(epoch_s(2024, 2, 29, 0).is_some());
        assert!(epoch_s(2000, 2, 29, 0).is_some());
        assert_eq!(epoch_s(2026, 9, 31, 0), None);
        assert_eq!(epoch_s(2026, 13, 1, 0), None);
        assert_eq!(sep6(10, 0, 5).to_string(), "2026-09-06 10:00:05");
        assert_eq!(
            serde_json::to_string(&sep6(23, 59, 59)).expect("json"),
            "\"2026-09-06T23:59:59\""
        );
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        // numpy.percentile([1, 2, 3, 4], [50, 95, 99]) = [2.5, 3.85, 3.97].
        let v = [1.0, 2.0, 3.0, 4.0];
        close(percentile(&v, 50.0).expect("p"), 2.5);
        close(percentile(&v, 95.0).expect("p"), 3.85);
        close(percentile(&v, 99.0).expect("p"), 3.97);
        // numpy.percentile([15, 20, 35, 40, 50], 40) = 29.0 (rank 1.6).
        close(
            percentile(&[15.0, 20.0, 35.0, 40.0, 50.0], 40.0).expect("p"),
            29.0,
        );
        close(percentile(&[7.0], 99.0).expect("p"), 7.0);
        assert_eq!(percentile(&[], 50.0), None);
        assert!(distribution(&[]).is_none());
    }

    #[test]
    fn fixture_lines_are_counted() {
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let counts: Vec<_> = report
            .instances
            .iter()
            .map(|i| {
                (
                    i.name.as_str(),
                    i.lines,
                    i.samples,
                    i.malformed_lines,
                    i.other_lines,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                ("instance-0", 32, 11, 0, 21),
                ("instance-1", 21, 9, 1, 11),
                ("instance-2", 23, 8, 1, 14),
            ]
        );
        // The 10:01:28 line cut after "Prefix cache hit ra", and the 10:00:22 one cut in
        // the generation throughput.
        assert_eq!(report.instances[1].malformed_examples, [15]);
        assert_eq!(report.instances[2].malformed_examples, [7]);
        // The malformed line's 31.9 % is not a sample.
        close(report.instances[1].max_kv_cache_usage_pct, 31.6);
    }

    #[test]
    fn fixture_curves_peaks_and_ratios() {
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let [i0, i1, i2] = &report.instances[..] else {
            panic!("three instances");
        };
        // instance-0: N=0 {18}; N=1 {80, 84, 88, 80} = 332/4; N=2 {160, 170, 150} = 480/3;
        // N=3 {240, 230} = 470/2; N=4 {300}.
        check_curve(
            i0,
            &[
                (0, 1, 18.0, 18.0, None),
                (1, 4, 83.0, 88.0, Some(83.0)),
                (2, 3, 160.0, 170.0, Some(80.0)),
                (3, 2, 235.0, 240.0, Some(235.0 / 3.0)),
                (4, 1, 300.0, 300.0, Some(75.0)),
            ],
        );
        // instance-1: N=1 {90, 85}; N=2 {170}; N=4 {330, 340}; N=6 {480, 470}; N=8 {600, 580}.
        check_curve(
            i1,
            &[
                (1, 2, 87.5, 90.0, Some(87.5)),
                (2, 1, 170.0, 170.0, Some(85.0)),
                (4, 2, 335.0, 340.0, Some(83.75)),
                (6, 2, 475.0, 480.0, Some(475.0 / 6.0)),
                (8, 2, 590.0, 600.0, Some(73.75)),
            ],
        );
        // instance-2: N=1 {85, 80}; N=2 {165, 160}; N=3 {250, 245}; N=4 {330, 320}.
        check_curve(
            i2,
            &[
                (1, 2, 82.5, 85.0, Some(82.5)),
                (2, 2, 162.5, 165.0, Some(81.25)),
                (3, 2, 247.5, 250.0, Some(82.5)),
                (4, 2, 325.0, 330.0, Some(81.25)),
            ],
        );

        let peaks: Vec<_> = [i0, i1, i2]
            .iter()
            .map(|i| {
                (
                    i.peak.at,
                    i.peak.generation_tok_s,
                    i.peak.running,
                    i.peak.prompt_tok_s,
                )
            })
            .collect();
        assert_eq!(
            peaks,
            [
                (sep6(10, 1, 5), 300.0, 4, 3000.0),
                (sep6(10, 1, 8), 600.0, 8, 1935.0),
                (sep6(10, 3, 20), 330.0, 4, 1000.0),
            ]
        );

        // Prompt sums 8000, 9435, 6540 over generation sums 1600, 3145, 1635.
        close(i0.prompt_generation_ratio.expect("ratio"), 5.0);
        close(i1.prompt_generation_ratio.expect("ratio"), 3.0);
        close(i2.prompt_generation_ratio.expect("ratio"), 4.0);
        // Every fixture sample is active.
        assert_eq!(
            [i0.active_samples, i1.active_samples, i2.active_samples],
            [11, 9, 8]
        );
        close(i0.mean_prompt_tok_s, 8000.0 / 11.0);
        close(i0.mean_generation_tok_s, 1600.0 / 11.0);
        close(i1.mean_prompt_tok_s, 9435.0 / 9.0);
        close(i1.mean_generation_tok_s, 3145.0 / 9.0);
        close(i2.mean_prompt_tok_s, 817.5);
        close(i2.mean_generation_tok_s, 204.375);
        assert_eq!([i0.max_waiting, i1.max_waiting, i2.max_waiting], [1, 2, 2]);
        assert_eq!([i0.preemptions, i1.preemptions, i2.preemptions], [0, 0, 1]);
    }

    #[test]
    fn fixture_spans_idle_gaps_and_restarts() {
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let [i0, i1, i2] = &report.instances[..] else {
            panic!("three instances");
        };
        assert_eq!(
            (i0.first, i0.last, i0.span_s),
            (sep6(10, 0, 5), sep6(10, 4, 45), 280)
        );
        assert_eq!(
            (i1.first, i1.last, i1.span_s),
            (sep6(10, 0, 8), sep6(10, 4, 28), 260)
        );
        assert_eq!(
            (i2.first, i2.last, i2.span_s),
            (sep6(10, 0, 2), sep6(10, 4, 40), 278)
        );
        // instance-0: gaps of 130 s and 70 s, idle 120 + 60.
        assert_eq!(
            (i0.idle.gaps, i0.idle.idle_s, i0.idle.longest_gap_s),
            (2, 180, 130)
        );
        // instance-1: 30, 50 and 130 s, idle 20 + 40 + 120.
        assert_eq!(
            (i1.idle.gaps, i1.idle.idle_s, i1.idle.longest_gap_s),
            (3, 180, 130)
        );
        // instance-2: 118 s across the crash, then 50 and 70 s: idle 108 + 40 + 60.
        assert_eq!(
            (i2.idle.gaps, i2.idle.idle_s, i2.idle.longest_gap_s),
            (3, 208, 118)
        );

        // Start-up lines before the first sample are not restarts.
        assert!(i0.restarts.is_empty());
        assert!(i1.restarts.is_empty());
        // instance-2 crashed; the new API server logged its arguments at 10:01:40.
        assert_eq!(i2.restarts.len(), 1);
        let r = i2.restarts[0];
        assert_eq!(
            (r.at, r.pid_before, r.pid_after),
            (sep6(10, 1, 40), Some(2000), Some(2100))
        );

        // A longer idle threshold leaves only the gaps above it.
        let long = LogsOptions {
            idle_gap_s: 60,
            ..options()
        };
        let report = analyze(&fixtures(), &long).expect("analyze");
        let idle: Vec<_> = report
            .instances
            .iter()
            .map(|i| (i.idle.gaps, i.idle.idle_s))
            .collect();
        assert_eq!(idle, [(2, 180), (1, 120), (2, 168)]);
    }

    #[test]
    fn fixture_cluster_per_minute() {
        // Per-minute maxima (instance-0, instance-1, instance-2) and sums:
        //   10:00  240  480  165  885  all three
        //   10:01  300  600    0  900
        //   10:02    0   85  250  335
        //   10:03  150    0  330  480
        //   10:04   80  340  160  580  all three
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let c = report.cluster.expect("cluster");
        assert_eq!(c.instances, ["instance-0", "instance-1", "instance-2"]);

        // All active: [580, 885]. Mean 732.5; P50 rank 0.5 → 732.5; P95 rank 0.95 →
        // 580 + 0.95 × 305 = 869.75; P99 rank 0.99 → 580 + 0.99 × 305 = 881.95.
        assert_eq!(c.all_active.minutes, 2);
        let d = c.all_active.distribution.expect("distribution");
        close(d.mean, 732.5);
        close(d.p50, 732.5);
        close(d.p95, 869.75);
        close(d.p99, 881.95);
        close(d.max, 885.0);
        // Any active: [335, 480, 580, 885, 900]. Mean 3180 / 5 = 636; P50 rank 2 → 580;
        // P95 rank 3.8 → 885 + 0.8 × 15 = 897; P99 rank 3.96 → 885 + 0.96 × 15 = 899.4.
        assert_eq!(c.any_active.minutes, 5);
        let d = c.any_active.distribution.expect("distribution");
        close(d.mean, 636.0);
        close(d.p50, 580.0);
        close(d.p95, 897.0);
        close(d.p99, 899.4);
        close(d.max, 900.0);
        // Nothing reaches the default 1000 tok/s.
        assert_eq!(
            (c.all_active.above_threshold, c.any_active.above_threshold),
            (0, 0)
        );

        let top: Vec<_> = c
            .any_active
            .top
            .iter()
            .map(|m| (m.minute, m.total_tok_s, m.contributions.clone()))
            .collect();
        assert_eq!(
            top,
            [
                (sep6(10, 1, 0), 900.0, vec![300.0, 600.0, 0.0]),
                (sep6(10, 0, 0), 885.0, vec![240.0, 480.0, 165.0]),
                (sep6(10, 4, 0), 580.0, vec![80.0, 340.0, 160.0]),
                (sep6(10, 3, 0), 480.0, vec![150.0, 0.0, 330.0]),
                (sep6(10, 2, 0), 335.0, vec![0.0, 85.0, 250.0]),
            ]
        );
        let all: Vec<_> = c
            .all_active
            .top
            .iter()
            .map(|m| (m.minute, m.total_tok_s))
            .collect();
        assert_eq!(all, [(sep6(10, 0, 0), 885.0), (sep6(10, 4, 0), 580.0)]);
    }

    #[test]
    fn threshold_and_top_k_are_options() {
        let options = LogsOptions {
            threshold_tok_s: 600.0,
            top_k: 2,
            ..options()
        };
        let c = analyze(&fixtures(), &options)
            .expect("analyze")
            .cluster
            .expect("cluster");
        // Above 600: 885 of the all-active minutes; 885 and 900 of all.
        assert_eq!(
            (c.all_active.above_threshold, c.any_active.above_threshold),
            (1, 2)
        );
        let top: Vec<_> = c.any_active.top.iter().map(|m| m.total_tok_s).collect();
        assert_eq!(top, [900.0, 885.0]);
        // Two instances: instance-0 and instance-2 share 10:00, 10:03 and 10:04.
        let two = [fixture("instance-0.log"), fixture("instance-2.log")];
        let c = analyze(&two, &options)
            .expect("analyze")
            .cluster
            .expect("cluster");
        let all: Vec<_> = c
            .all_active
            .top
            .iter()
            .map(|m| (m.minute, m.total_tok_s))
            .collect();
        assert_eq!(c.all_active.minutes, 3);
        // 240 + 165 = 405 at 10:00, 150 + 330 = 480 at 10:03, 80 + 160 = 240 at 10:04.
        assert_eq!(all, [(sep6(10, 3, 0), 480.0), (sep6(10, 0, 0), 405.0)]);
        // One input: no cluster.
        let one = analyze(&[fixture("instance-0.log")], &options).expect("analyze");
        assert!(one.cluster.is_none());
    }

    #[test]
    fn year_rolls_over_within_a_file() {
        let text = [
            line("12-31 23:59:45", 100.0, 1),
            line("12-31 23:59:55", 110.0, 1),
            // Another process's line a few seconds late is not a new year.
            "(EngineCore pid=8) INFO 12-31 23:59:50 [core.py:1] late".to_owned(),
            line("01-01 00:00:05", 120.0, 1),
            line("01-01 00:00:15", 130.0, 2),
        ]
        .join("\n");
        let i = one(&text, 2025);
        assert_eq!(i.first, LogTime(JAN_1_2026 - 15));
        assert_eq!(i.last, LogTime(JAN_1_2026 + 15));
        assert_eq!(i.last.to_string(), "2026-01-01 00:00:15");
        assert_eq!((i.span_s, i.idle.gaps), (30, 0));
        assert_eq!(i.peak.at, LogTime(JAN_1_2026 + 15));

        // Without the turn of the year, January would come before December.
        let text = [line("12-31 23:59:55", 1.0, 1), line("12-31 23:59:50", 1.0, 1)].join("\n");
        let i = one(&text, 2025);
        assert_eq!(
            (i.first, i.last),
            (LogTime(JAN_1_2026 - 10), LogTime(JAN_1_2026 - 5))
        );
    }

    #[test]
    fn prefixes_and_colours_are_stripped() {
        let text = [
            // `docker logs -t` with colours, including inside the message.
            "\x1b[36m2026-09-06T10:00:08.1Z\x1b[0m (APIServer pid=1) \x1b[32mINFO\x1b[0m 09-06 \
             10:00:08 [loggers.py:123] Engine 000: Avg prompt throughput: 5.0 tokens/s, Avg \
             generation throughput: 11.0 tokens/s, Running: \x1b[1m1\x1b[0m reqs, Waiting: 0 reqs, \
             GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%\x1b[0m\r"
                .to_owned(),
            // `kubectl logs --prefix`, no pid.
            format!(
                "[pod/titan-0/vllm] {}",
                line("09-06 10:00:18", 22.0, 2).replace("(APIServer pid=7) ", "")
            ),
            // `docker compose logs`.
            format!("vllm-1  | {}", line("09-06 10:00:28", 33.0, 3)),
            // journald.
            format!(
                "Sep 06 10:00:38 titan vllm[7]: {}",
                line("09-06 10:00:38", 44.0, 4)
            ),
        ]
        .join("\n");
        let i = one(&text, 2026);
        assert_eq!((i.samples, i.malformed_lines), (4, 0));
        let generation: Vec<_> = i
            .curve
            .iter()
            .map(|p| (p.running, p.max_generation_tok_s))
            .collect();
        assert_eq!(generation, [(1, 11.0), (2, 22.0), (3, 33.0), (4, 44.0)]);
        assert_eq!((i.first, i.last), (sep6(10, 0, 8), sep6(10, 0, 38)));
        // The pid went from 1 to none to 7: a restart, noticed when 7 shows (10:00:28).
        assert_eq!(i.restarts.len(), 1);
        assert_eq!(i.restarts[0].at, sep6(10, 0, 28));
    }

    #[test]
    fn every_version_of_the_line_parses() {
        // vLLM 0.32 on the CPU (`/work/shared/reference/samples/vllm-0.32-cpu-serve.log`).
        let s = stats(
            "Engine 000: Avg prompt throughput: 79.4 tokens/s, Avg generation throughput: 1.4 \
             tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache usage: 1.9%, Prefix cache \
             hit rate: 0.0%",
        )
        .expect("0.32");
        assert_eq!(
            (s.prompt, s.generation, s.running, s.waiting, s.kv_usage),
            (79.4, 1.4, 1, 0, 1.9)
        );
        // 0.33 with every optional part, XPU, aggregated over engines.
        let s = stats(
            "2 Engines Aggregated: Avg prompt throughput: 12000.5 tokens/s, Avg generation \
             throughput: 950.0 tokens/s, Running: 14 reqs, Waiting: 3 reqs, Deferred: 1 reqs, \
             KV fetch: 2 waiting to start, 1 in progress, 0 completed waiting, Preemptions: 4, \
             XPU KV cache usage: 88.2%, Prefix cache hit rate: 81.9%, Corrupted: 1 reqs, \
             External prefix cache hit rate: 10.0%, MM cache hit rate: 0.0%",
        )
        .expect("0.33");
        assert_eq!(
            (s.running, s.waiting, s.preemptions, s.kv_usage),
            (14, 3, 4, 88.2)
        );
        // V0 (`vllm/engine/metrics.py`), with and without the bracket before the file name.
        for header in [
            "INFO 05-10 17:20:55 metrics.py:334]",
            "INFO 05-10 17:20:55 [metrics.py:334]",
        ] {
            let text = format!(
                "{header} Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 25.3 \
                 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: \
                 0.4%, CPU KV cache usage: 0.0%."
            );
            let i = one(&text, 2024);
            assert_eq!((i.samples, i.max_waiting, i.max_kv_cache_usage_pct), (1, 2, 0.4));
            assert_eq!(i.first.to_string(), "2024-05-10 17:20:55");
        }
        // A part a later vLLM may add is accepted when whole.
        assert!(
            stats(
                "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 \
                 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, Spill: 3 \
                 blocks"
            )
            .is_some()
        );
    }

    #[test]
    fn a_cut_line_is_refused_or_read_right() {
        let full = "Engine 000: Avg prompt throughput: 179.4 tokens/s, Avg generation throughput: \
                    21.4 tokens/s, Running: 12 reqs, Waiting: 10 reqs, Deferred: 1 reqs, KV fetch: \
                    1 waiting to start, 0 in progress, 0 completed waiting, Preemptions: 13, GPU KV \
                    cache usage: 11.9%, Prefix cache hit rate: 30.5%";
        let whole = stats(full).expect("whole line");
        let mut accepted = Vec::new();
        for cut in 0..full.len() {
            if let Some(s) = stats(&full[..cut]) {
                // Only a cut between parts, after the KV cache usage, yields the same numbers.
                assert_eq!(s, whole, "cut at {cut}: {}", &full[..cut]);
                accepted.push(&full[cut - 5..cut]);
            }
        }
        assert_eq!(accepted, ["11.9%"]);
        // In a file, the cut lines are counted, not read.
        let text = [
            line("09-06 10:00:00", 50.0, 1),
            line("09-06 10:00:10", 60.0, 1)[..140].to_owned(),
            "(APIServer pid=7) INFO 09-06 10:00:20 [loggers.py:335] Engine 000: Avg".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:00:30 [loggers.py:335] Engine 000: Avg prompt throughput: x tokens/s".to_owned(),
            // No timestamp to place it by.
            "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%".to_owned(),
            // A date that does not exist.
            line("02-30 10:00:40", 70.0, 1),
            String::new(),
            "garbage \u{fffd}".to_owned(),
        ]
        .join("\n");
        let i = one(&text, 2026);
        assert_eq!((i.samples, i.malformed_lines, i.other_lines), (1, 5, 2));
        assert_eq!(i.malformed_examples, [2, 3, 4, 5, 6]);
    }

    #[test]
    fn startup_lines_mark_a_restart_when_the_pid_stays() {
        // In a container the API server is often pid 1 on every start.
        let text = [
            line("09-06 10:00:00", 50.0, 1),
            "(APIServer pid=7) INFO 09-06 10:05:00 [api_server.py:1896] vLLM API server version 0.10.2".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:05:00 [utils.py:328] non-default args: {}".to_owned(),
            "(APIServer pid=7) INFO 09-06 10:06:00 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000".to_owned(),
            line("09-06 10:06:30", 60.0, 1),
            "(APIServer pid=7) INFO 09-06 10:09:00 [utils.py:253] non-default args: {}".to_owned(),
        ]
        .join("\n");
        let i = one(&text, 2026);
        let restarts: Vec<_> = i
            .restarts
            .iter()
            .map(|r| (r.at, r.pid_before, r.pid_after))
            .collect();
        assert_eq!(
            restarts,
            [
                (sep6(10, 5, 0), Some(7), Some(7)),
                // Started again, and the file ends before it served.
                (sep6(10, 9, 0), Some(7), None),
            ]
        );
        // The 390 s without samples is idle all the same.
        assert_eq!((i.idle.gaps, i.idle.idle_s), (1, 380));
    }

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

    #[test]
    fn json_and_table() {
        let report = analyze(&fixtures(), &options()).expect("analyze");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["instances"][0]["first"], "2026-09-06T10:00:05");
        assert_eq!(
            json["instances"][0]["curve"][0]["per_request_tok_s"],
            serde_json::Value::Null
        );
        assert_eq!(
            json["cluster"]["any_active"]["top"][0]["minute"],
            "2026-09-06T10:01:00"
        );
        assert_eq!(json["cluster"]["all_active"]["distribution"]["p95"], 869.75);
        insta::assert_snapshot!(report.to_table(), @r"
        instance-0: 11 samples from 2026-09-06 10:00:05 to 2026-09-06 10:04:45 (4m40s)
          lines: 32 read, 11 stats, 0 malformed, 21 other
          idle: 2 gaps over 15s, 3m00s idle in all, longest gap 2m10s
          restarts: none
          running  samples  mean gen tok/s  max gen tok/s  per request tok/s
                0        1            18.0           18.0                  -
                1        4            83.0           88.0               83.0
                2        3           160.0          170.0               80.0
                3        2           235.0          240.0               78.3
                4        1           300.0          300.0               75.0
          peak: 300.0 tok/s generation at 2026-09-06 10:01:05 with 4 running
          active samples: 11, mean prompt 727.3 tok/s, mean generation 145.5 tok/s
          prompt:generation 5.0:1; max KV cache usage 11.8%, max waiting 1, preemptions 0

        instance-1: 9 samples from 2026-09-06 10:00:08 to 2026-09-06 10:04:28 (4m20s)
          lines: 21 read, 9 stats, 1 malformed (line 15), 11 other
          idle: 3 gaps over 15s, 3m00s idle in all, longest gap 2m10s
          restarts: none
          running  samples  mean gen tok/s  max gen tok/s  per request tok/s
                1        2            87.5           90.0               87.5
                2        1           170.0          170.0               85.0
                4        2           335.0          340.0               83.8
                6        2           475.0          480.0               79.2
                8        2           590.0          600.0               73.8
          peak: 600.0 tok/s generation at 2026-09-06 10:01:08 with 8 running
          active samples: 9, mean prompt 1048.3 tok/s, mean generation 349.4 tok/s
          prompt:generation 3.0:1; max KV cache usage 31.6%, max waiting 2, preemptions 0

        instance-2: 8 samples from 2026-09-06 10:00:02 to 2026-09-06 10:04:40 (4m38s)
          lines: 23 read, 8 stats, 1 malformed (line 7), 14 other
          idle: 3 gaps over 15s, 3m28s idle in all, longest gap 1m58s
          restarts: 1 (at 2026-09-06 10:01:40, pid 2000 -> 2100)
          running  samples  mean gen tok/s  max gen tok/s  per request tok/s
                1        2            82.5           85.0               82.5
                2        2           162.5          165.0               81.2
                3        2           247.5          250.0               82.5
                4        2           325.0          330.0               81.2
          peak: 330.0 tok/s generation at 2026-09-06 10:03:20 with 4 running
          active samples: 8, mean prompt 817.5 tok/s, mean generation 204.4 tok/s
          prompt:generation 4.0:1; max KV cache usage 35.6%, max waiting 2, preemptions 1

        cluster: 3 instances, per minute the highest sample of each, summed (tok/s)
          minutes with  count   mean    P50    P95    P99    max  > 1000
          all active        2  732.5  732.5  869.8  882.0  885.0       0
          any active        5  636.0  580.0  897.0  899.4  900.0       0
          largest minutes with all instances active:
            minute            total  instance-0  instance-1  instance-2
            2026-09-06 10:00  885.0       240.0       480.0       165.0
            2026-09-06 10:04  580.0        80.0       340.0       160.0
          largest minutes with any instance active:
            minute            total  instance-0  instance-1  instance-2
            2026-09-06 10:01  900.0       300.0       600.0         0.0
            2026-09-06 10:00  885.0       240.0       480.0       165.0
            2026-09-06 10:04  580.0        80.0       340.0       160.0
            2026-09-06 10:03  480.0       150.0         0.0       330.0
            2026-09-06 10:02  335.0         0.0        85.0       250.0
        ");
    }
}

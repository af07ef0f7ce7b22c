//! The figures `sous bench logs` reports, in the shape of its JSON document. Not here:
//! computing them ([`super::analyze`]) or the terminal text ([`super::render`]).

use serde::Serialize;

use super::LogTime;

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

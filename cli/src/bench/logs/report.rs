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
    /// The window asked for and how it was placed.
    pub window: WindowReport,
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
    /// Speculative-decoding lines read.
    pub spec_lines: usize,
    /// The part of this log the figures come from.
    pub window: InstanceWindow,
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
    /// KV cache usage over the samples, percent.
    pub kv_cache_usage_pct: Spread,
    /// The most requests waiting at once.
    pub max_waiting: u32,
    /// Requests waiting, mean over the samples.
    pub mean_waiting: f64,
    /// Preemptions summed over the samples (vLLM logs those of each interval, when
    /// there were any).
    pub preemptions: u64,
    /// The prefix-cache hit rate as logged, percent: vLLM's rate over its most recent
    /// 1000 requests at each line (`CachingMetrics`, `vllm/v1/metrics/stats.py`); none
    /// when no line in the window carries it.
    pub prefix_cache_hit_rate_pct: Option<LoggedRate>,
    /// The external (KV connector) prefix-cache hit rate as logged, percent.
    pub external_prefix_cache_hit_rate_pct: Option<LoggedRate>,
    /// Speculative decoding over the window; none without such lines.
    pub spec_decode: Option<SpecDecode>,
}

/// Where one log's figures come from.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceWindow {
    /// The first time counted (none: from the start of the log).
    pub since: Option<LogTime>,
    /// The first time not counted (none: to its end).
    pub until: Option<LogTime>,
    /// The restart the window starts after, with `--after-restart`.
    pub after_restart: Option<LogTime>,
    /// Stats and speculative-decoding lines outside the window, not counted.
    pub lines_outside: usize,
}

/// `from A to B`, `from A`, `before B` or `the whole log`.
pub(super) fn window_text(since: Option<LogTime>, until: Option<LogTime>) -> String {
    match (since, until) {
        (Some(s), Some(u)) => format!("from {s} to {u}"),
        (Some(s), None) => format!("from {s}"),
        (None, Some(u)) => format!("before {u}"),
        (None, None) => "the whole log".into(),
    }
}

/// The window asked for.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    /// `--since` as placed; none when not given.
    pub since: Option<LogTime>,
    /// `--until` as placed; none when not given.
    pub until: Option<LogTime>,
    /// What relative times count back from: the latest sample of all the logs.
    pub end_of_logs: LogTime,
    /// `--after-restart`: `last`, or the ordinal of the restart in each log.
    pub after_restart: Option<String>,
}

/// Mean, spread and percentiles of some values; every figure is 0 without values.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// How many values.
    pub samples: usize,
    /// The smallest.
    pub min: f64,
    /// 5th percentile (linear interpolation).
    pub p5: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Mean.
    pub mean: f64,
    /// The largest.
    pub max: f64,
}

/// A rate vLLM logs as it stands at each line.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LoggedRate {
    /// The last value in the window: the rate as it stood at the end.
    pub last: f64,
    /// Over the lines with requests running or tokens processed.
    pub active: Spread,
}

/// Speculative decoding over a window, vLLM's definitions applied to the summed counts
/// (`vllm/v1/spec_decode/metrics.py`).
#[derive(Debug, Clone, Serialize)]
pub struct SpecDecode {
    /// Lines in the window.
    pub lines: usize,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Draft tokens proposed.
    pub drafted_tokens: u64,
    /// Drafts, derived from each line (exact for drafters of a fixed length).
    pub drafts: f64,
    /// `accepted / drafted`, percent.
    pub acceptance_rate_pct: Option<f64>,
    /// `1 + accepted / drafts`: tokens per verification step, the bonus token counted.
    pub mean_acceptance_length: Option<f64>,
    /// Tokens accepted at each draft position per draft (V1 lines only).
    pub per_position_acceptance: Vec<f64>,
    /// The acceptance rate of each line that drafted, percent.
    pub per_line_acceptance_rate_pct: Spread,
    /// The mean acceptance length of each line that drafted.
    pub per_line_mean_acceptance_length: Spread,
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
    /// Their generation throughput, tokens/s.
    pub generation_tok_s: Spread,
    /// Their mean prompt throughput, tokens/s.
    pub mean_prompt_tok_s: f64,
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
    /// Every minute's total in time order, tokens/s (for the chart; not in the JSON).
    #[serde(skip)]
    pub totals: Vec<f64>,
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

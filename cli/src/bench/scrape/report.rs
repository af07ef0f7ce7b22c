//! The figures of a window as `sous bench scrape` reports them (the JSON document's
//! shape). Not here: computing them ([`super::analyze`]) or the terminal text
//! ([`super::render`]).

use serde::Serialize;

/// One bucket of a histogram's increase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    /// The upper bound as the exposition writes it (`+Inf` for the last).
    pub le: String,
    /// Observations at or below it during the window (cumulative).
    pub count: f64,
}

/// A latency histogram over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// `ttft`, `itl`, `tpot`, `e2e` or `queue`.
    pub name: &'static str,
    /// The metric, without `_bucket`.
    pub metric: String,
    /// Observations (Δ`_count`).
    pub count: f64,
    /// Their sum in seconds (Δ`_sum`).
    pub sum_s: f64,
    /// Δsum / Δcount.
    pub mean_ms: Option<f64>,
    /// Bucket-interpolated median.
    pub p50_ms: Option<f64>,
    /// Bucket-interpolated 90th percentile.
    pub p90_ms: Option<f64>,
    /// Bucket-interpolated 95th percentile.
    pub p95_ms: Option<f64>,
    /// Bucket-interpolated 99th percentile.
    pub p99_ms: Option<f64>,
    /// The percentiles that fell in the `+Inf` bucket: they are the largest finite
    /// bound, and the true values are above it.
    pub beyond_last_bucket: Vec<&'static str>,
    /// The increase of every bucket, summed over the other labels and the URLs.
    pub buckets: Vec<Bucket>,
    #[serde(skip)]
    pub(super) label: &'static str,
}

impl Latency {
    /// A histogram's figures before its percentiles: the buckets (`le` text, increase)
    /// in bound order, those whose `le` is not a number left out. Also returns the
    /// `(bound, increase)` pairs the percentiles are read from.
    pub(super) fn from_buckets(
        name: &'static str,
        label: &'static str,
        metric: &str,
        (count, sum_s): (f64, f64),
        by_le: impl IntoIterator<Item = (String, f64)>,
    ) -> (Latency, Vec<(f64, f64)>) {
        let mut parsed: Vec<(f64, String, f64)> = by_le
            .into_iter()
            .filter_map(|(le, n)| {
                let bound = match le.as_str() {
                    "+Inf" | "Inf" | "inf" => f64::INFINITY,
                    text => text.parse().ok()?,
                };
                Some((bound, le, n))
            })
            .collect();
        parsed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let pairs = parsed.iter().map(|(b, _, n)| (*b, *n)).collect();
        let latency = Latency {
            name,
            metric: metric.to_owned(),
            count,
            sum_s,
            mean_ms: (count > 0.0).then(|| sum_s / count * 1000.0),
            p50_ms: None,
            p90_ms: None,
            p95_ms: None,
            p99_ms: None,
            beyond_last_bucket: Vec::new(),
            buckets: parsed
                .into_iter()
                .map(|(_, le, count)| Bucket { le, count })
                .collect(),
            label,
        };
        (latency, pairs)
    }

    /// Sets the percentile `key` (`p50`, `p90`, `p95`, `p99`), noting when its rank fell
    /// in the `+Inf` bucket.
    pub(super) fn set_percentile(&mut self, key: &'static str, ms: Option<f64>, beyond_last_bucket: bool) {
        if beyond_last_bucket {
            self.beyond_last_bucket.push(key);
        }
        match key {
            "p50" => self.p50_ms = ms,
            "p90" => self.p90_ms = ms,
            "p95" => self.p95_ms = ms,
            _ => self.p99_ms = ms,
        }
    }

    pub(super) fn percentile(&self, key: &str) -> Option<f64> {
        match key {
            "p50" => self.p50_ms,
            "p90" => self.p90_ms,
            "p95" => self.p95_ms,
            _ => self.p99_ms,
        }
    }
}

/// Counter increases over the window and their rates; absent when no scrape has the
/// counter.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Tokens generated.
    pub generation_tokens: Option<f64>,
    /// Per second of the window.
    pub generation_tokens_per_s: Option<f64>,
    /// Prompt tokens (cached ones included).
    pub prompt_tokens: Option<f64>,
    /// Per second of the window.
    pub prompt_tokens_per_s: Option<f64>,
    /// Requests finished.
    pub requests_completed: Option<f64>,
    /// Per second of the window.
    pub requests_per_s: Option<f64>,
    /// Prompt tokens found in the prefix cache (TensorRT-LLM: blocks reused).
    pub prefix_cache_hits: Option<f64>,
    /// Prompt tokens looked up (TensorRT-LLM: blocks reused + missed).
    pub prefix_cache_queries: Option<f64>,
    /// hits / queries.
    pub prefix_cache_hit_rate: Option<f64>,
    /// Requests preempted.
    pub preemptions: Option<f64>,
    /// Drafts proposed (vLLM: one per request per step that drafted).
    pub spec_decode_drafts: Option<f64>,
    /// Draft tokens proposed.
    pub spec_decode_draft_tokens: Option<f64>,
    /// Of those, accepted.
    pub spec_decode_accepted_tokens: Option<f64>,
    /// accepted / draft tokens.
    pub spec_decode_acceptance_rate: Option<f64>,
    /// 1 + accepted / drafts.
    pub spec_decode_acceptance_length: Option<f64>,
    /// Accepted at each draft position (from the first) / drafts; empty when the engine
    /// does not count per position or nothing was drafted.
    pub spec_decode_per_position_acceptance_rates: Vec<f64>,
}

/// A gauge over the scrapes, per instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gauge {
    /// `running_requests`, `waiting_requests`, `kv_cache_usage`, ...
    pub name: &'static str,
    /// The metrics read.
    pub metrics: Vec<String>,
    /// The largest value of any instance at any scrape.
    pub max: f64,
    /// The mean over every instance's scrapes.
    pub mean: f64,
    /// Values averaged.
    pub samples: usize,
    #[serde(skip)]
    pub(super) label: &'static str,
}

/// A counter seen going down: the server restarted between two scrapes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reset {
    /// The URL.
    pub url: String,
    /// The first scrape after the restart, from 1.
    pub scrape: usize,
    /// When it was taken, seconds into the window.
    pub at_s: f64,
}

/// The figures of a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// How the percentiles were computed: [`super::PERCENTILE_METHOD`].
    pub percentile_method: &'static str,
    /// The URLs scraped.
    pub urls: Vec<String>,
    /// Whose metric names were found: `vllm`, `sglang`, `trtllm`.
    pub families: Vec<&'static str>,
    /// Scrapes scheduled per URL.
    pub scrapes: usize,
    /// Scrapes that failed and were skipped, over all URLs.
    pub failed_scrapes: usize,
    /// Seconds from the first scrape to the last.
    pub window_s: f64,
    /// The latency histograms found.
    pub latency: Vec<Latency>,
    /// Counter increases and rates.
    pub counters: Counters,
    /// Gauges over the scrapes.
    pub gauges: Vec<Gauge>,
    /// Restarts seen; increases span them.
    pub counter_resets: Vec<Reset>,
}

/// The figures of one instance, or of all of them summed, over a window Prometheus
/// stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// The `instance` label (empty for series without one); `None` for every instance
    /// summed.
    pub instance: Option<String>,
    /// The latency histograms found, as [`Report::latency`]; `count` and `sum_s` are
    /// `increase()`s, so extrapolated like the counters.
    pub latency: Vec<Latency>,
    /// Counter increases and rates, as [`Report::counters`].
    pub counters: Counters,
}

/// The figures of a past window, computed by a Prometheus server
/// (`sous bench scrape --prometheus`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrometheusReport {
    /// `prometheus`.
    pub source: &'static str,
    /// How the percentiles were computed: [`super::PROMETHEUS_PERCENTILE_METHOD`].
    pub percentile_method: &'static str,
    /// How the counts were computed: [`super::PROMETHEUS_INCREASE_METHOD`].
    pub increase_method: &'static str,
    /// The Prometheus server asked.
    pub prometheus: String,
    /// `--selector` as given (its matchers went into every series selector).
    pub selector: Option<String>,
    /// The window's first second, RFC 3339 (UTC).
    pub start: String,
    /// The window's end, RFC 3339 (UTC): every query's evaluation time.
    pub end: String,
    /// Its length in seconds: every range selector's, and the rates' denominator.
    pub window_s: f64,
    /// Whose metric names were found: `vllm`, `sglang`, `trtllm`.
    pub families: Vec<&'static str>,
    /// Every instance summed (by Prometheus: `sum by (le)`, `sum`).
    pub total: Figures,
    /// Each instance (`sum by (le, instance)`, `sum by (instance)`), by name.
    pub instances: Vec<Figures>,
    /// The PromQL queries evaluated.
    pub queries: usize,
}

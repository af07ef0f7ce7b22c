//! `sous bench scrape`: passive figures of a production server from the scrapes of its
//! Prometheus `/metrics` over a window, with no request of ours. Given the scrapes of
//! each URL (taking them is the command's job), this computes the increase of every
//! counter and histogram between the first and the last scrape, the rates over the
//! window, and the peak and mean of the gauges. Metric names per engine from
//! shared/reference/engines.md §3.1 (vLLM), §7 (SGLang) and §8 (TensorRT-LLM); the
//! exposition is parsed by [`super::prom`].
//!
//! Latency percentiles come from histogram buckets, so they are estimates: they are
//! computed exactly as Prometheus's `histogram_quantile` computes them
//! (`bucketQuantile` in prometheus `promql/quantile.go`): rank = q × count, the first
//! bucket whose cumulative count reaches the rank, and linear interpolation between
//! that bucket's lower bound (the previous `le`, 0 for the first) and its `le`; a rank
//! in the `+Inf` bucket gives the largest finite bound, which the report flags.
//!
//! Increases treat a counter that went down as a restart, as Prometheus's `increase()`
//! does (`promql/functions.go`): the pre-reset delta plus the value after the reset.
//! Unlike `increase()`, nothing is extrapolated to the window's edges: the figures are
//! those between the first and the last scrape.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::prom::Scrape;

/// What the report says about how its percentiles were computed.
pub const PERCENTILE_METHOD: &str = "prometheus histogram_quantile (linear within buckets)";

/// The quantiles reported for each histogram, with their JSON names.
const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")];

/// Why a window cannot be analysed or a flag read.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// A duration is not `N` followed by `ms`, `s`, `m` or `h` (repeated, e.g. `1m30s`).
    #[error("`{0}` is not a duration (write e.g. `30s`, `10m`, `1h` or `1m30s`)")]
    Duration(String),
    /// A duration of zero where a positive one is needed.
    #[error("a duration must be longer than zero")]
    ZeroDuration,
    /// No URL has a single scrape.
    #[error("no scrape to analyse")]
    NoScrapes,
}

/// Reads `30s`, `10m`, `1h`, `500ms` or a sequence of those (`1h30m`), with `humantime`.
pub fn parse_duration(text: &str) -> Result<Duration, ScrapeError> {
    let total = humantime::parse_duration(text.trim()).map_err(|_| ScrapeError::Duration(text.to_owned()))?;
    if total.is_zero() {
        return Err(ScrapeError::ZeroDuration);
    }
    Ok(total)
}

/// The URL to scrape for a server's base URL: `/metrics` appended unless it is there.
pub fn metrics_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/metrics") {
        base.to_owned()
    } else {
        format!("{base}/metrics")
    }
}

/// When to scrape, from the start: now, then every `interval` before `window` has
/// passed, and once more at `window`.
pub fn schedule(window: Duration, interval: Duration) -> Vec<Duration> {
    let mut times = vec![Duration::ZERO];
    if interval.is_zero() {
        times.push(window);
        return times;
    }
    let mut at = interval;
    while at < window {
        times.push(at);
        at += interval;
    }
    times.push(window);
    times
}

/// The engine whose naming a metric follows.
fn family(name: &str) -> Option<&'static str> {
    if name.starts_with("vllm:") {
        Some("vllm")
    } else if name.starts_with("sglang:") {
        Some("sglang")
    } else if name.starts_with("trtllm_") {
        Some("trtllm")
    } else {
        None
    }
}

/// The engines whose metrics `scrape` holds (empty: not an inference server's metrics).
pub fn families(scrape: &Scrape) -> Vec<&'static str> {
    let set: BTreeSet<&'static str> = scrape.samples.iter().filter_map(|s| family(&s.name)).collect();
    set.into_iter().collect()
}

/// One scrape that succeeded.
#[derive(Debug, Clone)]
pub struct Taken {
    /// Which round of the schedule, from 0.
    pub round: usize,
    /// Seconds since the first round began.
    pub at_s: f64,
    /// What `/metrics` said.
    pub scrape: Scrape,
}

/// The scrapes of one server, in order; the rounds it failed are absent.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The URL scraped.
    pub url: String,
    /// Its scrapes.
    pub taken: Vec<Taken>,
}

/// A metric under its engines' names: one group per engine, each the names it has had,
/// newest first (the first of a group that any scrape holds is used).
type Names = &'static [&'static [&'static str]];

/// The latency histograms: the report's name, the table's and the metrics.
const HISTOGRAMS: &[(&str, &str, Names)] = &[
    (
        "ttft",
        "TTFT",
        &[
            &["vllm:time_to_first_token_seconds"],
            &["sglang:time_to_first_token_seconds"],
            &["trtllm_time_to_first_token_seconds"],
        ],
    ),
    (
        "itl",
        "ITL",
        &[
            // Renamed in vLLM 0.11 (engines.md §3.1).
            &[
                "vllm:inter_token_latency_seconds",
                "vllm:time_per_output_token_seconds",
            ],
            &["sglang:inter_token_latency_seconds"],
        ],
    ),
    (
        "tpot",
        "TPOT",
        &[
            &["vllm:request_time_per_output_token_seconds"],
            &["sglang:request_time_per_output_token_seconds"],
            // TensorRT-LLM's is observed once per request (`tensorrt_llm/metrics/collector.py`).
            &["trtllm_time_per_output_token_seconds"],
        ],
    ),
    (
        "e2e",
        "E2E",
        &[
            &["vllm:e2e_request_latency_seconds"],
            &["sglang:e2e_request_latency_seconds"],
            &["trtllm_e2e_request_latency_seconds"],
        ],
    ),
    (
        "queue",
        "queue",
        &[
            &["vllm:request_queue_time_seconds"],
            &["sglang:queue_time_seconds"],
            &["trtllm_request_queue_time_seconds"],
        ],
    ),
];

const GENERATION_TOKENS: Names = &[
    &["vllm:generation_tokens_total"],
    &["sglang:generation_tokens_total"],
    &["trtllm_generation_tokens_total"],
];
const PROMPT_TOKENS: Names = &[
    &["vllm:prompt_tokens_total"],
    &["sglang:prompt_tokens_total"],
    &["trtllm_prompt_tokens_total"],
];
const REQUESTS: Names = &[
    &["vllm:request_success_total"],
    // Counted when a request finishes (`sglang/srt/observability/metrics_collector.py`).
    &["sglang:num_requests_total"],
    &["trtllm_request_success_total"],
];
// SGLang counts cached prompt tokens against all prompt tokens; TensorRT-LLM counts
// blocks reused against reused + missed.
const PREFIX_HITS: Names = &[
    &["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"],
    &["sglang:cached_tokens_total"],
    &["trtllm_kv_cache_reused_blocks_total"],
];
const PREFIX_QUERIES: Names = &[
    &[
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ],
    &["sglang:prompt_tokens_total"],
    &["trtllm_kv_cache_reused_blocks_total"],
    &["trtllm_kv_cache_missed_blocks_total"],
];
const PREEMPTIONS: Names = &[&["vllm:num_preemptions_total"]];
const DRAFT_TOKENS: Names = &[
    &["vllm:spec_decode_num_draft_tokens_total"],
    &["trtllm_spec_decode_drafted_tokens_total"],
];
const ACCEPTED_TOKENS: Names = &[
    &["vllm:spec_decode_num_accepted_tokens_total"],
    &["trtllm_spec_decode_accepted_tokens_total"],
];
const DRAFTS: Names = &[&["vllm:spec_decode_num_drafts_total"]];

/// How a gauge's series within one scrape combine into the instance's value.
#[derive(Clone, Copy)]
enum Combine {
    /// Counts of data-parallel engines add up.
    Sum,
    /// Fractions: the fullest engine.
    Max,
}

/// The gauges: the report's name, the table's, how series combine, and the metrics.
const GAUGES: &[(&str, &str, Combine, Names)] = &[
    (
        "running_requests",
        "running requests",
        Combine::Sum,
        &[
            &["vllm:num_requests_running"],
            &["sglang:num_running_reqs"],
            &["trtllm_num_requests_running"],
        ],
    ),
    (
        "waiting_requests",
        "waiting requests",
        Combine::Sum,
        &[
            &["vllm:num_requests_waiting"],
            &["sglang:num_queue_reqs"],
            &["trtllm_num_requests_waiting"],
        ],
    ),
    (
        "kv_cache_usage",
        "KV-cache usage",
        Combine::Max,
        &[
            &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            &["sglang:token_usage"],
            &["trtllm_kv_cache_utilization"],
        ],
    ),
    // SGLang's speculative-decoding figures are gauges over its last log interval.
    (
        "spec_accept_rate",
        "spec acceptance rate",
        Combine::Max,
        &[&["sglang:spec_accept_rate"]],
    ),
    (
        "spec_accept_length",
        "spec acceptance length",
        Combine::Max,
        &[
            &["sglang:spec_accept_length"],
            &["trtllm_spec_decode_acceptance_length"],
        ],
    ),
];

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
    label: &'static str,
}

impl Latency {
    fn percentile(&self, key: &str) -> Option<f64> {
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
    /// Draft tokens proposed.
    pub spec_decode_draft_tokens: Option<f64>,
    /// Of those, accepted.
    pub spec_decode_accepted_tokens: Option<f64>,
    /// accepted / draft tokens.
    pub spec_decode_acceptance_rate: Option<f64>,
    /// 1 + accepted / drafts.
    pub spec_decode_acceptance_length: Option<f64>,
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
    label: &'static str,
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
    /// How the percentiles were computed: [`PERCENTILE_METHOD`].
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

/// A quantile estimated from buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    /// The estimate, in the histogram's unit.
    pub value: f64,
    /// It fell in the `+Inf` bucket: `value` is the largest finite bound.
    pub beyond_last_bucket: bool,
}

/// Prometheus's `bucketQuantile` (`promql/quantile.go`) over `(le, cumulative count)`
/// pairs: `None` where it returns NaN (no observations, no `+Inf` bucket, fewer than two
/// buckets, q outside 0..=1).
pub fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<Quantile> {
    if !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut sorted = buckets.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    if !sorted.last().is_some_and(|b| b.0 == f64::INFINITY) {
        return None;
    }
    // coalesceBuckets: equal bounds (`0.1` and `0.10`) add up.
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for (le, count) in sorted {
        match merged.last_mut() {
            Some(last) if last.0 == le => last.1 += count,
            _ => merged.push((le, count)),
        }
    }
    // correctPrecisionErrors (tolerance 1e-12), then ensureMonotonic.
    let mut prev = merged[0].1;
    for b in merged.iter_mut().skip(1) {
        let delta = (b.1 - prev).abs();
        if delta == 0.0 {
            continue;
        }
        if delta / b.1 <= 1e-12 {
            b.1 = prev;
        } else {
            prev = b.1;
        }
    }
    let mut max = merged[0].1;
    for b in merged.iter_mut().skip(1) {
        if b.1 > max {
            max = b.1;
        } else {
            b.1 = max;
        }
    }
    let n = merged.len();
    if n < 2 {
        return None;
    }
    let observations = merged[n - 1].1;
    if observations == 0.0 {
        return None;
    }
    let rank = q * observations;
    // sort.Search over all but the +Inf bucket.
    let b = merged[..n - 1].partition_point(|b| b.1 < rank);
    if b == n - 1 {
        return Some(Quantile {
            value: merged[n - 2].0,
            beyond_last_bucket: true,
        });
    }
    if b == 0 && merged[0].0 <= 0.0 {
        return Some(Quantile {
            value: merged[0].0,
            beyond_last_bucket: false,
        });
    }
    let (start, end) = (if b > 0 { merged[b - 1].0 } else { 0.0 }, merged[b].0);
    let (below, count) = if b > 0 {
        (merged[b - 1].1, merged[b].1 - merged[b - 1].1)
    } else {
        (0.0, merged[b].1)
    };
    Some(Quantile {
        value: start + (end - start) * ((rank - below) / count),
        beyond_last_bucket: false,
    })
}

/// The per-series increase of `name` over an instance's scrapes, summed per value of
/// the label `by` (all together under "" without one); `None` when no scrape has it.
/// The scrapes where a series went down are added to `resets`.
fn increase(
    instance: &Instance,
    name: &str,
    by: Option<&str>,
    resets: &mut BTreeSet<usize>,
) -> Option<BTreeMap<String, f64>> {
    let mut last: HashMap<Vec<(String, String)>, f64> = HashMap::new();
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let mut seen = false;
    for (i, taken) in instance.taken.iter().enumerate() {
        for s in taken
            .scrape
            .samples
            .iter()
            .filter(|s| s.name == name && s.value.is_finite())
        {
            seen = true;
            let mut key = s.labels.clone();
            key.sort();
            let group = by
                .and_then(|l| s.labels.iter().find(|(k, _)| k == l))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let grew = match last.get(&key) {
                Some(&prev) if s.value >= prev => s.value - prev,
                Some(_) => {
                    resets.insert(i);
                    s.value
                }
                // A series born after the first scrape started from zero.
                None if i > 0 => s.value,
                None => 0.0,
            };
            *out.entry(group).or_insert(0.0) += grew;
            last.insert(key, s.value);
        }
    }
    seen.then_some(out)
}

/// Computes a window's figures.
struct Analysis<'a> {
    instances: &'a [Instance],
    /// (instance, index into its scrapes) where a counter went down.
    resets: BTreeSet<(usize, usize)>,
}

impl Analysis<'_> {
    fn present(&self, name: &str) -> bool {
        self.instances
            .iter()
            .flat_map(|i| &i.taken)
            .any(|t| t.scrape.samples.iter().any(|s| s.name == name))
    }

    /// The name each engine's group uses here.
    fn chosen(&self, names: Names, suffix: &str) -> Vec<&'static str> {
        names
            .iter()
            .filter_map(|group| {
                group
                    .iter()
                    .copied()
                    .find(|n| self.present(&format!("{n}{suffix}")))
            })
            .collect()
    }

    /// The increase of `metric` per value of `by`, summed over the instances.
    fn increase_by(&mut self, metric: &str, by: Option<&str>) -> Option<BTreeMap<String, f64>> {
        let mut total: Option<BTreeMap<String, f64>> = None;
        for (i, instance) in self.instances.iter().enumerate() {
            let mut resets = BTreeSet::new();
            if let Some(grew) = increase(instance, metric, by, &mut resets) {
                let t = total.get_or_insert_with(BTreeMap::new);
                for (k, v) in grew {
                    *t.entry(k).or_insert(0.0) += v;
                }
            }
            self.resets.extend(resets.into_iter().map(|r| (i, r)));
        }
        total
    }

    /// The increase of a counter over every label, instance and engine.
    fn counter(&mut self, names: Names) -> Option<f64> {
        let mut total = None;
        for name in self.chosen(names, "") {
            if let Some(grew) = self.increase_by(name, None) {
                *total.get_or_insert(0.0) += grew.values().sum::<f64>();
            }
        }
        total
    }

    fn histogram(&mut self, name: &'static str, label: &'static str, metric: &str) -> Option<Latency> {
        let by_le = self.increase_by(&format!("{metric}_bucket"), Some("le"))?;
        let count = self
            .increase_by(&format!("{metric}_count"), None)
            .map_or(0.0, |m| m.values().sum());
        let sum_s = self
            .increase_by(&format!("{metric}_sum"), None)
            .map_or(0.0, |m| m.values().sum());
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
        let pairs: Vec<(f64, f64)> = parsed.iter().map(|(b, _, n)| (*b, *n)).collect();
        let mut latency = Latency {
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
        for (q, key) in QUANTILES {
            let estimate = bucket_quantile(q, &pairs);
            if estimate.is_some_and(|e| e.beyond_last_bucket) {
                latency.beyond_last_bucket.push(key);
            }
            let ms = estimate.map(|e| e.value * 1000.0);
            match key {
                "p50" => latency.p50_ms = ms,
                "p90" => latency.p90_ms = ms,
                "p95" => latency.p95_ms = ms,
                _ => latency.p99_ms = ms,
            }
        }
        Some(latency)
    }

    fn gauge(
        &self,
        name: &'static str,
        label: &'static str,
        combine: Combine,
        names: Names,
    ) -> Option<Gauge> {
        let metrics = self.chosen(names, "");
        let mut values = Vec::new();
        for taken in self.instances.iter().flat_map(|i| &i.taken) {
            let value = taken
                .scrape
                .samples
                .iter()
                .filter(|s| metrics.contains(&s.name.as_str()) && s.value.is_finite())
                .map(|s| s.value)
                .reduce(|a, b| match combine {
                    Combine::Sum => a + b,
                    Combine::Max => a.max(b),
                });
            values.extend(value);
        }
        let max = values.iter().copied().reduce(f64::max)?;
        Some(Gauge {
            name,
            metrics: metrics.iter().map(|m| (*m).to_owned()).collect(),
            max,
            mean: values.iter().sum::<f64>() / values.len() as f64,
            samples: values.len(),
            label,
        })
    }
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

/// The figures of the window the instances' scrapes span; `scheduled` is the number of
/// rounds each URL was to be scraped.
pub fn analyze(instances: &[Instance], scheduled: usize) -> Result<Report, ScrapeError> {
    let times = || instances.iter().flat_map(|i| &i.taken).map(|t| t.at_s);
    let (Some(first), Some(last)) = (times().reduce(f64::min), times().reduce(f64::max)) else {
        return Err(ScrapeError::NoScrapes);
    };
    let window_s = last - first;
    let mut a = Analysis {
        instances,
        resets: BTreeSet::new(),
    };
    let mut latency = Vec::new();
    for (name, label, names) in HISTOGRAMS {
        for metric in a.chosen(names, "_bucket") {
            latency.extend(a.histogram(name, label, metric));
        }
    }
    let per_s = |v: Option<f64>| v.filter(|_| window_s > 0.0).map(|v| v / window_s);
    let mut c = Counters {
        generation_tokens: a.counter(GENERATION_TOKENS),
        prompt_tokens: a.counter(PROMPT_TOKENS),
        requests_completed: a.counter(REQUESTS),
        prefix_cache_hits: a.counter(PREFIX_HITS),
        prefix_cache_queries: a.counter(PREFIX_QUERIES),
        preemptions: a.counter(PREEMPTIONS),
        spec_decode_draft_tokens: a.counter(DRAFT_TOKENS),
        spec_decode_accepted_tokens: a.counter(ACCEPTED_TOKENS),
        ..Counters::default()
    };
    c.generation_tokens_per_s = per_s(c.generation_tokens);
    c.prompt_tokens_per_s = per_s(c.prompt_tokens);
    c.requests_per_s = per_s(c.requests_completed);
    c.prefix_cache_hit_rate = ratio(c.prefix_cache_hits, c.prefix_cache_queries);
    c.spec_decode_acceptance_rate = ratio(c.spec_decode_accepted_tokens, c.spec_decode_draft_tokens);
    let drafts = a.counter(DRAFTS);
    c.spec_decode_acceptance_length = ratio(c.spec_decode_accepted_tokens, drafts).map(|r| 1.0 + r);
    let gauges = GAUGES
        .iter()
        .filter_map(|(name, label, combine, names)| a.gauge(name, label, *combine, names))
        .collect();
    let counter_resets = a
        .resets
        .iter()
        .filter_map(|&(i, k)| {
            let taken = instances.get(i)?.taken.get(k)?;
            Some(Reset {
                url: instances[i].url.clone(),
                scrape: taken.round + 1,
                at_s: taken.at_s,
            })
        })
        .collect();
    let families: BTreeSet<&'static str> = instances
        .iter()
        .flat_map(|i| &i.taken)
        .flat_map(|t| families(&t.scrape))
        .collect();
    let taken: usize = instances.iter().map(|i| i.taken.len()).sum();
    Ok(Report {
        percentile_method: PERCENTILE_METHOD,
        urls: instances.iter().map(|i| i.url.clone()).collect(),
        families: families.into_iter().collect(),
        scrapes: scheduled,
        failed_scrapes: (scheduled * instances.len()).saturating_sub(taken),
        window_s,
        latency,
        counters: c,
        gauges,
        counter_resets,
    })
}

impl Report {
    /// The report for a terminal.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{} scraped {} time{} over {:.1} s ({}){}\n",
            match self.urls.as_slice() {
                [one] => one.clone(),
                many => format!("{} URLs", many.len()),
            },
            self.scrapes,
            if self.scrapes == 1 { "" } else { "s" },
            self.window_s,
            if self.families.is_empty() {
                "no known engine".to_owned()
            } else {
                self.families.join(", ")
            },
            if self.failed_scrapes > 0 {
                format!(", {} failed scrapes skipped", self.failed_scrapes)
            } else {
                String::new()
            },
        );
        if !self.latency.is_empty() {
            out.push_str(
                "\nlatency in ms; percentiles are bucket-interpolated estimates \
                 (Prometheus histogram_quantile, linear within buckets):\n",
            );
            let mut rows = vec![
                ["", "count", "mean", "p50", "p90", "p95", "p99"]
                    .map(str::to_owned)
                    .to_vec(),
            ];
            for l in &self.latency {
                let mut row = vec![l.label.to_owned(), format!("{:.0}", l.count), ms(l.mean_ms)];
                for (_, key) in QUANTILES {
                    let mark = if l.beyond_last_bucket.contains(&key) {
                        "+"
                    } else {
                        ""
                    };
                    row.push(format!("{}{mark}", ms(l.percentile(key))));
                }
                rows.push(row);
            }
            out.push_str(&super::report::align(&rows));
            if self.latency.iter().any(|l| !l.beyond_last_bucket.is_empty()) {
                out.push_str(
                    "(+: in the +Inf bucket; the largest finite bound is shown, the true value is above it)\n",
                );
            }
            if self.latency.iter().map(|l| l.name).collect::<BTreeSet<_>>().len() < self.latency.len() {
                let names: Vec<&str> = self.latency.iter().map(|l| l.metric.as_str()).collect();
                out.push_str(&format!("(rows in order: {})\n", names.join(", ")));
            }
        }
        let c = &self.counters;
        let mut lines = Vec::new();
        let rate = |what: &str, total: Option<f64>, per_s: Option<f64>, unit: &str| {
            total.map(|t| match per_s {
                Some(r) => format!("{what}: {r:.2} {unit}/s ({t:.0} in all)"),
                None => format!("{what}: {t:.0}"),
            })
        };
        lines.extend(rate(
            "generation",
            c.generation_tokens,
            c.generation_tokens_per_s,
            "tok",
        ));
        lines.extend(rate("prompt", c.prompt_tokens, c.prompt_tokens_per_s, "tok"));
        lines.extend(rate(
            "requests completed",
            c.requests_completed,
            c.requests_per_s,
            "req",
        ));
        if let (Some(r), Some(h), Some(q)) = (
            c.prefix_cache_hit_rate,
            c.prefix_cache_hits,
            c.prefix_cache_queries,
        ) {
            lines.push(format!(
                "prefix-cache hit rate: {:.1}% ({h:.0} of {q:.0})",
                r * 100.0
            ));
        }
        if let Some(p) = c.preemptions {
            lines.push(format!("preemptions: {p:.0}"));
        }
        if let Some(r) = c.spec_decode_acceptance_rate {
            lines.push(format!(
                "spec decode: acceptance rate {:.1}%{}",
                r * 100.0,
                c.spec_decode_acceptance_length
                    .map_or(String::new(), |l| format!(", mean acceptance length {l:.2}"))
            ));
        }
        if !lines.is_empty() {
            out.push_str("\ncounters over the window:\n");
            for line in lines {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if !self.gauges.is_empty() {
            out.push_str("\ngauges per instance over the scrapes:\n");
            for g in &self.gauges {
                let v = |x: f64| {
                    if g.name == "kv_cache_usage" {
                        format!("{:.1}%", x * 100.0)
                    } else {
                        format!("{x:.1}")
                    }
                };
                out.push_str(&format!("  {}: max {}, mean {}\n", g.label, v(g.max), v(g.mean)));
            }
        }
        for r in &self.counter_resets {
            out.push_str(&format!(
                "\ncounter reset: {} restarted before scrape {} ({:.1} s); the figures add the \
                 increase before the reset and the values after it\n",
                r.url, r.scrape, r.at_s
            ));
        }
        out
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(url: &str, texts: &[&str]) -> Instance {
        Instance {
            url: url.to_owned(),
            taken: texts
                .iter()
                .enumerate()
                .map(|(i, t)| Taken {
                    round: i,
                    at_s: 10.0 * i as f64,
                    scrape: Scrape::parse(t),
                })
                .collect(),
        }
    }

    /// A TTFT histogram with buckets 0.01, 0.025, 0.05, 0.1, +Inf (cumulative counts).
    fn ttft(labels: &str, counts: [u32; 5], sum: f64) -> String {
        let mut text = String::new();
        for (le, n) in ["0.01", "0.025", "0.05", "0.1", "+Inf"].iter().zip(counts) {
            let sep = if labels.is_empty() { "" } else { "," };
            text.push_str(&format!(
                "vllm:time_to_first_token_seconds_bucket{{{labels}{sep}le=\"{le}\"}} {n}\n"
            ));
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        text.push_str(&format!(
            "vllm:time_to_first_token_seconds_count{braces} {}\n",
            counts[4]
        ));
        text.push_str(&format!("vllm:time_to_first_token_seconds_sum{braces} {sum}\n"));
        text
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn percentiles_interpolate_within_buckets_by_hand() {
        // Before: 10, 20, 30, 40, 40 (sum 1 s); after: 60, 100, 125, 140, 140 (sum 3.5 s).
        // Increase: 50, 80, 95, 100, 100 cumulative, 100 observations, 2.5 s.
        let i = instance(
            "a",
            &[
                &ttft("", [10, 20, 30, 40, 40], 1.0),
                &ttft("", [60, 100, 125, 140, 140], 3.5),
            ],
        );
        let r = analyze(&[i], 2).expect("report");
        let l = &r.latency[0];
        assert_eq!(l.name, "ttft");
        assert_eq!(l.count, 100.0);
        // mean = 2.5 s / 100 = 25 ms.
        assert!(close(l.mean_ms, 25.0));
        // P50: rank 50; the first bucket already holds 50: 0 + 10 ms × 50/50 = 10 ms.
        assert!(close(l.p50_ms, 10.0));
        // P90: rank 90 is in (25 ms, 50 ms], which holds 95 - 80 = 15; 10 of them are
        // below the rank: 25 + 25 × 10/15 = 41.667 ms.
        assert!(close(l.p90_ms, 25.0 + 25.0 * 10.0 / 15.0));
        // P95: rank 95 is the top of (25 ms, 50 ms]: 50 ms.
        assert!(close(l.p95_ms, 50.0));
        // P99: rank 99 is in (50 ms, 100 ms], holding 5, 4 below the rank: 50 + 50 × 4/5 = 90 ms.
        assert!(close(l.p99_ms, 90.0));
        assert!(l.beyond_last_bucket.is_empty());
        assert_eq!(r.percentile_method, PERCENTILE_METHOD);
        assert_eq!(r.window_s, 10.0);
        let buckets: Vec<(&str, f64)> = l.buckets.iter().map(|b| (b.le.as_str(), b.count)).collect();
        assert_eq!(
            buckets,
            vec![
                ("0.01", 50.0),
                ("0.025", 80.0),
                ("0.05", 95.0),
                ("0.1", 100.0),
                ("+Inf", 100.0)
            ]
        );
    }

    #[test]
    fn a_rank_in_the_inf_bucket_gives_the_largest_finite_bound() {
        // Increase 50, 80, 95, 98, 100: P99's rank 99 is above the 98 of le=0.1.
        let i = instance(
            "a",
            &[&ttft("", [0; 5], 0.0), &ttft("", [50, 80, 95, 98, 100], 4.0)],
        );
        let r = analyze(&[i], 2).expect("report");
        let l = &r.latency[0];
        assert!(close(l.p99_ms, 100.0));
        assert_eq!(l.beyond_last_bucket, vec!["p99"]);
        // P95: rank 95 is still the top of (25 ms, 50 ms].
        assert!(close(l.p95_ms, 50.0));
        assert!(r.to_table().contains("100.0+"), "{}", r.to_table());
        // Prometheus's special cases: no +Inf bucket, no observations, a bound <= 0.
        assert_eq!(bucket_quantile(0.5, &[(0.1, 3.0), (1.0, 4.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(
            bucket_quantile(0.5, &[(-1.0, 3.0), (f64::INFINITY, 4.0)]).map(|q| q.value),
            Some(-1.0)
        );
    }

    #[test]
    fn a_counter_that_goes_down_is_a_restart() {
        let i = instance(
            "http://a/metrics",
            &[
                "vllm:generation_tokens_total 100\nvllm:num_requests_running 2\n",
                "vllm:generation_tokens_total 150\nvllm:num_requests_running 6\n",
                // Restarted: 20 since.
                "vllm:generation_tokens_total 20\nvllm:num_requests_running 1\n",
                "vllm:generation_tokens_total 70\nvllm:num_requests_running 3\n",
            ],
        );
        let r = analyze(&[i], 4).expect("report");
        // 50 before the restart, 20 + 50 after.
        assert_eq!(r.counters.generation_tokens, Some(120.0));
        // Over the 30 s from the first scrape to the last.
        assert!(close(r.counters.generation_tokens_per_s, 4.0));
        assert_eq!(
            r.counter_resets,
            vec![Reset {
                url: "http://a/metrics".into(),
                scrape: 3,
                at_s: 20.0
            }]
        );
        assert!(
            r.to_table()
                .contains("counter reset: http://a/metrics restarted before scrape 3")
        );
        // Histograms restart with the counters: 10 per bucket before, 5 after.
        let h = instance(
            "b",
            &[
                &ttft("", [0; 5], 0.0),
                &ttft("", [10; 5], 0.5),
                &ttft("", [5; 5], 0.2),
            ],
        );
        let hr = analyze(&[h], 3).expect("report");
        assert_eq!(hr.latency[0].count, 15.0);
        assert!(close(Some(hr.latency[0].sum_s), 0.7));
        assert_eq!(hr.counter_resets.len(), 1);
        let running = &r.gauges[0];
        assert_eq!(
            (running.name, running.max, running.mean),
            ("running_requests", 6.0, 3.0)
        );
    }

    #[test]
    fn series_sum_over_labels_and_urls() {
        // URL a has two engines, URL b one; the increases per bucket add up to
        // 50, 80, 95, 100, 100 as in the hand-computed test above.
        let a = instance(
            "a",
            &[
                &(ttft("engine=\"0\"", [0; 5], 0.0) + &ttft("engine=\"1\"", [5, 5, 5, 5, 5], 0.1)),
                &(ttft("engine=\"0\"", [20, 30, 35, 40, 40], 1.0)
                    + &ttft("engine=\"1\"", [15, 25, 30, 30, 30], 0.6)),
            ],
        );
        let b = instance(
            "b",
            &[&ttft("", [0; 5], 0.0), &ttft("", [20, 30, 35, 35, 35], 1.0)],
        );
        // a: 20+10, 30+20, 35+25, 40+25, 40+25 = 30, 50, 60, 65, 65; b: 20, 30, 35, 35, 35.
        let r = analyze(&[a, b], 2).expect("report");
        let l = &r.latency[0];
        assert_eq!(l.count, 100.0);
        assert!(close(Some(l.sum_s), 2.5));
        assert!(close(l.p50_ms, 10.0));
        assert!(close(l.p90_ms, 25.0 + 25.0 * 10.0 / 15.0));
        assert!(close(l.p99_ms, 90.0));
    }

    #[test]
    fn hit_rates_acceptance_and_new_series() {
        let i = instance(
            "a",
            &[
                "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n\
                 vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n\
                 vllm:spec_decode_num_accepted_tokens_total 12\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.1\n\
                 vllm:kv_cache_usage_perc{engine=\"1\"} 0.3\n",
                "vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 160\n\
                 vllm:spec_decode_num_drafts_total 30\nvllm:spec_decode_num_draft_tokens_total 90\n\
                 vllm:spec_decode_num_accepted_tokens_total 42\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.7\n\
                 vllm:request_success_total{finished_reason=\"stop\"} 4\n",
            ],
        );
        let r = analyze(&[i], 2).expect("report");
        let c = &r.counters;
        assert_eq!(c.prefix_cache_hit_rate, Some(0.75));
        assert_eq!(c.spec_decode_acceptance_rate, Some(0.5));
        assert_eq!(c.spec_decode_acceptance_length, Some(2.5));
        // Born after the first scrape: counted from zero.
        assert_eq!(c.requests_completed, Some(4.0));
        assert_eq!(c.preemptions, None);
        let kv = r.gauges.iter().find(|g| g.name == "kv_cache_usage").expect("kv");
        // The fuller engine of each scrape: 0.3, then 0.7.
        assert!(close(Some(kv.max), 0.7) && close(Some(kv.mean), 0.5));
        assert_eq!(r.families, vec!["vllm"]);
    }

    #[test]
    fn durations_urls_and_schedules() {
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m").ok(), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m").ok(), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s").ok(), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms").ok(), Some(Duration::from_millis(250)));
        for bad in ["", "10", "5x", "s"] {
            assert!(
                matches!(parse_duration(bad), Err(ScrapeError::Duration(_))),
                "{bad}"
            );
        }
        assert!(matches!(parse_duration("0s"), Err(ScrapeError::ZeroDuration)));
        assert_eq!(metrics_url("http://h:8000/"), "http://h:8000/metrics");
        assert_eq!(
            metrics_url("http://h:8000/prometheus/metrics"),
            "http://h:8000/prometheus/metrics"
        );
        let s = |w, i| schedule(Duration::from_secs(w), Duration::from_secs(i));
        assert_eq!(s(2, 1), [0, 1, 2].map(Duration::from_secs));
        assert_eq!(s(25, 10), [0, 10, 20, 25].map(Duration::from_secs));
        assert_eq!(s(5, 10), [0, 5].map(Duration::from_secs));
        assert!(matches!(analyze(&[], 3), Err(ScrapeError::NoScrapes)));
    }
}

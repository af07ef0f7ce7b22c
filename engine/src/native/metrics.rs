//! The engine's Prometheus metrics, named and labelled as vLLM's, and its periodic
//! stats line.
//!
//! Labels, help texts and bucket boundaries mirror vLLM 0.33
//! `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`); the names and the stats line
//! (`LoggingStatLogger.log`) are vLLM's as [`crate::dialect`] spells them, so that
//! `sous bench`, Grafana dashboards built for vLLM and anything else that scrapes vLLM
//! read the native engine unchanged. Not here: when the line is logged (the engine
//! loop) or served (`http`).
//!
//! The text exposition is written here rather than with a metrics crate: the Rust
//! clients (`prometheus`, `prometheus-client`) either reject the `vllm:` colon names or
//! emit OpenMetrics (`# EOF`, `_created`) where vLLM serves the classic text format, and
//! the format is a few lines of code.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::dialect::log::vllm::StatsLine;
use crate::dialect::metrics::vllm;

mod roofline;
pub use roofline::{
    DECODE_READ_BYTES, DECODE_SECONDS, DECODE_SEQUENCES, DECODE_STEPS, READ_BANDWIDTH, ReadBandwidth,
};

/// TTFT buckets (`loggers.py`, `histogram_time_to_first_token`).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency and TPOT buckets (`histogram_inter_token_latency`).
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Request-level latency buckets (`request_latency_buckets`).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// A cumulative histogram.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *b {
                *c += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// Why a request finished, as vLLM's `finished_reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// Cancelled, disconnected or shut down.
    Abort,
}

impl FinishReason {
    /// The label value and the OpenAI `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// The timings and counts of one finished request.
#[derive(Debug, Clone)]
pub struct FinishedRequest {
    /// Why it ended.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generation_tokens: usize,
    /// Arrival → first scheduled.
    pub queue: Option<Duration>,
    /// First scheduled → first token.
    pub prefill: Option<Duration>,
    /// First token → last token.
    pub decode: Option<Duration>,
    /// First scheduled → finished.
    pub inference: Option<Duration>,
    /// Arrival → finished.
    pub e2e: Duration,
    /// `max_tokens` of the request.
    pub max_tokens: usize,
}

#[derive(Debug)]
struct State {
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    prompt_tokens: u64,
    generation_tokens: u64,
    cached_prompt_tokens: u64,
    prefix_queries: u64,
    prefix_hits: u64,
    preemptions: u64,
    /// Preemptions since the last stats line (vLLM 0.33 logs those of the interval).
    interval_preemptions: u64,
    success: BTreeMap<FinishReason, u64>,
    running: usize,
    waiting: usize,
    kv_usage: f64,
    // The interval of the periodic line.
    interval_start: Instant,
    interval_prompt: u64,
    interval_generation: u64,
    /// Recent (queries, hits) per request, for the line's sliding hit rate (vLLM keeps
    /// the last 1000 requests: `CachingMetrics(max_recent_requests=1000)`).
    recent: std::collections::VecDeque<(u64, u64)>,
    /// Speculative decoding's counters, when the engine drafts: since start and since
    /// the last log line.
    spec: Option<(Spec, Spec)>,
    /// Decode steps' bytes and times: since start and since the last log line.
    steps: (roofline::Steps, roofline::Steps),
    bandwidth: Option<ReadBandwidth>,
}

/// vLLM's spec-decode counters (`vllm/v1/spec_decode/metrics.py`).
#[derive(Debug, Clone, Default)]
struct Spec {
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    /// Accepted tokens by draft position.
    per_position: Vec<u64>,
}

impl Spec {
    fn new(tokens: usize) -> Spec {
        Spec {
            per_position: vec![0; tokens],
            ..Spec::default()
        }
    }

    fn add(&mut self, drafted: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += drafted as u64;
        self.accepted += accepted as u64;
        for p in self.per_position.iter_mut().take(accepted) {
            *p += 1;
        }
    }
}

/// The engine's metrics: written by the engine loop, read by `/metrics`.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    cache_info: Vec<(String, String)>,
    state: Mutex<State>,
}

impl Metrics {
    /// Metrics for the model clients know as `model_name`; `cache_info` becomes the
    /// labels of `vllm:cache_config_info`; `speculative_tokens`: the draft length, when
    /// the engine drafts (the spec-decode series exist only then, as in vLLM).
    pub fn new(
        model_name: &str,
        cache_info: Vec<(String, String)>,
        speculative_tokens: Option<usize>,
    ) -> Metrics {
        Metrics {
            model_name: model_name.to_owned(),
            cache_info,
            state: Mutex::new(State {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                tpot: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(REQUEST_BUCKETS),
                queue: Histogram::new(REQUEST_BUCKETS),
                prefill: Histogram::new(REQUEST_BUCKETS),
                decode: Histogram::new(REQUEST_BUCKETS),
                inference: Histogram::new(REQUEST_BUCKETS),
                prompt_tokens: 0,
                generation_tokens: 0,
                cached_prompt_tokens: 0,
                prefix_queries: 0,
                prefix_hits: 0,
                preemptions: 0,
                interval_preemptions: 0,
                success: BTreeMap::new(),
                running: 0,
                waiting: 0,
                kv_usage: 0.0,
                interval_start: Instant::now(),
                interval_prompt: 0,
                interval_generation: 0,
                recent: Default::default(),
                spec: speculative_tokens.map(|k| (Spec::new(k), Spec::new(k))),
                steps: Default::default(),
                bandwidth: None,
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A panic while holding the lock cannot leave the counters inconsistent in a way
        // that matters more than losing them, so a poisoned lock is used as it is.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// A request was admitted: `queried` prompt tokens looked up, `hit` found cached.
    pub fn admitted(&self, queried: usize, hit: usize, prefix_caching: bool) {
        self.with(|s| {
            if prefix_caching {
                s.prefix_queries += queried as u64;
                s.prefix_hits += hit as u64;
                s.recent.push_back((queried as u64, hit as u64));
                if s.recent.len() > 1000 {
                    s.recent.pop_front();
                }
            }
            s.cached_prompt_tokens += hit as u64;
        });
    }

    /// Prompt tokens computed in a step (cached ones excluded).
    pub fn computed_prompt(&self, tokens: usize) {
        self.with(|s| s.interval_prompt += tokens as u64);
    }

    /// A token was generated; `first` is the request's first, with its TTFT; else the
    /// time since the previous token.
    pub fn token(&self, ttft: Option<Duration>, itl: Option<Duration>) {
        self.with(|s| {
            s.generation_tokens += 1;
            s.interval_generation += 1;
            if let Some(t) = ttft {
                s.ttft.observe(t.as_secs_f64());
            }
            if let Some(t) = itl {
                s.itl.observe(t.as_secs_f64());
            }
        });
    }

    /// A draft of `drafted` tokens was verified; its first `accepted` stood.
    pub fn speculated(&self, drafted: usize, accepted: usize) {
        self.with(|s| {
            if let Some((total, interval)) = &mut s.spec {
                total.add(drafted, accepted);
                interval.add(drafted, accepted);
            }
        });
    }

    /// The read bandwidth measured at load, which the roofline line and series compare
    /// decode steps with.
    pub fn set_bandwidth(&self, bandwidth: ReadBandwidth) {
        self.with(|s| s.bandwidth = Some(bandwidth));
    }

    /// A decode step of `sequences` sequences read `bytes` in `seconds`.
    pub fn decode_step(&self, sequences: usize, bytes: u64, seconds: f64) {
        self.with(|s| {
            s.steps.0.add(sequences, bytes, seconds);
            s.steps.1.add(sequences, bytes, seconds);
        });
    }

    /// A sequence was preempted.
    pub fn preempted(&self) {
        self.with(|s| {
            s.preemptions += 1;
            s.interval_preemptions += 1;
        });
    }

    /// A request finished.
    pub fn finished(&self, r: &FinishedRequest) {
        self.with(|s| {
            *s.success.entry(r.reason).or_default() += 1;
            s.prompt_tokens += r.prompt_tokens as u64;
            s.e2e.observe(r.e2e.as_secs_f64());
            for (h, v) in [
                (&mut s.queue, r.queue),
                (&mut s.prefill, r.prefill),
                (&mut s.decode, r.decode),
                (&mut s.inference, r.inference),
            ] {
                if let Some(v) = v {
                    h.observe(v.as_secs_f64());
                }
            }
            if r.generation_tokens > 1
                && let Some(d) = r.decode
            {
                s.tpot.observe(d.as_secs_f64() / (r.generation_tokens - 1) as f64);
            }
        });
    }

    /// The scheduler's state after a step.
    pub fn gauges(&self, running: usize, waiting: usize, kv_usage: f64) {
        self.with(|s| {
            s.running = running;
            s.waiting = waiting;
            s.kv_usage = kv_usage;
        });
    }

    /// `(running, waiting, kv_usage)` as last reported.
    pub fn snapshot(&self) -> (usize, usize, f64) {
        self.with(|s| (s.running, s.waiting, s.kv_usage))
    }

    /// How long until the current interval ends, when it saw work that no line has told
    /// yet (vLLM's logger runs on a timer, so the interval of the last tokens is logged
    /// even once the engine is idle); none when there is nothing to tell.
    pub fn untold(&self, interval: Duration) -> Option<Duration> {
        self.with(|s| {
            let drafted = s.spec.as_ref().is_some_and(|(_, spec)| spec.drafts > 0);
            (s.interval_prompt > 0 || s.interval_generation > 0 || drafted)
                .then(|| interval.saturating_sub(s.interval_start.elapsed()))
        })
    }

    /// vLLM's periodic lines, when `interval` has passed since the last ones: the stats
    /// line (not when the engine was idle all along; vLLM logs those at DEBUG only) and,
    /// when the engine drafts and drafted in the interval, the `SpecDecoding metrics:`
    /// line. Empty before the interval is over.
    pub fn stats_lines(&self, interval: Duration, device: &str) -> Vec<String> {
        self.with(|s| {
            let elapsed = s.interval_start.elapsed();
            if elapsed < interval {
                return Vec::new();
            }
            let secs = elapsed.as_secs_f64();
            let idle =
                s.interval_prompt == 0 && s.interval_generation == 0 && s.running == 0 && s.waiting == 0;
            let (q, h) = s.recent.iter().fold((0, 0), |(q, h), r| (q + r.0, h + r.1));
            let line = StatsLine {
                engine: 0,
                prompt_tok_s: s.interval_prompt as f64 / secs,
                generation_tok_s: s.interval_generation as f64 / secs,
                running: s.running,
                waiting: s.waiting,
                preemptions: s.interval_preemptions,
                device,
                kv_usage: s.kv_usage,
                prefix_hit_rate: (q > 0).then(|| h as f64 / q as f64),
            };
            s.interval_start = Instant::now();
            s.interval_prompt = 0;
            s.interval_generation = 0;
            s.interval_preemptions = 0;
            let mut lines = Vec::new();
            if !idle {
                lines.push(line.to_string());
            }
            if let Some((_, spec)) = &mut s.spec {
                if spec.drafts > 0 {
                    lines.push(spec_line(spec, secs));
                }
                *spec = Spec::new(spec.per_position.len());
            }
            lines.extend(s.steps.1.line(s.bandwidth));
            s.steps.1 = Default::default();
            lines
        })
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let labels = format!("engine=\"0\",model_name=\"{}\"", escape(&self.model_name));
        self.with(|s| {
            let mut out = String::new();
            let mut gauge = |name: &str, help: &str, value: f64| {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}"
                );
            };
            gauge(
                vllm::NUM_REQUESTS_RUNNING,
                "Number of requests in model execution batches.",
                s.running as f64,
            );
            gauge(
                vllm::NUM_REQUESTS_WAITING,
                "Number of requests waiting to be processed.",
                s.waiting as f64,
            );
            gauge(
                vllm::KV_CACHE_USAGE_PERC,
                "KV-cache usage. 1 means 100 percent usage.",
                s.kv_usage,
            );
            let info: Vec<String> = self
                .cache_info
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let name = vllm::CACHE_CONFIG_INFO;
            let _ = writeln!(
                out,
                "# HELP {name} Information of the LLMEngine CacheConfig\n\
                 # TYPE {name} gauge\n{name}{{{},{labels}}} 1.0",
                info.join(",")
            );
            let mut counter = |name: &str, help: &str, series: &[(String, u64)]| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                for (extra, value) in series {
                    let _ = writeln!(out, "{name}{{{extra}{labels}}} {value}.0");
                }
            };
            counter(
                vllm::NUM_PREEMPTIONS,
                "Cumulative number of preemption from the engine.",
                &[(String::new(), s.preemptions)],
            );
            counter(
                vllm::PROMPT_TOKENS,
                "Number of prefill tokens processed.",
                &[(String::new(), s.prompt_tokens)],
            );
            counter(
                vllm::PROMPT_TOKENS_CACHED,
                "Number of cached prompt tokens (local prefix cache).",
                &[(String::new(), s.cached_prompt_tokens)],
            );
            counter(
                vllm::GENERATION_TOKENS,
                "Number of generation tokens processed.",
                &[(String::new(), s.generation_tokens)],
            );
            counter(
                vllm::PREFIX_CACHE_QUERIES,
                "Prefix cache queries, in terms of number of queried tokens.",
                &[(String::new(), s.prefix_queries)],
            );
            counter(
                vllm::PREFIX_CACHE_HITS,
                "Prefix cache hits, in terms of number of cached tokens.",
                &[(String::new(), s.prefix_hits)],
            );
            let success: Vec<(String, u64)> = [FinishReason::Stop, FinishReason::Length, FinishReason::Abort]
                .iter()
                .map(|r| {
                    (
                        format!("{}=\"{}\",", vllm::FINISHED_REASON, r.as_str()),
                        s.success.get(r).copied().unwrap_or(0),
                    )
                })
                .collect();
            counter(
                vllm::REQUEST_SUCCESS,
                "Count of successfully processed requests.",
                &success,
            );
            if let Some((spec, _)) = &s.spec {
                counter(
                    vllm::SPEC_DECODE_NUM_DRAFTS,
                    "Number of spec decoding drafts.",
                    &[(String::new(), spec.drafts)],
                );
                counter(
                    vllm::SPEC_DECODE_NUM_DRAFT_TOKENS,
                    "Number of draft tokens.",
                    &[(String::new(), spec.draft_tokens)],
                );
                counter(
                    vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS,
                    "Number of accepted tokens.",
                    &[(String::new(), spec.accepted)],
                );
                let per_position: Vec<(String, u64)> = spec
                    .per_position
                    .iter()
                    .enumerate()
                    .map(|(p, &v)| (format!("{}=\"{p}\",", vllm::POSITION), v))
                    .collect();
                counter(
                    vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
                    "Accepted tokens per draft position.",
                    &per_position,
                );
            }
            for (name, help, h) in [
                (
                    vllm::TIME_TO_FIRST_TOKEN,
                    "Histogram of time to first token in seconds.",
                    &s.ttft,
                ),
                (
                    vllm::INTER_TOKEN_LATENCY,
                    "Histogram of inter-token latency in seconds.",
                    &s.itl,
                ),
                (
                    vllm::REQUEST_TIME_PER_OUTPUT_TOKEN,
                    "Histogram of time_per_output_token_seconds per request.",
                    &s.tpot,
                ),
                (
                    vllm::E2E_REQUEST_LATENCY,
                    "Histogram of e2e request latency in seconds.",
                    &s.e2e,
                ),
                (
                    vllm::REQUEST_QUEUE_TIME,
                    "Histogram of time spent in WAITING phase for request.",
                    &s.queue,
                ),
                (
                    vllm::REQUEST_PREFILL_TIME,
                    "Histogram of time spent in PREFILL phase for request.",
                    &s.prefill,
                ),
                (
                    vllm::REQUEST_DECODE_TIME,
                    "Histogram of time spent in DECODE phase for request.",
                    &s.decode,
                ),
                (
                    vllm::REQUEST_INFERENCE_TIME,
                    "Histogram of time spent in RUNNING phase for request.",
                    &s.inference,
                ),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
                for (b, c) in h.bounds.iter().zip(&h.counts) {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{}\",{labels}}} {c}.0", fmt_bound(*b));
                }
                let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{labels}}} {}.0", h.count);
                let _ = writeln!(out, "{name}_count{{{labels}}} {}.0", h.count);
                let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
            }
            s.steps.0.render(s.bandwidth, &labels, &mut out);
            out
        })
    }
}

/// Bucket bounds as Python's `float.__repr__` prints them (`1.0`, `0.25`).
/// vLLM's `SpecDecodingLogging.log` line (`vllm/v1/spec_decode/metrics.py`) for the
/// counters of an interval of `secs` seconds with at least one draft.
fn spec_line(spec: &Spec, secs: f64) -> String {
    let drafts = spec.drafts as f64;
    let per_position: Vec<String> = spec
        .per_position
        .iter()
        .map(|&a| format!("{:.3}", a as f64 / drafts))
        .collect();
    let rate = if spec.draft_tokens > 0 {
        spec.accepted as f64 / spec.draft_tokens as f64 * 100.0
    } else {
        0.0
    };
    format!(
        "SpecDecoding metrics: Mean acceptance length: {:.2}, Accepted throughput: {:.2} tokens/s, \
         Drafted throughput: {:.2} tokens/s, Accepted: {} tokens, Drafted: {} tokens, Per-position acceptance \
         rate: {}, Avg Draft acceptance rate: {rate:.1}%",
        1.0 + spec.accepted as f64 / drafts,
        spec.accepted as f64 / secs,
        spec.draft_tokens as f64 / secs,
        spec.accepted,
        spec.draft_tokens,
        per_position.join(", "),
    )
}

fn fmt_bound(b: f64) -> String {
    crate::chat::python_float_repr(b)
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests;

//! Which metrics make each figure of `sous bench scrape`, in every engine's names: the
//! latency histograms, the counters and the gauges, each with the name the report and
//! the table give it. The spellings are [`sous_engine::dialect::metrics`]'s; here is
//! only which of them measure the same thing. Not here: computing the figures.

use sous_engine::dialect::metrics::{sglang, trtllm, vllm};

/// A metric under its engines' names: one group per engine, each the names it has had,
/// newest first (the first of a group that any scrape holds is used).
pub(super) type Names = &'static [&'static [&'static str]];

/// The latency histograms: the report's name, the table's and the metrics.
pub(super) const HISTOGRAMS: &[(&str, &str, Names)] = &[
    (
        "ttft",
        "TTFT",
        &[
            &[vllm::TIME_TO_FIRST_TOKEN],
            &[sglang::TIME_TO_FIRST_TOKEN],
            &[trtllm::TIME_TO_FIRST_TOKEN],
        ],
    ),
    (
        "itl",
        "ITL",
        &[
            // Renamed in vLLM 0.11 (`vllm/v1/metrics/loggers.py`).
            &[vllm::INTER_TOKEN_LATENCY, vllm::TIME_PER_OUTPUT_TOKEN],
            &[sglang::INTER_TOKEN_LATENCY],
        ],
    ),
    (
        "tpot",
        "TPOT",
        &[
            &[vllm::REQUEST_TIME_PER_OUTPUT_TOKEN],
            &[sglang::REQUEST_TIME_PER_OUTPUT_TOKEN],
            // TensorRT-LLM's is observed once per request (`tensorrt_llm/metrics/collector.py`).
            &[trtllm::TIME_PER_OUTPUT_TOKEN],
        ],
    ),
    (
        "e2e",
        "E2E",
        &[
            &[vllm::E2E_REQUEST_LATENCY],
            &[sglang::E2E_REQUEST_LATENCY],
            &[trtllm::E2E_REQUEST_LATENCY],
        ],
    ),
    (
        "queue",
        "queue",
        &[
            &[vllm::REQUEST_QUEUE_TIME],
            &[sglang::QUEUE_TIME],
            &[trtllm::REQUEST_QUEUE_TIME],
        ],
    ),
];

pub(super) const GENERATION_TOKENS: Names = &[
    &[vllm::GENERATION_TOKENS],
    &[sglang::GENERATION_TOKENS],
    &[trtllm::GENERATION_TOKENS],
];
pub(super) const PROMPT_TOKENS: Names = &[
    &[vllm::PROMPT_TOKENS],
    &[sglang::PROMPT_TOKENS],
    &[trtllm::PROMPT_TOKENS],
];
pub(super) const REQUESTS: Names = &[
    &[vllm::REQUEST_SUCCESS],
    // Counted when a request finishes (SGLang 0.5.23
    // `python/sglang/srt/observability/metrics_collector.py`).
    &[sglang::NUM_REQUESTS],
    &[trtllm::REQUEST_SUCCESS],
];
// SGLang counts cached prompt tokens against all prompt tokens; TensorRT-LLM counts
// blocks reused against reused + missed.
pub(super) const PREFIX_HITS: Names = &[
    &[vllm::PREFIX_CACHE_HITS, vllm::GPU_PREFIX_CACHE_HITS],
    &[sglang::CACHED_TOKENS],
    &[trtllm::KV_CACHE_REUSED_BLOCKS],
];
pub(super) const PREFIX_QUERIES: Names = &[
    &[vllm::PREFIX_CACHE_QUERIES, vllm::GPU_PREFIX_CACHE_QUERIES],
    &[sglang::PROMPT_TOKENS],
    &[trtllm::KV_CACHE_REUSED_BLOCKS],
    &[trtllm::KV_CACHE_MISSED_BLOCKS],
];
pub(super) const PREEMPTIONS: Names = &[&[vllm::NUM_PREEMPTIONS]];
pub(super) const DRAFT_TOKENS: Names = &[
    &[vllm::SPEC_DECODE_NUM_DRAFT_TOKENS],
    &[trtllm::SPEC_DECODE_DRAFTED_TOKENS],
];
pub(super) const ACCEPTED_TOKENS: Names = &[
    &[vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS],
    &[trtllm::SPEC_DECODE_ACCEPTED_TOKENS],
];
pub(super) const DRAFTS: Names = &[&[vllm::SPEC_DECODE_NUM_DRAFTS]];
/// Accepted draft tokens by their position in the draft, in the label [`POSITION`].
pub(super) const ACCEPTED_PER_POSITION: Names = &[&[vllm::SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS]];
/// The label of [`ACCEPTED_PER_POSITION`] that says the position (0 for the first).
pub(super) const POSITION: &str = vllm::POSITION;

/// How a gauge's series within one scrape combine into the instance's value.
#[derive(Clone, Copy)]
pub(super) enum Combine {
    /// Counts of data-parallel engines add up.
    Sum,
    /// Fractions: the fullest engine.
    Max,
}

/// The gauges: the report's name, the table's, how series combine, and the metrics.
pub(super) const GAUGES: &[(&str, &str, Combine, Names)] = &[
    (
        "running_requests",
        "running requests",
        Combine::Sum,
        &[
            &[vllm::NUM_REQUESTS_RUNNING],
            &[sglang::NUM_RUNNING_REQS],
            &[trtllm::NUM_REQUESTS_RUNNING],
        ],
    ),
    (
        "waiting_requests",
        "waiting requests",
        Combine::Sum,
        &[
            &[vllm::NUM_REQUESTS_WAITING],
            &[sglang::NUM_QUEUE_REQS],
            &[trtllm::NUM_REQUESTS_WAITING],
        ],
    ),
    (
        "kv_cache_usage",
        "KV-cache usage",
        Combine::Max,
        &[
            &[vllm::KV_CACHE_USAGE_PERC, vllm::GPU_CACHE_USAGE_PERC],
            &[sglang::TOKEN_USAGE],
            &[trtllm::KV_CACHE_UTILIZATION],
        ],
    ),
    // SGLang's speculative-decoding figures are gauges over its last log interval.
    (
        "spec_accept_rate",
        "spec acceptance rate",
        Combine::Max,
        &[&[sglang::SPEC_ACCEPT_RATE]],
    ),
    (
        "spec_accept_length",
        "spec acceptance length",
        Combine::Max,
        &[
            &[sglang::SPEC_ACCEPT_LENGTH],
            &[trtllm::SPEC_DECODE_ACCEPTANCE_LENGTH],
        ],
    ),
];

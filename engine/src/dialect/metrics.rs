//! The Prometheus metric names of each engine, as they appear in a scrape: counters
//! with their `_total` suffix, histograms without `_bucket`, `_sum` and `_count`.
//! The native engine exposes vLLM's names ([`vllm`]) so that `sous bench`, Grafana
//! dashboards built for vLLM and anything else that scrapes vLLM read it unchanged;
//! `sous bench` reads all three families.
//!
//! Not here: which names make which figure (the readers decide), bucket boundaries
//! and help texts (the native engine's own, beside its histograms).

/// vLLM 0.33 `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`) and
/// `vllm/v1/spec_decode/metrics.py` (`SpecDecodingProm`); every series carries the
/// labels `model_name` and `engine` (the data-parallel engine's index). The names
/// marked as older are those of vLLM 0.10, kept for servers not yet upgraded: vLLM
/// 0.11 renamed them and 0.13 (0.17 for the time per output token) removed them.
pub mod vllm {
    /// Every name starts with this.
    pub const PREFIX: &str = "vllm:";

    /// Requests in the running batch (gauge).
    pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
    /// Requests waiting to be scheduled (gauge).
    pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
    /// KV-cache usage, 0 to 1 (gauge).
    pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
    /// [`KV_CACHE_USAGE_PERC`] before vLLM 0.11.
    pub const GPU_CACHE_USAGE_PERC: &str = "vllm:gpu_cache_usage_perc";
    /// The cache configuration as labels, value 1 (gauge).
    pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

    /// Preemptions (counter).
    pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions_total";
    /// Prompt tokens, cached ones included (counter).
    pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
    /// Prompt tokens found in the local prefix cache (counter).
    pub const PROMPT_TOKENS_CACHED: &str = "vllm:prompt_tokens_cached_total";
    /// Generated tokens (counter).
    pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
    /// Prompt tokens looked up in the prefix cache (counter).
    pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
    /// Of those, found (counter).
    pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
    /// [`PREFIX_CACHE_QUERIES`] before vLLM 0.11.
    pub const GPU_PREFIX_CACHE_QUERIES: &str = "vllm:gpu_prefix_cache_queries_total";
    /// [`PREFIX_CACHE_HITS`] before vLLM 0.11.
    pub const GPU_PREFIX_CACHE_HITS: &str = "vllm:gpu_prefix_cache_hits_total";
    /// Finished requests, by [`FINISHED_REASON`] (counter).
    pub const REQUEST_SUCCESS: &str = "vllm:request_success_total";
    /// The label of [`REQUEST_SUCCESS`]: `stop`, `length`, `abort`.
    pub const FINISHED_REASON: &str = "finished_reason";

    /// Draft proposals (counter; only with speculative decoding).
    pub const SPEC_DECODE_NUM_DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
    /// Draft tokens proposed (counter).
    pub const SPEC_DECODE_NUM_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
    /// Draft tokens accepted (counter).
    pub const SPEC_DECODE_NUM_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens_total";
    /// Draft tokens accepted per draft position, by [`POSITION`] (counter).
    pub const SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS: &str =
        "vllm:spec_decode_num_accepted_tokens_per_pos_total";
    /// The label of [`SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS`], from `0`.
    pub const POSITION: &str = "position";

    /// Time to first token, seconds (histogram).
    pub const TIME_TO_FIRST_TOKEN: &str = "vllm:time_to_first_token_seconds";
    /// Gaps between tokens, seconds (histogram).
    pub const INTER_TOKEN_LATENCY: &str = "vllm:inter_token_latency_seconds";
    /// [`INTER_TOKEN_LATENCY`] before vLLM 0.11.
    pub const TIME_PER_OUTPUT_TOKEN: &str = "vllm:time_per_output_token_seconds";
    /// Each request's mean time per output token, seconds (histogram).
    pub const REQUEST_TIME_PER_OUTPUT_TOKEN: &str = "vllm:request_time_per_output_token_seconds";
    /// Arrival to last token, seconds (histogram).
    pub const E2E_REQUEST_LATENCY: &str = "vllm:e2e_request_latency_seconds";
    /// Time waiting to be scheduled, seconds (histogram).
    pub const REQUEST_QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
    /// Time in prefill, seconds (histogram).
    pub const REQUEST_PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
    /// Time in decode, seconds (histogram).
    pub const REQUEST_DECODE_TIME: &str = "vllm:request_decode_time_seconds";
    /// Time running, seconds (histogram).
    pub const REQUEST_INFERENCE_TIME: &str = "vllm:request_inference_time_seconds";
}

/// SGLang 0.5.23 `python/sglang/srt/observability/metrics_collector.py`, served only
/// with `--enable-metrics`. Its speculative-decoding figures are gauges over the last
/// log interval, not counters.
pub mod sglang {
    /// Every name starts with this.
    pub const PREFIX: &str = "sglang:";

    /// Requests running (gauge).
    pub const NUM_RUNNING_REQS: &str = "sglang:num_running_reqs";
    /// Requests queued (gauge).
    pub const NUM_QUEUE_REQS: &str = "sglang:num_queue_reqs";
    /// KV-cache usage, 0 to 1 (gauge).
    pub const TOKEN_USAGE: &str = "sglang:token_usage";
    /// Requests retracted (preempted) (gauge).
    pub const NUM_RETRACTED_REQS: &str = "sglang:num_retracted_reqs";
    /// Mean accepted draft tokens over the last interval (gauge).
    pub const SPEC_ACCEPT_RATE: &str = "sglang:spec_accept_rate";
    /// Mean acceptance length over the last interval (gauge).
    pub const SPEC_ACCEPT_LENGTH: &str = "sglang:spec_accept_length";

    /// Prompt tokens (counter).
    pub const PROMPT_TOKENS: &str = "sglang:prompt_tokens_total";
    /// Generated tokens (counter).
    pub const GENERATION_TOKENS: &str = "sglang:generation_tokens_total";
    /// Prompt tokens served from the radix cache, by `cache_source` (counter).
    pub const CACHED_TOKENS: &str = "sglang:cached_tokens_total";
    /// Requests, counted when they finish (counter).
    pub const NUM_REQUESTS: &str = "sglang:num_requests_total";

    /// Time to first token, seconds (histogram).
    pub const TIME_TO_FIRST_TOKEN: &str = "sglang:time_to_first_token_seconds";
    /// Gaps between tokens, seconds (histogram).
    pub const INTER_TOKEN_LATENCY: &str = "sglang:inter_token_latency_seconds";
    /// Each request's mean time per output token, seconds (histogram).
    pub const REQUEST_TIME_PER_OUTPUT_TOKEN: &str = "sglang:request_time_per_output_token_seconds";
    /// Arrival to last token, seconds (histogram).
    pub const E2E_REQUEST_LATENCY: &str = "sglang:e2e_request_latency_seconds";
    /// Time queued, seconds (histogram).
    pub const QUEUE_TIME: &str = "sglang:queue_time_seconds";
}

/// TensorRT-LLM `tensorrt_llm/metrics/collector.py` (`MetricsCollector`), served at
/// `/prometheus/metrics` with `return_perf_metrics: true`. The first releases with it
/// (1.1) had only the request, latency and KV-cache-usage names; the token, block and
/// speculative-decoding counters came later (the release of each is not pinned).
pub mod trtllm {
    /// Every name starts with this.
    pub const PREFIX: &str = "trtllm_";

    /// Requests running (gauge).
    pub const NUM_REQUESTS_RUNNING: &str = "trtllm_num_requests_running";
    /// Requests queued (gauge).
    pub const NUM_REQUESTS_WAITING: &str = "trtllm_num_requests_waiting";
    /// KV-cache usage, 0 to 1 (gauge).
    pub const KV_CACHE_UTILIZATION: &str = "trtllm_kv_cache_utilization";
    /// Block reuse rate of the KV cache (gauge).
    pub const KV_CACHE_HIT_RATE: &str = "trtllm_kv_cache_hit_rate";
    /// Mean acceptance length of speculative decoding (gauge).
    pub const SPEC_DECODE_ACCEPTANCE_LENGTH: &str = "trtllm_spec_decode_acceptance_length";

    /// Prompt tokens (counter).
    pub const PROMPT_TOKENS: &str = "trtllm_prompt_tokens_total";
    /// Generated tokens (counter).
    pub const GENERATION_TOKENS: &str = "trtllm_generation_tokens_total";
    /// Finished requests (counter).
    pub const REQUEST_SUCCESS: &str = "trtllm_request_success_total";
    /// KV-cache blocks reused (counter).
    pub const KV_CACHE_REUSED_BLOCKS: &str = "trtllm_kv_cache_reused_blocks_total";
    /// KV-cache blocks missed (counter).
    pub const KV_CACHE_MISSED_BLOCKS: &str = "trtllm_kv_cache_missed_blocks_total";
    /// Draft tokens proposed (counter).
    pub const SPEC_DECODE_DRAFTED_TOKENS: &str = "trtllm_spec_decode_drafted_tokens_total";
    /// Draft tokens accepted (counter).
    pub const SPEC_DECODE_ACCEPTED_TOKENS: &str = "trtllm_spec_decode_accepted_tokens_total";

    /// Time to first token, seconds (histogram).
    pub const TIME_TO_FIRST_TOKEN: &str = "trtllm_time_to_first_token_seconds";
    /// Each request's time per output token, observed once per request, seconds
    /// (histogram).
    pub const TIME_PER_OUTPUT_TOKEN: &str = "trtllm_time_per_output_token_seconds";
    /// Arrival to last token, seconds (histogram).
    pub const E2E_REQUEST_LATENCY: &str = "trtllm_e2e_request_latency_seconds";
    /// Time queued, seconds (histogram).
    pub const REQUEST_QUEUE_TIME: &str = "trtllm_request_queue_time_seconds";
}

//! What each engine calls things: the Prometheus metric names of vLLM, SGLang and
//! TensorRT-LLM ([`metrics`]), and the log lines sous writes as vLLM writes them (the
//! native engine's start-up capacity and periodic stats) or reads from an engine's
//! output (capacity, stats, start-up, out of memory) ([`log`]).
//!
//! One home, so that the writer (`native`) and the readers (`serve::logscan`,
//! `sous bench`) cannot drift apart, and so that each spelling cites the upstream file
//! and release it mirrors once. Not here: reading a scrape or a log, or what a figure
//! means; those stay with the code that computes them.

pub mod log;
pub mod metrics;

/// An engine whose metric names sous knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// vLLM, and the native engine, which uses vLLM's names.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM's `trtllm-serve`.
    Trtllm,
}

impl Family {
    /// Every family, in the order reports list them.
    pub const ALL: [Family; 3] = [Family::Vllm, Family::Sglang, Family::Trtllm];

    /// The family's name in reports: `vllm`, `sglang`, `trtllm`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Vllm => "vllm",
            Family::Sglang => "sglang",
            Family::Trtllm => "trtllm",
        }
    }

    /// The prefix of every metric the family exposes.
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Vllm => metrics::vllm::PREFIX,
            Family::Sglang => metrics::sglang::PREFIX,
            Family::Trtllm => metrics::trtllm::PREFIX,
        }
    }

    /// The family an engine's metrics follow (the native engine writes vLLM's).
    pub fn of_engine(engine: crate::recipe::EngineKind) -> Family {
        use crate::recipe::EngineKind;
        match engine {
            EngineKind::Vllm | EngineKind::Native => Family::Vllm,
            EngineKind::Sglang => Family::Sglang,
            EngineKind::Trtllm => Family::Trtllm,
        }
    }

    /// The path the family's server exposes Prometheus text at: `/metrics`, or for
    /// trtllm-serve `/prometheus/metrics` (`tensorrt_llm/serve/openai_server.py`).
    pub fn metrics_path(self) -> &'static str {
        match self {
            Family::Vllm | Family::Sglang => "/metrics",
            Family::Trtllm => "/prometheus/metrics",
        }
    }

    /// The family whose naming a metric follows, by its prefix.
    pub fn of_metric(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| name.starts_with(f.prefix()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_told_by_prefix() {
        assert_eq!(
            Family::of_metric(metrics::vllm::NUM_REQUESTS_RUNNING),
            Some(Family::Vllm)
        );
        assert_eq!(
            Family::of_metric(metrics::sglang::TOKEN_USAGE),
            Some(Family::Sglang)
        );
        assert_eq!(
            Family::of_metric(metrics::trtllm::KV_CACHE_UTILIZATION),
            Some(Family::Trtllm)
        );
        assert_eq!(Family::of_metric("process_cpu_seconds_total"), None);
        assert_eq!(Family::ALL.map(Family::name), ["vllm", "sglang", "trtllm"]);
    }
}

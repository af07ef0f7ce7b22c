//! Reading an engine's output for what sous needs to know: that it ran out of memory at
//! start-up, and how many tokens of KV cache it got.
//!
//! What the lines look like, and which upstream file each comes from, is in
//! [`crate::dialect::log`]; here is only how a line is searched for them. Not here:
//! what the supervisor does with the answers.

use serde::Serialize;

use crate::dialect::log::{OUT_OF_MEMORY, sglang, trtllm, vllm};
use crate::recipe::EngineKind;

/// Whether a line of engine output reports running out of memory.
pub fn is_oom(line: &str) -> bool {
    OUT_OF_MEMORY.iter().any(|p| line.contains(p))
}

/// The KV-cache capacity an engine reported at start-up.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Capacity {
    /// Tokens the KV cache holds.
    pub tokens: u64,
    /// Requests of `max_model_len` tokens that fit at once (vLLM).
    pub max_concurrency: Option<f64>,
    /// The line it came from.
    pub line: String,
}

/// The KV capacity in a line of engine output, if it is the engine's capacity line.
pub fn capacity(kind: EngineKind, line: &str) -> Option<Capacity> {
    let number_after = |marker: &str| -> Option<u64> {
        let rest = &line[line.find(marker)? + marker.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(|c| *c != ',')
            .collect();
        digits.parse().ok()
    };
    match kind {
        // "GPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x"
        // (the device word is CPU, GPU, XPU ...).
        EngineKind::Vllm | EngineKind::Native => {
            let tokens = number_after(vllm::KV_CACHE_SIZE)?;
            let max_concurrency = line.find(vllm::PER_REQUEST).and_then(|i| {
                let rest = line[i + vllm::PER_REQUEST.len()..].trim_start();
                rest.trim_end_matches(|c: char| !c.is_ascii_digit())
                    .trim_end_matches('x')
                    .parse()
                    .ok()
            });
            Some(Capacity {
                tokens,
                max_concurrency,
                line: line.to_owned(),
            })
        }
        // "max_total_num_tokens=N, chunked_prefill_size=..."
        EngineKind::Sglang => number_after(sglang::MAX_TOTAL_NUM_TOKENS).map(|tokens| Capacity {
            tokens,
            max_concurrency: None,
            line: line.to_owned(),
        }),
        // "[MemUsageChange] Allocated 1.01 GiB for max tokens in paged KV cache (8256)."
        EngineKind::Trtllm => {
            if !line.contains(trtllm::PAGED_KV_CACHE) {
                return None;
            }
            number_after(trtllm::PAGED_KV_CACHE_TOKENS).map(|tokens| Capacity {
                tokens,
                max_concurrency: None,
                line: line.to_owned(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_real_capacity_lines() {
        // A real vLLM 0.32 log (`tests/fixtures/vllm-logs/README.md` says where from).
        let log = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/vllm-logs/vllm-0.32-cpu-serve.log"
        ))
        .expect("the vLLM 0.32 sample log");
        let found: Vec<Capacity> = log
            .lines()
            .filter_map(|l| capacity(EngineKind::Vllm, l))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].tokens, found[0].max_concurrency), (46_592, Some(22.75)));
        assert!(
            found[0]
                .line
                .starts_with("(EngineCore pid=13411) INFO 11-29 23:22:19")
        );
        // The native engine's line, written by the same dialect, reads back.
        let native = vllm::capacity_line("CPU", 1_234_567, 32_768, 37.68);
        let c = capacity(EngineKind::Native, &native).expect("native line");
        assert_eq!((c.tokens, c.max_concurrency), (1_234_567, Some(37.68)));
        // The pool `sous plan` gives Llama-3.1-8B on an H100 at 0.88
        // (engine/tests/log_fixtures.rs checks it).
        let sglang = "max_total_num_tokens=406385, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=16, context_len=131072, available_gpu_mem=12.1 GB";
        assert_eq!(
            capacity(EngineKind::Sglang, sglang).map(|c| c.tokens),
            Some(406_385)
        );
        let trt = "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 1.01 GiB for max tokens in paged KV cache (8256).";
        assert_eq!(capacity(EngineKind::Trtllm, trt).map(|c| c.tokens), Some(8256));
        assert!(capacity(EngineKind::Vllm, "Starting vLLM server on http://0.0.0.0:8013").is_none());
    }

    #[test]
    fn recognises_out_of_memory() {
        assert!(is_oom(
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
        ));
        assert!(is_oom(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        ));
        assert!(is_oom("NVRM: nvAssertFailedNoLog: NV_ERR_NO_MEMORY"));
        assert!(!is_oom("INFO Application startup complete."));
    }
}

//! Reading an engine's output for what sous needs to know: that it ran out of memory at
//! start-up, how many tokens of KV cache it got, and how long each phase of its start
//! took.
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

/// A phase of a start: the build's, as sous times them, then the engine's, as the
/// engine reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Fetching the model, or finding it up to date (`sous pull`'s work).
    Pull,
    /// Quantizing it, or finding the checkpoint up to date (`sous quantize`'s work).
    Quantize,
    /// Reading the weights.
    Weights,
    /// The weights and the model's construction.
    ModelLoading,
    /// torch.compile.
    Compile,
    /// CUDA graph capture.
    Graphs,
    /// Profiling, the KV cache's allocation and the warm-up (compilation and graph
    /// capture included).
    EngineInit,
}

impl Phase {
    /// How the phase is named in sous's output.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Pull => "pull",
            Phase::Quantize => "quantize",
            Phase::Weights => "weights",
            Phase::ModelLoading => "model loading",
            Phase::Compile => "torch.compile",
            Phase::Graphs => "graph capture",
            Phase::EngineInit => "engine init",
        }
    }
}

/// One phase and the seconds it took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct PhaseTime {
    /// The phase.
    pub phase: Phase,
    /// Its seconds.
    pub seconds: f64,
}

/// The start-up phases a line of vLLM-format output reports (vLLM's and the native
/// engine's): none, one, or two for an `init engine` line that gives its compilation.
pub fn phases(line: &str) -> Vec<PhaseTime> {
    use vllm::phase;
    let seconds_after = |text: &str, marker: &str| -> Option<f64> {
        let rest = &text[text.find(marker)? + marker.len()..];
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().ok()
    };
    let one = |phase: Phase, seconds: Option<f64>| {
        seconds
            .map(|seconds| PhaseTime { phase, seconds })
            .into_iter()
            .collect()
    };
    if let Some(at) = line.find(phase::WEIGHTS) {
        one(Phase::Weights, seconds_after(&line[at..], phase::WEIGHTS))
    } else if let Some(at) = line.find(phase::MODEL_LOADING) {
        one(
            Phase::ModelLoading,
            seconds_after(&line[at..], phase::MODEL_LOADING_SECONDS),
        )
    } else if let Some(at) = line.find(phase::COMPILE) {
        one(Phase::Compile, seconds_after(&line[at..], phase::COMPILE))
    } else if let Some(at) = line.find(phase::GRAPHS) {
        one(Phase::Graphs, seconds_after(&line[at..], phase::GRAPHS))
    } else if let Some(at) = line.find(phase::INIT_ENGINE) {
        let rest = &line[at..];
        let mut found: Vec<PhaseTime> = one(Phase::EngineInit, seconds_after(rest, phase::TOOK));
        if let Some(seconds) = seconds_after(rest, phase::COMPILATION) {
            found.push(PhaseTime {
                phase: Phase::Compile,
                seconds,
            });
        }
        found
    } else {
        Vec::new()
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
    fn reads_the_phases_of_a_start() {
        // The real vLLM 0.32 log: its weights and its engine's initialization.
        let log = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/vllm-logs/vllm-0.32-cpu-serve.log"
        ))
        .expect("the vLLM 0.32 sample log");
        let found: Vec<PhaseTime> = log.lines().flat_map(phases).collect();
        let at = |phase, seconds| PhaseTime { phase, seconds };
        assert_eq!(found, [at(Phase::Weights, 0.58), at(Phase::EngineInit, 2.58)]);
        // GPU lines, in the formats of vLLM's sources (`dialect::log::vllm::phase`),
        // as vLLM 0.11 and later print them.
        for (line, want) in [
            (
                "(EngineCore_DP0 pid=212) INFO 10-06 12:00:20 [gpu_model_runner.py:2602] Model loading took 14.2500 GiB and 20.312345 seconds",
                vec![at(Phase::ModelLoading, 20.312345)],
            ),
            (
                "Model loading took 55.22 GiB memory and 20.3s",
                vec![at(Phase::ModelLoading, 20.3)],
            ),
            (
                "(EngineCore_DP0 pid=212) INFO 10-06 12:00:29 [monitor.py:34] torch.compile takes 42.18 s in total",
                vec![at(Phase::Compile, 42.18)],
            ),
            (
                "(EngineCore_DP0 pid=212) INFO 10-06 12:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, took 0.31 GiB",
                vec![at(Phase::Graphs, 8.0)],
            ),
            (
                "(EngineCore pid=594) INFO 08-04 13:16:52 [core.py:306] init engine (profile, create kv cache, warmup model) took 60.86 s (compilation: 30.08 s)",
                vec![at(Phase::EngineInit, 60.86), at(Phase::Compile, 30.08)],
            ),
            ("INFO Application startup complete.", vec![]),
        ] {
            assert_eq!(phases(line), want, "{line}");
        }
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

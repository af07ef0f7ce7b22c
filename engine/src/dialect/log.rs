//! The lines engines log that sous writes or reads: vLLM's start-up capacity line and
//! periodic stats line (written by the native engine, read by `serve::logscan` and
//! `sous bench logs`), vLLM's log prefix and start-up lines, the capacity lines of
//! SGLang and TensorRT-LLM, and the out-of-memory messages every engine can print.
//!
//! Patterns are given as regular-expression text for the readers to compile (this
//! crate does not depend on `regex`); what a reader does with a match is its own
//! business. Real lines of vLLM 0.32 are in `tests/fixtures/vllm-logs/`.

/// vLLM's lines.
pub mod vllm {
    use std::fmt;

    /// The prefix of every line and the message after it: vLLM 0.33 `vllm/logger.py`
    /// `_FORMAT` (`%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`)
    /// with `_DATE_FORMAT` (`%m-%d %H:%M:%S`: no year), after the
    /// `(APIServer pid=N) ` that vLLM writes before every line of its processes; the V0
    /// engine wrote no `[`. Groups: `pid`, `mo`, `d`, `h`, `mi`, `s`, `src` (the file
    /// and line), `msg`.
    pub const LINE_PATTERN: &str = r"(?:\([A-Za-z_][\w.-]* pid=(?P<pid>\d+)\)\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<mo>\d{2})-(?P<d>\d{2}) (?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:[.,]\d+)?\s+\[?(?P<src>[^\]\s]+)\]\s?(?P<msg>.*)$";

    /// A message with vLLM's prefix, as `vllm/logger.py` writes it from the API server's
    /// process: `(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] message`; `at` is
    /// the local time (Python's `logging` formats `asctime` in local time) and `source`
    /// the file and line that logged it.
    pub fn prefixed(pid: u32, level: &str, at: chrono::NaiveDateTime, source: &str, message: &str) -> String {
        format!(
            "(APIServer pid={pid}) {level} {} [{source}] {message}",
            at.format("%m-%d %H:%M:%S")
        )
    }

    /// The start of a periodic stats message, up to the parts that vary by release:
    /// vLLM 0.33 `vllm/v1/metrics/loggers.py` `LoggingStatLogger.log` (and 0.10.2's
    /// single format string, and V0's `vllm/engine/metrics.py`). Groups: `prompt`,
    /// `gen`, `running`, `tail` (the `, Key: value` parts after `Running`).
    pub const STATS_PATTERN: &str = r"Avg prompt throughput: (?P<prompt>\d+(?:\.\d+)?) tokens/s, Avg generation throughput: (?P<gen>\d+(?:\.\d+)?) tokens/s, Running: (?P<running>\d+) reqs(?P<tail>.*)$";

    /// The one part of a stats message with commas inside (vLLM 0.33), at the start of
    /// the rest of a message.
    pub const KV_FETCH_PATTERN: &str =
        r"^KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting";

    /// Every stats message names this.
    pub const STATS_MARKER: &str = "Avg prompt throughput";
    /// The file that logs the stats (`[loggers.py:335]`).
    pub const STATS_SOURCE: &str = "loggers.py";
    /// How a stats message of one engine starts: `Engine 000: `.
    pub const ENGINE_PREFIX: &str = "Engine ";
    /// How a stats message aggregated over data-parallel engines starts, after the
    /// count: `2 Engines Aggregated: `.
    pub const AGGREGATED: &str = " Engines Aggregated";

    /// The keys of the parts of a stats message after `Running`, each `Key: value`.
    pub mod part {
        /// `Waiting: N reqs`.
        pub const WAITING: &str = "Waiting";
        /// V0's name of [`WAITING`].
        pub const PENDING: &str = "Pending";
        /// V0: `Swapped: N reqs`.
        pub const SWAPPED: &str = "Swapped";
        /// 0.33: `Deferred: N reqs`.
        pub const DEFERRED: &str = "Deferred";
        /// 0.33: `Corrupted: N reqs`.
        pub const CORRUPTED: &str = "Corrupted";
        /// `Preemptions: N`, only when not zero.
        pub const PREEMPTIONS: &str = "Preemptions";
        /// `Prefix cache hit rate: P%`, over the most recent 1000 requests
        /// (`CachingMetrics(max_recent_requests=1000)`, `vllm/v1/metrics/stats.py`).
        pub const PREFIX_CACHE_HIT_RATE: &str = "Prefix cache hit rate";
        /// 0.33: `External prefix cache hit rate: P%`.
        pub const EXTERNAL_PREFIX_CACHE_HIT_RATE: &str = "External prefix cache hit rate";
        /// 0.33: `MM cache hit rate: P%`.
        pub const MM_CACHE_HIT_RATE: &str = "MM cache hit rate";
        /// `GPU KV cache usage: P%`: the device word (`GPU`, `CPU`, `XPU`) before this;
        /// V0 names the GPU first and the CPU swap space second.
        pub const KV_CACHE_USAGE: &str = " KV cache usage";
    }

    /// The first line of each start of vLLM's API server: the non-default arguments
    /// (0.10 and later, `vllm/entrypoints/utils.py`), its version (0.10.2) and the
    /// listening address.
    pub const STARTUP_MESSAGES: &[&str] = &[
        "non-default args:",
        NATIVE_STARTING,
        "vLLM API server version",
        "Starting vLLM API server",
        "Starting vLLM server on",
    ];

    /// What sous's native engine logs once it listens (it is not vLLM, so it does not
    /// claim vLLM's own line).
    pub const NATIVE_STARTING: &str = "Starting vLLM-compatible API server on";

    /// One periodic stats line as vLLM 0.33 writes it for one engine
    /// (`LoggingStatLogger.log`): the parts joined by `", "`, the optional ones only when
    /// there is something to say.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StatsLine<'a> {
        /// The engine's index (`Engine 000`).
        pub engine: u32,
        /// Prompt tokens computed per second over the interval.
        pub prompt_tok_s: f64,
        /// Tokens generated per second over the interval.
        pub generation_tok_s: f64,
        /// Requests running.
        pub running: usize,
        /// Requests waiting.
        pub waiting: usize,
        /// Preemptions in the interval (0.33 resets the count at each line); the part is
        /// left out at 0.
        pub preemptions: u64,
        /// The device word: `GPU` for CUDA, else the device type upper-cased.
        pub device: &'a str,
        /// KV-cache usage, 0 to 1.
        pub kv_usage: f64,
        /// The prefix-cache hit rate, 0 to 1; the part is left out without one.
        pub prefix_hit_rate: Option<f64>,
    }

    impl fmt::Display for StatsLine<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "{ENGINE_PREFIX}{:03}: Avg prompt throughput: {:.1} tokens/s, Avg generation \
                 throughput: {:.1} tokens/s, Running: {} reqs, {}: {} reqs",
                self.engine,
                self.prompt_tok_s,
                self.generation_tok_s,
                self.running,
                part::WAITING,
                self.waiting
            )?;
            if self.preemptions > 0 {
                write!(f, ", {}: {}", part::PREEMPTIONS, self.preemptions)?;
            }
            write!(
                f,
                ", {}{}: {:.1}%",
                self.device,
                part::KV_CACHE_USAGE,
                self.kv_usage * 100.0
            )?;
            if let Some(rate) = self.prefix_hit_rate {
                write!(f, ", {}: {:.1}%", part::PREFIX_CACHE_HIT_RATE, rate * 100.0)?;
            }
            Ok(())
        }
    }

    /// The start-up phases vLLM logs with the seconds each took, in the order they
    /// come (the native engine logs the same lines for its own phases).
    pub mod phase {
        /// `Loading weights took 0.58 seconds` (`vllm/model_executor/model_loader/
        /// default_loader.py`; the real 0.32 log in `tests/fixtures/vllm-logs/` has it).
        pub const WEIGHTS: &str = "Loading weights took ";
        /// `Model loading took 14.2500 GiB and 20.312345 seconds`
        /// (`vllm/v1/worker/gpu_model_runner.py`, `load_model`; later releases write
        /// `55.22 GiB memory and 20.3s`, as the native engine does): the weights and the
        /// model's construction; the seconds follow [`MODEL_LOADING_SECONDS`].
        pub const MODEL_LOADING: &str = "Model loading took ";
        /// What comes before the seconds of [`MODEL_LOADING`].
        pub const MODEL_LOADING_SECONDS: &str = " and ";
        /// `torch.compile takes 42.18 s in total` (`vllm/compilation/monitor.py`).
        pub const COMPILE: &str = "torch.compile takes ";
        /// `Graph capturing finished in 18 secs, took 0.96 GiB`
        /// (`vllm/v1/worker/gpu_model_runner.py`, `capture_model`).
        pub const GRAPHS: &str = "Graph capturing finished in ";
        /// `init engine (profile, create kv cache, warmup model) took 2.58 seconds`
        /// (`vllm/v1/engine/core.py`, `_initialize_kv_caches`; some releases write `s`,
        /// later ones add `(compilation: 30.08 s)`): profiling, the KV cache's
        /// allocation and the warm-up, compilation and graph capture included.
        pub const INIT_ENGINE: &str = "init engine";
        /// What comes before the seconds of [`INIT_ENGINE`].
        pub const TOOK: &str = " took ";
        /// What comes before the compilation's seconds within [`INIT_ENGINE`]'s line.
        pub const COMPILATION: &str = "(compilation: ";
    }

    /// Marks the capacity line and comes before its token count.
    pub const KV_CACHE_SIZE: &str = "KV cache size:";
    /// Comes before the capacity line's concurrency (`22.75x`).
    pub const PER_REQUEST: &str = "per request:";

    /// The KV capacity line of vLLM 0.28 and later (0.33 `vllm/v1/core/kv_cache_utils.py`,
    /// logged once the cache is sized; before 0.28 the two halves were two lines):
    /// `GPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per
    /// request: 22.75x`, with the numbers written as Python's `{:,}` writes them.
    pub fn capacity_line(device: &str, tokens: usize, max_model_len: usize, max_concurrency: f64) -> String {
        format!(
            "{device} {KV_CACHE_SIZE} {} tokens, Maximum concurrency for {} tokens {PER_REQUEST} {max_concurrency:.2}x",
            thousands(tokens),
            thousands(max_model_len),
        )
    }

    /// An integer with `,` every three digits, as Python's `f"{n:,}"`.
    pub fn thousands(n: usize) -> String {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    }
}

/// SGLang 0.5.23's lines (`python/sglang/srt/managers/scheduler.py`).
pub mod sglang {
    /// Marks the capacity line and comes before its token count:
    /// `max_total_num_tokens=406385, chunked_prefill_size=8192, ...`.
    pub const MAX_TOTAL_NUM_TOKENS: &str = "max_total_num_tokens=";
}

/// TensorRT-LLM's lines (the C++ runtime's `[MemUsageChange]` log of the KV-cache
/// allocation, e.g. in NVIDIA/TensorRT-LLM#8961).
pub mod trtllm {
    /// Marks the capacity line: `[TensorRT-LLM][INFO] [MemUsageChange] Allocated 1.01
    /// GiB for max tokens in paged KV cache (8256).`
    pub const PAGED_KV_CACHE: &str = "max tokens in paged KV cache";
    /// Comes before the capacity line's token count.
    pub const PAGED_KV_CACHE_TOKENS: &str = "paged KV cache (";
}

/// Messages that mean "not enough memory" at start-up: vLLM 0.33's
/// (`vllm/v1/core/kv_cache_planning.py`: no memory for the cache blocks, or less than
/// one request of `max_model_len`; `vllm/v1/worker/utils.py`: less free memory than
/// `gpu_memory_utilization` asks), PyTorch's and CUDA's (`torch.OutOfMemoryError`,
/// `cudaErrorMemoryAllocation`, which SGLang and TensorRT-LLM print too) and the NVIDIA
/// driver's (`NV_ERR_NO_MEMORY`).
pub const OUT_OF_MEMORY: &[&str] = &[
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "No available memory for the cache blocks",
    "is larger than the available KV cache memory",
    "less than desired GPU memory utilization",
    "NV_ERR_NO_MEMORY",
    "cudaErrorMemoryAllocation",
];

#[cfg(test)]
mod tests {
    use super::vllm::*;

    /// A real vLLM 0.32 log (`tests/fixtures/vllm-logs/README.md` says where from).
    fn sample() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/vllm-logs/vllm-0.32-cpu-serve.log"
        );
        std::fs::read_to_string(path).expect("the vLLM 0.32 sample log")
    }

    /// The message of the sample's first line containing `marker`.
    fn message(log: &str, marker: &str) -> String {
        let line = log.lines().find(|l| l.contains(marker)).expect("a line");
        line[line.find("] ").expect("a prefix") + 2..].to_owned()
    }

    #[test]
    fn the_capacity_line_is_vllms() {
        let log = sample();
        assert_eq!(
            capacity_line("CPU", 46_592, 2048, 22.75),
            message(&log, KV_CACHE_SIZE)
        );
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_stats_line_is_vllms() {
        let log = sample();
        let line = StatsLine {
            engine: 0,
            prompt_tok_s: 79.4,
            generation_tok_s: 1.4,
            running: 1,
            waiting: 0,
            preemptions: 0,
            device: "CPU",
            kv_usage: 0.019,
            prefix_hit_rate: Some(0.0),
        };
        assert_eq!(line.to_string(), message(&log, STATS_MARKER));
        let busy = StatsLine {
            preemptions: 3,
            prefix_hit_rate: None,
            device: "GPU",
            ..line
        };
        assert!(
            busy.to_string()
                .ends_with("Waiting: 0 reqs, Preemptions: 3, GPU KV cache usage: 1.9%"),
            "{busy}"
        );
        assert!(STARTUP_MESSAGES.iter().any(|m| log.contains(m)));
    }

    #[test]
    fn the_prefix_is_vllms() {
        let log = sample();
        let real = log
            .lines()
            .find(|l| l.contains(STATS_MARKER))
            .expect("a stats line");
        let at = chrono::NaiveDate::from_ymd_opt(2025, 11, 29)
            .and_then(|d| d.and_hms_opt(23, 23, 43))
            .expect("time");
        let message = &real[real.find("] ").expect("prefix") + 2..];
        assert_eq!(prefixed(13398, "INFO", at, "loggers.py:335", message), real);
        assert_eq!(
            prefixed(7, "ERROR", at, "core.rs:554", "boom"),
            "(APIServer pid=7) ERROR 11-29 23:23:43 [core.rs:554] boom"
        );
    }
}

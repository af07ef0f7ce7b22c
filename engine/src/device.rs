//! The memory an engine starts against, and whether a recipe's memory fraction fits it
//! before anything is launched.
//!
//! A GPU's memory is what its driver reports (`cuMemGetInfo`: free and total); the
//! `sous` binary asks the driver and hands the numbers here, so that the rules are
//! tested without a GPU. The rules are the engines' own:
//!
//! - vLLM takes `--gpu-memory-utilization` of the device's *total* memory and refuses
//!   to start when less than that is free: `request_memory` in
//!   `vllm/v1/worker/utils.py` (vLLM 0.10 to 0.33) raises `Free memory on device
//!   cuda:0 (85.92/121.69 GiB) on startup is less than desired GPU memory utilization
//!   (0.92, 111.95 GiB)`, after the weights may already have been downloaded and the
//!   container pulled. The same check here runs before the launch.
//! - SGLang takes `--mem-fraction-static` of the memory *free* when it starts
//!   (`init_torch_distributed` returns `get_available_gpu_memory`,
//!   `python/sglang/srt/model_executor/model_runner.py`), and TensorRT-LLM its
//!   `free_gpu_memory_fraction` of what is free after the weights: both fit by
//!   construction, with a smaller KV cache when other processes hold memory.
//! - The native engine's fraction is of the host's memory (`MemTotal`), which must be
//!   available (`MemAvailable`).
//!
//! On unified memory (a DGX Spark's GB10) the GPU's free memory is the host's, less
//! what the OS holds: users report 101.3-102.2 GiB free of 121.69 GiB at boot, with the
//! page cache dropped (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks issue 47), so a
//! fraction of 0.87 can never start there; and the page cache left by a weight download
//! costs several GiB more. The page cache is reported beside the numbers, with the
//! command that drops it.

use serde::Serialize;

use crate::host::Meminfo;
use crate::recipe::EngineKind;
use crate::size::gib;

/// One GPU's memory, as its driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Its ordinal among the devices the driver lists (`cuda:N`).
    pub ordinal: u32,
    /// e.g. `NVIDIA GB10`.
    pub name: String,
    /// Free memory (`cuMemGetInfo`), bytes.
    pub free_bytes: u64,
    /// Total memory (`cuMemGetInfo`), bytes.
    pub total_bytes: u64,
    /// The device shares the host's memory (`CU_DEVICE_ATTRIBUTE_INTEGRATED`).
    pub unified: bool,
}

/// What an engine's memory fraction is a fraction of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FractionOf {
    /// The GPU's total memory, which must be free at the start (vLLM).
    DeviceTotal,
    /// The GPU's memory free at the start (SGLang, TensorRT-LLM): always fits.
    DeviceFree,
    /// The host's memory, which must be available (the native engine).
    HostTotal,
}

impl FractionOf {
    /// The engine's rule.
    pub fn of(kind: EngineKind) -> FractionOf {
        match kind {
            EngineKind::Vllm => FractionOf::DeviceTotal,
            EngineKind::Sglang | EngineKind::Trtllm => FractionOf::DeviceFree,
            EngineKind::Native => FractionOf::HostTotal,
        }
    }
}

/// The memory a fraction is checked against: one GPU's (the one with the least free
/// memory among those the engine uses) or the host's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pool {
    /// Whose memory, for messages: `this host's`, `cuda:0's (NVIDIA GB10, unified memory)`.
    pub whose: String,
    /// Total, bytes.
    pub total_bytes: u64,
    /// What can be had now (free GPU memory, or `MemAvailable`), bytes.
    pub available_bytes: u64,
    /// The host's page cache when it counts against this memory (the host's own, or a
    /// unified GPU's), bytes.
    pub page_cache_bytes: Option<u64>,
    /// A GPU's memory rather than the host's.
    pub device: bool,
}

impl Pool {
    /// The host's memory.
    pub fn host(meminfo: &Meminfo) -> Pool {
        Pool {
            whose: "this host's".into(),
            total_bytes: meminfo.total,
            available_bytes: meminfo.available,
            page_cache_bytes: Some(meminfo.cached),
            device: false,
        }
    }

    /// The GPU of `devices` with the least free memory (an engine spread over several
    /// GPUs starts only where each has its share), with the host's page cache when it
    /// shares the host's memory. `None` without devices.
    pub fn device(devices: &[DeviceMemory], host: Option<&Meminfo>) -> Option<Pool> {
        let d = devices.iter().min_by_key(|d| d.free_bytes)?;
        let unified = if d.unified { ", unified memory" } else { "" };
        Some(Pool {
            whose: format!("cuda:{}'s ({}{unified})", d.ordinal, d.name),
            total_bytes: d.total_bytes,
            available_bytes: d.free_bytes,
            page_cache_bytes: d.unified.then(|| host.map(|m| m.cached)).flatten(),
            device: true,
        })
    }

    /// What `fraction` asks for: `ceil(total × fraction)`, as vLLM's `request_memory`.
    pub fn asks(&self, fraction: f64) -> u64 {
        (self.total_bytes as f64 * fraction).ceil() as u64
    }

    /// Whether what `fraction` asks for can be had now.
    pub fn fits(&self, fraction: f64) -> bool {
        self.asks(fraction) <= self.available_bytes
    }

    /// `free` for a GPU, `available` for the host (`MemAvailable`).
    pub fn free_word(&self) -> &'static str {
        if self.device { "free" } else { "available" }
    }

    /// `121.69 GiB, 85.92 GiB free (page cache 20.00 GiB)`.
    pub fn describe(&self) -> String {
        let cache = self
            .page_cache_bytes
            .map_or(String::new(), |c| format!(" (page cache {})", gib(c)));
        format!(
            "{} {}, {} {}{cache}",
            self.whose,
            gib(self.total_bytes),
            gib(self.available_bytes),
            self.free_word()
        )
    }
}

/// What a recipe's fraction asks of the memory it starts against, for `sous plan`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preflight {
    /// The memory, as it is now.
    pub pool: Pool,
    /// The fraction checked: the recipe's, or the engine's default.
    pub fraction: f64,
    /// What it asks for, bytes.
    pub asks_bytes: u64,
    /// Whether that can be had now.
    pub fits: bool,
    /// The first of the recipe's `memory.oom_fallback` that fits when the fraction
    /// does not; `sous serve` starts there.
    pub fallback: Option<f64>,
}

impl Preflight {
    /// `fraction` (then `fallbacks`) against `pool`.
    pub fn check(pool: Pool, fraction: f64, fallbacks: &[f64]) -> Preflight {
        let fits = pool.fits(fraction);
        let fallback = if fits {
            None
        } else {
            fallbacks.iter().copied().find(|&f| pool.fits(f))
        };
        Preflight {
            asks_bytes: pool.asks(fraction),
            fits,
            fallback,
            fraction,
            pool,
        }
    }

    /// One sentence: `0.92 asks for 111.95 GiB of cuda:0's (...) 121.69 GiB, 85.92 GiB free: ...`.
    pub fn describe(&self) -> String {
        let verdict = match (self.fits, self.fallback) {
            (true, _) => "fits".to_owned(),
            (false, Some(f)) => {
                format!("does not fit; `sous serve` starts at {f} from `memory.oom_fallback`")
            }
            (false, None) => "does not fit, and no `memory.oom_fallback` value does".to_owned(),
        };
        format!(
            "{} asks for {} of {}: {verdict}",
            self.fraction,
            gib(self.asks_bytes),
            self.pool.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    fn bytes(g: f64) -> u64 {
        (g * GIB) as u64
    }

    /// The numbers of a real refusal on a DGX Spark, as vLLM printed them: `Free
    /// memory on device cuda:0 (85.92/121.69 GiB) on startup is less than desired GPU
    /// memory utilization (0.92, 111.95 GiB)`.
    #[test]
    fn a_spark_refusal_vllm_printed_is_refused_with_its_numbers() {
        let spark = DeviceMemory {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            free_bytes: bytes(85.92),
            total_bytes: bytes(121.69),
            unified: true,
        };
        let host = Meminfo {
            total: bytes(121.69),
            available: bytes(110.0),
            free: bytes(80.0),
            cached: bytes(25.0),
        };
        let pool = Pool::device(std::slice::from_ref(&spark), Some(&host)).expect("a pool");
        let check = Preflight::check(pool, 0.92, &[0.85, 0.7]);
        assert!(!check.fits);
        // vLLM's own figure for what 0.92 asks, to the hundredth of a GiB.
        assert_eq!(gib(check.asks_bytes), "111.95 GiB");
        assert_eq!(
            check.fallback,
            Some(0.7),
            "0.85 asks 103.44 GiB, more than is free"
        );
        assert_eq!(
            check.describe(),
            "0.92 asks for 111.95 GiB of cuda:0's (NVIDIA GB10, unified memory) 121.69 GiB, 85.92 GiB free (page cache 25.00 GiB): does not fit; `sous serve` starts at 0.7 from `memory.oom_fallback`"
        );
    }

    #[test]
    fn the_gpu_with_the_least_free_memory_is_the_one_checked() {
        let gpu = |ordinal, free| DeviceMemory {
            ordinal,
            name: "NVIDIA H100 80GB HBM3".into(),
            free_bytes: bytes(free),
            total_bytes: bytes(79.19),
            unified: false,
        };
        let pool = Pool::device(&[gpu(0, 78.0), gpu(1, 40.0)], None).expect("a pool");
        assert!(pool.whose.starts_with("cuda:1's"), "{}", pool.whose);
        assert_eq!(
            pool.page_cache_bytes, None,
            "a discrete GPU's memory is not the page cache's"
        );
        assert!(pool.fits(0.5) && !pool.fits(0.9));
        assert_eq!(Pool::device(&[], None), None);
        assert!(Preflight::check(pool, 0.5, &[]).fits);
    }

    #[test]
    fn each_engine_takes_its_fraction_of_its_own_memory() {
        assert_eq!(FractionOf::of(EngineKind::Vllm), FractionOf::DeviceTotal);
        assert_eq!(FractionOf::of(EngineKind::Sglang), FractionOf::DeviceFree);
        assert_eq!(FractionOf::of(EngineKind::Trtllm), FractionOf::DeviceFree);
        assert_eq!(FractionOf::of(EngineKind::Native), FractionOf::HostTotal);
    }
}

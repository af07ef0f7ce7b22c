//! `[memory]` of the raw recipe: the accelerator memory the engine may use, the KV
//! cache's budget, dtype and host tier, and the weights kept on the host. As the rest
//! of `file`, only what the TOML may say; the doc comments are the user documentation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// `[memory]`: accelerator memory and the KV cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    /// Fraction of the accelerator's memory the engine may use, in (0, 1]. vLLM: of
    /// total memory, weights and activations included (`--gpu-memory-utilization`);
    /// SGLang: weights and KV pool (`--mem-fraction-static`); TensorRT-LLM: of the
    /// memory left free after the weights (`free_gpu_memory_fraction`). Unset: the
    /// engine's default, which changes between releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<f64>,

    /// Values of `gpu_utilization` to fall back to, in order, when the engine dies of
    /// an out-of-memory error at start-up (e.g. `[0.85]`). Each must be below the one
    /// before it. Overriding `gpu_utilization` (`--set memory.gpu_utilization=0.85`)
    /// keeps only the fallbacks below the new value: the way to step down by hand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_fallback: Vec<f64>,

    /// Data type of the KV cache: `auto` (the model's), `fp8` (E4M3), `fp8_e4m3`,
    /// `fp8_e5m2`, `bfloat16`, `float16` or `nvfp4`. Engines and releases differ in
    /// which they accept; sous refuses the ones the recipe's engine does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<KvCacheDtype>,

    /// A fixed KV-cache budget per GPU instead of a fraction of memory: bytes, or a
    /// size with a unit (`14.5GiB`, `16GB`, `512MiB`). vLLM then ignores
    /// `gpu_utilization` (`--kv-cache-memory-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes: Option<ByteSize>,

    /// Host RAM the engine may use to offload the KV cache from the GPU, as a size
    /// (`100GiB`). vLLM: `--kv-offloading-size` (native backend); SGLang: hierarchical
    /// cache; TensorRT-LLM: `kv_cache_config.host_cache_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_offload_bytes: Option<ByteSize>,

    /// Weights the engine keeps in host memory rather than on the GPU, by tensor name
    /// (globs: `*` within a name part, `**` across parts): what an engine option such
    /// as vLLM's `--cpu-offload-gb` or a model's own offload switch (the Titan report's
    /// `VLLM_PLE_CPU_OFFLOAD=1`) moves off the GPU. sous moves nothing: `sous plan`
    /// counts these weights on the host side instead of the GPU's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_weights: Vec<String>,

    /// Host memory that must stay available while the engine starts and runs, as a
    /// size (`8GiB`). `sous serve` watches the host's available memory (`MemAvailable`)
    /// and stops the engine (SIGTERM, then SIGKILL after `server.stop_grace`) when it
    /// falls below this, then starts it again at the next `oom_fallback` value, as after
    /// an out-of-memory start. For unified memory (a DGX Spark), where an engine that
    /// overshoots its budget can wedge the whole machine. Unset: not watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_floor: Option<ByteSize>,

    /// Native engine only: how the token embedding and a float output projection
    /// (`lm_head`, or the embedding where they are tied) are held in memory. `auto`: as
    /// the other float weights. `q8_0`: llama.cpp's Q8_0, quantized at load (8 bits a
    /// value and an f16 scale per 32: 0.53× of bf16, and of what every decode step reads
    /// from it); checkpoints keep them in 16 bits even when their layers are NVFP4.
    /// Other engines hold them as the checkpoint does, and sous warns that it is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_dtype: Option<EmbeddingDtype>,
}

/// How the native engine holds embeddings (`memory.embedding_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EmbeddingDtype {
    /// As the other float weights.
    #[serde(rename = "auto")]
    Auto,
    /// llama.cpp's Q8_0: 8-bit integers, one f16 scale per 32 values.
    #[serde(rename = "q8_0")]
    Q8_0,
}

impl EmbeddingDtype {
    /// The recipe spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EmbeddingDtype::Auto => "auto",
            EmbeddingDtype::Q8_0 => "q8_0",
        }
    }
}

/// KV-cache data types, by meaning rather than by any one engine's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    /// The model's own data type.
    Auto,
    /// 8-bit floating point, E4M3 on NVIDIA GPUs.
    Fp8,
    /// 8-bit floating point, E4M3.
    Fp8E4m3,
    /// 8-bit floating point, E5M2.
    Fp8E5m2,
    /// bfloat16.
    Bfloat16,
    /// IEEE half precision.
    Float16,
    /// NVFP4 (4-bit, block-scaled).
    Nvfp4,
}

impl KvCacheDtype {
    /// The recipe spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8 => "fp8",
            KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            KvCacheDtype::Fp8E5m2 => "fp8_e5m2",
            KvCacheDtype::Bfloat16 => "bfloat16",
            KvCacheDtype::Float16 => "float16",
            KvCacheDtype::Nvfp4 => "nvfp4",
        }
    }

    /// Bytes per element of the cache (a half for the 4-bit types), not counting scales.
    pub fn element_bytes(self) -> Option<f64> {
        match self {
            KvCacheDtype::Auto => None,
            KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => Some(1.0),
            KvCacheDtype::Bfloat16 | KvCacheDtype::Float16 => Some(2.0),
            KvCacheDtype::Nvfp4 => Some(0.5),
        }
    }
}

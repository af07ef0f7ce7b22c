//! The raw recipe: exactly what a recipe TOML file may contain, nothing derived.
//!
//! Every field is optional here because a recipe may be split across an `extends`
//! chain, the `SOUS_*` environment and `--set` overrides; what must be present is
//! decided when the layers are merged and resolved (`resolve.rs`). The doc comments
//! on these types are the user documentation: `recipes/recipe.schema.json` and
//! `docs/recipe.md` are generated from them (`schema.rs`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// A sous recipe: one model, how to build it and how to serve it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "sous recipe")]
pub struct RecipeFile {
    /// Name of the deployment: it names the state directory and the instance that
    /// `sous serve --replace` looks for. Lower-case letters, digits, `.`, `_` and `-`.
    /// Defaults to the recipe's file name without `.toml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// One line saying what this recipe is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,

    /// A parent recipe, as a path relative to this file. This file's settings are laid
    /// over the parent's: tables merge key by key, arrays and values are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,

    /// Which model to serve and where its weights come from.
    #[serde(default, skip_serializing_if = "is_default")]
    pub model: ModelSection,

    /// An optional build step: quantize the model's weights before serving them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<QuantizeSection>,

    /// Which engine serves the model, and which release of it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub engine: EngineSection,

    /// How much accelerator memory the engine may take, and for what.
    #[serde(default, skip_serializing_if = "is_default")]
    pub memory: MemorySection,

    /// How requests are scheduled and answered: context length, batching, caching,
    /// speculative decoding, parallelism, parsers.
    #[serde(default, skip_serializing_if = "is_default")]
    pub serving: ServingSection,

    /// Where the OpenAI-compatible server listens and how it authenticates clients.
    #[serde(default, skip_serializing_if = "is_default")]
    pub server: ServerSection,

    /// Environment variables set for the engine process, verbatim
    /// (e.g. `VLLM_PLE_CPU_OFFLOAD = "1"`). vLLM's `VLLM_CPU_KVCACHE_SPACE` (whole GiB)
    /// is checked as vLLM parses it and counted by `sous plan` for its CPU backend.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,

    /// How `sous deploy render` runs the recipe elsewhere: Kubernetes, compose, systemd.
    /// `sous serve` ignores this section.
    #[serde(default, skip_serializing_if = "is_default")]
    pub deploy: DeploySection,
}

/// `[model]`: the weights to serve.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Hugging Face Hub repository id, `org/name` (e.g. `Qwen/Qwen3.8-27B`). With `path`
    /// it says where the weights in `path` come from; alone, the engine is given the
    /// repository id and the weights come from the Hub cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,

    /// Branch, tag or commit of `repo`. Default: `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,

    /// A local directory holding the weights (Hub layout: `config.json`, `*.safetensors`,
    /// tokenizer files). When set, the engine is given this path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,

    /// The model name clients send in requests and `/v1/models` reports. Default: what
    /// the engine calls it when given no name, the argument it is started with:
    /// `path` when set (as written), else the repository id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
}

/// `[quantize]`: turn the model's weights into NVFP4 before serving.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuantizeSection {
    /// Quantization scheme. `nvfp4a16`: FP4 weights, 16-bit activations (needs no
    /// calibration). `nvfp4`: FP4 weights and activations (W4A4, needs calibration data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<QuantScheme>,

    /// Checkpoint format. `compressed-tensors` (llm-compressor's; vLLM and SGLang load
    /// it) or `modelopt` (NVIDIA ModelOpt's; TensorRT-LLM, vLLM and SGLang load it).
    /// Default: `compressed-tensors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<QuantFormat>,

    /// Modules kept at their original precision, in addition to the ones the reference
    /// tools always keep (lm_head, embeddings, norms, routers). Exact names, or
    /// regular expressions prefixed with `re:` (e.g. `re:.*mlp\.gate$`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,

    /// Scheme `nvfp4` only: the text the native engine runs the model over to measure
    /// activation ranges. `builtin` (chapter I of *Alice's Adventures in Wonderland*,
    /// public domain) or a UTF-8 text file, relative to the recipe file that names it.
    /// Default: `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,

    /// Scheme `nvfp4` only: how the text becomes samples. `chat`: paragraphs longer than
    /// 200 characters, each a user message through the model's chat template, cut to
    /// `seq_len` tokens (llm-compressor's NVFP4 examples calibrate on chat data this way;
    /// an instruct model is served chat). `text`: the whole text tokenized without special
    /// tokens and cut into consecutive windows of exactly `seq_len` tokens (calibration on
    /// a plain corpus, for base models without a chat template). Default: `chat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_format: Option<CalibrationFormat>,

    /// Scheme `nvfp4` only: calibration samples (the first N paragraphs or windows).
    /// Default: 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub samples: Option<u32>,

    /// Scheme `nvfp4` only: longest calibration sample (`chat`), or the length of every
    /// window (`text`), in tokens. Default: 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub seq_len: Option<u32>,

    /// Where the quantization kernels run: `cpu`, or `cuda` / `cuda:N` (an NVIDIA GPU,
    /// through the driver and NVRTC). The checkpoint's bytes are the same on every
    /// device. Default: `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// How calibration text becomes samples (`quantize.calibration_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationFormat {
    /// Paragraphs, each a user message through the chat template.
    #[default]
    Chat,
    /// Consecutive windows of the plain text.
    Text,
}

impl CalibrationFormat {
    /// As a recipe or a flag writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CalibrationFormat::Chat => "chat",
            CalibrationFormat::Text => "text",
        }
    }
}

/// NVFP4 quantization schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuantScheme {
    /// FP4 (E2M1) weights with FP8 block scales and 16-bit activations.
    Nvfp4a16,
    /// FP4 weights and FP4 activations (W4A4).
    Nvfp4,
}

/// NVFP4 checkpoint formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum QuantFormat {
    /// compressed-tensors, as llm-compressor writes it.
    CompressedTensors,
    /// NVIDIA ModelOpt's format (`hf_quant_config.json`).
    Modelopt,
}

/// `[engine]`: what serves the model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// The engine: `vllm`, `sglang`, `trtllm` (TensorRT-LLM's `trtllm-serve`) or
    /// `native` (the engine built into sous, CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<EngineKind>,

    /// The engine's release, e.g. `0.27.1`. Flags that an engine renamed between
    /// releases are rendered for this one. Unset: the newest release sous knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Container image to run the engine in (e.g. `vllm/vllm-openai:v0.27.1`). Unset:
    /// the engine runs as a host process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// The engine's executable when it is not the usual one on `PATH` (`vllm`,
    /// `python3 -m sglang.launch_server`, `trtllm-serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,

    /// Escape hatch: arguments appended verbatim to the engine's command line, after
    /// everything sous renders. A flag that sets what a recipe field sets
    /// (`--gpu-memory-utilization`, `--max-model-len`, ...) is refused, naming the field;
    /// the rest is not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,

    /// Escape hatch for TensorRT-LLM: a table merged over the YAML options file sous
    /// writes for `trtllm-serve` (any `LlmArgs` field but those a recipe field sets,
    /// which are refused). Other engines refuse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_options: Option<serde_json::Map<String, serde_json::Value>>,

    /// Where `sous serve` runs the engine: `host` (a process on this machine, the
    /// default) or `docker` / `podman` (a container of `image`, with the GPUs, the Hub
    /// cache, the model directory and the port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,

    /// How many times `sous serve` restarts an engine that crashed after it was ready,
    /// within 10 minutes, before giving up with the engine's exit code. Default: 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
}

/// Where an engine process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// A process on this machine.
    Host,
    /// A Docker container of `engine.image`.
    Docker,
    /// A Podman container of `engine.image`.
    Podman,
}

/// The serving engines sous knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM (`vllm serve`).
    Vllm,
    /// SGLang (`python3 -m sglang.launch_server`).
    Sglang,
    /// TensorRT-LLM (`trtllm-serve`).
    Trtllm,
    /// The engine built into sous (CPU, run as a `sous` process).
    Native,
}

impl EngineKind {
    /// The name used in recipes and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Trtllm => "trtllm",
            EngineKind::Native => "native",
        }
    }

    /// The name people call the engine by.
    pub fn display_name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
            EngineKind::Trtllm => "TensorRT-LLM",
            EngineKind::Native => "the native engine",
        }
    }
}

impl Runtime {
    /// The recipe spelling, which is also the container CLI's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Host => "host",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// `[serving]`: scheduling, caching and the OpenAI-API features.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServingSection {
    /// Longest sequence (prompt plus output) in tokens. Unset: the model's own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,

    /// Most requests decoded together; more wait in the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,

    /// Most tokens scheduled in one engine step (the prefill chunk size with chunked
    /// prefill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batched_tokens: Option<u64>,

    /// Reuse the KV cache of prompt prefixes seen before. Rendered explicitly either
    /// way when set: engine defaults differ by release and by model (hybrid models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<bool>,

    /// Split long prompts into chunks scheduled alongside decoding requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunked_prefill: Option<bool>,

    /// Speculative decoding, e.g. `{ method = "mtp", tokens = 2 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeSection>,

    /// Tensor-parallel size: GPUs one copy of the model is split across.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<u32>,

    /// Pipeline-parallel size: stages the layers are split into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_parallel: Option<u32>,

    /// Data-parallel size: copies of the model behind one endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<u32>,

    /// Spread MoE experts across the data- or tensor-parallel GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_parallel: Option<bool>,

    /// Parser that separates the model's reasoning from its answer (e.g. `qwen3`).
    /// Names as vLLM spells them; sous translates for other engines where it knows how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_parser: Option<String>,

    /// Parser that extracts tool calls from the model's output (e.g. `qwen3_coder`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_parser: Option<String>,

    /// Let the model decide when to call a tool (`tool_choice: "auto"`). Needs
    /// `tool_call_parser`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_tool_choice: Option<bool>,

    /// Run Python code shipped with the model repository (custom architectures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_remote_code: Option<bool>,

    /// Data type of weights and activations: `auto`, `bfloat16`, `float16` or `float32`.
    /// The native engine computes in f32 (`auto`, `float32`) or in bf16 (`bfloat16`:
    /// bf16 weights and product inputs, f32 accumulation); it refuses `float16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<ModelDtype>,
}

/// `[serving.speculative]`: draft tokens verified by the target model in one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeSection {
    /// `mtp` (the checkpoint's own multi-token-prediction head), a model-specific MTP
    /// head as vLLM names it (`qwen3_next_mtp`, `deepseek_mtp`, ...), `eagle`, `eagle3`,
    /// `draft_model` (these three need `model`) or `ngram` (prompt lookup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,

    /// Tokens drafted per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u32>,

    /// The draft model (Hub id or path) for `eagle`, `eagle3` and `draft_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,

    /// `ngram`: shortest n-gram to look up in the prompt. Default: `prompt_lookup_max`,
    /// or 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup_min: Option<u32>,

    /// `ngram`: longest n-gram to look up in the prompt. Default: `prompt_lookup_min`,
    /// or 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup_max: Option<u32>,
}

/// Model compute data types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelDtype {
    /// The checkpoint's own type.
    Auto,
    /// bfloat16.
    Bfloat16,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision.
    Float32,
}

impl ModelDtype {
    /// The spelling shared by vLLM, SGLang and the recipe.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelDtype::Auto => "auto",
            ModelDtype::Bfloat16 => "bfloat16",
            ModelDtype::Float16 => "float16",
            ModelDtype::Float32 => "float32",
        }
    }
}

/// `[server]`: the HTTP endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address to listen on. Default: `0.0.0.0` (all interfaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,

    /// How long the engine may take to become ready (`/health` answering 200) before
    /// `sous serve` gives up: `90s`, `30m`. Default: `30m` (a 27B model takes minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<String>,

    /// How long an engine may take to stop after SIGTERM before it is killed: `30s`.
    /// Default: `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_grace: Option<String>,

    /// TCP port. Default: 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,

    /// Name of an environment variable holding the API key clients must send
    /// (`Authorization: Bearer ...`). The key itself never appears in a recipe,
    /// a rendered command line or a log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

/// `[deploy]`: what `sous deploy render` needs beyond the recipe to run it on
/// Kubernetes, with compose or under systemd. Sizes and memory are Kubernetes
/// quantities (`120Gi`, `64Gi`, `500M`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploySection {
    /// Name of the Kubernetes objects, compose service and systemd unit. Default: the
    /// recipe's name with `.` and `_` turned into `-` (a DNS-1123 label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Kubernetes namespace of every object. Unset: none is written, and the namespace
    /// comes from `kubectl apply -n`, the kustomization or the GitOps tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Identical instances behind one Service (compose: one service per instance,
    /// each with its own GPUs and port). Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,

    /// GPUs one node offers. A recipe whose parallelism (tensor × pipeline × data)
    /// needs more is deployed across nodes as a LeaderWorkerSet. Unset: one node
    /// holds the whole instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,

    /// The sous image the init containers run `sous pull` and `sous quantize` in (and
    /// the native engine's container). Default: `sous:VERSION`, the tag the
    /// repository's `Dockerfile` is built with in the README.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sous_image: Option<String>,

    /// `runtimeClassName` of the pods, e.g. `nvidia` on K3s, where GPU pods need it
    /// unless the node's default runtime was changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,

    /// Node labels the pods must run on (`nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<TolerationSection>,

    /// Memory the engine container requests (scheduling), e.g. `64Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_request: Option<String>,

    /// Memory limit of the engine container, e.g. `120Gi`. On unified-memory machines
    /// (DGX Spark, GB10) CUDA allocations may not be counted against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,

    /// Name of the engine's container in the pod (what `kubectl logs -c` takes).
    /// Default: `engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,

    /// The engine container's start-up probe. Default: every `10s`, as many failures as
    /// cover `server.startup_timeout`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub startup_probe: StartupProbeSection,

    /// Size of the in-memory `/dev/shm` the engine gets (NCCL, tensor parallelism).
    /// Default: `2Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,

    /// How long the first start may take to download (and quantize) the model, on top
    /// of `server.startup_timeout`: sets the rollout's `progressDeadlineSeconds`. `30m`,
    /// `2h`. Default: `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_timeout: Option<String>,

    /// Also render a Prometheus Operator `ServiceMonitor` that scrapes `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<bool>,

    /// What sits in front of the replicas: a prefix-cache-aware router, or nothing.
    #[serde(default, skip_serializing_if = "is_default")]
    pub router: RouterSection,

    /// The volume the model, the Hugging Face cache, the quantized checkpoint and the
    /// engine's compile cache live on.
    #[serde(default, skip_serializing_if = "is_default")]
    pub storage: StorageSection,

    /// An existing claim that already holds a `model.path` model without `model.repo`,
    /// mounted read-only at `model.path` (sous cannot fill a volume it has no source
    /// for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_claim: Option<String>,

    /// The Kubernetes Secret the pods read `HF_TOKEN` (optional) and the API key of
    /// `server.api_key_env` from, each under its variable's name as the key. No secret
    /// value is ever written into a rendering. Default: `<deploy.name>-secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,

    /// Extra labels on every object and pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Extra annotations on every object and pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `[deploy.storage]`: the model cache volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    /// Size of the claim sous creates, e.g. `100Gi`. Default: the model's files on
    /// disk or on the Hub (twice that with `[quantize]`), plus a quarter for the
    /// engine's caches, rounded up to a GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,

    /// Storage class of the claim. Unset: the cluster's default (`local-path` on K3s,
    /// which deletes the data with the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,

    /// Use this existing claim instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<String>,

    /// Access mode of the claim sous creates: `ReadWriteOnce` (default: every replica
    /// on one node) or `ReadWriteMany` (replicas on several nodes share it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
}

/// `[deploy.router]`: the router in front of the replicas. sous renders an existing
/// router (vllm-project/router's `vllm-router`, sgl-project's `sglang-router`, both on
/// PyPI); it never routes itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouterSection {
    /// `vllm-router`, `sglang-router` or `none` (one Service, which balances by
    /// connection). Default: `none` for one replica; for more, the engine's own router
    /// (`sglang-router` for SGLang, `vllm-router` otherwise), because behind a plain
    /// Service a conversation's next turn lands on another replica, whose prefix cache
    /// has never seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RouterKind>,

    /// How a request picks its replica. Default: `cache_aware` (the replica whose
    /// recent prompts share the longest prefix with it, unless the load is uneven).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<RouterPolicy>,

    /// The router's release, as on PyPI. Default: `0.1.17` (`vllm-router`), `0.3.2`
    /// (`sglang-router`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// The image the router runs in (Kubernetes, compose). Default:
    /// `vllm-router:VERSION` or `sglang-router:VERSION`, built from the repository's
    /// `docker/router.Dockerfile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,

    /// `cache_aware`: the share of a prompt (0..1) that must match a replica's cache
    /// for it to win. Unset: the router's default (0.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_threshold: Option<f64>,

    /// `cache_aware`: requests of difference between the busiest and the idlest replica
    /// above which load wins over cache. Unset: the router's default (64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_abs_threshold: Option<u32>,

    /// `cache_aware`: ratio of the busiest to the idlest replica's load above which load
    /// wins over cache (with `balance_abs_threshold`). Unset: the router's default (1.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_rel_threshold: Option<f64>,
}

/// The routers sous renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RouterKind {
    /// No router: the replicas behind one Service.
    None,
    /// vLLM's router (vllm-project/router, `vllm-router` on PyPI).
    VllmRouter,
    /// SGLang's router (sgl-project/sglang `sgl-router`, `sglang-router` on PyPI).
    SglangRouter,
}

impl RouterKind {
    /// The spelling in recipes, and the PyPI package.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterKind::None => "none",
            RouterKind::VllmRouter => "vllm-router",
            RouterKind::SglangRouter => "sglang-router",
        }
    }
}

/// Routing policies, as both routers spell them (`--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouterPolicy {
    /// The replica with the longest shared prefix, unless the load is uneven.
    CacheAware,
    /// A hash of the session (vllm-router only).
    ConsistentHash,
    /// Each replica in turn.
    RoundRobin,
    /// The less loaded of two replicas drawn at random.
    PowerOfTwo,
    /// A replica drawn at random.
    Random,
}

impl RouterPolicy {
    /// The spelling on the routers' command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterPolicy::CacheAware => "cache_aware",
            RouterPolicy::ConsistentHash => "consistent_hash",
            RouterPolicy::RoundRobin => "round_robin",
            RouterPolicy::PowerOfTwo => "power_of_two",
            RouterPolicy::Random => "random",
        }
    }
}

/// `[deploy.startup_probe]`: how Kubernetes waits for a loading engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartupProbeSection {
    /// Time between probes: `10s`, `20s`. Default: `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,

    /// Failed probes before the pod is restarted. Default: as many as cover
    /// `server.startup_timeout` (180 for the default 30 minutes at `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
}

/// Access modes of a volume claim, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    /// Mounted read-write by the pods of one node.
    ReadWriteOnce,
    /// Mounted read-write by pods on many nodes.
    ReadWriteMany,
}

impl AccessMode {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}

/// A Kubernetes toleration: `{ key = "nvidia.com/gpu", operator = "Exists", effect =
/// "NoSchedule" }`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TolerationSection {
    /// The taint's key; unset with `operator = "Exists"` tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// The taint's value, with `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

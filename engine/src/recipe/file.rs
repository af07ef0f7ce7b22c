//! The raw recipe: exactly what a recipe TOML file may contain, nothing derived.
//!
//! Every field is optional here because a recipe may be split across an `extends`
//! chain, the `SOUS_*` environment and `--set` overrides; what must be present is
//! decided when the layers are merged and resolved (`resolve.rs`). The doc comments
//! on these types are the user documentation: `recipes/recipe.schema.json` and
//! `docs/recipe.md` are generated from them (`schema.rs`).
//!
//! This file holds the recipe as a whole and its `[model]`, `[quantize]` and `[engine]`
//! sections; `memory`, `serving` (with `[server]`) and `deploy` hold the others.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod deploy;
mod memory;
mod serving;

pub use deploy::{
    AccessMode, DeploySection, RouterKind, RouterPolicy, RouterSection, StartupProbeSection, StorageSection,
    TolerationSection,
};
pub use memory::{EmbeddingDtype, KvCacheDtype, MemorySection};
pub use serving::{ModelDtype, ServerSection, ServingSection, SpeculativeSection};

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

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

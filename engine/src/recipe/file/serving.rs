//! `[serving]` and `[server]` of the raw recipe: scheduling, caching, the model's
//! compute dtype, speculative decoding and the OpenAI-API features, and where and how
//! the server listens. As the rest of `file`, only what the TOML may say; the doc
//! comments are the user documentation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

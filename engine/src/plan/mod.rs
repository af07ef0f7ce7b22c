//! `sous plan`'s arithmetic: whether a recipe fits a machine, the KV cache its engine
//! will size at start-up (tokens and concurrency, as the engine logs them), and a
//! ceiling on single-stream decode speed, from the model's `config.json` and weight
//! sizes, without a GPU and without the weights.
//!
//! - `shape`: the layers of a `config.json`.
//! - `kv`: vLLM's cache layout (groups, hybrid block alignment, blocks, concurrency).
//! - `hardware`: the machines, from `recipes/hardware.toml`.
//! - `vllm`, `native`, `pool`: each engine's KV budget and capacity.
//! - `fit`: whether the weights, the cache and the engine's own memory fit the machine.
//!
//! This file holds the plan's types and [`plan`], which picks the engine's rule and adds
//! the checks and the decode ceiling every engine shares.
//!
//! The native engine's capacity is its own start-up code ([`crate::native::capacity`]),
//! so the plan and the log line cannot disagree. SGLang and TensorRT-LLM size a pool of
//! token slots by their own fractions (`pool`); their hybrid and sliding-window pools
//! are not modelled, and a plan for such a model says so.

mod fit;
pub mod hardware;
pub mod kv;
mod native;
mod pool;
pub mod shape;
mod vllm;

use serde::Serialize;

pub use hardware::{Hardware, HardwareError};
pub use pool::{SGLANG_ASSUMED_FRACTION, TRTLLM_DEFAULT_FREE_FRACTION, TRTLLM_TOKENS_PER_BLOCK};
pub use shape::{Layer, Shape, ShapeError};
pub use vllm::{VLLM_CPU_DEFAULT_KV, VLLM_DEFAULT_BATCHED_TOKENS, VLLM_DEFAULT_MAX_SEQS};

use crate::launch::RenderError;
use crate::native::KvSettings;
use crate::recipe::{EngineKind, Recipe};

/// The share of a bf16 checkpoint's bytes its NVFP4 weights take (FP4 values and FP8
/// scales for every 16; the layers the quantizer keeps stay 16-bit): what the plan's
/// advice assumes before the quantizer's own layout is asked (`sous plan --set
/// quantize.scheme=nvfp4a16` counts it exactly).
pub const NVFP4_SHARE: f64 = 0.28;
/// What sous sets aside for CUDA graphs and the CUDA context when it estimates a GPU
/// budget: vLLM captures graphs for up to 512 batch sizes and logs their memory
/// ("Graph capturing finished in N secs, took X GiB"), typically 0.5 to 1.5 GiB.
pub const CUDA_GRAPHS_ESTIMATE: u64 = 1 << 30;

/// The model's side of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// From `config.json`.
    pub shape: Shape,
    /// Bytes of the weights the engine loads (after a planned quantization).
    pub weight_bytes: u64,
    /// Bytes of the routed experts among them (MoE), for the bytes read per token.
    pub expert_bytes: u64,
    /// The native engine's KV bytes per token (its own rule), when it can serve the model.
    pub native_kv_per_token: Option<u64>,
    /// The native engine's linear-attention state per running sequence (hybrid models;
    /// 0 otherwise).
    pub native_state_per_sequence: u64,
    /// Bytes of weights the engine keeps in host memory (`memory.host_weights`), not
    /// among `weight_bytes`.
    pub host_weight_bytes: u64,
}

/// Why a plan could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// An engine whose memory rules sous does not model for this model.
    #[error("sous cannot plan for {0} yet")]
    Engine(&'static str),
    /// A KV dtype without a known size.
    #[error("`memory.kv_cache_dtype` {0} has no size sous knows")]
    KvDtype(String),
    /// The native engine's budget could not be computed.
    #[error("{0}")]
    Native(String),
    /// The engine would not read the recipe's memory settings as written.
    #[error(transparent)]
    Recipe(#[from] RenderError),
}

impl crate::diagnose::Diagnose for PlanError {
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            PlanError::Engine(_) => {
                Some("plan the recipe with `--set engine.kind=vllm` for vLLM's figures".into())
            }
            PlanError::Recipe(e) => e.hint(),
            _ => None,
        }
    }
}

/// Where the KV budget comes from, line by line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    /// Bytes the cache gets.
    pub kv_bytes: u64,
    /// Whether the figure is the recipe's own (`kv_cache_bytes`) rather than an estimate.
    pub exact: bool,
    /// The arithmetic, one step a line.
    pub steps: Vec<String>,
}

/// What must be held in one GPU's memory (or the host's) and is more than there is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shortfall {
    /// What is held, part by part, in bytes: the weights per GPU, the KV budget, the
    /// engine's own memory.
    pub parts: Vec<Part>,
    /// Their sum.
    pub needed_bytes: u64,
    /// The memory there is.
    pub memory_bytes: u64,
}

/// One part of a [`Shortfall`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    /// What it is.
    pub what: String,
    /// Bytes.
    pub bytes: u64,
    /// Whether the figure is an estimate.
    pub estimated: bool,
}

/// A plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The engine planned for.
    pub engine: String,
    /// The machine.
    pub hardware: String,
    /// Its memory per GPU, bytes.
    pub memory_bytes: u64,
    /// Weights per GPU, bytes.
    pub weight_bytes: u64,
    /// The KV budget per GPU.
    pub budget: Budget,
    /// Tokens of KV cache, as the engine's start-up line will say.
    pub kv_tokens: u64,
    /// Requests of `max_model_len` tokens at once, as the engine will say.
    pub max_concurrency: f64,
    /// Tokens of context the cache holds at full concurrency (`max_concurrency ×
    /// max_model_len`), which counts what sliding windows and fixed states leave free.
    pub context_tokens: u64,
    /// How the cache is laid out, one step a line.
    pub layout: Vec<String>,
    /// `serving.max_model_len` (or the model's limit).
    pub max_model_len: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// KV bytes per token per growing layer.
    pub bytes_per_token_per_layer: u64,
    /// Layers whose cache grows with the context, of all layers.
    pub growing_layers: usize,
    /// All decoder layers.
    pub layers: usize,
    /// Whether the weights and a fixed KV budget fit the memory and one request of
    /// `max_model_len` fits the cache.
    pub fits: bool,
    /// What does not fit the memory, when something does not.
    pub shortfall: Option<Shortfall>,
    /// What to do, most useful first.
    pub advice: Vec<String>,
    /// What the field reports learned that applies here.
    pub warnings: Vec<String>,
    /// A ceiling on single-stream decode, tokens/s: bandwidth over the bytes read per
    /// token (active weights plus the KV of a full-length context). An upper bound.
    pub decode_ceiling_tok_s: Option<f64>,
    /// The same ceiling with the recipe's speculative decoding, if every drafted token
    /// were accepted (`tokens + 1` per step); measured acceptance lengths are lower
    /// (2.3 to 2.6 of 3 in the DGX Spark report).
    pub decode_ceiling_speculative_tok_s: Option<f64>,
    /// Weights kept in host memory (`memory.host_weights`), bytes; absent from the
    /// JSON when none are.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_weight_bytes: u64,
    /// The second tier of the KV cache, in host memory (`memory.kv_offload_bytes`);
    /// absent from the JSON without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_tier: Option<HostTier>,
}

/// The KV cache's second tier: blocks the engine moves to host memory when the GPU's
/// cache evicts them, and loads back when a prompt's prefix is found there instead of
/// computing it again. Requests run from the GPU's cache; the host tier holds prefixes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostTier {
    /// Host memory the engine gets for it, per instance (`memory.kv_offload_bytes`).
    pub kv_bytes: u64,
    /// Tokens it holds, at the GPU cache's bytes per token (the engines keep the
    /// GPU's block layout there).
    pub kv_tokens: u64,
    /// Bytes of KV of one request of `max_model_len` tokens: what loading its prefix
    /// back moves.
    pub request_bytes: u64,
    /// The machine's host memory per instance, when known.
    pub host_memory: Option<u64>,
}

/// Plans `recipe` for `model` on `hardware`.
pub fn plan(recipe: &Recipe, model: &Model, hardware: &Hardware) -> Result<Plan, PlanError> {
    plan_with(recipe, &KvSettings::from_recipe(recipe), model, hardware)
}

/// [`plan`], with the native engine's KV settings already resolved (`sous serve` has
/// them from the engine's [`Settings`](crate::native::Settings), which it resolves once);
/// the plans of other engines do not read them.
pub fn plan_with(
    recipe: &Recipe,
    native_kv: &KvSettings,
    model: &Model,
    hardware: &Hardware,
) -> Result<Plan, PlanError> {
    let max_model_len = recipe
        .serving
        .max_model_len
        .or(model.shape.max_position_embeddings)
        .unwrap_or(4096);
    // What the engine will read, as `sous serve` renders it: the same settings.
    let memory = crate::launch::memory::resolve(recipe)?;
    let (mut plan, overhead) = match (recipe.engine.kind, &memory) {
        (EngineKind::Vllm, Some(memory)) => vllm::vllm(recipe, memory, model, hardware, max_model_len)?,
        (EngineKind::Sglang | EngineKind::Trtllm, Some(memory)) => {
            pool::pool(recipe, memory, model, hardware, max_model_len)?
        }
        _ => (
            native::native(native_kv, model, hardware, max_model_len)?,
            Vec::new(),
        ),
    };
    fit::check_memory(&mut plan, overhead, recipe, model, hardware);
    if model.weight_bytes == 0 {
        plan.warnings.push(
            "no *.safetensors beside config.json: the weights are not counted, so only a KV budget the recipe fixes (`memory.kv_cache_bytes`) is exact".into(),
        );
    }
    plan.warnings.extend(warnings(recipe, hardware));
    fit::host_side(&mut plan, recipe, model, hardware, max_model_len);
    if let Some(bandwidth) = hardware.bandwidth_gbs
        && model.weight_bytes > 0
    {
        let (n, k) = model.shape.experts.unwrap_or((1, 1));
        let active =
            model.weight_bytes - model.expert_bytes + model.expert_bytes * k as u64 / n.max(1) as u64;
        let kv = plan.bytes_per_token_per_layer * plan.growing_layers as u64 * max_model_len;
        let tp = recipe.serving.tensor_parallel.unwrap_or(1) as f64;
        let ceiling = bandwidth * 1e9 * tp / (active + kv) as f64;
        plan.decode_ceiling_tok_s = Some(ceiling);
        if let Some(tokens) = recipe.serving.speculative.as_ref().and_then(|s| s.tokens) {
            plan.decode_ceiling_speculative_tok_s = Some(ceiling * f64::from(tokens + 1));
        }
    }
    Ok(plan)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Bytes of one element of the model's compute dtype (`serving.dtype` over the
/// checkpoint's) and of the KV cache (`memory.kv_cache_dtype`, `auto` being the model's).
fn element_bytes(recipe: &Recipe, shape: &Shape) -> Result<(f64, f64), PlanError> {
    let dtype = match recipe.dtype() {
        None | Some(crate::recipe::ModelDtype::Auto) => shape.dtype.as_str(),
        Some(d) => d.as_str(),
    };
    let model = shape::dtype_bytes(dtype).unwrap_or(2.0);
    let kv = match recipe.memory.kv_cache_dtype {
        None | Some(crate::recipe::KvCacheDtype::Auto) => model,
        Some(d) => d
            .element_bytes()
            .ok_or_else(|| PlanError::KvDtype(d.as_str().into()))?,
    };
    Ok((model, kv))
}

fn warnings(recipe: &Recipe, hardware: &Hardware) -> Vec<String> {
    let mut w = Vec::new();
    if hardware.unified && !hardware.cpu {
        w.push(format!(
            "{} shares its memory with the CPU and the OS: a fraction of it is a fraction of everything, vLLM refuses to start when that fraction is more than is free at start-up (the OS and every other process count), and a pod's memory limit may not count CUDA allocations",
            hardware.description
        ));
    }
    if recipe.quantize.is_some() && !hardware.native_fp4 && !hardware.cpu {
        w.push(format!(
            "{} has no FP4 tensor cores: NVFP4 weights run a slower emulated path there",
            hardware.description
        ));
    }
    w
}

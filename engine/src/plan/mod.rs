//! `sous plan`'s arithmetic: whether a recipe fits a machine, the KV cache its engine
//! will size at start-up (tokens and concurrency, as the engine logs them), and a
//! ceiling on single-stream decode speed, from the model's `config.json` and weight
//! sizes, without a GPU and without the weights.
//!
//! - `shape`: the layers of a `config.json`.
//! - `kv`: vLLM's cache layout (groups, hybrid block alignment, blocks, concurrency).
//! - `hardware`: the machines, from `recipes/hardware.toml`.
//!
//! The native engine's capacity is its own start-up code ([`crate::native::capacity`]),
//! so the plan and the log line cannot disagree. SGLang and TensorRT-LLM size a pool of
//! token slots by their own fractions (`pool`); their hybrid and sliding-window pools
//! are not modelled, and a plan for such a model says so.

pub mod hardware;
pub mod kv;
pub mod shape;

use serde::Serialize;

pub use hardware::{Hardware, HardwareError};
pub use shape::{Layer, Shape, ShapeError};

use crate::launch::RenderError;
use crate::launch::memory::{EngineMemory, VLLM_CPU_KV_SPACE};
use crate::native::KvSettings;
use crate::recipe::{EngineKind, Recipe};
use crate::size::gib;

/// vLLM's CPU backend's KV space up to 0.12 when `VLLM_CPU_KVCACHE_SPACE` is unset
/// (`vllm/platforms/cpu.py` of 0.10.2: 4 GiB).
pub const VLLM_CPU_DEFAULT_KV: u64 = 4 << 30;
/// The share of a bf16 checkpoint's bytes its NVFP4 weights take (FP4 values and FP8
/// scales for every 16; the layers the quantizer keeps stay 16-bit): what the plan's
/// advice assumes before the quantizer's own layout is asked (`sous plan --set
/// quantize.scheme=nvfp4a16` counts it exactly).
pub const NVFP4_SHARE: f64 = 0.28;
/// vLLM's default `--max-num-batched-tokens` for online serving on GPUs (chunked
/// prefill), and its default `--max-num-seqs` (`vllm/engine/arg_utils.py`).
pub const VLLM_DEFAULT_BATCHED_TOKENS: u64 = 8192;
/// See [`VLLM_DEFAULT_BATCHED_TOKENS`].
pub const VLLM_DEFAULT_MAX_SEQS: u64 = 256;
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
        (EngineKind::Vllm, Some(memory)) => vllm(recipe, memory, model, hardware, max_model_len)?,
        (EngineKind::Sglang | EngineKind::Trtllm, Some(memory)) => {
            pool(recipe, memory, model, hardware, max_model_len)?
        }
        _ => (native(native_kv, model, hardware, max_model_len)?, Vec::new()),
    };
    check_memory(&mut plan, overhead, recipe, model, hardware);
    if model.weight_bytes == 0 {
        plan.warnings.push(
            "no *.safetensors beside config.json: the weights are not counted, so only a KV budget the recipe fixes (`memory.kv_cache_bytes`) is exact".into(),
        );
    }
    plan.warnings.extend(warnings(recipe, hardware));
    host_side(&mut plan, recipe, model, hardware, max_model_len);
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

/// What the engine keeps in host memory: the cache's second tier
/// (`memory.kv_offload_bytes`, which the native engine refuses) and the weights of
/// `memory.host_weights`, checked against the machine's host memory when known.
fn host_side(plan: &mut Plan, recipe: &Recipe, model: &Model, hardware: &Hardware, max_model_len: u64) {
    plan.host_weight_bytes = model.host_weight_bytes;
    let offload = recipe
        .memory
        .kv_offload_bytes
        .filter(|_| recipe.engine.kind != EngineKind::Native);
    if let Some(offload) = offload {
        host_tier(plan, offload, hardware, max_model_len);
    }
    let needed = offload.unwrap_or(0) + model.host_weight_bytes;
    if needed == 0 {
        return;
    }
    let what = match (offload.is_some(), model.host_weight_bytes > 0) {
        (true, true) => "the host tier and the host-side weights ask",
        (true, false) => "the host tier asks",
        _ => "the host-side weights ask",
    };
    match hardware.host_memory {
        Some(host) if needed > host => {
            plan.fits = false;
            plan.advice.insert(
                0,
                format!(
                    "{what} {} of host memory per instance, more than the machine's {}: lower `memory.kv_offload_bytes` or keep fewer weights on the host (the engine's own memory comes on top)",
                    gib(needed),
                    gib(host)
                ),
            );
        }
        Some(_) => {}
        None => plan.warnings.push(format!(
            "{what} {} per instance, not checked against the machine's memory: pass `--host-memory SIZE` (per instance)",
            gib(needed)
        )),
    }
}

/// Counts `memory.kv_offload_bytes` as the cache's second tier.
fn host_tier(plan: &mut Plan, offload: u64, hardware: &Hardware, max_model_len: u64) {
    let per_token = plan.bytes_per_token_per_layer * plan.growing_layers as u64;
    // The GPU cache's own ratio (blocks, groups and alignment included); the plain
    // per-token size where the cache is empty.
    let kv_tokens = if plan.budget.kv_bytes > 0 && plan.kv_tokens > 0 {
        (u128::from(offload) * u128::from(plan.kv_tokens) / u128::from(plan.budget.kv_bytes)) as u64
    } else {
        offload.checked_div(per_token).unwrap_or(0)
    };
    plan.host_tier = Some(HostTier {
        kv_bytes: offload,
        kv_tokens,
        request_bytes: per_token * max_model_len,
        host_memory: hardware.host_memory,
    });
    if hardware.unified {
        plan.warnings.push(format!(
            "`memory.kv_offload_bytes` on unified memory ({}): the host tier is the same memory as the GPU's cache, so it adds no room; give the GPU's cache the memory instead",
            hardware.name
        ));
    }
}

/// Whether the weights, the engine's own memory and a fixed KV budget fit one GPU (the
/// host's RAM on a CPU); when they do not, the plan does not fit, says what does not and
/// by how much, and leads its advice with the smallest changes that would fit.
/// `overhead`: what the engine holds besides the weights and the cache (activations,
/// CUDA graphs), as the engine's plan estimated it.
fn check_memory(plan: &mut Plan, overhead: Vec<Part>, recipe: &Recipe, model: &Model, hardware: &Hardware) {
    let where_ = if hardware.cpu { "" } else { " per GPU" };
    let mut parts = vec![Part {
        what: format!("the weights{where_}"),
        bytes: plan.weight_bytes,
        estimated: false,
    }];
    let others: u64 = overhead.iter().map(|p| p.bytes).sum();
    parts.extend(overhead);
    let fixed_kv = plan.budget.exact.then_some(plan.budget.kv_bytes);
    if let Some(kv) = fixed_kv {
        parts.push(Part {
            what: format!("the fixed KV budget{where_}"),
            bytes: kv,
            estimated: false,
        });
    }
    let needed: u64 = parts.iter().map(|p| p.bytes).sum();
    if needed <= hardware.memory {
        return;
    }
    let memory = hardware.memory;
    let fits = |weights: u64| weights + others + fixed_kv.unwrap_or(0) <= memory;
    let mut ways = Vec::new();
    let gpu_engine = !hardware.cpu && recipe.engine.kind != EngineKind::Native;
    if gpu_engine && model.weight_bytes > 0 {
        let tp = recipe.serving.tensor_parallel.unwrap_or(1).max(1);
        let pp = recipe.serving.pipeline_parallel.unwrap_or(1).max(1);
        if let Some(t) = (1..=6)
            .map(|k| tp << k)
            .find(|&t| fits(model.weight_bytes / u64::from(t * pp)))
        {
            ways.push(format!(
                "split the model across more GPUs: `serving.tensor_parallel = {t}` leaves {} of weights per GPU",
                gib(model.weight_bytes / u64::from(t * pp))
            ));
        }
    }
    if recipe.quantize.is_none() && !hardware.cpu {
        let quantized = (plan.weight_bytes as f64 * NVFP4_SHARE) as u64;
        if fits(quantized) {
            ways.push(format!(
                "quantize the weights: `[quantize] scheme = \"nvfp4a16\"` writes about {}{where_} (`sous plan --set quantize.scheme=nvfp4a16` counts it exactly)",
                gib(quantized)
            ));
        }
    }
    if let Some(kv) = fixed_kv {
        let room = memory.saturating_sub(plan.weight_bytes + others);
        if room > 0 && room < kv {
            ways.push(format!(
                "give the cache less: `memory.kv_cache_bytes` of at most {} (the memory left by the rest)",
                gib(room)
            ));
        }
    }
    if ways.is_empty() {
        ways.push(format!(
            "nothing in the recipe's reach makes {} fit {}: a machine with more memory",
            gib(needed),
            gib(memory)
        ));
    }
    plan.fits = false;
    // The engine's own advice on the same levers guessed without the whole sum.
    let levers = ["serving.tensor_parallel", "[quantize]"];
    plan.advice.retain(|a| {
        !levers
            .iter()
            .any(|l| a.contains(l) && ways.iter().any(|w| w.contains(l)))
    });
    ways.append(&mut plan.advice);
    plan.advice = ways;
    plan.shortfall = Some(Shortfall {
        parts,
        needed_bytes: needed,
        memory_bytes: memory,
    });
}

fn native(
    kv: &KvSettings,
    model: &Model,
    hardware: &Hardware,
    max_model_len: u64,
) -> Result<Plan, PlanError> {
    let per_token = model
        .native_kv_per_token
        .ok_or(PlanError::Engine("the native engine (this architecture)"))?;
    let host = hardware.cpu.then_some(hardware.memory).or(Some(hardware.memory));
    let kv_bytes = kv
        .budget(model.weight_bytes, host)
        .map_err(|e| PlanError::Native(e.to_string()))?;
    let steps = match (kv.bytes, kv.memory_fraction) {
        (Some(b), _) => vec![format!("`memory.kv_cache_bytes`: {}", gib(b))],
        (None, Some(f)) => vec![
            format!(
                "{f} of {} RAM = {}",
                gib(hardware.memory),
                gib((hardware.memory as f64 * f) as u64)
            ),
            format!(
                "less the weights ({}) = {}",
                gib(model.weight_bytes),
                gib(kv_bytes)
            ),
        ],
        (None, None) => vec![format!(
            "the default: 4 GiB, at most a quarter of RAM = {}",
            gib(kv_bytes)
        )],
    };
    let cap = crate::native::capacity(per_token, kv_bytes, max_model_len as usize);
    let layers = model.shape.layers.len();
    let fits = cap.tokens as u64 >= max_model_len;
    let mut advice = Vec::new();
    if !fits {
        advice.push(format!(
            "set `serving.max_model_len` to {} or less, or `memory.kv_cache_bytes` to at least {}",
            cap.tokens,
            gib(per_token * max_model_len)
        ));
        if kv.dtype == crate::native::KvDtype::F32 {
            advice.push("set `memory.kv_cache_dtype = \"bfloat16\"`: half the bytes per token".into());
        }
    }
    Ok(Plan {
        engine: "native".into(),
        hardware: hardware.name.clone(),
        memory_bytes: hardware.memory,
        weight_bytes: model.weight_bytes,
        budget: Budget {
            kv_bytes,
            exact: kv.bytes.is_some(),
            steps,
        },
        kv_tokens: cap.tokens as u64,
        max_concurrency: cap.max_concurrency,
        context_tokens: (cap.max_concurrency * max_model_len as f64) as u64,
        layout: {
            let n = |v: u64| crate::dialect::log::vllm::thousands(v as usize);
            vec![
                format!(
                    "{layers} layers: {} B per token in {} (`memory.kv_cache_dtype`)",
                    n(per_token),
                    kv.dtype.name()
                ),
                format!(
                    "{} B / ({} B × {} tokens a block) = {} blocks = {} tokens",
                    n(kv_bytes),
                    n(per_token),
                    crate::native::BLOCK_SIZE,
                    n(cap.blocks as u64),
                    n(cap.tokens as u64)
                ),
            ]
        },
        max_model_len,
        block_size: crate::native::BLOCK_SIZE,
        bytes_per_token_per_layer: per_token / layers.max(1) as u64,
        growing_layers: layers,
        layers,
        fits,
        shortfall: None,
        advice,
        warnings: Vec::new(),
        decode_ceiling_tok_s: None,
        decode_ceiling_speculative_tok_s: None,
        host_tier: None,
        host_weight_bytes: 0,
    })
}

fn vllm(
    recipe: &Recipe,
    memory: &EngineMemory,
    model: &Model,
    hardware: &Hardware,
    max_model_len: u64,
) -> Result<(Plan, Vec<Part>), PlanError> {
    let shape = &model.shape;
    let (model_bytes, kv_bytes_el) = element_bytes(recipe, shape)?;
    let tp = recipe.serving.tensor_parallel.unwrap_or(1).max(1) as u64;
    let pp = recipe.serving.pipeline_parallel.unwrap_or(1).max(1) as u64;
    let weights = model.weight_bytes / (tp * pp);
    let batched = recipe
        .serving
        .max_batched_tokens
        .unwrap_or(VLLM_DEFAULT_BATCHED_TOKENS);
    let seqs = recipe
        .serving
        .max_num_seqs
        .map_or(VLLM_DEFAULT_MAX_SEQS, u64::from);
    let mut warnings = Vec::new();
    // The profile run's peak (`gpu_worker.determine_available_memory`): activations
    // of one `max_num_batched_tokens` step, estimated as the residual stream, the
    // attention and MLP intermediates, and the sampler's logits for `max_num_seqs`.
    let h = shape.hidden_size as u64;
    let i = shape.intermediate_size as u64;
    let activation = ((batched * (4 * h + 2 * i) / tp) as f64 * model_bytes
        + (seqs * shape.vocab_size as u64 * 4) as f64) as u64;
    let overhead = if hardware.cpu {
        Vec::new()
    } else {
        vec![
            Part {
                what: format!("activations of a {batched}-token step"),
                bytes: activation,
                estimated: true,
            },
            Part {
                what: "CUDA graphs and context".into(),
                bytes: CUDA_GRAPHS_ESTIMATE,
                estimated: true,
            },
        ]
    };
    if !hardware.cpu && memory.cpu_kv_space.is_some() {
        warnings.push(format!(
            "`{VLLM_CPU_KV_SPACE}` in `[env]` sizes the cache of vLLM's CPU backend only: on a GPU it changes nothing"
        ));
    }
    let (available, exact, steps) = if hardware.cpu {
        vllm_cpu_budget(memory, hardware, weights, &mut warnings)
    } else if let Some(b) = memory.kv_cache_bytes {
        (
            b,
            true,
            vec![format!(
                "`--kv-cache-memory-bytes` (`memory.kv_cache_bytes`): {}",
                gib(b)
            )],
        )
    } else {
        let util = memory
            .gpu_utilization
            .unwrap_or_else(|| memory.vllm_default_utilization());
        let requested = (hardware.memory as f64 * util) as u64;
        let kv = requested.saturating_sub(weights + activation + CUDA_GRAPHS_ESTIMATE);
        let default = if memory.gpu_utilization.is_none() {
            format!(", vLLM {}'s default", memory.version)
        } else {
            String::new()
        };
        (
            kv,
            false,
            vec![
                format!(
                    "{util} of {} = {} for vLLM (`--gpu-memory-utilization`{default})",
                    gib(hardware.memory),
                    gib(requested)
                ),
                format!("less the weights, {} per GPU", gib(weights)),
                format!(
                    "less activations of a {batched}-token step (estimated) {}",
                    gib(activation)
                ),
                format!(
                    "less CUDA graphs and context (estimated) {}",
                    gib(CUDA_GRAPHS_ESTIMATE)
                ),
                format!("= {} for the KV cache", gib(kv)),
            ],
        )
    };
    let settings = kv::Settings {
        block_size: recipe_block_size(hardware),
        kv_bytes: kv_bytes_el,
        state_bytes: model_bytes,
        ssm_bytes: shape
            .ssm_dtype
            .as_deref()
            .and_then(shape::dtype_bytes)
            .unwrap_or(model_bytes),
        tensor_parallel: tp as usize,
        max_model_len,
        max_batched_tokens: batched,
        kernel_alignment: 16,
    };
    let layout = kv::layout(&shape.layers, &settings, available);
    let tokens = layout.tokens();
    let concurrency = layout.max_concurrency();
    let fits = concurrency >= 1.0;
    let mut advice = Vec::new();
    if !exact && available == 0 {
        // The weights (and activations) alone exceed the share the engine may take.
        let util = memory
            .gpu_utilization
            .unwrap_or_else(|| memory.vllm_default_utilization());
        let ceiling = if hardware.unified { 0.9 } else { 0.95 };
        if util < ceiling {
            advice.push(format!(
                "raise `memory.gpu_utilization` towards {ceiling} (the most that leaves this machine room for the CUDA context{})",
                if hardware.unified { " and the OS" } else { "" }
            ));
        }
        if recipe.quantize.is_none() && !hardware.cpu {
            advice.push(
                "quantize the weights: `[quantize] scheme = \"nvfp4a16\"` writes about 0.28 of bf16's bytes"
                    .into(),
            );
        }
        advice.push(format!(
            "split the model across GPUs: `serving.tensor_parallel = {}`",
            recipe.serving.tensor_parallel.unwrap_or(1).max(1) * 2
        ));
    }
    if !fits {
        // The longest context one request can have in this budget.
        let mut lo = 1u64;
        let mut hi = max_model_len;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            let l = kv::layout(
                &shape.layers,
                &kv::Settings {
                    max_model_len: mid,
                    ..settings
                },
                available,
            );
            if l.max_concurrency() >= 1.0 {
                lo = mid
            } else {
                hi = mid - 1
            }
        }
        advice.push(format!("set `serving.max_model_len` to {lo} or less"));
        if kv_bytes_el > 1.0 && !hardware.cpu {
            advice.push("set `memory.kv_cache_dtype = \"fp8\"`: half the bytes per token".into());
        }
    }
    if !exact && recipe.memory.gpu_utilization.is_some_and(|u| u < 0.6) {
        advice.push(format!(
            "`memory.gpu_utilization` {} leaves {} of this GPU unused: 0.90 is vLLM's default",
            recipe.memory.gpu_utilization.unwrap_or_default(),
            gib(hardware.memory
                - (hardware.memory as f64 * recipe.memory.gpu_utilization.unwrap_or_default()) as u64)
        ));
    }
    if layout.block_size > settings.block_size && recipe.serving.prefix_caching == Some(true) {
        warnings.push(format!(
            "the hybrid layout makes attention blocks of {} tokens: prefix caching only reuses whole blocks, so a shared prefix shorter than that is never a hit",
            layout.block_size
        ));
    }
    let plan = Plan {
        engine: format!("vllm{}", if hardware.cpu { " (CPU backend)" } else { "" }),
        hardware: hardware.name.clone(),
        memory_bytes: hardware.memory,
        weight_bytes: weights,
        budget: Budget {
            kv_bytes: available,
            exact,
            steps,
        },
        kv_tokens: tokens,
        max_concurrency: concurrency,
        context_tokens: layout.context_tokens(max_model_len),
        layout: layout.explain(&shape.layers, &settings, available),
        max_model_len,
        block_size: layout.block_size,
        bytes_per_token_per_layer: layout.attention_bytes_per_token,
        growing_layers: shape.growing_layers(),
        layers: shape.layers.len(),
        fits,
        shortfall: None,
        advice,
        warnings,
        decode_ceiling_tok_s: None,
        decode_ceiling_speculative_tok_s: None,
        host_tier: None,
        host_weight_bytes: 0,
    };
    Ok((plan, overhead))
}

/// vLLM's CPU backend's KV budget, by release (`vllm/platforms/cpu.py` and
/// `vllm/v1/worker/cpu_worker.py`; the rules are in `launch::memory`).
fn vllm_cpu_budget(
    memory: &EngineMemory,
    hardware: &Hardware,
    weights: u64,
    warnings: &mut Vec<String>,
) -> (u64, bool, Vec<String>) {
    let v = &memory.version;
    if let Some(b) = memory.cpu_kv_space {
        let flag = if memory.kv_cache_bytes.is_some() {
            ", over `--kv-cache-memory-bytes`"
        } else {
            ""
        };
        return (
            b,
            true,
            vec![format!("`{VLLM_CPU_KV_SPACE}` in `[env]`{flag}: {}", gib(b))],
        );
    }
    if v.at_least(0, 20, 0) {
        if let Some(b) = memory.kv_cache_bytes {
            return (
                b,
                true,
                vec![format!(
                    "`--kv-cache-memory-bytes` (`memory.kv_cache_bytes`): {}",
                    gib(b)
                )],
            );
        }
        let util = memory
            .gpu_utilization
            .unwrap_or_else(|| memory.vllm_default_utilization());
        let requested = (hardware.memory as f64 * util) as u64;
        let kv = requested.saturating_sub(weights);
        return (
            kv,
            false,
            vec![
                format!(
                    "{util} of {} RAM = {} for vLLM (`--gpu-memory-utilization`, a fraction of RAM on the CPU backend)",
                    gib(hardware.memory),
                    gib(requested)
                ),
                format!(
                    "less what the process holds once loaded, estimated as the weights: {}",
                    gib(weights)
                ),
                format!("= {} for the KV cache", gib(kv)),
            ],
        );
    }
    if memory.kv_cache_bytes.is_some() {
        warnings.push(format!(
            "vLLM {v}'s CPU backend sizes its cache from `{VLLM_CPU_KV_SPACE}` alone and ignores `--kv-cache-memory-bytes` (`memory.kv_cache_bytes`): set `[env] {VLLM_CPU_KV_SPACE}` to the budget in whole GiB"
        ));
    }
    if v.at_least(0, 13, 0) {
        let half = hardware.memory / 2;
        (
            half,
            false,
            vec![format!(
                "`{VLLM_CPU_KV_SPACE}` unset: vLLM {v} takes half of the RAM of each NUMA node ({} with one node)",
                gib(half)
            )],
        )
    } else {
        (
            VLLM_CPU_DEFAULT_KV,
            true,
            vec![format!(
                "`{VLLM_CPU_KV_SPACE}` unset: vLLM {v} takes {}",
                gib(VLLM_CPU_DEFAULT_KV)
            )],
        )
    }
}

/// SGLang's default `--mem-fraction-static` when the recipe sets none: its
/// `ServerArgs` picks one by GPU memory; 0.88 is the value it picks for 80 GB and
/// larger GPUs (`python/sglang/srt/server_args.py`), and is labelled an assumption.
pub const SGLANG_ASSUMED_FRACTION: f64 = 0.88;
/// TensorRT-LLM's default `kv_cache_config.free_gpu_memory_fraction`
/// (`tensorrt_llm/llmapi/llm_args.py`) and tokens per KV block (`tokens_per_block`).
pub const TRTLLM_DEFAULT_FREE_FRACTION: f64 = 0.9;
/// See [`TRTLLM_DEFAULT_FREE_FRACTION`].
pub const TRTLLM_TOKENS_PER_BLOCK: usize = 32;

/// SGLang and TensorRT-LLM: a pool of token slots, `cell_size` bytes each over every
/// layer. SGLang (`model_runner.profile_max_num_token`): `rest = free_after_weights -
/// total * (1 - mem_fraction_static)`, `max_total_num_tokens = rest // cell_size`, the
/// cell `kv_heads/tp * head_dim * layers * 2 * dtype` or, for MLA, `(kv_lora_rank +
/// qk_rope_head_dim) * layers * dtype`. TensorRT-LLM (`KvCacheCreator`): the fraction
/// `free_gpu_memory_fraction` of the memory free after the weights and a profiling
/// run, in blocks of 32 tokens.
fn pool(
    recipe: &Recipe,
    memory: &EngineMemory,
    model: &Model,
    hardware: &Hardware,
    max_model_len: u64,
) -> Result<(Plan, Vec<Part>), PlanError> {
    let kind = recipe.engine.kind;
    let shape = &model.shape;
    if shape
        .layers
        .iter()
        .any(|l| !matches!(l, Layer::Full { .. } | Layer::Mla { .. }))
    {
        return Err(PlanError::Engine(match kind {
            EngineKind::Sglang => "SGLang with sliding-window or linear-attention layers",
            _ => "TensorRT-LLM with sliding-window or linear-attention layers",
        }));
    }
    let (_, kv_el) = element_bytes(recipe, shape)?;
    let tp = recipe.serving.tensor_parallel.unwrap_or(1).max(1) as usize;
    let pp = recipe.serving.pipeline_parallel.unwrap_or(1).max(1) as u64;
    let per_layer = |l: &Layer| -> f64 {
        match *l {
            Layer::Full { kv_heads, head_dim } => ((kv_heads / tp).max(1) * head_dim * 2) as f64 * kv_el,
            Layer::Mla { latent } => latent as f64 * kv_el,
            _ => 0.0,
        }
    };
    let cell = (shape.layers.iter().map(per_layer).sum::<f64>() / pp as f64) as u64;
    let weights = model.weight_bytes / (tp as u64 * pp);
    let (kv_bytes, exact, mut steps, block) = if kind == EngineKind::Sglang {
        // `memory.kv_cache_bytes` is refused for SGLang (`launch::memory`).
        let (fraction, assumed) = match memory.gpu_utilization {
            Some(f) => (f, ""),
            None => (SGLANG_ASSUMED_FRACTION, " (assumed: SGLang picks it by GPU size)"),
        };
        let total = hardware.memory as f64;
        let kv = (total * fraction - weights as f64 - CUDA_GRAPHS_ESTIMATE as f64).max(0.0);
        (
            kv as u64,
            false,
            vec![
                format!(
                    "`--mem-fraction-static` {fraction}{assumed} of {} = {}",
                    gib(hardware.memory),
                    gib((total * fraction) as u64)
                ),
                format!("less the weights, {} per GPU", gib(weights)),
                format!(
                    "less CUDA graphs and context (estimated) {}",
                    gib(CUDA_GRAPHS_ESTIMATE)
                ),
                format!("= {} for the token pool", gib(kv as u64)),
            ],
            1,
        )
    } else {
        // `KvCacheConfig`: the smaller of `max_gpu_total_bytes` and the fraction's share,
        // the fraction defaulting to 0.9 whether or not the bytes are set.
        let fraction = memory.gpu_utilization.unwrap_or(TRTLLM_DEFAULT_FREE_FRACTION);
        let free = hardware.memory.saturating_sub(weights + CUDA_GRAPHS_ESTIMATE);
        let share = (free as f64 * fraction) as u64;
        let mut steps = vec![
            format!(
                "{} less the weights ({}) and runtime buffers (estimated {}) = {} free",
                gib(hardware.memory),
                gib(weights),
                gib(CUDA_GRAPHS_ESTIMATE),
                gib(free)
            ),
            format!("`free_gpu_memory_fraction` {fraction} of it = {}", gib(share)),
        ];
        let (kv, exact) = match memory.kv_cache_bytes {
            Some(b) => {
                steps.push(format!(
                    "`max_gpu_total_bytes` (`memory.kv_cache_bytes`) {}: the smaller of the two",
                    gib(b)
                ));
                (b.min(share), b <= share)
            }
            None => (share, false),
        };
        (kv, exact, steps, TRTLLM_TOKENS_PER_BLOCK)
    };
    let mut tokens = kv_bytes.checked_div(cell).unwrap_or(0) / block as u64 * block as u64;
    if let Some(cap) = memory.max_tokens
        && cap < tokens
    {
        let (flag, whence) = match kind {
            EngineKind::Sglang => ("--max-total-tokens", "engine.extra_args"),
            _ => ("kv_cache_config.max_tokens", "engine.extra_options"),
        };
        steps.push(format!("`{flag}` {cap} in `{whence}` caps the pool"));
        tokens = cap / block as u64 * block as u64;
    }
    let max_concurrency = tokens as f64 / max_model_len.max(1) as f64;
    let fits = tokens >= max_model_len;
    let mut advice = Vec::new();
    if !fits {
        advice.push(format!("set `serving.max_model_len` to {tokens} or less"));
        if kv_el > 1.0 {
            advice.push("set `memory.kv_cache_dtype = \"fp8\"`: half the bytes per token".into());
        }
    }
    let growing = shape.growing_layers();
    let plan = Plan {
        engine: kind.as_str().into(),
        hardware: hardware.name.clone(),
        memory_bytes: hardware.memory,
        weight_bytes: weights,
        budget: Budget {
            kv_bytes,
            exact,
            steps,
        },
        kv_tokens: tokens,
        max_concurrency,
        context_tokens: tokens,
        layout: vec![format!(
            "{growing} layers: {} B per token over all of them (the pool's cell); {} B / {} B = {} tokens",
            cell, kv_bytes, cell, tokens
        )],
        max_model_len,
        block_size: block,
        bytes_per_token_per_layer: cell / growing.max(1) as u64,
        growing_layers: growing,
        layers: shape.layers.len(),
        fits,
        shortfall: None,
        advice,
        warnings: Vec::new(),
        decode_ceiling_tok_s: None,
        decode_ceiling_speculative_tok_s: None,
        host_tier: None,
        host_weight_bytes: 0,
    };
    let overhead = vec![Part {
        what: "CUDA graphs and context".into(),
        bytes: CUDA_GRAPHS_ESTIMATE,
        estimated: true,
    }];
    Ok((plan, overhead))
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

/// vLLM's default block size: 128 on its CPU backend, 16 on GPUs.
fn recipe_block_size(hardware: &Hardware) -> usize {
    if hardware.cpu { 128 } else { 16 }
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

//! The plans of SGLang and TensorRT-LLM, which size a pool of token slots by their own
//! fractions of the GPU's memory. Their hybrid and sliding-window pools are not
//! modelled: a plan for such a model is refused. Whether the plan fits the memory is
//! `fit`'s.

use super::{Budget, CUDA_GRAPHS_ESTIMATE, Hardware, Layer, Model, Part, Plan, PlanError, element_bytes};
use crate::launch::memory::EngineMemory;
use crate::recipe::{EngineKind, Recipe};
use crate::size::gib;

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
pub(super) fn pool(
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

//! vLLM's plan: the KV budget its GPU worker is left after the profile run (weights,
//! activations, CUDA graphs) or its CPU backend's budget by release, laid out in its
//! cache groups by [`super::kv`]. Whether the plan fits the memory is `fit`'s.

use super::{Budget, CUDA_GRAPHS_ESTIMATE, Hardware, Model, Part, Plan, PlanError, element_bytes, kv};
use crate::launch::memory::{EngineMemory, VLLM_CPU_KV_SPACE};
use crate::recipe::Recipe;
use crate::size::gib;

/// vLLM's CPU backend's KV space up to 0.12 when `VLLM_CPU_KVCACHE_SPACE` is unset
/// (`vllm/platforms/cpu.py` of 0.10.2: 4 GiB).
pub const VLLM_CPU_DEFAULT_KV: u64 = 4 << 30;
/// vLLM's default `--max-num-batched-tokens` for online serving on GPUs (chunked
/// prefill), and its default `--max-num-seqs` (`vllm/engine/arg_utils.py`).
pub const VLLM_DEFAULT_BATCHED_TOKENS: u64 = 8192;
/// See [`VLLM_DEFAULT_BATCHED_TOKENS`].
pub const VLLM_DEFAULT_MAX_SEQS: u64 = 256;

pub(super) fn vllm(
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
            .and_then(super::shape::dtype_bytes)
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

/// vLLM's default block size: 128 on its CPU backend, 16 on GPUs.
fn recipe_block_size(hardware: &Hardware) -> usize {
    if hardware.cpu { 128 } else { 16 }
}

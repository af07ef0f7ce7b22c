//! Whether a plan fits the machine: the weights, the engine's own memory and a fixed
//! KV budget against one GPU's memory (the host's RAM on a CPU), and what the engine
//! keeps in host memory (the cache's second tier and `memory.host_weights`) against the
//! host's. A plan that does not fit says by how much and leads its advice with the
//! smallest changes that would fit. The engines' own budgets are in their modules.

use super::{Hardware, HostTier, Model, NVFP4_SHARE, Part, Plan, Shortfall};
use crate::recipe::{EngineKind, Recipe};
use crate::size::gib;

/// What the engine keeps in host memory: the cache's second tier
/// (`memory.kv_offload_bytes`, which the native engine refuses) and the weights of
/// `memory.host_weights`, checked against the machine's host memory when known.
pub(super) fn host_side(
    plan: &mut Plan,
    recipe: &Recipe,
    model: &Model,
    hardware: &Hardware,
    max_model_len: u64,
) {
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
pub(super) fn check_memory(
    plan: &mut Plan,
    overhead: Vec<Part>,
    recipe: &Recipe,
    model: &Model,
    hardware: &Hardware,
) {
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

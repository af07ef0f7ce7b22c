//! The native engine's plan: its KV budget and capacity by its own start-up code
//! ([`KvSettings::budget`] and [`crate::native::capacity`]), so that the plan and the
//! engine's log line cannot disagree. Whether the plan fits the memory is `fit`'s.

use super::{Budget, Hardware, Model, Plan, PlanError};
use crate::native::KvSettings;
use crate::size::gib;

pub(super) fn native(
    kv: &KvSettings,
    model: &Model,
    hardware: &Hardware,
    max_model_len: u64,
) -> Result<Plan, PlanError> {
    let per_token = model
        .native_kv_per_token
        .ok_or(PlanError::Engine("the native engine (this architecture)"))?;
    let host = hardware.cpu.then_some(hardware.memory).or(Some(hardware.memory));
    let whole = kv
        .budget(model.weight_bytes, host)
        .map_err(|e| PlanError::Native(e.to_string()))?;
    let states = model.native_state_per_sequence;
    let kv_bytes = kv
        .after_states(whole, states)
        .map_err(|e| PlanError::Native(e.to_string()))?;
    let mut steps = match (kv.bytes, kv.memory_fraction) {
        (Some(b), _) => vec![format!("`memory.kv_cache_bytes`: {}", gib(b))],
        (None, Some(f)) => vec![
            format!(
                "{f} of {} RAM = {}",
                gib(hardware.memory),
                gib((hardware.memory as f64 * f) as u64)
            ),
            format!("less the weights ({}) = {}", gib(model.weight_bytes), gib(whole)),
        ],
        (None, None) => vec![format!(
            "the default: 4 GiB, at most a quarter of RAM = {}",
            gib(whole)
        )],
    };
    if states > 0 {
        steps.push(format!(
            "less {} sequences' linear-attention state ({} each) = {}",
            kv.max_num_seqs,
            gib(states),
            gib(kv_bytes)
        ));
    }
    let cap = crate::native::capacity(per_token, kv_bytes, max_model_len as usize);
    let layers = model.shape.layers.len();
    // Linear-attention layers hold a state per sequence, not keys and values per token.
    let linear = model
        .shape
        .layers
        .iter()
        .filter(|l| matches!(l, super::shape::Layer::GatedDeltaNet { .. }))
        .count();
    let growing = layers - linear;
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
                    "{growing} attention layers: {} B per token in {} (`memory.kv_cache_dtype`)",
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
        bytes_per_token_per_layer: per_token / growing.max(1) as u64,
        growing_layers: growing,
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

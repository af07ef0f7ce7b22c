//! Layers that engines fuse into one GEMM share one global scale.
//!
//! vLLM loads q/k/v into one `QKVParallelLinear`, gate/up into one
//! `MergedColumnParallelLinear` and MoE w1/w3 into `w13`, and applies a single global
//! scale to the fused weight (the max, or the first member's): a member quantized with
//! its own scale is then silently dequantized with the wrong one (vLLM
//! `compressed_tensors_w4a16_nvfp4.py` and `modelopt.py` take the max; vllm #54974;
//! `docs/nvfp4.md`, "Fused layers share one global scale"). llm-compressor therefore links the weight observers of
//! `FUSED_LAYER_NAMES` (`src/llmcompressor/observers/helpers.py`) wherever a parent
//! module has *all* the names of a tuple, and ModelOpt takes the max amax of Linears
//! sharing an input; both give every member the global scale of the group's amax.
//! The groups below are llm-compressor's list, and the linear-attention pairs vLLM fuses.

use std::collections::BTreeMap;

use super::error::QuantizeError;
use super::select::Decision;
use super::source::SourceTensor;

/// The sibling names fused together, as in llm-compressor's `FUSED_LAYER_NAMES`.
const FUSED: &[&[&str]] = &[
    &["gate_proj", "up_proj"],
    &["q_proj", "k_proj", "v_proj"],
    &["q_a_proj", "kv_a_proj_with_mqa"],
    &["w1", "w3"],
    // vLLM's Qwen3.5 fuses these too (`in_proj_qkvz`, `in_proj_ba` in
    // `vllm/model_executor/models/qwen3_5.py`); they are kept unless linear attention
    // is asked to be quantized, which llm-compressor's examples never do.
    &["in_proj_qkv", "in_proj_z"],
    &["in_proj_b", "in_proj_a"],
];

/// Groups of tensor indices that share a global scale; every quantized tensor is in
/// exactly one group (most alone), listed in file order.
pub fn groups(tensors: &[SourceTensor], decisions: &[Decision]) -> Result<Vec<Vec<usize>>, QuantizeError> {
    // parent module -> (last name segment -> tensor index), over 2-D `.weight` tensors.
    let mut by_parent: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if t.shape.len() != 2 {
            continue;
        }
        if let Some(module) = t.name.strip_suffix(".weight")
            && let Some((parent, last)) = module.rsplit_once('.')
        {
            by_parent.entry(parent).or_default().insert(last, i);
        }
    }
    let mut grouped = vec![false; tensors.len()];
    let mut groups = Vec::new();
    for children in by_parent.values() {
        for names in FUSED {
            let Some(members) = names
                .iter()
                .map(|n| children.get(n).copied())
                .collect::<Option<Vec<usize>>>()
            else {
                continue;
            };
            let quantized: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| decisions[i] == Decision::Quantize)
                .collect();
            if quantized.is_empty() {
                continue;
            }
            if let Some(&ignored) = members.iter().find(|&&i| decisions[i] != Decision::Quantize) {
                return Err(QuantizeError::SplitFusedGroup {
                    quantized: tensors[quantized[0]].name.clone(),
                    ignored: tensors[ignored].name.clone(),
                });
            }
            for &i in &members {
                grouped[i] = true;
            }
            groups.push(members);
        }
    }
    for (i, decision) in decisions.iter().enumerate() {
        if *decision == Decision::Quantize && !grouped[i] {
            groups.push(vec![i]);
        }
    }
    for group in &mut groups {
        group.sort_unstable();
    }
    groups.sort_unstable_by_key(|g| g[0]);
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::select::Kept;

    fn tensors(names: &[&str]) -> Vec<SourceTensor> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| SourceTensor {
                name: (*n).into(),
                shard: 0,
                dtype: safetensors::Dtype::BF16,
                shape: vec![16, 16],
                offset: i as u64 * 512,
                len: 512,
            })
            .collect()
    }

    #[test]
    fn qkv_gate_up_and_experts_are_grouped() {
        let t = tensors(&[
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.1.block_sparse_moe.experts.0.w1.weight",
            "model.layers.1.block_sparse_moe.experts.0.w2.weight",
            "model.layers.1.block_sparse_moe.experts.0.w3.weight",
            "model.layers.1.block_sparse_moe.experts.1.w1.weight",
            "model.layers.1.block_sparse_moe.experts.1.w3.weight",
        ]);
        let d = vec![Decision::Quantize; t.len()];
        let g = groups(&t, &d).expect("groups");
        assert_eq!(
            g,
            vec![
                vec![0, 1, 2],
                vec![3],
                vec![4, 5],
                vec![6],
                vec![7, 9],
                vec![8],
                vec![10, 11]
            ]
        );
    }

    #[test]
    fn partial_names_are_not_a_group_and_split_groups_are_refused() {
        // A parent with only q_proj and k_proj is not a q/k/v group.
        let t = tensors(&["a.q_proj.weight", "a.k_proj.weight"]);
        let g = groups(&t, &[Decision::Quantize, Decision::Quantize]).expect("groups");
        assert_eq!(g, vec![vec![0], vec![1]]);
        let t = tensors(&["a.gate_proj.weight", "a.up_proj.weight"]);
        let d = [
            Decision::Quantize,
            Decision::Keep(Kept::Ignored("a.up_proj".into())),
        ];
        assert!(matches!(
            groups(&t, &d),
            Err(QuantizeError::SplitFusedGroup { .. })
        ));
        // All kept: nothing to group.
        let d = [Decision::Keep(Kept::Tower), Decision::Keep(Kept::Tower)];
        assert!(groups(&t, &d).expect("groups").is_empty());
    }
}

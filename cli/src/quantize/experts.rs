//! Fused expert tensors become one weight per expert.
//!
//! transformers 5 saves a MoE layer's experts as two 3-D tensors,
//! `mlp.experts.gate_up_proj` `[experts, 2 × width, hidden]` (each expert's gate rows,
//! then its up rows) and `mlp.experts.down_proj` `[experts, hidden, width]`, as the
//! Hub's Qwen3.5-MoE checkpoints do. vLLM reads that fused form only for unquantized
//! weights (`vllm/model_executor/models/qwen3_5.py`, `load_weights`: the
//! `fused_expert_params_mapping` matches `experts.gate_up_proj` and `experts.down_proj`,
//! which a quantized checkpoint's `…_packed`/`…_scale` tensors never are); a quantized
//! checkpoint holds one `experts.E.gate_proj`/`up_proj`/`down_proj` per expert, read
//! through `FusedMoE.make_expert_params_mapping`, and that is what llm-compressor
//! writes. So the quantizer sees each expert's slices of the fused tensors as tensors of
//! their own, named as vLLM loads them: every expert is then quantized (or kept) like
//! any Linear, never left behind in 16 bits because it did not look like one.
//!
//! A slice is a byte range of the shard, so nothing is copied: each expert's matrices
//! are contiguous in `[experts, rows, cols]` order.

use serde_json::Value;

use super::error::QuantizeError;
use super::source::SourceTensor;

/// The fused tensors' names under a MoE block (`….mlp`).
const GATE_UP: &str = "experts.gate_up_proj";
const DOWN: &str = "experts.down_proj";

/// `tensors` with every fused expert tensor replaced by its per-expert slices, in file
/// order. `config` is the model's `config.json` (its `hidden_size`, or its
/// `text_config`'s, tells the layout apart from the transposed one).
pub fn split(
    config: &serde_json::Map<String, Value>,
    tensors: Vec<SourceTensor>,
) -> Result<Vec<SourceTensor>, QuantizeError> {
    if !tensors.iter().any(|t| is_fused(&t.name)) {
        return Ok(tensors);
    }
    let text = config.get("text_config").and_then(Value::as_object);
    let hidden = [text, Some(config)]
        .into_iter()
        .flatten()
        .find_map(|c| c.get("hidden_size").and_then(Value::as_u64))
        .map(|h| h as usize);
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !is_fused(&t.name) {
            out.push(t);
            continue;
        }
        let Some(hidden) = hidden else {
            return Err(layout(&t, "config.json has no `hidden_size` to check it against"));
        };
        let &[experts, rows, cols] = t.shape.as_slice() else {
            return Err(layout(&t, "expected 3 dimensions [experts, rows, cols]"));
        };
        let gate_up = t.name.ends_with(GATE_UP);
        let parent = &t.name[..t.name.len() - if gate_up { GATE_UP.len() } else { DOWN.len() }];
        // [experts, 2 width, hidden] and [experts, hidden, width]; the transposed form
        // (GPT-OSS's [experts, hidden, 2 width]) is another layout, not this one.
        let expected = if gate_up {
            cols == hidden && rows % 2 == 0
        } else {
            rows == hidden
        };
        if !expected {
            let want = if gate_up {
                format!("[{experts}, 2 × width, {hidden}]")
            } else {
                format!("[{experts}, {hidden}, width]")
            };
            return Err(layout(
                &t,
                &format!("expected {want} (hidden_size {hidden}); the transposed layout is not supported"),
            ));
        }
        let element = (t.dtype.bitsize() / 8) as u64;
        let per_expert = (rows * cols) as u64 * element;
        let parts: &[(&str, usize)] = if gate_up {
            &[("gate_proj", 0), ("up_proj", rows / 2)]
        } else {
            &[("down_proj", 0)]
        };
        let part_rows = if gate_up { rows / 2 } else { rows };
        for e in 0..experts {
            for &(name, first_row) in parts {
                out.push(SourceTensor {
                    name: format!("{parent}experts.{e}.{name}.weight"),
                    shard: t.shard,
                    dtype: t.dtype,
                    shape: vec![part_rows, cols],
                    offset: t.offset + e as u64 * per_expert + (first_row * cols) as u64 * element,
                    len: (part_rows * cols) as u64 * element,
                });
            }
        }
    }
    Ok(out)
}

fn is_fused(name: &str) -> bool {
    (name.ends_with(GATE_UP) || name.ends_with(DOWN)) && name.contains(".mlp.")
}

fn layout(t: &SourceTensor, message: &str) -> QuantizeError {
    QuantizeError::FusedExperts {
        tensor: t.name.clone(),
        shape: t.shape.clone(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: &[usize], offset: u64) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shard: 0,
            dtype: safetensors::Dtype::BF16,
            shape: shape.to_vec(),
            offset,
            len: shape.iter().product::<usize>() as u64 * 2,
        }
    }

    fn config(hidden: u64) -> serde_json::Map<String, Value> {
        serde_json::json!({"text_config": {"hidden_size": hidden}})
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn each_expert_gets_its_gate_up_and_down_slices() {
        let p = "model.layers.0.mlp.";
        let tensors = vec![
            tensor(&format!("{p}experts.gate_up_proj"), &[2, 8, 16], 100),
            tensor(
                &format!("{p}experts.down_proj"),
                &[2, 16, 4],
                100 + 2 * 8 * 16 * 2,
            ),
            tensor(&format!("{p}gate.weight"), &[2, 16], 100 + 512 + 256),
        ];
        let split = split(&config(16), tensors).expect("split");
        let got: Vec<(&str, Vec<usize>, u64, u64)> = split
            .iter()
            .map(|t| (t.name.as_str(), t.shape.clone(), t.offset, t.len))
            .collect();
        let n = |s: &str| format!("{p}{s}");
        let want = [
            (n("experts.0.gate_proj.weight"), vec![4, 16], 100, 128),
            (n("experts.0.up_proj.weight"), vec![4, 16], 228, 128),
            (n("experts.1.gate_proj.weight"), vec![4, 16], 356, 128),
            (n("experts.1.up_proj.weight"), vec![4, 16], 484, 128),
            (n("experts.0.down_proj.weight"), vec![16, 4], 612, 128),
            (n("experts.1.down_proj.weight"), vec![16, 4], 740, 128),
            (n("gate.weight"), vec![2, 16], 868, 64),
        ];
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((g.0, &g.1, g.2, g.3), (w.0.as_str(), &w.1, w.2, w.3));
        }
    }

    #[test]
    fn the_transposed_layout_is_refused_by_name() {
        let t = vec![tensor("model.layers.0.mlp.experts.gate_up_proj", &[2, 16, 8], 0)];
        let err = split(&config(16), t).expect_err("transposed");
        let text = err.to_string();
        assert!(text.contains("model.layers.0.mlp.experts.gate_up_proj"), "{text}");
        assert!(text.contains("transposed"), "{text}");
    }
}

//! Never a silent half-quantization: before any work, every tensor that is a Linear
//! layer's weight in a form the selection does not recognise is refused by name; after
//! the writing, the output is read back from its own headers and compared with the plan
//! before it is renamed into place.
//!
//! The failure this guards against is the quiet one: ModelOpt 0.46 wrote
//! `Qwen3_5MoeExperts`' fused 3-D tensors in bf16 and reported success
//! (NVIDIA/Model-Optimizer issues 2011 and 1255), giving a "4-bit" checkpoint most of
//! whose bytes were 16-bit. Here a checkpoint leaves staging only if the NVFP4 tensors
//! it holds are exactly the planned ones, every shard has the planned size, and no
//! weight the recipe did not ask to keep is left in 16 bits.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;
use sous_engine::checkpoint::names::{self, Nvfp4Names};
use sous_engine::recipe::QuantFormat;

use super::error::{QuantizeError, io};
use super::layout::Layout;
use super::select::{Decision, Kept, Selector};
use super::source::{SourceTensor, read_header};

/// Refuses a tensor that holds Linear weights the selection would write unchanged
/// without a reason: a MoE layer's expert weights (or any `…_proj` tensor) not named as
/// one weight per expert, unless `quantize.ignore` keeps them.
pub fn preflight(
    tensors: &[SourceTensor],
    decisions: &[Decision],
    selector: &Selector,
) -> Result<(), QuantizeError> {
    for (t, d) in tensors.iter().zip(decisions) {
        if *d != Decision::Keep(Kept::NotLinear) || t.shape.len() < 2 {
            continue;
        }
        let segments: Vec<&str> = t.name.split('.').collect();
        let last = segments.last().copied().unwrap_or_default();
        let weights = segments.contains(&"experts") || last.ends_with("_proj");
        let bias = last.contains("bias") || last.contains("scale");
        if weights && !bias && !selector.ignores(&t.name) {
            return Err(QuantizeError::UnplannedLinear {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
            });
        }
    }
    Ok(())
}

/// What the read-back found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// NVFP4 weights in the output.
    pub nvfp4: usize,
    /// Tensors in the output.
    pub tensors: usize,
}

/// Reads the headers of the shards written under `dir` and checks them against the
/// plan: the same tensors with the same dtypes and shapes, every shard of its planned
/// size, one NVFP4 weight per quantized source weight, and every source weight either
/// quantized or kept as planned.
pub fn written(
    dir: &Path,
    layout: &Layout,
    tensors: &[SourceTensor],
    decisions: &[Decision],
    format: QuantFormat,
) -> Result<Verified, QuantizeError> {
    let mut found: BTreeMap<String, (Dtype, Vec<usize>)> = BTreeMap::new();
    for shard in &layout.shards {
        let path = dir.join(&shard.name);
        let size = std::fs::metadata(&path).map_err(io(&path))?.len();
        if size != shard.size {
            return Err(half(
                &shard.name,
                &format!("{size} bytes, planned {}", shard.size),
            ));
        }
        let mut file = std::fs::File::open(&path).map_err(io(&path))?;
        for t in read_header(&mut file, &path, size, 0)?.0 {
            found.insert(t.name, (t.dtype, t.shape));
        }
        for t in &shard.tensors {
            match found.get(&t.name) {
                Some((dtype, shape)) if *dtype == t.dtype && *shape == t.shape => {}
                Some((dtype, shape)) => {
                    return Err(half(
                        &t.name,
                        &format!(
                            "written as {dtype:?} {shape:?}, planned {:?} {:?}",
                            t.dtype, t.shape
                        ),
                    ));
                }
                None => return Err(half(&t.name, &format!("missing from {}", shard.name))),
            }
        }
    }
    let nvfp4 = Nvfp4Names::of(format);
    let mut quantized = 0;
    for (t, d) in tensors.iter().zip(decisions) {
        let module = names::module_of(&t.name);
        let packed = found.get(&names::tensor(module, nvfp4.packed));
        let is_nvfp4 = packed.is_some_and(|(dtype, _)| *dtype == Dtype::U8)
            && found.contains_key(&names::tensor(module, nvfp4.scales))
            && found.contains_key(&names::tensor(module, nvfp4.global));
        match d {
            Decision::Quantize if !is_nvfp4 => {
                return Err(half(&t.name, "planned as NVFP4 but not written as NVFP4"));
            }
            Decision::Quantize => quantized += 1,
            Decision::Keep(_) => match found.get(&t.name) {
                Some((dtype, _)) if *dtype == t.dtype => {}
                _ => return Err(half(&t.name, "planned unchanged but not written unchanged")),
            },
        }
    }
    let expected = decisions.iter().filter(|d| **d == Decision::Quantize).count();
    if quantized != expected {
        return Err(half(
            "the checkpoint",
            &format!("{quantized} NVFP4 weights written, {expected} planned"),
        ));
    }
    Ok(Verified {
        nvfp4: quantized,
        tensors: found.len(),
    })
}

fn half(tensor: &str, message: &str) -> QuantizeError {
    QuantizeError::NotAsPlanned {
        tensor: tensor.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn tensor(name: &str, shape: &[usize], offset: u64) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shard: 0,
            dtype: Dtype::BF16,
            shape: shape.to_vec(),
            offset,
            len: shape.iter().product::<usize>() as u64 * 2,
        }
    }

    #[test]
    fn expert_weights_no_rule_covers_are_refused_unless_ignored() {
        let tensors = vec![
            tensor("model.layers.0.mlp.experts.w13_weight", &[4, 64, 32], 0),
            tensor("model.layers.0.linear_attn.conv1d.weight", &[128, 1, 4], 0),
            tensor("model.layers.0.mlp.experts.gate_up_proj_bias", &[4, 64], 0),
        ];
        let selector = Selector::new(&[], None).expect("rules");
        let decisions: Vec<Decision> = tensors.iter().map(|t| selector.decide(t)).collect();
        let err = preflight(&tensors, &decisions, &selector).expect_err("refused");
        assert!(
            err.to_string().contains("model.layers.0.mlp.experts.w13_weight"),
            "{err}"
        );
        let kept = Selector::new(&[r"re:.*experts\.w13_weight".into()], None).expect("rules");
        preflight(&tensors, &decisions, &kept).expect("asked to keep");
    }

    #[test]
    fn the_read_back_catches_a_missing_nvfp4_weight_and_a_short_shard() {
        let tensors = vec![
            tensor("model.layers.0.mlp.down_proj.weight", &[32, 64], 0),
            tensor("model.norm.weight", &[64], 4096),
        ];
        let decisions = vec![Decision::Quantize, Decision::Keep(Kept::NotLinear)];
        let format = QuantFormat::CompressedTensors;
        let layout =
            Layout::plan(&tensors, &decisions, format, u64::MAX, &HashMap::new(), false).expect("layout");
        let dir = tempfile::tempdir().expect("tempdir");
        for shard in &layout.shards {
            let mut bytes = shard.header.clone();
            bytes.resize(shard.size as usize, 0);
            std::fs::write(dir.path().join(&shard.name), bytes).expect("write");
        }
        let ok = written(dir.path(), &layout, &tensors, &decisions, format).expect("as planned");
        assert_eq!(ok.nvfp4, 1);
        // A plan that says the weight stays bf16 no longer matches what is on disk.
        let all_kept = vec![Decision::Keep(Kept::LmHead), Decision::Keep(Kept::NotLinear)];
        let err = written(dir.path(), &layout, &tensors, &all_kept, format).expect_err("differs");
        assert!(err.to_string().contains("down_proj"), "{err}");
        // A shard cut short.
        let shard = dir.path().join(&layout.shards[0].name);
        let bytes = std::fs::read(&shard).expect("read");
        std::fs::write(&shard, &bytes[..bytes.len() - 1]).expect("truncate");
        let err = written(dir.path(), &layout, &tensors, &decisions, format).expect_err("short");
        assert!(err.to_string().contains("planned"), "{err}");
    }
}

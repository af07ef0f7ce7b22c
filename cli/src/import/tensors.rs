//! GGUF tensors to HF tensors: names, the Q/K row order, dequantization and the output
//! dtype. Not here: where the bytes go (see `write`).
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the
//! rows of `q_proj` and `k_proj` inside every head, from HF's "rotate half" layout (the
//! first half of a head's rows pair with the second half) to GGML's interleaved layout
//! (rows 2i and 2i+1 pair). We undo it exactly as transformers does when it reads a GGUF
//! (`modeling_gguf_pytorch_utils.py`, `LlamaTensorProcessor._reverse_permute_weights`):
//! view the rows of a head as (half, 2) and swap the two axes.

use candle_core::{DType, Tensor};

use super::config::LlamaConfig;
use super::gguf::Gguf;
use super::{Dtype, ImportError};

/// What to do to a tensor's rows after dequantizing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Keep them.
    AsIs,
    /// Undo llama.cpp's rotary permutation, with this many heads.
    Unpermute {
        /// Heads of this projection (query heads for Q, KV heads for K).
        heads: u64,
    },
}

/// One tensor to convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Name in the GGUF file.
    pub gguf_name: String,
    /// Name in the HF checkpoint.
    pub hf_name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Row fix-up.
    pub rows: Rows,
}

impl Planned {
    /// Bytes this tensor takes in the output dtype.
    pub fn bytes(&self, dtype: Dtype) -> u64 {
        self.shape.iter().product::<usize>() as u64 * dtype.size() as u64
    }
}

/// Maps every tensor of a llama GGUF to its HF name, in file order; refuses names it
/// does not know, so that nothing is silently dropped.
pub fn plan(gguf: &Gguf, config: &LlamaConfig) -> Result<Vec<Planned>, ImportError> {
    let mut planned = Vec::with_capacity(gguf.tensor_names().len());
    for name in gguf.tensor_names() {
        let (hf_name, rows) = hf_name(name, config).ok_or_else(|| ImportError::UnknownTensor {
            path: gguf.path().to_owned(),
            name: name.clone(),
        })?;
        let Some((shape, _)) = gguf.tensor_info(name) else {
            continue;
        };
        if let Rows::Unpermute { heads } = rows {
            let ok = shape.len() == 2 && heads > 0 && (shape[0] as u64).is_multiple_of(2 * heads);
            if !ok {
                return Err(ImportError::Malformed {
                    path: gguf.path().to_owned(),
                    reason: format!(
                        "tensor `{name}` has shape {shape:?}, which does not split into {heads} heads of even size"
                    ),
                });
            }
        }
        planned.push(Planned {
            gguf_name: name.clone(),
            hf_name,
            shape,
            rows,
        });
    }
    for layer in 0..config.num_hidden_layers {
        for part in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            let name = format!("blk.{layer}.{part}.weight");
            if !gguf.has_tensor(&name) {
                return Err(ImportError::MissingTensor {
                    path: gguf.path().to_owned(),
                    name,
                });
            }
        }
    }
    Ok(planned)
}

/// The HF name of a llama GGUF tensor (llama.cpp `gguf-py/gguf/tensor_mapping.py`, read
/// backwards), and whether its rows need un-permuting.
fn hf_name(gguf_name: &str, config: &LlamaConfig) -> Option<(String, Rows)> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some((name.to_owned(), Rows::AsIs));
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    if layer >= config.num_hidden_layers {
        return None;
    }
    let (hf_part, rows) = match part {
        "attn_norm.weight" => ("input_layernorm.weight", Rows::AsIs),
        "ffn_norm.weight" => ("post_attention_layernorm.weight", Rows::AsIs),
        "attn_q.weight" => (
            "self_attn.q_proj.weight",
            Rows::Unpermute {
                heads: config.num_attention_heads,
            },
        ),
        "attn_k.weight" => (
            "self_attn.k_proj.weight",
            Rows::Unpermute {
                heads: config.num_key_value_heads,
            },
        ),
        "attn_v.weight" => ("self_attn.v_proj.weight", Rows::AsIs),
        "attn_output.weight" => ("self_attn.o_proj.weight", Rows::AsIs),
        "ffn_gate.weight" => ("mlp.gate_proj.weight", Rows::AsIs),
        "ffn_up.weight" => ("mlp.up_proj.weight", Rows::AsIs),
        "ffn_down.weight" => ("mlp.down_proj.weight", Rows::AsIs),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf_part}"), rows))
}

/// Reads, dequantizes (to f32, candle's `QTensor::dequantize`), fixes the rows of and
/// casts one tensor. The cast rounds to nearest-even, as PyTorch's `.to()` does.
pub fn convert(gguf: &mut Gguf, tensor: &Planned, dtype: Dtype) -> Result<Tensor, ImportError> {
    let err = |source| ImportError::Tensor {
        name: tensor.gguf_name.clone(),
        source: super::gguf::without_backtrace(source),
    };
    let q = gguf.read_tensor(&tensor.gguf_name)?;
    let mut t = q.dequantize(&candle_core::Device::Cpu).map_err(err)?;
    if let Rows::Unpermute { heads } = tensor.rows {
        t = unpermute(&t, heads as usize).map_err(err)?;
    }
    let target = match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::Bf16 => DType::BF16,
    };
    t.to_dtype(target).map_err(err)
}

/// GGML interleaved rotary rows back to HF's half-split rows, per head.
pub fn unpermute(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = t.dims2()?;
    let half = rows / heads / 2;
    t.reshape((heads, half, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head of 4 rows: GGML order (0, 2, 1, 3) of HF rows comes back as (0, 1, 2, 3).
    #[test]
    fn unpermute_restores_half_split_rows() -> candle_core::Result<()> {
        // HF rows r0..r3 (r0 pairs with r2, r1 with r3); GGML stores r0 r2 r1 r3, twice
        // for two heads.
        let ggml: Vec<f32> = vec![0., 2., 1., 3., 10., 12., 11., 13.];
        let t = Tensor::from_vec(ggml, (8, 1), &candle_core::Device::Cpu)?;
        let hf = unpermute(&t, 2)?.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(hf, vec![0., 1., 2., 3., 10., 11., 12., 13.]);
        Ok(())
    }
}

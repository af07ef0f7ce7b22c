//! A checkpoint's multi-token-prediction (MTP) head, as Qwen3-Next and Qwen3.5 ship it:
//! from a token and the decoder's final hidden state at the position before it, one
//! more decoder layer predicts the token after it. It drafts tokens for speculative
//! decoding that the model then verifies.
//!
//! The forward follows vLLM's `Qwen3NextMultiTokenPredictor`
//! (`vllm/model_executor/models/qwen3_next_mtp.py`; `qwen3_5_mtp.py` is the same):
//! `fc(cat(norm_e(embed(token)), norm_h(hidden)))`, one full-attention decoder layer of
//! the model's kind with keys and values of its own, the head's final norm, and the
//! model's output projection. The pair (token `i + 1`, hidden state `i`) sits at
//! position `i`, as vLLM's proposer (`vllm/v1/spec_decode/eagle.py`) places it; a second
//! draft feeds the head's own normed output back with the first draft.

use sous_kernels::gemm::Packed;
use sous_kernels::transformer as k;

use super::Layer;
use super::moe::Product;
use crate::native::NativeError;

/// The MTP head's weights (`mtp.*`).
pub(super) struct Mtp {
    /// `[hidden, 2 hidden]`.
    fc: Packed,
    norm_embedding: Vec<f32>,
    norm_hidden: Vec<f32>,
    pub(super) layer: Layer,
    pub(super) norm: Vec<f32>,
}

impl Mtp {
    pub(super) fn new(
        fc: Packed,
        norm_embedding: Vec<f32>,
        norm_hidden: Vec<f32>,
        layer: Layer,
        norm: Vec<f32>,
    ) -> Mtp {
        Mtp {
            fc,
            norm_embedding,
            norm_hidden,
            layer,
            norm,
        }
    }

    /// The layer's input: `fc(cat(norm_e(embedded), norm_h(hidden)))`, `rows × hidden`
    /// each.
    pub(super) fn input(
        &self,
        embedded: &[f32],
        hidden: &[f32],
        eps: f32,
        product: &Product,
    ) -> Result<Vec<f32>, NativeError> {
        let h = self.norm_hidden.len();
        if hidden.len() != embedded.len() {
            return Err(NativeError::Internal(format!(
                "{} hidden values for {} embedded ones",
                hidden.len(),
                embedded.len()
            )));
        }
        let rows = embedded.len() / h;
        let mut cat = vec![0.0f32; rows * 2 * h];
        for ((dst, e), x) in cat
            .chunks_exact_mut(2 * h)
            .zip(embedded.chunks_exact(h))
            .zip(hidden.chunks_exact(h))
        {
            let (a, b) = dst.split_at_mut(h);
            k::rms_norm_row(e, &self.norm_embedding, eps, a);
            k::rms_norm_row(x, &self.norm_hidden, eps, b);
        }
        let mut out = vec![0.0f32; rows * h];
        product(&cat, rows, &self.fc, &mut out);
        Ok(out)
    }

    pub(super) fn bytes(&self) -> u64 {
        self.fc.bytes() + self.layer.bytes()
    }
}

//! Loading a [`Model`] from a checkpoint: all of its layers, none of them (the stem a
//! layer-by-layer calibration starts from) or a range of them, float weights held in
//! the requested precision and the token embedding as [`Embeddings`] says, each
//! layer's projections fused into the products the forward pass runs.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use sous_kernels::gemm::{Packed, Tuning};
use sous_kernels::transformer::Rotary;

use super::{Embeddings, Layer, Model};
use crate::native::NativeError;
use crate::native::config::{Family, ModelConfig};
use crate::native::weights::{Checkpoint, Precision};

impl Model {
    /// Loads the weights of `checkpoint`, float ones held in `precision`, with rotary
    /// tables for `max_len` positions.
    pub fn load(
        config: ModelConfig,
        checkpoint: &Checkpoint,
        precision: Precision,
        max_len: usize,
    ) -> Result<Model, NativeError> {
        Model::load_with(config, checkpoint, precision, Embeddings::Stored, max_len)
    }

    /// [`Model::load`], with the token embedding and a float output projection held as
    /// `embeddings` says.
    pub fn load_with(
        config: ModelConfig,
        checkpoint: &Checkpoint,
        precision: Precision,
        embeddings: Embeddings,
        max_len: usize,
    ) -> Result<Model, NativeError> {
        let all = 0..config.layers;
        Model::load_parts(config, checkpoint, precision, embeddings, max_len, all)
    }

    /// The token embedding, final norm and output projection of `checkpoint` and none
    /// of its layers: the start of a calibration that takes the layers one at a time
    /// ([`Model::with_layers`]).
    pub fn load_stem(
        config: ModelConfig,
        checkpoint: &Checkpoint,
        precision: Precision,
        max_len: usize,
    ) -> Result<Model, NativeError> {
        Model::load_parts(config, checkpoint, precision, Embeddings::Stored, max_len, 0..0)
    }

    /// A model holding `layers` of `checkpoint` (the one this model was loaded from),
    /// in this model's precision, sharing its embedding and output projection. Its
    /// calibration passes start from the hidden states entering `layers.start`.
    pub fn with_layers(&self, checkpoint: &Checkpoint, layers: Range<usize>) -> Result<Model, NativeError> {
        Ok(Model {
            config: self.config.clone(),
            precision: self.precision,
            embed: Arc::clone(&self.embed),
            layers: load_layers(&self.config, checkpoint, self.precision, layers.clone())?,
            first_layer: layers.start,
            norm: self.norm.clone(),
            lm_head: self.lm_head.clone(),
            rotary: self.rotary.clone(),
            tuning: self.tuning,
            scratch: Mutex::default(),
        })
    }

    fn load_parts(
        config: ModelConfig,
        checkpoint: &Checkpoint,
        precision: Precision,
        embeddings: Embeddings,
        max_len: usize,
        layers: Range<usize>,
    ) -> Result<Model, NativeError> {
        let first_layer = layers.start;
        let layers = load_layers(&config, checkpoint, precision, layers)?;
        let c = &config;
        let h = c.hidden_size;
        let dtype = precision;
        const EMBED: &str = "model.embed_tokens.weight";
        // The lm_head's prefix, unless it is the embedding (tied and not stored apart).
        let head = (!c.tie_word_embeddings || checkpoint.has("lm_head.weight")).then_some("lm_head");
        let shape = [c.vocab_size, h];
        let (embed, lm_head) = match embeddings {
            Embeddings::Stored => (
                checkpoint.matrix(EMBED, shape, dtype)?,
                head.map(|p| checkpoint.linear(p, shape, dtype)).transpose()?,
            ),
            Embeddings::Q8_0 => {
                // A 16-bit lm_head becomes Q8_0; one the quantizer quantized stays as it is.
                let q8_or_stored = |p: &str| {
                    let weight = format!("{p}.weight");
                    if checkpoint.has(&weight) {
                        checkpoint.matrix_q8_0(&weight, shape)
                    } else {
                        checkpoint.linear(p, shape, dtype)
                    }
                };
                (
                    checkpoint.matrix_q8_0(EMBED, shape)?,
                    head.map(q8_or_stored).transpose()?,
                )
            }
        };
        let rotary = Rotary::new(&config.inv_freq(), max_len, 1.0);
        Ok(Model {
            norm: checkpoint.vector("model.norm.weight")?,
            config,
            precision,
            embed: Arc::new(embed),
            layers,
            first_layer,
            lm_head: lm_head.map(Arc::new),
            rotary,
            tuning: Tuning::default(),
            scratch: Mutex::default(),
        })
    }
}

/// Loads layer `i` of the decoder from `checkpoint`, float weights held in `precision`.
fn load_layer(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    precision: Precision,
    i: usize,
) -> Result<Layer, NativeError> {
    let dtype = precision;
    let stack = |name: String, parts: Vec<Packed>| {
        Packed::stack(parts).map_err(|e| NativeError::Config {
            path: name.into(),
            message: format!("cannot fuse the projections: {e}"),
        })
    };
    let c = config;
    let (h, hd) = (c.hidden_size, c.head_dim);
    let p = format!("model.layers.{i}");
    let q = checkpoint.linear(&format!("{p}.self_attn.q_proj"), [c.heads * hd, h], dtype)?;
    let kp = checkpoint.linear(&format!("{p}.self_attn.k_proj"), [c.kv_heads * hd, h], dtype)?;
    let v = checkpoint.linear(&format!("{p}.self_attn.v_proj"), [c.kv_heads * hd, h], dtype)?;
    let qkv_bias = if c.attention_bias {
        let mut bias = checkpoint.vector(&format!("{p}.self_attn.q_proj.bias"))?;
        bias.extend(checkpoint.vector(&format!("{p}.self_attn.k_proj.bias"))?);
        bias.extend(checkpoint.vector(&format!("{p}.self_attn.v_proj.bias"))?);
        Some(bias)
    } else {
        None
    };
    let (q_norm, k_norm) = if c.family == Family::Qwen3 {
        (
            Some(checkpoint.vector(&format!("{p}.self_attn.q_norm.weight"))?),
            Some(checkpoint.vector(&format!("{p}.self_attn.k_norm.weight"))?),
        )
    } else {
        (None, None)
    };
    let input_scales = if checkpoint.quantization().activations() {
        // Fused inputs take the largest of their members' scales, as vLLM does
        // (`process_weights_after_loading` of its compressed-tensors W4A4
        // scheme; its ModelOpt one takes the largest `input_scale` and inverts
        // it); q/k/v and gate/up read one input, so they agree anyway.
        let modelopt = checkpoint.quantization() == crate::native::weights::Quantization::Nvfp4W4a4ModelOpt;
        let scale = |modules: &[&str]| -> Result<f32, NativeError> {
            let mut best = f32::NEG_INFINITY;
            for m in modules {
                let name = if modelopt {
                    "input_scale"
                } else {
                    "input_global_scale"
                };
                let values = checkpoint.vector(&format!("{p}.{m}.{name}"))?;
                best = values.iter().copied().fold(best, f32::max);
            }
            Ok(if modelopt { 1.0 / best } else { best })
        };
        Some([
            scale(&["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])?,
            scale(&["self_attn.o_proj"])?,
            scale(&["mlp.gate_proj", "mlp.up_proj"])?,
            scale(&["mlp.down_proj"])?,
        ])
    } else {
        None
    };
    let gate = checkpoint.linear(&format!("{p}.mlp.gate_proj"), [c.intermediate_size, h], dtype)?;
    let up = checkpoint.linear(&format!("{p}.mlp.up_proj"), [c.intermediate_size, h], dtype)?;
    Ok(Layer {
        input_norm: checkpoint.vector(&format!("{p}.input_layernorm.weight"))?,
        qkv: stack(format!("{p}.self_attn"), vec![q, kp, v])?,
        qkv_bias,
        q_norm,
        k_norm,
        o: checkpoint.linear(&format!("{p}.self_attn.o_proj"), [h, c.heads * hd], dtype)?,
        post_norm: checkpoint.vector(&format!("{p}.post_attention_layernorm.weight"))?,
        gate_up: stack(format!("{p}.mlp"), vec![gate, up])?,
        down: checkpoint.linear(&format!("{p}.mlp.down_proj"), [h, c.intermediate_size], dtype)?,
        input_scales,
    })
}

/// Loads `layers` of the decoder, or says which are not in it.
fn load_layers(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    precision: Precision,
    layers: Range<usize>,
) -> Result<Vec<Layer>, NativeError> {
    if layers.end > config.layers {
        return Err(NativeError::Internal(format!(
            "layers {layers:?} of a model of {} layers",
            config.layers
        )));
    }
    layers
        .map(|i| load_layer(config, checkpoint, precision, i))
        .collect()
}

//! Loading a [`Model`] from a checkpoint: all of its layers, none of them (the stem a
//! layer-by-layer calibration starts from) or a range of them, float weights held in
//! the requested precision and the token embedding as [`Embeddings`] says, each
//! layer's projections fused into the products the forward pass runs.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use sous_kernels::gemm::{Packed, Tuning};
use sous_kernels::transformer::Rotary;

use super::linear::LinearAttention;
use super::moe::{Experts, input_scale, load_mlp};
use super::mtp::Mtp;
use super::{Attention, Embeddings, Ffn, Layer, Mixer, Model};
use crate::native::NativeError;
use crate::native::config::ModelConfig;
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
            mtp: None,
            tuning: self.tuning,
            scratch: Mutex::default(),
        })
    }

    /// Loads `layers` again from `checkpoint` (the one this model was loaded from, with
    /// the overlay it has now), replacing those held.
    pub fn reload_layers(
        &mut self,
        checkpoint: &Checkpoint,
        layers: Range<usize>,
    ) -> Result<(), NativeError> {
        let held = self.first_layer..self.first_layer + self.layers.len();
        if layers.start < held.start || layers.end > held.end {
            return Err(NativeError::Internal(format!(
                "reload of layers {layers:?} in a model holding {held:?}"
            )));
        }
        let fresh = load_layers(&self.config, checkpoint, self.precision, layers.clone())?;
        let at = layers.start - self.first_layer;
        self.layers.splice(at..at + fresh.len(), fresh);
        Ok(())
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
        let whole = layers == (0..config.layers);
        let layers = load_layers(&config, checkpoint, precision, layers)?;
        let mtp = if whole && checkpoint.has(MTP_FC) {
            Some(load_mtp(&config, checkpoint, precision)?)
        } else {
            None
        };
        let c = &config;
        let h = c.hidden_size;
        let dtype = precision;
        let embed_name = format!("{}.embed_tokens.weight", c.prefix);
        let embed_name = embed_name.as_str();
        // The lm_head's prefix, unless it is the embedding (tied and not stored apart).
        let head = (!c.tie_word_embeddings || checkpoint.has("lm_head.weight")).then_some("lm_head");
        let shape = [c.vocab_size, h];
        let (embed, lm_head) = match embeddings {
            Embeddings::Stored => (
                checkpoint.matrix(embed_name, shape, dtype)?,
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
                    checkpoint.matrix_q8_0(embed_name, shape)?,
                    head.map(q8_or_stored).transpose()?,
                )
            }
        };
        let rotary = Rotary::new(&config.inv_freq(), max_len, 1.0);
        Ok(Model {
            norm: norm_weight(&config, checkpoint, &format!("{}.norm.weight", config.prefix))?,
            config,
            precision,
            embed: Arc::new(embed),
            layers,
            first_layer,
            lm_head: lm_head.map(Arc::new),
            rotary,
            mtp,
            tuning: Tuning::default(),
            scratch: Mutex::default(),
        })
    }
}

/// The MTP head's input projection: what says a checkpoint has one.
const MTP_FC: &str = "mtp.fc.weight";

/// The checkpoint's MTP head (`mtp.*`): its layer is a full-attention layer of the
/// model's kind, with experts if its tensors have them.
fn load_mtp(config: &ModelConfig, checkpoint: &Checkpoint, precision: Precision) -> Result<Mtp, NativeError> {
    let h = config.hidden_size;
    let p = "mtp.layers.0";
    let sparse = config.moe.is_some() && checkpoint.has(&format!("{p}.mlp.gate.weight"));
    let layer = load_layer_at(config, checkpoint, precision, p, false, sparse)?;
    let norm = |name: &str| norm_weight(config, checkpoint, name);
    Ok(Mtp::new(
        checkpoint.linear("mtp.fc", [h, 2 * h], precision)?,
        norm("mtp.pre_fc_norm_embedding.weight")?,
        norm("mtp.pre_fc_norm_hidden.weight")?,
        layer,
        norm("mtp.norm.weight")?,
    ))
}

/// Loads layer `i` of the decoder from `checkpoint`, float weights held in `precision`.
fn load_layer(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    precision: Precision,
    i: usize,
) -> Result<Layer, NativeError> {
    let linear = config.linear.as_ref().is_some_and(|l| l.layers[i]);
    let sparse = config.moe.as_ref().is_some_and(|m| m.is_sparse(i));
    load_layer_at(
        config,
        checkpoint,
        precision,
        &format!("{}.layers.{i}", config.prefix),
        linear,
        sparse,
    )
}

/// Loads the layer under prefix `p`: linear attention or attention, experts or a dense
/// MLP.
fn load_layer_at(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    precision: Precision,
    p: &str,
    linear: bool,
    sparse: bool,
) -> Result<Layer, NativeError> {
    let c = config;
    let h = c.hidden_size;
    let mixer = match c.linear.as_ref().filter(|_| linear) {
        Some(l) => Mixer::Linear(LinearAttention::load(
            c.family,
            l,
            h,
            c.rms_norm_eps,
            checkpoint,
            precision,
            p,
        )?),
        None => Mixer::Attention(load_attention(c, checkpoint, precision, p)?),
    };
    // W4A4: the attention's activation scales (linear attention stays 16-bit).
    let attention = |modules: &[&str]| -> Result<Option<f32>, NativeError> {
        let names: Vec<String> = modules.iter().map(|m| format!("{p}.self_attn.{m}")).collect();
        input_scale(checkpoint, &names.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let input_scales = if linear {
        [None, None]
    } else {
        [
            attention(&["q_proj", "k_proj", "v_proj"])?,
            attention(&["o_proj"])?,
        ]
    };
    let mlp = match &c.moe {
        Some(moe) if sparse => Ffn::Experts(Experts::load(c.family, moe, h, checkpoint, precision, p)?),
        _ => {
            let names = ["gate_proj", "up_proj", "down_proj"];
            Ffn::Dense(load_mlp(
                checkpoint,
                precision,
                &format!("{p}.mlp"),
                names,
                h,
                c.intermediate_size,
            )?)
        }
    };
    // Qwen3-Next and Qwen3.5 scale by `1 + weight` (transformers' `Qwen3NextRMSNorm`).
    let norm =
        |name: &str| -> Result<Vec<f32>, NativeError> { norm_weight(c, checkpoint, &format!("{p}.{name}")) };
    Ok(Layer {
        input_norm: norm("input_layernorm.weight")?,
        mixer,
        post_norm: norm("post_attention_layernorm.weight")?,
        mlp,
        input_scales,
    })
}

/// An RMSNorm's weight as the product uses it: `1 + weight` where the family's norms
/// are zero-centred.
pub(super) fn norm_weight(
    c: &ModelConfig,
    checkpoint: &Checkpoint,
    name: &str,
) -> Result<Vec<f32>, NativeError> {
    let mut w = checkpoint.vector(name)?;
    if c.family.zero_centred_norms() {
        w.iter_mut().for_each(|w| *w += 1.0);
    }
    Ok(w)
}

/// Layer prefix `p`'s attention projections (a gated attention's q rows are each
/// head's query, then its gate).
fn load_attention(
    c: &ModelConfig,
    checkpoint: &Checkpoint,
    dtype: Precision,
    p: &str,
) -> Result<Attention, NativeError> {
    let (h, hd) = (c.hidden_size, c.head_dim);
    let gated = c.linear.is_some();
    let q_rows = if gated { 2 * c.heads * hd } else { c.heads * hd };
    let q = checkpoint.linear(&format!("{p}.self_attn.q_proj"), [q_rows, h], dtype)?;
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
    let (q_norm, k_norm) = if c.family.qk_norm() {
        (
            Some(norm_weight(
                c,
                checkpoint,
                &format!("{p}.self_attn.q_norm.weight"),
            )?),
            Some(norm_weight(
                c,
                checkpoint,
                &format!("{p}.self_attn.k_norm.weight"),
            )?),
        )
    } else {
        (None, None)
    };
    let qkv = Packed::stack(vec![q, kp, v]).map_err(|e| NativeError::Config {
        path: format!("{p}.self_attn").into(),
        message: format!("cannot fuse the projections: {e}"),
    })?;
    Ok(Attention {
        qkv,
        qkv_bias,
        q_norm,
        k_norm,
        o: checkpoint.linear(&format!("{p}.self_attn.o_proj"), [h, c.heads * hd], dtype)?,
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

//! A model directory's `config.json`, read into what the decoder needs.
//!
//! Field names and defaults follow transformers' `LlamaConfig`, `MistralConfig`,
//! `Qwen2Config` and `Qwen3Config` (`transformers/models/*/configuration_*.py`); the
//! experts and linear-attention layers of the MoE and hybrid families are in `layers`. Rotary
//! settings are read from `rope_scaling` + `rope_theta` (transformers 4) or from
//! `rope_parameters` (transformers 5), whichever the file has.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::NativeError;

mod layers;

pub use layers::{LinearConfig, MoeConfig};
use layers::{MoeKind, RawLayers};

/// The architectures the native engine runs, as `config.json` names them.
pub const ARCHITECTURES: [&str; 12] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
];

/// Architectures whose `config.json` nests the decoder's settings in `text_config` and
/// whose checkpoints hold its weights under `model.language_model.` (the multimodal
/// Qwen3.5 checkpoints: the native engine runs their text decoder).
const NESTED: [&str; 2] = [
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
];

/// The decoder families the native engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3, SmolLM, TinyLlama.
    Llama,
    /// Mistral (Llama with an optional sliding window).
    Mistral,
    /// Qwen2 / Qwen2.5: biases on q, k and v.
    Qwen2,
    /// Qwen3: RMSNorm on each query and key head.
    Qwen3,
    /// Mixtral: Mistral with a mixture of experts.
    Mixtral,
    /// Qwen2-MoE: Qwen2 with experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3 with experts.
    Qwen3Moe,
    /// Qwen3-Next: hybrid (Gated DeltaNet and gated attention), experts with a shared one.
    Qwen3Next,
    /// Qwen3.5, dense or MoE: Qwen3-Next's layers with separate linear-attention
    /// projections.
    Qwen3_5,
}

impl Family {
    /// Whether query and key heads are RMS-normed (Qwen3 and its successors).
    pub fn qk_norm(self) -> bool {
        matches!(
            self,
            Family::Qwen3 | Family::Qwen3Moe | Family::Qwen3Next | Family::Qwen3_5
        )
    }

    /// Whether every RMSNorm outside the linear attention scales by `1 + weight`
    /// (zero-centred weights), as Qwen3-Next and Qwen3.5 do.
    pub fn zero_centred_norms(self) -> bool {
        matches!(self, Family::Qwen3Next | Family::Qwen3_5)
    }
}

/// How rotary frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Scale factor.
        factor: f32,
        /// Low-frequency factor.
        low_freq_factor: f32,
        /// High-frequency factor.
        high_freq_factor: f32,
        /// The context length the model was trained at.
        original_max_position_embeddings: f32,
    },
}

/// What the decoder needs from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family, from `architectures`.
    pub family: Family,
    /// `architectures[0]`, for messages.
    pub architecture: String,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on the q/k/v projections.
    pub attention_bias: bool,
    /// Sliding attention window, when the model uses one.
    pub sliding_window: Option<usize>,
    /// End-of-sequence ids from the config.
    pub eos_token_ids: Vec<u32>,
    /// The checkpoint's dtype (`torch_dtype` / `dtype`).
    pub dtype: Option<String>,
    /// The `quantization_config`, if any.
    pub quantization: Option<Value>,
    /// The experts, for a mixture-of-experts model.
    pub moe: Option<MoeConfig>,
    /// The linear-attention layers, for a hybrid model; its full-attention layers are
    /// gated (`q_proj` gives each head's query and an output gate).
    pub linear: Option<LinearConfig>,
    /// Leading values of each head that rotary embedding turns (`head_dim` unless the
    /// config has a `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Where the decoder's tensors are: `model`, or `model.language_model` for a
    /// multimodal checkpoint (the embedding is `{prefix}.embed_tokens.weight`, the layers
    /// `{prefix}.layers.N`).
    pub prefix: String,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    eos_token_id: Option<Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    quantization_config: Option<Value>,
    qkv_bias: Option<bool>,
    #[serde(flatten)]
    layers: RawLayers,
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn read(dir: &Path) -> Result<ModelConfig, NativeError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| NativeError::Io {
            path: path.clone(),
            source,
        })?;
        ModelConfig::parse(&text, &path)
    }

    /// Parses the text of a `config.json` (`path` is for messages).
    pub fn parse(text: &str, path: &Path) -> Result<ModelConfig, NativeError> {
        let mut value: Value = serde_json::from_str(text).map_err(|e| config_error(path, e.to_string()))?;
        let first = value
            .pointer("/architectures/0")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let nested = NESTED.contains(&first);
        if nested {
            // The decoder's settings, with what only the top level says (architectures,
            // quantization, dtype, ids) added.
            let Some(Value::Object(mut merged)) = value.get("text_config").cloned() else {
                return Err(config_error(
                    path,
                    format!("`text_config` is missing for {first}"),
                ));
            };
            if let Value::Object(top) = &value {
                for (key, v) in top {
                    merged.entry(key.clone()).or_insert_with(|| v.clone());
                }
            }
            value = Value::Object(merged);
        }
        let raw: Raw = serde_json::from_value(value).map_err(|e| config_error(path, e.to_string()))?;
        let architecture = raw.architectures.first().cloned().unwrap_or_default();
        let family = match architecture.as_str() {
            "LlamaForCausalLM" => Family::Llama,
            "MistralForCausalLM" => Family::Mistral,
            "Qwen2ForCausalLM" => Family::Qwen2,
            "Qwen3ForCausalLM" => Family::Qwen3,
            "MixtralForCausalLM" => Family::Mixtral,
            "Qwen2MoeForCausalLM" => Family::Qwen2Moe,
            "Qwen3MoeForCausalLM" => Family::Qwen3Moe,
            "Qwen3NextForCausalLM" => Family::Qwen3Next,
            "Qwen3_5ForCausalLM"
            | "Qwen3_5MoeForCausalLM"
            | "Qwen3_5ForConditionalGeneration"
            | "Qwen3_5MoeForConditionalGeneration" => Family::Qwen3_5,
            "" => return Err(config_error(path, "`architectures` is missing".into())),
            other => {
                return Err(NativeError::Unsupported {
                    what: format!("architecture `{other}`"),
                    hint: format!(
                        "the native engine runs {}; serve this model with vLLM or SGLang",
                        ARCHITECTURES.join(", ")
                    ),
                });
            }
        };
        let need = |value: Option<usize>, key: &str| {
            value.ok_or_else(|| config_error(path, format!("`{key}` is missing")))
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let heads = need(raw.num_attention_heads, "num_attention_heads")?;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let head_dim = raw.head_dim.unwrap_or(hidden_size / heads.max(1));
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(config_error(
                path,
                format!("{heads} attention heads cannot be shared by {kv_heads} key/value heads"),
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(config_error(
                path,
                format!("head_dim {head_dim} is odd: rotary embeddings need pairs"),
            ));
        }
        let (rope_theta, rope_scaling) = rope(&raw, path)?;
        let layers = need(raw.num_hidden_layers, "num_hidden_layers")?;
        let moe_kind = match family {
            Family::Mixtral => Some(MoeKind::Mixtral),
            Family::Qwen3Moe => Some(MoeKind::Plain),
            Family::Qwen2Moe => Some(MoeKind::Shared { norm_default: false }),
            Family::Qwen3Next | Family::Qwen3_5 => Some(MoeKind::Shared { norm_default: true }),
            _ => None,
        };
        let moe = match moe_kind {
            Some(kind) => raw
                .layers
                .moe(kind, raw.intermediate_size)
                .map_err(|m| config_error(path, m))?,
            None => None,
        };
        let hybrid = matches!(family, Family::Qwen3Next | Family::Qwen3_5);
        let linear = if hybrid {
            Some(raw.layers.linear(layers).map_err(|m| config_error(path, m))?)
        } else {
            None
        };
        let rope_params = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
        let factor = raw
            .layers
            .partial_rotary_factor(rope_params, if hybrid { 0.25 } else { 1.0 });
        // transformers: `int(head_dim * partial_rotary_factor)`, rotated in pairs.
        let rotary_dim = ((head_dim as f64 * factor) as usize).min(head_dim);
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(config_error(
                path,
                format!("partial_rotary_factor {factor} of head_dim {head_dim} leaves no pairs to rotate"),
            ));
        }
        let eos_token_ids = match &raw.eos_token_id {
            Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(Value::Array(ids)) => ids.iter().filter_map(|v| v.as_u64()).map(|n| n as u32).collect(),
            _ => Vec::new(),
        };
        let sliding_window = match (family, raw.use_sliding_window) {
            // Qwen configs carry a window they do not use unless `use_sliding_window`.
            (Family::Qwen2 | Family::Qwen3 | Family::Qwen2Moe | Family::Qwen3Moe, Some(false) | None) => None,
            (Family::Qwen3Next | Family::Qwen3_5, _) => None,
            _ => raw.sliding_window,
        };
        Ok(ModelConfig {
            family,
            architecture,
            hidden_size,
            // An MoE model whose every layer has experts may have no dense width.
            intermediate_size: match (raw.intermediate_size, &moe) {
                (Some(width), _) => width,
                (None, Some(_)) => 0,
                (None, None) => need(None, "intermediate_size")?,
            },
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(2048),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw
                .attention_bias
                .or(raw.qkv_bias)
                .unwrap_or(matches!(family, Family::Qwen2 | Family::Qwen2Moe)),
            sliding_window,
            eos_token_ids,
            dtype: raw.dtype.or(raw.torch_dtype),
            quantization: raw.quantization_config,
            moe,
            linear,
            rotary_dim,
            prefix: if nested { "model.language_model" } else { "model" }.to_owned(),
        })
    }

    /// The rotary inverse frequencies, scaled as the config says
    /// (transformers' `modeling_rope_utils.py`).
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rotary_dim;
        let base: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &self.rope_scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth =
                                (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

fn rope(raw: &Raw, path: &Path) -> Result<(f32, RopeScaling), NativeError> {
    let params = raw
        .rope_parameters
        .as_ref()
        .or(raw.rope_scaling.as_ref())
        .filter(|v| !v.is_null());
    let theta = raw
        .rope_theta
        .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64))
        .unwrap_or(10_000.0) as f32;
    let Some(params) = params else {
        return Ok((theta, RopeScaling::Default));
    };
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number = |key: &str| -> Result<f32, NativeError> {
        params
            .get(key)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
            .ok_or_else(|| config_error(path, format!("rope scaling `{kind}` needs `{key}`")))
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: number("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")?,
        },
        other => {
            return Err(NativeError::Unsupported {
                what: format!("rope scaling `{other}` in {}", path.display()),
                hint: "the native engine knows `default`, `linear` and `llama3` rotary scaling".into(),
            });
        }
    };
    Ok((theta, scaling))
}

fn config_error(path: &Path, message: String) -> NativeError {
    NativeError::Config {
        path: PathBuf::from(path),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelConfig, NativeError> {
        ModelConfig::parse(text, Path::new("config.json"))
    }

    #[test]
    fn reads_smollm2_and_refuses_unknown_architectures() {
        let config = parse(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,"intermediate_size":1536,
            "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,
            "rms_norm_eps":1e-5,"rope_theta":100000.0,"tie_word_embeddings":true,"eos_token_id":2}"#,
        )
        .expect("valid");
        assert_eq!(
            (config.head_dim, config.kv_heads, config.eos_token_ids.clone()),
            (64, 3, vec![2])
        );
        assert_eq!(config.rope_scaling, RopeScaling::Default);
        let err = parse(r#"{"architectures":["GPT2LMHeadModel"]}"#).expect_err("unsupported");
        assert!(err.to_string().contains("GPT2LMHeadModel"), "{err}");
    }

    #[test]
    fn a_multimodal_qwen3_5_is_read_from_its_text_config() {
        let config = parse(
            r#"{"architectures":["Qwen3_5MoeForConditionalGeneration"],"model_type":"qwen3_5_moe",
            "tie_word_embeddings":false,"vision_config":{"depth":1},
            "text_config":{"hidden_size":64,"num_hidden_layers":4,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":16,"vocab_size":256,"num_experts":8,
            "num_experts_per_tok":2,"moe_intermediate_size":32,"shared_expert_intermediate_size":48,
            "layer_types":["linear_attention","linear_attention","linear_attention","full_attention"],
            "linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,
            "linear_value_head_dim":16,"linear_conv_kernel_dim":4,
            "rope_parameters":{"rope_theta":10000.0,"partial_rotary_factor":0.25,"rope_type":"default"}}}"#,
        )
        .expect("valid");
        assert_eq!(config.family, Family::Qwen3_5);
        assert_eq!(config.prefix, "model.language_model");
        assert_eq!((config.hidden_size, config.rotary_dim), (64, 4));
        assert_eq!(config.moe.as_ref().map(|m| m.experts), Some(8));
        assert_eq!(config.linear.as_ref().map(LinearConfig::count), Some(3));
        let err =
            parse(r#"{"architectures":["Qwen3_5ForConditionalGeneration"]}"#).expect_err("no text_config");
        assert!(err.to_string().contains("text_config"), "{err}");
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let config = parse(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":1,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":10,
            "rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
            "high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#,
        )
        .expect("valid");
        let plain = 1.0f32;
        let scaled = config.inv_freq();
        assert_eq!(scaled[0], plain);
        let last = 1.0 / 500000f32.powf(126.0 / 128.0);
        assert!((scaled[63] - last / 8.0).abs() < 1e-12);
    }
}

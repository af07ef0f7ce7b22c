//! The model's hyperparameters, read from the GGUF `{arch}.*` metadata, and the HF
//! `config.json` and `generation_config.json` written from them.
//!
//! Only the `llama` architecture is known (llama.cpp files Llama 1/2/3, Mistral and
//! SmolLM under it). Anything else is refused by name rather than guessed. The key names
//! are llama.cpp's (`gguf-py/gguf/constants.py`, `Keys.LLM` and `Keys.Attention`); the
//! mapping to HF fields mirrors transformers 5 `integrations/gguf/gguf_config_mapping.py`
//! (`integrations/ggml.py`, `GGUF_CONFIG_MAPPING["llama"]`, in transformers 4). Not
//! here: tensors and the tokenizer.

use serde_json::{Map, Value, json};

use super::gguf::Gguf;
use super::{Dtype, ImportError};

/// Architectures `sous import gguf` can convert.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

/// The hyperparameters of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Width of the residual stream.
    pub hidden_size: u64,
    /// Width of the MLP.
    pub intermediate_size: u64,
    /// Decoder layers.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: u64,
    /// Width of one head.
    pub head_dim: u64,
    /// Epsilon of the RMS norms.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// HF `rope_scaling`, when the GGUF declares linear or YaRN scaling.
    pub rope_scaling: Option<Value>,
    /// Context length the model was trained for.
    pub max_position_embeddings: u64,
    /// Rows of the embedding matrix.
    pub vocab_size: u64,
    /// Whether the output projection reuses the embedding (no `output.weight` tensor).
    pub tie_word_embeddings: bool,
    /// Special token ids from `tokenizer.ggml.*`.
    pub bos_token_id: Option<u64>,
    /// End-of-sequence id.
    pub eos_token_id: Option<u64>,
    /// Padding id.
    pub pad_token_id: Option<u64>,
}

impl LlamaConfig {
    /// Reads the hyperparameters; refuses architectures and features sous cannot convert.
    pub fn from_gguf(gguf: &Gguf) -> Result<LlamaConfig, ImportError> {
        let arch = gguf.string("general.architecture")?;
        if !SUPPORTED_ARCHITECTURES.contains(&arch) {
            return Err(ImportError::UnsupportedArchitecture {
                path: gguf.path().to_owned(),
                arch: arch.to_owned(),
            });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let unsupported = |what: String| ImportError::Unsupported {
            path: gguf.path().to_owned(),
            what,
        };

        if let Some(experts) = gguf.opt_uint(&key("expert_count"))?
            && experts > 0
        {
            return Err(unsupported(format!(
                "a mixture of experts ({experts} experts, Mixtral style)"
            )));
        }
        if gguf.has_tensor("rope_freqs.weight") {
            // Llama 3.1 style scaling: the GGUF keeps only the computed per-frequency
            // factors, not the `low_freq_factor`/`high_freq_factor` HF needs.
            return Err(unsupported(
                "Llama 3.1 style RoPE scaling (a `rope_freqs.weight` tensor)".to_owned(),
            ));
        }

        let hidden_size = gguf.uint(&key("embedding_length"))?;
        let num_attention_heads = gguf.uint(&key("attention.head_count"))?;
        let num_key_value_heads = gguf
            .opt_uint(&key("attention.head_count_kv"))?
            .unwrap_or(num_attention_heads);
        if num_attention_heads == 0
            || num_key_value_heads == 0
            || !num_attention_heads.is_multiple_of(num_key_value_heads)
        {
            return Err(ImportError::BadValue {
                path: gguf.path().to_owned(),
                key: key("attention.head_count_kv"),
                expected: format!("a divisor of {num_attention_heads} query heads"),
                found: num_key_value_heads.to_string(),
            });
        }
        let head_dim = match gguf.opt_uint(&key("attention.key_length"))? {
            Some(d) => d,
            None => hidden_size / num_attention_heads,
        };

        let (vocab_size, _) = embedding_shape(gguf)?;
        let tie_word_embeddings = !gguf.has_tensor("output.weight");

        let rope_scaling = match gguf.opt_string(&key("rope.scaling.type"))? {
            None | Some("none") => None,
            Some(kind @ ("linear" | "yarn")) => {
                let factor = gguf.opt_float(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                let mut scaling = json!({ "rope_type": kind, "factor": factor });
                if let Some(orig) = gguf.opt_uint(&key("rope.scaling.original_context_length"))? {
                    scaling["original_max_position_embeddings"] = json!(orig);
                }
                Some(scaling)
            }
            Some(other) => return Err(unsupported(format!("RoPE scaling type `{other}`"))),
        };

        Ok(LlamaConfig {
            hidden_size,
            intermediate_size: gguf.uint(&key("feed_forward_length"))?,
            num_hidden_layers: gguf.uint(&key("block_count"))?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            // llama.cpp's defaults when the key is absent (`llama-hparams`, LLM_ARCH_LLAMA).
            rms_norm_eps: gguf
                .opt_float(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
            rope_theta: gguf.opt_float(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings: gguf.uint(&key("context_length"))?,
            vocab_size,
            tie_word_embeddings,
            bos_token_id: gguf.opt_uint("tokenizer.ggml.bos_token_id")?,
            eos_token_id: gguf.opt_uint("tokenizer.ggml.eos_token_id")?,
            pad_token_id: gguf.opt_uint("tokenizer.ggml.padding_token_id")?,
        })
    }

    /// HF `config.json` for `LlamaForCausalLM`.
    pub fn to_hf_config(&self, dtype: Dtype) -> Value {
        let mut config = Map::new();
        let mut put = |k: &str, v: Value| {
            config.insert(k.to_owned(), v);
        };
        put("architectures", json!(["LlamaForCausalLM"]));
        put("model_type", json!("llama"));
        put("hidden_act", json!("silu"));
        put("hidden_size", json!(self.hidden_size));
        put("intermediate_size", json!(self.intermediate_size));
        put("num_hidden_layers", json!(self.num_hidden_layers));
        put("num_attention_heads", json!(self.num_attention_heads));
        put("num_key_value_heads", json!(self.num_key_value_heads));
        put("head_dim", json!(self.head_dim));
        put("rms_norm_eps", json!(round_f32(self.rms_norm_eps)));
        put("rope_theta", json!(round_f32(self.rope_theta)));
        put("rope_scaling", self.rope_scaling.clone().unwrap_or(Value::Null));
        put("max_position_embeddings", json!(self.max_position_embeddings));
        put("vocab_size", json!(self.vocab_size));
        put("tie_word_embeddings", json!(self.tie_word_embeddings));
        put("attention_bias", json!(false));
        put("attention_dropout", json!(0.0));
        put("mlp_bias", json!(false));
        put("pretraining_tp", json!(1));
        put("initializer_range", json!(0.02));
        put("use_cache", json!(true));
        put("bos_token_id", json!(self.bos_token_id));
        put("eos_token_id", json!(self.eos_token_id));
        put("pad_token_id", json!(self.pad_token_id));
        put("torch_dtype", json!(dtype.torch_name()));
        Value::Object(config)
    }

    /// HF `generation_config.json`: the special ids only; sampling settings are not in
    /// GGUF files, so HF's defaults (greedy) apply.
    pub fn to_generation_config(&self) -> Value {
        json!({
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        })
    }
}

/// GGUF stores `f32` values; printing them through `f64` would turn `1e-5` into
/// `9.999999747378752e-6`. Shortest decimal of the `f32`, as Python's `float32` repr does.
fn round_f32(value: f64) -> f64 {
    let short = format!("{}", value as f32);
    short.parse().unwrap_or(value)
}

/// (rows, width) of `token_embd.weight`, which every llama GGUF has.
fn embedding_shape(gguf: &Gguf) -> Result<(u64, u64), ImportError> {
    match gguf.tensor_info("token_embd.weight") {
        Some((dims, _)) if dims.len() == 2 => Ok((dims[0] as u64, dims[1] as u64)),
        Some((dims, _)) => Err(ImportError::Malformed {
            path: gguf.path().to_owned(),
            reason: format!("tensor `token_embd.weight` has shape {dims:?}, expected 2 dimensions"),
        }),
        None => Err(ImportError::MissingTensor {
            path: gguf.path().to_owned(),
            name: "token_embd.weight".to_owned(),
        }),
    }
}

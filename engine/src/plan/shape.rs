//! What a model's `config.json` says about its KV cache: each decoder layer's kind
//! (full attention, sliding-window attention, MLA, or a linear-attention / state-space
//! layer whose state does not grow with the context) and sizes, read the way
//! Hugging Face transformers reads each family's config (the per-family
//! `configuration_*.py` of transformers 4.57).
//!
//! A config whose layers sous cannot classify is an error naming the key it looked
//! for, never a guess.

use serde_json::Value;

/// One decoder layer, as far as the cache is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// K and V of every token: `kv_heads × head_dim` each.
    Full {
        /// Key/value heads.
        kv_heads: usize,
        /// Values per head.
        head_dim: usize,
    },
    /// K and V of the last `window` tokens only.
    Sliding {
        /// Key/value heads.
        kv_heads: usize,
        /// Values per head.
        head_dim: usize,
        /// Tokens attended to.
        window: usize,
    },
    /// Multi-head latent attention (DeepSeek V2/V3): one compressed vector of
    /// `kv_lora_rank + qk_rope_head_dim` values per token, shared by every head.
    Mla {
        /// `kv_lora_rank + qk_rope_head_dim`.
        latent: usize,
    },
    /// Gated DeltaNet (Qwen3-Next): a fixed-size recurrent state per request.
    GatedDeltaNet {
        /// Key heads.
        key_heads: usize,
        /// Value heads.
        value_heads: usize,
        /// Values per key head.
        key_dim: usize,
        /// Values per value head.
        value_dim: usize,
        /// Width of the causal convolution.
        conv_kernel: usize,
    },
}

/// What the cache planner needs from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// `architectures[0]`.
    pub architecture: String,
    /// The decoder layers, in order.
    pub layers: Vec<Layer>,
    /// The checkpoint's compute dtype (`torch_dtype` / `dtype`), e.g. `bfloat16`.
    pub dtype: String,
    /// The dtype of linear-attention recurrent states when the config fixes one
    /// (`mamba_ssm_dtype`, e.g. `float32` for Qwen3.5).
    pub ssm_dtype: Option<String>,
    /// The longest context the model supports.
    pub max_position_embeddings: Option<u64>,
    /// MoE: routed experts, and how many each token uses.
    pub experts: Option<(usize, usize)>,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width (the dense MLP's; an expert's for MoE models without a dense one).
    pub intermediate_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
}

/// Why a config could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config.json: {0}")]
pub struct ShapeError(pub String);

fn get(config: &Value, key: &str) -> Option<usize> {
    config.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

fn need(config: &Value, key: &str) -> Result<usize, ShapeError> {
    get(config, key).ok_or_else(|| ShapeError(format!("`{key}` is missing or not a whole number")))
}

impl Shape {
    /// Reads a model's `config.json` (the text model's, for multimodal configs that
    /// nest it under `text_config`).
    pub fn from_config(config: &Value) -> Result<Shape, ShapeError> {
        let architecture = config["architectures"][0]
            .as_str()
            .unwrap_or("unknown")
            .to_owned();
        let text = config
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(config);
        let dtype = text
            .get("torch_dtype")
            .or_else(|| text.get("dtype"))
            .or_else(|| config.get("torch_dtype"))
            .and_then(Value::as_str)
            .unwrap_or("bfloat16")
            .to_owned();
        let count = need(text, "num_hidden_layers")?;
        let heads = need(text, "num_attention_heads")?;
        let kv_heads = get(text, "num_key_value_heads").unwrap_or(heads);
        let head_dim = match get(text, "head_dim") {
            Some(d) => d,
            None => need(text, "hidden_size")? / heads.max(1),
        };
        let full = Layer::Full { kv_heads, head_dim };

        let layers = if let Some(rank) = get(text, "kv_lora_rank") {
            // DeepSeek V2/V3: every attention layer is MLA.
            let latent = rank + need(text, "qk_rope_head_dim")?;
            vec![Layer::Mla { latent }; count]
        } else if let Some(types) = text.get("layer_types").and_then(Value::as_array) {
            if types.len() != count {
                return Err(ShapeError(format!(
                    "`layer_types` has {} entries for {count} layers",
                    types.len()
                )));
            }
            let window = get(text, "sliding_window");
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(full),
                    Some("sliding_attention") => Ok(Layer::Sliding {
                        kv_heads,
                        head_dim,
                        window: window.ok_or_else(|| {
                            ShapeError(
                                "`layer_types` names sliding layers but `sliding_window` is unset".into(),
                            )
                        })?,
                    }),
                    Some("linear_attention") => gated_delta_net(text),
                    other => Err(ShapeError(format!(
                        "layer type {other:?} in `layer_types` is not one sous can size"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?
        } else if let Some(interval) = get(text, "full_attention_interval") {
            // Qwen3-Next before `layer_types`: every `interval`-th layer is full
            // attention, the others Gated DeltaNet.
            (0..count)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        Ok(full)
                    } else {
                        gated_delta_net(text)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?
        } else if let Some(window) = get(text, "sliding_window")
            && text.get("use_sliding_window").and_then(Value::as_bool) != Some(false)
        {
            let sliding = Layer::Sliding {
                kv_heads,
                head_dim,
                window,
            };
            // Gemma 3: every `pattern`-th layer is global; transformers' default pattern
            // is 6 (`Gemma3TextConfig`, `configuration_gemma3.py`), which the published
            // configs rely on by leaving the key out.
            let pattern = get(text, "sliding_window_pattern")
                .or_else(|| architecture.starts_with("Gemma3").then_some(6));
            if let Some(pattern) = pattern {
                (0..count)
                    .map(|i| if (i + 1) % pattern == 0 { full } else { sliding })
                    .collect()
            } else if architecture.starts_with("Gemma2") {
                // Gemma 2 alternates, sliding first (`is_sliding = not bool(layer_idx % 2)`).
                (0..count)
                    .map(|i| if i % 2 == 0 { sliding } else { full })
                    .collect()
            } else if let Some(max_window_layers) = get(text, "max_window_layers")
                && text.get("use_sliding_window").and_then(Value::as_bool) == Some(true)
            {
                // Qwen2: layers from `max_window_layers` on use the window.
                (0..count)
                    .map(|i| if i >= max_window_layers { sliding } else { full })
                    .collect()
            } else {
                // Mistral 7B v0.1: the window applies to every layer.
                vec![sliding; count]
            }
        } else {
            vec![full; count]
        };

        let experts = match (
            get(text, "num_experts")
                .or_else(|| get(text, "n_routed_experts"))
                .or_else(|| get(text, "num_local_experts")),
            get(text, "num_experts_per_tok"),
        ) {
            (Some(n), Some(k)) if n > 0 => Some((n, k)),
            _ => None,
        };
        let hidden_size = get(text, "hidden_size").unwrap_or(heads * head_dim);
        Ok(Shape {
            architecture,
            layers,
            dtype,
            ssm_dtype: text
                .get("mamba_ssm_dtype")
                .and_then(Value::as_str)
                .map(str::to_owned),
            hidden_size,
            intermediate_size: get(text, "intermediate_size")
                .or_else(|| get(text, "moe_intermediate_size"))
                .unwrap_or(4 * hidden_size),
            vocab_size: get(text, "vocab_size").unwrap_or(0),
            max_position_embeddings: text.get("max_position_embeddings").and_then(Value::as_u64),
            experts,
        })
    }

    /// Layers whose cache grows with the context (full attention and MLA), and all.
    pub fn growing_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l, Layer::Full { .. } | Layer::Mla { .. }))
            .count()
    }
}

fn gated_delta_net(text: &Value) -> Result<Layer, ShapeError> {
    Ok(Layer::GatedDeltaNet {
        key_heads: need(text, "linear_num_key_heads")?,
        value_heads: need(text, "linear_num_value_heads")?,
        key_dim: need(text, "linear_key_head_dim")?,
        value_dim: need(text, "linear_value_head_dim")?,
        conv_kernel: need(text, "linear_conv_kernel_dim")?,
    })
}

/// Bytes of one element of a dtype as configs and recipes spell it.
pub fn dtype_bytes(dtype: &str) -> Option<f64> {
    Some(match dtype {
        "float32" | "fp32" => 4.0,
        "bfloat16" | "float16" | "half" | "bf16" | "fp16" => 2.0,
        "fp8" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" => 1.0,
        "nvfp4" => 0.5,
        _ => return None,
    })
}

//! The parts of `config.json` that make a decoder layer other than Llama's: a
//! mixture-of-experts MLP, and the Gated DeltaNet (linear attention) layers and gated
//! attention of the hybrid Qwen models.
//!
//! Field names and defaults follow transformers 5.17's configuration classes:
//! `Qwen2MoeConfig`, `Qwen3MoeConfig`, `MixtralConfig`, `Qwen3NextConfig`,
//! `Qwen3_5TextConfig` and `Qwen3_5MoeTextConfig`
//! (`transformers/models/*/configuration_*.py`).

use serde::Deserialize;
use serde_json::Value;

/// A mixture-of-experts MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Each expert's MLP width.
    pub intermediate_size: usize,
    /// Whether the top-k routing weights are renormalized to sum to one.
    pub norm_topk_prob: bool,
    /// The width of the shared expert every token also goes through (its output scaled
    /// by `sigmoid(shared_expert_gate · x)`), if the model has one.
    pub shared_expert: Option<usize>,
    /// Every `sparse_step`-th layer has experts (`decoder_sparse_step`)...
    sparse_step: usize,
    /// ...except these, which have a dense MLP (`mlp_only_layers`).
    dense_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `i` has experts (else a dense MLP of `intermediate_size`), as
    /// transformers' `Qwen3MoeDecoderLayer` decides it.
    pub fn is_sparse(&self, i: usize) -> bool {
        !self.dense_layers.contains(&i) && (i + 1).is_multiple_of(self.sparse_step.max(1))
    }
}

/// The Gated DeltaNet layers of a hybrid model.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearConfig {
    /// Which layers are linear attention (the others are gated full attention).
    pub layers: Vec<bool>,
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads.
    pub v_heads: usize,
    /// Values per query/key head.
    pub k_dim: usize,
    /// Values per value head.
    pub v_dim: usize,
    /// Width of the causal convolution.
    pub conv_kernel: usize,
}

impl LinearConfig {
    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// f32 values of one sequence's state in one layer: the convolution's last inputs
    /// and the recurrent `k_dim × v_dim` state of every value head.
    pub fn state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.v_heads * self.k_dim * self.v_dim
    }

    /// Linear-attention layers.
    pub fn count(&self) -> usize {
        self.layers.iter().filter(|&&l| l).count()
    }
}

#[derive(Deserialize, Default)]
pub(super) struct RawLayers {
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    shared_expert_intermediate_size: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    partial_rotary_factor: Option<f64>,
}

/// What kind of MoE a family has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MoeKind {
    /// Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE: top-k with the config's `norm_topk_prob`
    /// (default per family) and a gated shared expert.
    Shared { norm_default: bool },
    /// Qwen3-MoE: top-k, `norm_topk_prob`, no shared expert.
    Plain,
    /// Mixtral: top-k always renormalized.
    Mixtral,
}

impl RawLayers {
    /// The MoE settings, or a message naming the missing field.
    pub(super) fn moe(
        &self,
        kind: MoeKind,
        intermediate_size: Option<usize>,
    ) -> Result<Option<MoeConfig>, String> {
        // transformers 5 writes `num_local_experts` for every family (the Qwen configs'
        // `attribute_map` maps `num_experts` to it); the models' own checkpoints have
        // `num_experts`, Mixtral's `num_local_experts`.
        let experts = self.num_experts.or(self.num_local_experts);
        let Some(experts) = experts.filter(|&e| e > 0) else {
            // A hybrid family without experts is the dense one.
            return match kind {
                MoeKind::Shared { .. } => Ok(None),
                _ => Err("`num_experts` is missing".into()),
            };
        };
        let top_k = self
            .num_experts_per_tok
            .ok_or("`num_experts_per_tok` is missing")?;
        if top_k == 0 || top_k > experts {
            return Err(format!(
                "`num_experts_per_tok` {top_k} is not between 1 and {experts} experts"
            ));
        }
        let width = match kind {
            MoeKind::Mixtral => intermediate_size,
            _ => self.moe_intermediate_size,
        };
        let shared_expert = match kind {
            MoeKind::Shared { .. } => Some(
                self.shared_expert_intermediate_size
                    .ok_or("`shared_expert_intermediate_size` is missing")?,
            )
            .filter(|&w| w > 0),
            _ => None,
        };
        Ok(Some(MoeConfig {
            experts,
            top_k,
            intermediate_size: width.ok_or("`moe_intermediate_size` is missing")?,
            norm_topk_prob: match kind {
                MoeKind::Mixtral => true,
                MoeKind::Plain => self.norm_topk_prob.unwrap_or(false),
                MoeKind::Shared { norm_default } => self.norm_topk_prob.unwrap_or(norm_default),
            },
            shared_expert,
            sparse_step: self.decoder_sparse_step.unwrap_or(1),
            dense_layers: self.mlp_only_layers.clone().unwrap_or_default(),
        }))
    }

    /// The linear-attention settings of a hybrid model of `layers` layers.
    pub(super) fn linear(&self, layers: usize) -> Result<LinearConfig, String> {
        let kinds: Vec<bool> = match &self.layer_types {
            Some(types) => {
                if types.len() != layers {
                    return Err(format!("`layer_types` names {} layers of {layers}", types.len()));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "linear_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        other => Err(format!(
                            "`layer_types` holds `{other}`, not linear or full attention"
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            None => {
                let interval = self.full_attention_interval.unwrap_or(4).max(1);
                (0..layers).map(|i| !(i + 1).is_multiple_of(interval)).collect()
            }
        };
        let need = |v: Option<usize>, key: &str| v.filter(|&v| v > 0).ok_or(format!("`{key}` is missing"));
        let config = LinearConfig {
            layers: kinds,
            k_heads: need(self.linear_num_key_heads, "linear_num_key_heads")?,
            v_heads: need(self.linear_num_value_heads, "linear_num_value_heads")?,
            k_dim: need(self.linear_key_head_dim, "linear_key_head_dim")?,
            v_dim: need(self.linear_value_head_dim, "linear_value_head_dim")?,
            conv_kernel: need(self.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
        };
        if !config.v_heads.is_multiple_of(config.k_heads) {
            return Err(format!(
                "{} linear value heads cannot share {} key heads",
                config.v_heads, config.k_heads
            ));
        }
        Ok(config)
    }

    /// `partial_rotary_factor`, from the top level or the rotary parameters.
    pub(super) fn partial_rotary_factor(&self, rope: Option<&Value>, default: f64) -> f64 {
        self.partial_rotary_factor
            .or_else(|| {
                rope.and_then(|r| r.get("partial_rotary_factor"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(default)
    }
}

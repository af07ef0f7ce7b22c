//! Which tensors become NVFP4 and which keep their precision, as the reference tools
//! choose (llm-compressor 0.14.0.1 `examples/quantization_w4a16_fp4/` and
//! `examples/quantization_w4a4_fp4/`; ModelOpt 0.47.0
//! `modelopt_recipes/configs/ptq/units/default_disabled_quantizers.yaml`; summarized in
//! `docs/nvfp4.md`, "What is quantized").
//!
//! Quantized: the 2-D weights of the decoder's Linear layers (llm-compressor's
//! `targets="Linear"`). Kept: lm_head (every llm-compressor example ignores it; ModelOpt
//! excludes `*lm_head*`), embeddings (not Linear), norms and biases (not 2-D weights),
//! MoE routers (`re:.*mlp.gate$`, `re:.*router`, `re:.*shared_expert_gate$` in the
//! llm-compressor examples; ModelOpt's default-disabled quantizers), linear attention
//! (`re:.*linear_attn.*` in the Qwen3-Next examples: "Gated DeltaNet fused projections
//! are incompatible with microscale formats"), Mamba mixer projections, MTP layers
//! (llm-compressor does not even load them; ModelOpt keeps `mtp.*`), and vision or
//! audio towers (ModelOpt 0.47 `*visual*`, `*vision_tower*`, `*vision_model*`,
//! `*multi_modal_projector*`, `*embed_vision*`). The recipe's `quantize.ignore` adds
//! exact module names or `re:` patterns, matched from the start of the module name as
//! compressed-tensors' and vLLM's `re.match` do.
//!
//! Not here: fused groups (`fused.rs`) or output names (`layout.rs`).

use regex::Regex;

use super::error::QuantizeError;
use super::source::SourceTensor;

/// What happens to one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// NVFP4.
    Quantize,
    /// Written unchanged.
    Keep(Kept),
}

/// Why a tensor is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Not the 2-D weight of a Linear-like layer (norms, biases, buffers, convolutions).
    NotLinear,
    /// A token or position embedding.
    Embedding,
    /// The output head.
    LmHead,
    /// A MoE router.
    Router,
    /// Linear attention (Gated DeltaNet).
    LinearAttention,
    /// A Mamba mixer projection.
    Mamba,
    /// A multi-token-prediction layer.
    Mtp,
    /// A vision or audio tower, or a multimodal projector.
    Tower,
    /// `quantize.ignore`.
    Ignored(String),
}

impl Kept {
    /// Whether the kept tensor is a Linear layer's weight: those are the modules that
    /// compressed-tensors lists in `ignore` and ModelOpt in `exclude_modules`.
    pub fn is_linear(&self) -> bool {
        !matches!(self, Kept::NotLinear | Kept::Embedding)
    }

    /// A short reason for the summary.
    pub fn reason(&self) -> String {
        match self {
            Kept::NotLinear => "not a Linear weight".into(),
            Kept::Embedding => "embedding".into(),
            Kept::LmHead => "lm_head".into(),
            Kept::Router => "MoE router".into(),
            Kept::LinearAttention => "linear attention".into(),
            Kept::Mamba => "Mamba mixer".into(),
            Kept::Mtp => "MTP layer".into(),
            Kept::Tower => "vision/audio tower".into(),
            Kept::Ignored(pattern) => format!("ignored by `{pattern}`"),
        }
    }
}

/// One `quantize.ignore` entry.
#[derive(Debug)]
enum Pattern {
    Exact(String),
    Regex(String, Regex),
}

/// The selection rules for one model.
#[derive(Debug)]
pub struct Selector {
    ignore: Vec<Pattern>,
    /// Decoder layers at or past this index are MTP layers (DeepSeek-V3 numbers its MTP
    /// layer after the last decoder layer; `num_nextn_predict_layers` says it has one).
    mtp_from: Option<usize>,
    /// Quantize linear-attention projections too (but `in_proj_a`/`in_proj_b`, which
    /// ModelOpt keeps as well): what `sous quantize --scan` measures, never a default.
    linear_attention: bool,
}

impl Selector {
    /// Rules for a model with `num_hidden_layers` decoder layers (when it declares MTP
    /// layers) and the user's ignore list.
    pub fn new(ignore: &[String], mtp_from: Option<usize>) -> Result<Selector, QuantizeError> {
        let ignore = ignore
            .iter()
            .map(|entry| match entry.strip_prefix("re:") {
                Some(re) => Regex::new(&format!("^(?:{re})"))
                    .map(|r| Pattern::Regex(entry.clone(), r))
                    .map_err(|e| QuantizeError::BadPattern {
                        pattern: entry.clone(),
                        message: e.to_string(),
                    }),
                None => Ok(Pattern::Exact(entry.clone())),
            })
            .collect::<Result<_, _>>()?;
        Ok(Selector {
            ignore,
            mtp_from,
            linear_attention: false,
        })
    }

    /// These rules, with linear-attention projections quantized.
    pub fn quantizing_linear_attention(mut self) -> Selector {
        self.linear_attention = true;
        self
    }

    /// Quantize or keep, and why.
    pub fn decide(&self, tensor: &SourceTensor) -> Decision {
        let Some(module) = tensor.name.strip_suffix(".weight") else {
            return Decision::Keep(Kept::NotLinear);
        };
        if tensor.shape.len() != 2 {
            return Decision::Keep(Kept::NotLinear);
        }
        if let Some(kept) = self.builtin(module) {
            return Decision::Keep(kept);
        }
        for pattern in &self.ignore {
            let hit = match pattern {
                Pattern::Exact(name) => name == module || *name == tensor.name,
                Pattern::Regex(_, re) => re.is_match(module),
            };
            if hit {
                let entry = match pattern {
                    Pattern::Exact(name) | Pattern::Regex(name, _) => name.clone(),
                };
                return Decision::Keep(Kept::Ignored(entry));
            }
        }
        Decision::Quantize
    }

    /// Whether a `quantize.ignore` entry names this tensor (or its module).
    pub fn ignores(&self, tensor: &str) -> bool {
        let module = tensor.strip_suffix(".weight").unwrap_or(tensor);
        self.ignore.iter().any(|pattern| match pattern {
            Pattern::Exact(name) => name == module || name == tensor,
            Pattern::Regex(_, re) => re.is_match(module),
        })
    }

    fn builtin(&self, module: &str) -> Option<Kept> {
        let segments: Vec<&str> = module.split('.').collect();
        let last = segments.last().copied().unwrap_or_default();
        if segments.iter().any(|s| s.contains("embed")) || matches!(last, "wte" | "wpe") {
            return Some(Kept::Embedding);
        }
        if last == "lm_head" || module == "output" || segments.iter().any(|s| s.contains("output_layer")) {
            return Some(Kept::LmHead);
        }
        if segments.iter().any(|s| {
            s.contains("visual")
                || s.contains("vision")
                || *s == "multi_modal_projector"
                || s.contains("audio")
        }) {
            return Some(Kept::Tower);
        }
        if segments.first() == Some(&"mtp") || segments.contains(&"mtp") || self.is_mtp_layer(&segments) {
            return Some(Kept::Mtp);
        }
        if last == "gate" || last == "shared_expert_gate" || segments.iter().any(|s| s.contains("router")) {
            return Some(Kept::Router);
        }
        let small_gates = matches!(last, "in_proj_a" | "in_proj_b" | "in_proj_ba");
        if segments.contains(&"linear_attn") && (!self.linear_attention || small_gates) {
            return Some(Kept::LinearAttention);
        }
        if segments.contains(&"mixer")
            && matches!(last, "in_proj" | "out_proj" | "x_proj" | "dt_proj" | "conv1d")
        {
            return Some(Kept::Mamba);
        }
        None
    }

    fn is_mtp_layer(&self, segments: &[&str]) -> bool {
        let Some(first_mtp) = self.mtp_from else {
            return false;
        };
        segments
            .windows(2)
            .find(|w| w[0] == "layers")
            .and_then(|w| w[1].parse::<usize>().ok())
            .is_some_and(|layer| layer >= first_mtp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: &[usize]) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shard: 0,
            dtype: safetensors::Dtype::BF16,
            shape: shape.to_vec(),
            offset: 0,
            len: 0,
        }
    }

    fn decide(selector: &Selector, name: &str) -> Decision {
        selector.decide(&tensor(name, &[64, 64]))
    }

    #[test]
    fn decoder_linears_are_quantized_and_the_rest_kept() {
        let s = Selector::new(&[], None).expect("rules");
        for name in [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.3.mlp.experts.7.down_proj.weight",
            "model.layers.1.block_sparse_moe.experts.0.w1.weight",
            "model.layers.2.mixer.q_proj.weight",
        ] {
            assert_eq!(decide(&s, name), Decision::Quantize, "{name}");
        }
        let kept = [
            ("lm_head.weight", Kept::LmHead),
            ("model.embed_tokens.weight", Kept::Embedding),
            ("transformer.wte.weight", Kept::Embedding),
            ("model.layers.0.mlp.gate.weight", Kept::Router),
            ("model.layers.0.mlp.shared_expert_gate.weight", Kept::Router),
            ("model.layers.0.block_sparse_moe.gate.weight", Kept::Router),
            ("model.layers.0.feed_forward.router.weight", Kept::Router),
            (
                "model.layers.0.linear_attn.in_proj_qkvz.weight",
                Kept::LinearAttention,
            ),
            ("model.layers.0.mixer.in_proj.weight", Kept::Mamba),
            ("mtp.layers.0.mlp.up_proj.weight", Kept::Mtp),
            ("model.visual.blocks.0.attn.qkv.weight", Kept::Tower),
            (
                "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight",
                Kept::Tower,
            ),
            ("model.multi_modal_projector.linear_1.weight", Kept::Tower),
        ];
        for (name, want) in kept {
            assert_eq!(decide(&s, name), Decision::Keep(want), "{name}");
        }
        assert_eq!(
            s.decide(&tensor("model.norm.weight", &[64])),
            Decision::Keep(Kept::NotLinear)
        );
        assert_eq!(
            s.decide(&tensor("model.layers.0.self_attn.q_proj.bias", &[64])),
            Decision::Keep(Kept::NotLinear)
        );
    }

    #[test]
    fn deepseek_mtp_layer_follows_the_decoder() {
        let s = Selector::new(&[], Some(61)).expect("rules");
        assert_eq!(
            decide(&s, "model.layers.60.mlp.up_proj.weight"),
            Decision::Quantize
        );
        assert_eq!(
            decide(&s, "model.layers.61.mlp.up_proj.weight"),
            Decision::Keep(Kept::Mtp)
        );
    }

    #[test]
    fn ignore_entries_match_like_compressed_tensors() {
        let s = Selector::new(
            &[
                "model.layers.0.mlp.down_proj".into(),
                r"re:.*self_attn\.o_proj".into(),
            ],
            None,
        )
        .expect("rules");
        assert!(matches!(
            decide(&s, "model.layers.0.mlp.down_proj.weight"),
            Decision::Keep(Kept::Ignored(_))
        ));
        assert_eq!(
            decide(&s, "model.layers.1.mlp.down_proj.weight"),
            Decision::Quantize
        );
        assert!(matches!(
            decide(&s, "model.layers.5.self_attn.o_proj.weight"),
            Decision::Keep(Kept::Ignored(_))
        ));
        // `re:` matches from the start, as Python's re.match.
        let anchored = Selector::new(&[r"re:self_attn".into()], None).expect("rules");
        assert_eq!(
            decide(&anchored, "model.layers.5.self_attn.o_proj.weight"),
            Decision::Quantize
        );
        assert!(matches!(
            Selector::new(&["re:(".into()], None),
            Err(QuantizeError::BadPattern { .. })
        ));
    }
}

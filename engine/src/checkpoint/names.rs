//! The tensor names of one NVFP4-quantized Linear layer in each checkpoint format, and
//! the `config.json` `quantization_config` values that identify the format.
//!
//! For a module `P` (e.g. `model.layers.0.mlp.down_proj`) whose unquantized weight is
//! `P.weight`:
//!
//! | format | packed FP4 codes, U8 `[out, in/2]` | FP8 E4M3 block scales `[out, in/16]` | F32 per-tensor scale |
//! |---|---|---|---|
//! | compressed-tensors | `P.weight_packed` | `P.weight_scale` | `P.weight_global_scale`, shape `[1]` |
//! | ModelOpt | `P.weight` | `P.weight_scale` | `P.weight_scale_2`, 0-d |
//!
//! compressed-tensors 0.19.0 names them in `NVFP4PackedCompressor.compression_param_names`
//! (`src/compressed_tensors/compressors/nvfp4/`); ModelOpt 0.47.0 in
//! `quantizer_attr_names()` (`modelopt/torch/quantization/utils.py`), and squeezes the
//! per-tensor scale to 0-d in `modelopt/torch/export/unified_export_hf.py`. Weight-only
//! (NVFP4A16) checkpoints have no activation scales (`input_global_scale`,
//! `input_scale`), so none are named here.
//!
//! Not here: the arithmetic behind the values (`sous-kernels`), or the rest of the
//! configuration files.

use crate::recipe::QuantFormat;

/// `quant_method` of a compressed-tensors checkpoint.
pub const COMPRESSED_TENSORS: &str = "compressed-tensors";
/// The compressed-tensors `format` of packed NVFP4 weights.
pub const NVFP4_PACK_QUANTIZED: &str = "nvfp4-pack-quantized";
/// `quant_method` of a ModelOpt checkpoint.
pub const MODELOPT: &str = "modelopt";
/// ModelOpt's `quant_algo` for NVFP4 weights with 16-bit activations.
pub const W4A16_NVFP4: &str = "W4A16_NVFP4";
/// ModelOpt's `quant_algo` for NVFP4 weights and activations (W4A4).
pub const NVFP4: &str = "NVFP4";

/// The suffix of an unquantized Linear weight.
pub const WEIGHT: &str = "weight";

/// The suffixes of one quantized layer's tensors in one format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4Names {
    /// The packed FP4 codes.
    pub packed: &'static str,
    /// The FP8 block scales.
    pub scales: &'static str,
    /// The per-tensor scale.
    pub global: &'static str,
    /// The per-tensor scale's shape.
    pub global_shape: &'static [usize],
    /// W4A4: the per-tensor activation scale (a multiplier in compressed-tensors,
    /// `2688 / amax`; a divisor in ModelOpt, `amax / 2688`).
    pub input: &'static str,
}

impl Nvfp4Names {
    /// The names `format` uses.
    pub const fn of(format: QuantFormat) -> Nvfp4Names {
        match format {
            QuantFormat::CompressedTensors => Nvfp4Names {
                packed: "weight_packed",
                scales: "weight_scale",
                global: "weight_global_scale",
                global_shape: &[1],
                input: "input_global_scale",
            },
            QuantFormat::Modelopt => Nvfp4Names {
                packed: WEIGHT,
                scales: "weight_scale",
                global: "weight_scale_2",
                global_shape: &[],
                input: "input_scale",
            },
        }
    }
}

/// The full name of `module`'s tensor `suffix`: `module.suffix`.
pub fn tensor(module: &str, suffix: &str) -> String {
    format!("{module}.{suffix}")
}

/// The module a weight belongs to: `P` of `P.weight` (the name itself if it has no
/// `.weight` suffix).
pub fn module_of(weight: &str) -> &str {
    weight
        .strip_suffix(WEIGHT)
        .and_then(|m| m.strip_suffix('.'))
        .unwrap_or(weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_name_the_same_layer() {
        let ct = Nvfp4Names::of(QuantFormat::CompressedTensors);
        let mo = Nvfp4Names::of(QuantFormat::Modelopt);
        let module = module_of("model.layers.0.mlp.down_proj.weight");
        assert_eq!(module, "model.layers.0.mlp.down_proj");
        assert_eq!(
            tensor(module, ct.packed),
            "model.layers.0.mlp.down_proj.weight_packed"
        );
        assert_eq!(tensor(module, mo.packed), "model.layers.0.mlp.down_proj.weight");
        assert_eq!(
            tensor(module, mo.global),
            "model.layers.0.mlp.down_proj.weight_scale_2"
        );
        assert_eq!((ct.global_shape, mo.global_shape), (&[1usize][..], &[][..]));
        assert_eq!(module_of("lm_head"), "lm_head");
        assert_eq!(module_of("x.weight_scale"), "x.weight_scale");
    }
}

//! What each checkpoint format calls things: tensor names, dtypes and shapes per
//! quantized layer, and the configuration files engines read to recognise it.
//!
//! compressed-tensors (reference §3): `P.weight_packed` U8 `[out, in/2]`,
//! `P.weight_scale` F8_E4M3 `[out, in/16]`, `P.weight_global_scale` F32 `[1]`, and
//! `config.json` `quantization_config` as llm-compressor 0.14 writes it for
//! `NVFP4A16`, minus `scale_dtype`/`zp_dtype`: compressed-tensors ≤ 0.12 (which some
//! vLLM releases pin) rejects those keys, and they are optional in 0.19 with the same
//! meaning for NVFP4 (§3.2, "Compatibility rule").
//!
//! ModelOpt (§4): `P.weight` U8, `P.weight_scale` F8_E4M3, `P.weight_scale_2` F32 0-d
//! (`.squeeze()`d in `unified_export_hf.py`), `hf_quant_config.json` with the nested
//! `quantization` object vLLM and TensorRT-LLM require, and the flat
//! `quantization_config` ModelOpt 0.47 adds to `config.json`.

use serde_json::{Value, json};
use sous_engine::recipe::{QuantFormat, QuantScheme};
use sous_kernels::Flavor;

/// The NVFP4 block size, in the configs.
const GROUP_SIZE: u32 = 16;

/// Per-layer tensor names and the global scale's shape.
pub struct Names {
    /// Suffix of the packed FP4 codes.
    pub packed: &'static str,
    /// Suffix of the FP8 block scales.
    pub scales: &'static str,
    /// Suffix of the per-tensor scale.
    pub global: &'static str,
    /// Shape of the per-tensor scale.
    pub global_shape: &'static [usize],
}

/// The tensor names of `format`.
pub fn names(format: QuantFormat) -> Names {
    match format {
        QuantFormat::CompressedTensors => Names {
            packed: "weight_packed",
            scales: "weight_scale",
            global: "weight_global_scale",
            global_shape: &[1],
        },
        QuantFormat::Modelopt => Names {
            packed: "weight",
            scales: "weight_scale",
            global: "weight_scale_2",
            global_shape: &[],
        },
    }
}

/// Which ModelOpt export to reproduce: the two differ in one rounding of
/// `weight_scale_2` (reference §2.2), which can flip block scales and codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelOptExport {
    /// On a GPU, the normal case, which published ModelOpt checkpoints carry:
    /// `weight_scale_2 = amax * f32(1/2688)`.
    Gpu,
    /// On a CPU: `weight_scale_2 = amax / 2688`.
    Cpu,
}

/// Whose arithmetic the format's bytes follow.
pub fn flavor(format: QuantFormat, export: ModelOptExport) -> Flavor {
    match (format, export) {
        (QuantFormat::CompressedTensors, _) => Flavor::CompressedTensors,
        (QuantFormat::Modelopt, ModelOptExport::Gpu) => Flavor::ModelOptGpu,
        (QuantFormat::Modelopt, ModelOptExport::Cpu) => Flavor::ModelOptCpu,
    }
}

/// The short name of a format, for messages and metadata.
pub fn format_name(format: QuantFormat) -> &'static str {
    match format {
        QuantFormat::CompressedTensors => "compressed-tensors",
        QuantFormat::Modelopt => "modelopt",
    }
}

/// The short name of a scheme.
pub fn scheme_name(scheme: QuantScheme) -> &'static str {
    match scheme {
        QuantScheme::Nvfp4a16 => "nvfp4a16",
        QuantScheme::Nvfp4 => "nvfp4",
    }
}

/// `config.json`'s `quantization_config` for a weight-only NVFP4 checkpoint; `ignore`
/// lists the Linear modules kept unquantized (compressed-tensors) or every kept
/// module (ModelOpt), sorted.
pub fn quantization_config(format: QuantFormat, ignore: &[String]) -> Value {
    match format {
        QuantFormat::CompressedTensors => json!({
            "config_groups": {
                "group_0": {
                    "format": "nvfp4-pack-quantized",
                    "input_activations": null,
                    "output_activations": null,
                    "targets": ["Linear"],
                    "weights": {
                        "actorder": null,
                        "block_structure": null,
                        "dynamic": false,
                        "group_size": GROUP_SIZE,
                        "num_bits": 4,
                        "observer": "memoryless_minmax",
                        "observer_kwargs": {},
                        "strategy": "tensor_group",
                        "symmetric": true,
                        "type": "float"
                    }
                }
            },
            "format": "nvfp4-pack-quantized",
            "global_compression_ratio": null,
            "ignore": ignore,
            "kv_cache_scheme": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.19.0"
        }),
        QuantFormat::Modelopt => json!({
            "config_groups": {
                "group_0": {
                    "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE},
                    "targets": ["Linear"]
                }
            },
            "ignore": ignore,
            "quant_algo": "W4A16_NVFP4",
            "producer": producer(),
            "quant_method": "modelopt"
        }),
    }
}

/// ModelOpt's `hf_quant_config.json` for a weight-only NVFP4 checkpoint.
pub fn hf_quant_config(exclude: &[String]) -> Value {
    json!({
        "producer": producer(),
        "quantization": {
            "quant_algo": "W4A16_NVFP4",
            "kv_cache_quant_algo": null,
            "group_size": GROUP_SIZE,
            "exclude_modules": exclude
        }
    })
}

/// Who wrote the checkpoint. Loaders read only `quantization`; the producer is sous,
/// not ModelOpt, and says so.
fn producer() -> Value {
    json!({"name": "sous", "version": env!("CARGO_PKG_VERSION")})
}

//! The configuration files that tell engines what a checkpoint is, and which tool's
//! arithmetic its bytes follow. The tensor names of each format are
//! [`sous_engine::checkpoint::names`]'s, shared with the native engine's loader.
//!
//! compressed-tensors: `config.json` `quantization_config` as llm-compressor 0.14.0.1
//! (with compressed-tensors 0.19.0, `ModelCompressor.update_config` in
//! `src/compressed_tensors/compressors/model_compressors/model_compressor.py`) writes it
//! for `NVFP4A16`, minus `scale_dtype`/`zp_dtype`: compressed-tensors 0.12.2 and older
//! (which some vLLM releases pin) reject those keys (`QuantizationArgs` is
//! `extra="forbid"` there), and they are optional in 0.19.0 with the same meaning for
//! NVFP4.
//!
//! ModelOpt: `hf_quant_config.json` with the nested `quantization` object vLLM
//! (`ModelOptNvFp4Config.from_config`, `vllm/model_executor/layers/quantization/
//! modelopt.py`) and TensorRT-LLM (`tensorrt_llm/_torch/model_config.py`) require, and
//! the flat `quantization_config` ModelOpt 0.47.0 adds to `config.json`
//! (`convert_hf_quant_config_format`, `modelopt/torch/export/`).
//!
//! `docs/nvfp4.md` shows both formats whole.

use serde_json::{Value, json};
use sous_engine::checkpoint::names::{
    COMPRESSED_TENSORS, MODELOPT, NVFP4, NVFP4_PACK_QUANTIZED, W4A16_NVFP4,
};
use sous_engine::recipe::{QuantFormat, QuantScheme};
use sous_kernels::Flavor;

/// The NVFP4 block size, in the configs.
const GROUP_SIZE: u32 = 16;

/// Which ModelOpt export to reproduce: the two differ in one rounding of
/// `weight_scale_2` (PyTorch divides by a Python float as a multiplication by its f32
/// reciprocal on CUDA, a true division on the CPU; `docs/nvfp4.md`), which can flip
/// block scales and codes.
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
        QuantFormat::CompressedTensors => COMPRESSED_TENSORS,
        QuantFormat::Modelopt => MODELOPT,
    }
}

/// The short name of a scheme.
pub fn scheme_name(scheme: QuantScheme) -> &'static str {
    match scheme {
        QuantScheme::Nvfp4a16 => "nvfp4a16",
        QuantScheme::Nvfp4 => "nvfp4",
    }
}

/// `config.json`'s `quantization_config` for an NVFP4 checkpoint; `ignore` lists the
/// Linear modules kept unquantized (compressed-tensors) or every kept module
/// (ModelOpt), sorted. `w4a4` adds compressed-tensors' `input_activations`: FP4 in
/// blocks of 16 with scales computed at run time (`dynamic: "local"`) under the
/// calibrated per-tensor `input_global_scale`, as the `NVFP4` preset scheme of
/// compressed-tensors 0.19.0 (`quantization/quant_scheme.py`) serializes, minus
/// `scale_dtype`/`zp_dtype` as for the weights.
pub fn quantization_config(format: QuantFormat, ignore: &[String], w4a4: bool) -> Value {
    let input_activations = if w4a4 {
        json!({
            "actorder": null,
            "block_structure": null,
            "dynamic": "local",
            "group_size": GROUP_SIZE,
            "num_bits": 4,
            "observer": "static_minmax",
            "observer_kwargs": {},
            "strategy": "tensor_group",
            "symmetric": true,
            "type": "float"
        })
    } else {
        Value::Null
    };
    match format {
        QuantFormat::CompressedTensors => json!({
            "config_groups": {
                "group_0": {
                    "format": NVFP4_PACK_QUANTIZED,
                    "input_activations": input_activations,
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
            "format": NVFP4_PACK_QUANTIZED,
            "global_compression_ratio": null,
            "ignore": ignore,
            "kv_cache_scheme": null,
            "quant_method": COMPRESSED_TENSORS,
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.19.0"
        }),
        // ModelOpt 0.47 `convert_hf_quant_config_format`
        // (`modelopt/torch/export/convert_hf_config.py`): for `NVFP4` (W4A4) the group
        // also lists FP4 input activations in blocks of 16.
        QuantFormat::Modelopt if w4a4 => json!({
            "config_groups": {
                "group_0": {
                    "input_activations": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE},
                    "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE},
                    "targets": ["Linear"]
                }
            },
            "ignore": ignore,
            "quant_algo": NVFP4,
            "producer": producer(),
            "quant_method": MODELOPT
        }),
        QuantFormat::Modelopt => json!({
            "config_groups": {
                "group_0": {
                    "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE},
                    "targets": ["Linear"]
                }
            },
            "ignore": ignore,
            "quant_algo": W4A16_NVFP4,
            "producer": producer(),
            "quant_method": MODELOPT
        }),
    }
}

/// ModelOpt's `hf_quant_config.json` for an NVFP4 checkpoint: `W4A16_NVFP4` weight-only,
/// `NVFP4` with FP4 activations (W4A4).
pub fn hf_quant_config(exclude: &[String], w4a4: bool) -> Value {
    json!({
        "producer": producer(),
        "quantization": {
            "quant_algo": if w4a4 { NVFP4 } else { W4A16_NVFP4 },
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

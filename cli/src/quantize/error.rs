//! Why a quantization cannot go ahead, naming the file or tensor and what to do.

use std::io;
use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose, user_unless};

/// A quantization that cannot run or finish.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// W4A4 needs activation scales, which need calibration data run through the model.
    #[error(
        "scheme `nvfp4` (W4A4) needs an `input_global_scale` for every quantized layer, measured by \
         running calibration data through the model, and none was given"
    )]
    NeedsCalibration,
    /// Calibration could not run.
    #[error("calibration: {message}")]
    Calibration {
        /// What went wrong.
        message: String,
    },
    /// The calibration text file cannot be read.
    #[error("cannot read the calibration text `{}`: {message}", path.display())]
    CalibrationText {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// `--device cuda` and the GPU cannot be used.
    #[error("cannot quantize on the GPU: {message}")]
    Gpu {
        /// What is missing or failed.
        message: String,
    },
    /// A quantized layer had no calibrated input range.
    #[error("`{module}` is quantized but calibration measured no input range for it")]
    Uncalibrated {
        /// The module.
        module: String,
    },
    /// The directory holds no safetensors model.
    #[error("{dir}: {reason}")]
    NoModel {
        /// The directory.
        dir: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A source file is unreadable or malformed.
    #[error("{file}: {message}")]
    BadSource {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The model already carries a quantization.
    #[error("{dir} is already quantized (`quantization_config.quant_method` is `{method}`)")]
    AlreadyQuantized {
        /// The model directory.
        dir: PathBuf,
        /// Its quantization method.
        method: String,
    },
    /// A weight to quantize has an input dimension that is not a multiple of 16.
    #[error("{tensor} has {cols} input features, not a multiple of 16 (NVFP4 blocks are 16 wide)")]
    NotBlockAligned {
        /// The tensor.
        tensor: String,
        /// Its input dimension.
        cols: usize,
    },
    /// A weight to quantize is not bf16, fp16 or fp32.
    #[error("{tensor} is {dtype}; only BF16, F16 and F32 weights can be quantized")]
    UnsupportedDtype {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: String,
    },
    /// A weight holds NaN or infinity: its scales would be meaningless.
    #[error("{tensor} holds NaN or infinite values")]
    NonFinite {
        /// The tensor.
        tensor: String,
    },
    /// Some members of a layer that engines fuse are ignored and others are not.
    #[error("{ignored} is kept unquantized but {quantized} is quantized; engines fuse them into one layer")]
    SplitFusedGroup {
        /// A member that would be quantized.
        quantized: String,
        /// A member that is ignored.
        ignored: String,
    },
    /// Fused expert tensors in a layout the quantizer does not read.
    #[error("fused expert tensor `{tensor}` has shape {shape:?}: {message}")]
    FusedExperts {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// What was expected.
        message: String,
    },
    /// A tensor of Linear weights that no rule quantizes or keeps.
    #[error(
        "`{tensor}` (shape {shape:?}) holds Linear weights that would be written unchanged without being asked: \
         a half-quantized checkpoint"
    )]
    UnplannedLinear {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// The written checkpoint does not match the plan.
    #[error("the written checkpoint is not what was planned: `{tensor}`: {message}")]
    NotAsPlanned {
        /// The tensor (or file).
        tensor: String,
        /// What differs.
        message: String,
    },
    /// `--scan` cannot run.
    #[error("scan: {message}")]
    Scan {
        /// What went wrong.
        message: String,
    },
    /// An `ignore` entry is not a valid regular expression.
    #[error("ignore pattern `{pattern}` is not a valid regular expression: {message}")]
    BadPattern {
        /// The entry.
        pattern: String,
        /// The regex error.
        message: String,
    },
    /// The output directory holds another sous quantization.
    #[error("{out} already exists and is not this quantization of this model")]
    OutputExists {
        /// The directory.
        out: PathBuf,
    },
    /// The output path holds files sous did not write; they are never replaced.
    #[error("{out} exists and holds files sous did not write")]
    OutputForeign {
        /// The path.
        out: PathBuf,
    },
    /// The output would overwrite the source.
    #[error("the output {out} is the source model's directory, or inside or around it")]
    OutputIsSource {
        /// The path.
        out: PathBuf,
    },
    /// sous got something wrong (a bug).
    #[error("internal error: {0}")]
    Bug(String),
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl Diagnose for QuantizeError {
    /// Only a bug is sous's fault; the input or the environment otherwise.
    fn class(&self) -> Class {
        user_unless(matches!(
            self,
            QuantizeError::Bug(_) | QuantizeError::NotAsPlanned { .. }
        ))
    }

    fn hint(&self) -> Option<String> {
        match self {
            QuantizeError::NeedsCalibration => Some(
                "give `--calibration builtin` (or a text file), or use `--scheme nvfp4a16` (no calibration)".into(),
            ),
            QuantizeError::Gpu { .. } => Some(
                "`--device cuda` needs an NVIDIA driver (libcuda) and NVRTC (libnvrtc, from the CUDA toolkit or the \
                 `nvidia-cuda-nvrtc` wheel) on the library path; without them, quantize on the CPU (`--device cpu`, the \
                 default)"
                    .into(),
            ),
            QuantizeError::CalibrationText { .. } => Some(
                "give a UTF-8 text file (`--calibration FILE`, or `quantize.calibration` relative to the recipe), \
                 or `builtin`"
                    .into(),
            ),
            QuantizeError::Calibration { .. } => Some(
                "W4A4 calibration runs the model in the native engine (Llama-family decoders with a \
                 tokenizer and chat template); for other models use `--scheme nvfp4a16`"
                    .into(),
            ),
            QuantizeError::Uncalibrated { module } => Some(format!(
                "the native engine calibrates Llama-family decoder layers only; keep `{module}` unquantized \
                 with `--ignore`, or use `--scheme nvfp4a16`"
            )),
            QuantizeError::NoModel { .. } => {
                Some("give a directory with config.json and *.safetensors (Hub layout)".into())
            }
            QuantizeError::AlreadyQuantized { .. } => Some("quantize the original bf16/fp16 model".into()),
            QuantizeError::NotBlockAligned { tensor, .. } | QuantizeError::UnsupportedDtype { tensor, .. } => Some(
                format!(
                    "keep it unquantized: add `{}` to `quantize.ignore` (or `--ignore`)",
                    tensor.strip_suffix(".weight").unwrap_or(tensor)
                ),
            ),
            QuantizeError::NonFinite { .. } => Some("the source checkpoint is damaged; check its download".into()),
            QuantizeError::SplitFusedGroup { .. } => Some(
                "ignore all of q/k/v (or gate/up, w1/w3) or none of them: vLLM requires one scheme per fused layer"
                    .into(),
            ),
            QuantizeError::UnplannedLinear { tensor, .. } => Some(format!(
                "keep it on purpose with `--ignore {}` (recipe `quantize.ignore`), or report the layout so sous \
                 can quantize it",
                tensor.strip_suffix(".weight").unwrap_or(tensor)
            )),
            QuantizeError::NotAsPlanned { .. } => Some(
                "nothing was put in place; rerun, and report it if it happens again (the disk may be failing)".into(),
            ),
            QuantizeError::Scan { .. } => Some(
                "the scan runs the model in the native engine (`sous doctor` lists the architectures it runs) \
                 with the model's own tokenizer; quantize without `--scan` to keep the reference tools' default list"
                    .into(),
            ),
            QuantizeError::FusedExperts { .. } => Some(
                "sous reads transformers 5's fused experts (`gate_up_proj` [experts, 2 × width, hidden], \
                 `down_proj` [experts, hidden, width]) or one tensor per expert; re-save the model with \
                 transformers or report the layout"
                    .into(),
            ),
            QuantizeError::BadPattern { .. } => {
                Some("write an exact module name, or `re:` followed by a Rust regular expression".into())
            }
            QuantizeError::OutputExists { .. } => {
                Some("choose another `--out`, or pass `--force` to replace it".into())
            }
            QuantizeError::OutputForeign { .. } => {
                Some("choose another `--out`, or remove it first (sous replaces only its own output)".into())
            }
            QuantizeError::OutputIsSource { .. } => Some("write the checkpoint somewhere else".into()),
            QuantizeError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull => {
                Some("free disk space: the output needs about 30 % of the bf16 model's size".into())
            }
            _ => None,
        }
    }
}

impl From<sous_engine::atomic::AtomicError> for QuantizeError {
    fn from(e: sous_engine::atomic::AtomicError) -> QuantizeError {
        use sous_engine::atomic::AtomicError;
        match e {
            AtomicError::Exists { path } => QuantizeError::OutputExists { out: path },
            AtomicError::NoName { path } => QuantizeError::Io {
                source: io::Error::new(io::ErrorKind::InvalidInput, "the output path has no name"),
                path,
            },
            AtomicError::Io { path, source } => QuantizeError::Io { path, source },
        }
    }
}

/// An I/O error with its path.
pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> QuantizeError {
    let path = path.into();
    move |source| QuantizeError::Io { path, source }
}

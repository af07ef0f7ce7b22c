//! The recipe's model: where the weights are (a Hub repository at a revision, or a
//! local directory), the name clients use, and the optional build step that quantizes
//! them first. Whether the engine can load them is the adapters' concern (`launch/`).

use std::path::{Path, PathBuf};

use crate::recipe::{
    CalibrationFormat, ModelSection, QuantFormat, QuantScheme, QuantizeSection, RecipeError,
};
use crate::repo::RepoId;

use super::Invalid;

/// Default `model.revision`.
pub const DEFAULT_REVISION: &str = "main";

/// Where the weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Hub repository id.
    pub repo: Option<RepoId>,
    /// Revision of `repo` (default `main`).
    pub revision: Option<String>,
    /// Local directory.
    pub path: Option<String>,
    /// Name clients use.
    pub served_name: String,
}

impl Model {
    /// What the engine is given: the local path if there is one, else the repository id.
    pub fn engine_arg(&self) -> &str {
        self.path
            .as_deref()
            .or(self.repo.as_ref().map(RepoId::as_str))
            .unwrap_or_default()
    }
}

/// The build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantize {
    /// Scheme.
    pub scheme: QuantScheme,
    /// Format.
    pub format: QuantFormat,
    /// Extra modules kept unquantized.
    pub ignore: Vec<String>,
    /// What the activation scales are measured on (scheme `nvfp4` only).
    pub calibration: Option<Calibration>,
    /// Where the kernels run.
    pub device: QuantDevice,
}

/// Where quantization runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantDevice {
    /// The CPU.
    #[default]
    Cpu,
    /// CUDA device N.
    Cuda(u32),
}

impl std::fmt::Display for QuantDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantDevice::Cpu => f.write_str("cpu"),
            QuantDevice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for QuantDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<QuantDevice, String> {
        match s.trim() {
            "cpu" => Ok(QuantDevice::Cpu),
            "cuda" => Ok(QuantDevice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(QuantDevice::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device: write `cpu`, `cuda` or `cuda:N`")),
        }
    }
}

/// Default `quantize.samples`.
pub const DEFAULT_CALIBRATION_SAMPLES: usize = 16;
/// Default `quantize.seq_len`.
pub const DEFAULT_CALIBRATION_SEQ_LEN: usize = 512;

/// W4A4 calibration: which text, how it becomes samples, how many, how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calibration {
    /// The text.
    pub text: CalibrationText,
    /// Paragraphs through the chat template, or windows of the plain text.
    pub format: CalibrationFormat,
    /// Samples (paragraphs or windows) to run.
    pub samples: usize,
    /// Longest sample (`chat`) or every window (`text`), in tokens.
    pub seq_len: usize,
}

/// Where calibration text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalibrationText {
    /// The text shipped with sous.
    Builtin,
    /// A file (absolute, or relative to where `sous` runs when it came from `--set`).
    File(PathBuf),
}

impl CalibrationText {
    /// As a recipe or a flag writes it.
    pub fn as_arg(&self) -> String {
        match self {
            CalibrationText::Builtin => "builtin".into(),
            CalibrationText::File(path) => path.display().to_string(),
        }
    }
}

pub(super) fn resolve_model(raw: ModelSection, invalid: &Invalid<'_>) -> Result<Model, RecipeError> {
    if raw.repo.is_none() && raw.path.is_none() {
        return Err(RecipeError::Missing {
            key: "model.repo".into(),
            message: "the recipe names no model".into(),
            hint: Some("set `model.repo = \"org/name\"` (a Hub repository) or `model.path = \"/models/x\"` (a local directory)".into()),
        });
    }
    let repo = match &raw.repo {
        None => None,
        Some(text) => Some(text.parse::<RepoId>().map_err(|e| {
            invalid(
                &["model", "repo"],
                e.to_string(),
                Some("write `org/name`, e.g. `Qwen/Qwen3.8-27B`; for a local directory use `model.path`"),
            )
        })?),
    };
    if raw.revision.is_some() && raw.repo.is_none() {
        return Err(invalid(
            &["model", "revision"],
            "a revision needs `model.repo`: a local `model.path` has no revisions".into(),
            None,
        ));
    }
    if let Some(path) = &raw.path
        && path.trim().is_empty()
    {
        return Err(invalid(&["model", "path"], "the path is empty".into(), None));
    }
    let served_name = match raw.served_name {
        Some(name) if name.trim().is_empty() => {
            return Err(invalid(
                &["model", "served_name"],
                "the name is empty".into(),
                None,
            ));
        }
        Some(name) => name,
        // What the engine itself calls the model without `--served-model-name`: the
        // argument it was started with (vLLM's `served_model_name` defaults to
        // `model`, SGLang's to `model_path`), so clients that call the model by its
        // path keep working when sous serves it.
        None => raw.path.clone().or_else(|| raw.repo.clone()).unwrap_or_default(),
    };
    let revision = raw
        .repo
        .as_ref()
        .map(|_| raw.revision.unwrap_or_else(|| DEFAULT_REVISION.to_owned()));
    Ok(Model {
        repo,
        revision,
        path: raw.path,
        served_name,
    })
}

/// Resolves `[quantize]`; `base` is the directory of the recipe file that names
/// `quantize.calibration` (relative calibration files are found there). Errors name the
/// key at fault.
pub(super) fn resolve_quantize(
    raw: QuantizeSection,
    base: Option<&Path>,
) -> Result<Quantize, (&'static str, String)> {
    let scheme = raw.scheme.ok_or_else(|| {
        (
            "scheme",
            "`[quantize]` needs a `scheme`: `nvfp4a16` or `nvfp4`".to_owned(),
        )
    })?;
    let calibration = if scheme == QuantScheme::Nvfp4 {
        let text = match raw.calibration.as_deref().map(str::trim) {
            None | Some("builtin") => CalibrationText::Builtin,
            Some("") => {
                return Err((
                    "calibration",
                    "the calibration text is empty: write `builtin` or a file".into(),
                ));
            }
            Some(file) => {
                let path = Path::new(file);
                CalibrationText::File(match base {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.to_path_buf(),
                })
            }
        };
        let count = |key: &'static str, value: Option<u32>, default: usize| match value {
            None => Ok(default),
            Some(0) => Err((key, format!("`quantize.{key}` must be at least 1"))),
            Some(n) => Ok(n as usize),
        };
        Some(Calibration {
            text,
            format: raw.calibration_format.unwrap_or_default(),
            samples: count("samples", raw.samples, DEFAULT_CALIBRATION_SAMPLES)?,
            seq_len: count("seq_len", raw.seq_len, DEFAULT_CALIBRATION_SEQ_LEN)?,
        })
    } else {
        for (key, set) in [
            ("calibration", raw.calibration.is_some()),
            ("calibration_format", raw.calibration_format.is_some()),
            ("samples", raw.samples.is_some()),
            ("seq_len", raw.seq_len.is_some()),
        ] {
            if set {
                return Err((
                    key,
                    format!(
                        "`quantize.{key}` is for scheme `nvfp4` (W4A4), which calibrates activation scales; \
                         `nvfp4a16` needs no calibration"
                    ),
                ));
            }
        }
        None
    };
    let device = match &raw.device {
        None => QuantDevice::Cpu,
        Some(text) => text.parse().map_err(|m| ("device", m))?,
    };
    Ok(Quantize {
        scheme,
        format: raw.format.unwrap_or(QuantFormat::CompressedTensors),
        ignore: raw.ignore,
        calibration,
        device,
    })
}

//! `sous quantize`: a bf16/fp16/fp32 safetensors model in, an NVFP4 checkpoint out
//! that vLLM, SGLang and TensorRT-LLM load, with bytes identical to what
//! llm-compressor (compressed-tensors format) or ModelOpt would write.
//!
//! - `source`: the input directory, its shard headers and provenance; windows of
//!   tensor data through memory maps.
//! - `select`: which tensors are quantized, as the reference tools choose.
//! - `experts`: fused 3-D expert tensors seen as one weight per expert.
//! - `fused`: groups that share one global scale.
//! - `checkpoint`: each format's configuration files (tensor and file names are
//!   `sous_engine::checkpoint`'s, shared with the native engine).
//! - `layout`: output shards, offsets and headers, planned up front.
//! - `files`: the output's other files, written or copied from the source.
//! - `write`: the work, window by window, through `sous-kernels`.
//! - `verify`: no Linear left in 16 bits unasked, and the output read back against the
//!   plan before it is put in place.
//! - `marker`: the completion marker and the rerun check; the output itself is staged
//!   and renamed into place by `sous_engine::atomic`.
//! - `scan`: `--scan`, the ignore list chosen by measurement.
//! - `meter`: the bytes in and out, model and tensor, reported to the caller's
//!   [`Reporter`].
//!
//! Not here: the command line (`commands/quantize.rs`) or the numerics
//! (`sous-kernels`).

pub mod calibrate;
mod checkpoint;
mod error;
mod experts;
mod files;
mod fused;
mod gpu;
mod layout;
pub mod marker;
mod meter;
pub mod scan;
mod select;
mod source;
mod verify;
mod write;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sous_engine::atomic::{Existing, StagingDir};
use sous_engine::recipe::{QuantFormat, QuantScheme};
use sous_engine::reporter::Reporter;

pub use calibrate::{Calibration, CalibrationSet};
pub use checkpoint::ModelOptExport;
pub use error::QuantizeError;
pub use marker::MARKER;
pub use source::{Provenance, SourceTensor, header_tensors};
pub use write::TensorReport;

use error::io;
use files::{copy_other_files, other_files, write_configs};
use layout::Layout;
use marker::Marker;
use select::{Decision, Selector};
use source::Source;

/// Default largest output shard, as `sous quantize --max-shard-size` and
/// `sous import gguf --max-shard-size` write it: transformers' default
/// `max_shard_size` (`5GB`, decimal).
pub const DEFAULT_MAX_SHARD_SIZE: &str = "5GB";
/// [`DEFAULT_MAX_SHARD_SIZE`] in bytes, for callers without a flag (the pipeline).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// Default largest slice of a tensor mapped at once. `SOUS_QUANTIZE_WINDOW` (bytes)
/// overrides it, for tests and machines with very little memory.
pub const DEFAULT_WINDOW: u64 = 64 << 20;

pub use sous_engine::recipe::QuantDevice as Device;

/// A quantization to run.
#[derive(Debug, Clone)]
pub struct Request {
    /// The source model directory.
    pub source: PathBuf,
    /// The output directory.
    pub out: PathBuf,
    /// Scheme.
    pub scheme: QuantScheme,
    /// Checkpoint format.
    pub format: QuantFormat,
    /// Which ModelOpt export the bytes reproduce (ModelOpt format only).
    pub modelopt_export: ModelOptExport,
    /// Extra modules to keep unquantized (names or `re:` patterns).
    pub ignore: Vec<String>,
    /// Largest output shard, in bytes of tensor data.
    pub max_shard_bytes: u64,
    /// Replace an existing output that is not this quantization.
    pub force: bool,
    /// Hash every quantized tensor and its dequantization into the summary.
    pub digests: bool,
    /// Where the weights came from, when the caller knows better than the directory.
    pub provenance: Option<Provenance>,
    /// Largest slice of a tensor mapped at once.
    pub window_bytes: u64,
    /// W4A4 (`scheme` `nvfp4`): what to calibrate on. Calibration runs only when
    /// the output is not already this quantization.
    pub calibration: Option<CalibrationSet>,
    /// Where the kernels run. The bytes are the same on every device.
    pub device: Device,
    /// Quantize linear-attention projections too, which the reference tools' examples
    /// keep (`scan` measures what that costs).
    pub linear_attention: bool,
}

/// What a quantization did; the `--json` output, also kept in the completion marker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The output directory.
    pub output: PathBuf,
    /// The source directory.
    pub source: PathBuf,
    /// Source repository, if known.
    pub repo: Option<String>,
    /// Source commit, if known.
    pub commit: Option<String>,
    /// `nvfp4a16`.
    pub scheme: String,
    /// `compressed-tensors` or `modelopt`.
    pub format: String,
    /// The sous that wrote it.
    pub sous_version: String,
    /// Nothing was done: the output was already this quantization.
    pub up_to_date: bool,
    /// Wall time of the quantization.
    pub seconds: f64,
    /// Source tensor bytes read.
    pub bytes_in: u64,
    /// Tensor bytes written.
    pub bytes_out: u64,
    /// Source bytes per second, in GB/s.
    pub gb_per_s: f64,
    /// Output shards.
    pub shards: usize,
    /// Weights quantized.
    pub quantized: usize,
    /// The NVFP4 kernel used (`avx2`, `portable`, `cuda compute_90`).
    pub kernel: String,
    /// Where it ran: `cpu`, or `cuda:N (name)`.
    #[serde(default)]
    pub device: String,
    /// Threads the kernel ran on.
    pub threads: usize,
    /// Per quantized weight.
    pub tensors: Vec<TensorReport>,
    /// Tensors written unchanged, with the reason.
    pub kept: Vec<KeptTensor>,
    /// W4A4: how calibration ran (the per-module ranges are in `tensors`'
    /// `input_global_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationSummary>,
}

/// How a W4A4 checkpoint was calibrated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationSummary {
    /// `builtin` or the file.
    pub source: String,
    /// How the text became samples: `chat` or `text`.
    pub format: String,
    /// Samples run.
    pub samples: usize,
    /// Tokens run.
    pub tokens: usize,
    /// Whether the pass rounded as a bf16 model does.
    pub bf16: bool,
    /// Seconds it took.
    pub seconds: f64,
    /// Peak resident memory of the process once calibration was over (Linux).
    pub peak_rss_bytes: Option<u64>,
    /// Each quantized module's `input_global_scale`.
    pub input_global_scale: BTreeMap<String, f32>,
}

/// A tensor written unchanged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeptTensor {
    /// Name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// Runs a quantization, or finds it already done, reporting progress to `reporter`.
pub fn run(request: &Request, reporter: &dyn Reporter) -> Result<Summary, QuantizeError> {
    let w4a4 = request.scheme == QuantScheme::Nvfp4;
    let calibration_set = match (w4a4, &request.calibration) {
        (true, None) => return Err(QuantizeError::NeedsCalibration),
        (true, Some(c)) => Some(c),
        (false, _) => None,
    };
    let started = Instant::now();
    let source = open_source(&request.source)?;
    let decisions = decide(
        &source.config,
        &source.tensors,
        &request.ignore,
        request.linear_attention,
    )?;
    let groups = fused::groups(&source.tensors, &decisions)?;
    let fingerprint = marker::fingerprint(&inputs(&source, request));
    let done = || {
        marker::completed::<Summary>(&request.out, &fingerprint).map(|mut summary| {
            summary.up_to_date = true;
            summary.output = request.out.clone();
            summary
        })
    };
    if let Some(summary) = done() {
        return Ok(summary);
    }
    check_output(request)?;
    // Held to the end: a concurrent run into the same output waits, then finds this
    // one's marker.
    let _lock = marker::lock(&request.out, reporter)?;
    if let Some(summary) = done() {
        return Ok(summary);
    }
    // The GPU is opened before anything long runs, so a missing driver fails fast.
    let mut gpu = match request.device {
        Device::Cpu => None,
        Device::Cuda(ordinal) => {
            let largest = groups
                .iter()
                .map(|g| g.iter().map(|&i| source.tensors[i].len).sum::<u64>())
                .max()
                .unwrap_or(0) as usize;
            let cache = sous_engine::paths::cache_dir();
            let pipeline = gpu::Pipeline::open(ordinal as usize, Some(&cache), largest).map_err(|e| {
                QuantizeError::Gpu {
                    message: e.to_string(),
                }
            })?;
            reporter.status("gpu", &pipeline.info().to_string());
            Some(pipeline)
        }
    };
    let calibration = match calibration_set {
        Some(set) => {
            let samples = calibrate::samples(&request.source, set)?;
            // The activations have the weights' dtype; a bf16 model is calibrated
            // with bf16 rounding, as transformers runs it for llm-compressor.
            let bf16 = source
                .tensors
                .iter()
                .zip(&decisions)
                .any(|(t, d)| *d == Decision::Quantize && t.dtype == safetensors::Dtype::BF16);
            Some(calibrate::calibrate(
                &request.source,
                &set.source,
                &samples,
                bf16,
                reporter,
            )?)
        }
        None => None,
    };
    let inputs = match &calibration {
        Some(c) => input_scales(
            &source.tensors,
            &decisions,
            c,
            checkpoint::flavor(request.format, request.modelopt_export),
        )?,
        None => BTreeMap::new(),
    };
    let provenance = request
        .provenance
        .clone()
        .unwrap_or_else(|| source.provenance.clone());
    let layout = Layout::plan(
        &source.tensors,
        &decisions,
        request.format,
        request.max_shard_bytes,
        &metadata(request, &provenance),
        w4a4,
    )?;
    // `check_output` has decided that what is at `out`, if anything, may go.
    let staging = StagingDir::create(&request.out, Existing::Replace)?;
    let mut meter = meter::Meter::new(reporter, source.tensors.iter().map(|t| t.len).sum());
    let options = write::Options {
        window_bytes: request.window_bytes,
        digests: request.digests,
    };
    let flavor = checkpoint::flavor(request.format, request.modelopt_export);
    let written = write::write(
        &source,
        &layout,
        &groups,
        flavor,
        staging.path(),
        options,
        &inputs,
        gpu.as_mut().map(|p| p as &mut dyn write::Accelerator),
        &mut meter,
    );
    meter.finish();
    if let Some(pipeline) = &gpu
        && !pipeline.on_cpu.is_empty()
    {
        reporter.warn(&format!(
            "{} fused group(s) too large for the GPU's buffers were quantized on the CPU (the same bytes), the first {}",
            pipeline.on_cpu.len(),
            pipeline.on_cpu[0]
        ));
    }
    let mut tensors = written?;
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    write_configs(&source, &decisions, request.format, &layout, staging.path(), w4a4)?;
    copy_other_files(&source.dir, staging.path())?;
    verify::written(
        staging.path(),
        &layout,
        &source.tensors,
        &decisions,
        request.format,
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes_in: u64 = source.tensors.iter().map(|t| t.len).sum();
    let summary = Summary {
        output: request.out.clone(),
        source: request.source.clone(),
        repo: provenance.repo,
        commit: provenance.commit,
        scheme: checkpoint::scheme_name(request.scheme).into(),
        format: checkpoint::format_name(request.format).into(),
        sous_version: env!("CARGO_PKG_VERSION").into(),
        up_to_date: false,
        seconds,
        bytes_in,
        bytes_out: layout.data_bytes(),
        gb_per_s: bytes_in as f64 / seconds.max(1e-9) / 1e9,
        shards: layout.shards.len(),
        quantized: tensors.len(),
        kernel: match &gpu {
            Some(pipeline) => format!("cuda {}", pipeline.info().arch),
            None => sous_kernels::fast::Kernel::detect().name().into(),
        },
        device: match &gpu {
            Some(pipeline) => format!("cuda:{} ({})", pipeline.info().ordinal, pipeline.info().name),
            None => "cpu".into(),
        },
        threads: rayon::current_num_threads(),
        tensors,
        kept: source
            .tensors
            .iter()
            .zip(&decisions)
            .filter_map(|(t, d)| match d {
                Decision::Keep(kept) => Some(KeptTensor {
                    name: t.name.clone(),
                    reason: kept.reason(),
                }),
                Decision::Quantize => None,
            })
            .collect(),
        calibration: calibration.as_ref().map(|c| CalibrationSummary {
            source: c.source.clone(),
            format: calibration_set.map_or("chat", |s| s.format.as_str()).to_owned(),
            samples: c.samples,
            tokens: c.tokens,
            bf16: c.bf16,
            seconds: c.seconds,
            peak_rss_bytes: c.peak_rss_bytes,
            input_global_scale: inputs
                .iter()
                .map(|(&i, &v)| (names_module(&source.tensors[i].name), v))
                .collect(),
        }),
    };
    marker::commit(
        staging,
        &Marker {
            fingerprint,
            summary: &summary,
        },
    )?;
    Ok(summary)
}

/// Each quantized tensor's activation scale, from its module's calibrated input amax
/// as the tool `flavor` names computes it: compressed-tensors' `input_global_scale =
/// 2688 / amax` (`generate_gparam`) in the activations' dtype, which is the weights'
/// (the observer's statistics keep it), so a bf16 model gets a bf16-valued scale as
/// llm-compressor writes and an f32 model an f32 one; ModelOpt's `input_scale =
/// amax / 2688` in f32 (`NVFP4QTensor.get_activation_scaling_factor`, ModelOpt 0.47;
/// on a GPU export the division is a multiplication by `f32(1/2688)`, as for
/// `weight_scale_2`).
fn input_scales(
    tensors: &[SourceTensor],
    decisions: &[Decision],
    calibration: &Calibration,
    flavor: sous_kernels::Flavor,
) -> Result<BTreeMap<usize, f32>, QuantizeError> {
    use sous_kernels::formats::bf16::round_bf16;
    use sous_kernels::{Dtype, TensorScale};
    let mut out = BTreeMap::new();
    for (i, (t, d)) in tensors.iter().zip(decisions).enumerate() {
        if *d != Decision::Quantize {
            continue;
        }
        let module = names_module(&t.name);
        let amax = *calibration
            .input_amax
            .get(&module)
            .ok_or_else(|| QuantizeError::Uncalibrated {
                module: module.clone(),
            })?;
        let dtype = write::kernel_dtype(t.dtype).unwrap_or(Dtype::F32);
        let amax = if dtype == Dtype::Bf16 {
            round_bf16(amax)
        } else {
            amax
        };
        out.insert(i, TensorScale::from_amax(flavor, dtype, amax).value());
    }
    Ok(out)
}

fn names_module(tensor: &str) -> String {
    sous_engine::checkpoint::names::module_of(tensor).to_owned()
}

/// The output may be replaced only if it is absent, an empty directory, or (with
/// `--force`) an earlier sous quantization; never the source, nor anything around it.
fn check_output(request: &Request) -> Result<(), QuantizeError> {
    let absolute = |p: &Path| {
        std::path::absolute(p)
            .map(|a| a.components().collect::<PathBuf>())
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| absolute(p));
    let (out, source) = (real(&request.out), real(&request.source));
    if out.starts_with(&source) || source.starts_with(&out) {
        return Err(QuantizeError::OutputIsSource {
            out: request.out.clone(),
        });
    }
    let Ok(meta) = std::fs::symlink_metadata(&request.out) else {
        return Ok(());
    };
    let foreign = || QuantizeError::OutputForeign {
        out: request.out.clone(),
    };
    if !meta.is_dir() {
        return Err(foreign());
    }
    let mut entries = std::fs::read_dir(&request.out).map_err(io(&request.out))?;
    if entries.next().is_none() {
        return Ok(());
    }
    if !request.out.join(MARKER).is_file() {
        return Err(foreign());
    }
    if !request.force {
        return Err(QuantizeError::OutputExists {
            out: request.out.clone(),
        });
    }
    Ok(())
}

/// The source model, fused expert tensors seen as one weight per expert.
fn open_source(dir: &Path) -> Result<Source, QuantizeError> {
    let mut source = Source::open(dir)?;
    source.tensors = experts::split(&source.config, std::mem::take(&mut source.tensors))?;
    Ok(source)
}

/// What happens to each tensor of a model with this `config.json`: quantized, or kept
/// (with the reason), checked for what the kernels can read.
fn decide(
    config: &serde_json::Map<String, Value>,
    tensors: &[SourceTensor],
    ignore: &[String],
    linear_attention: bool,
) -> Result<Vec<Decision>, QuantizeError> {
    let text = config.get("text_config").and_then(Value::as_object);
    let hidden_layers = [Some(config), text]
        .into_iter()
        .flatten()
        .find_map(|c| c.get("num_hidden_layers").and_then(Value::as_u64))
        .map(|n| n as usize);
    let mtp_from = config
        .get("num_nextn_predict_layers")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
        .and(hidden_layers);
    let mut selector = Selector::new(ignore, mtp_from)?;
    if linear_attention {
        selector = selector.quantizing_linear_attention();
    }
    let decisions: Vec<Decision> = tensors.iter().map(|t| selector.decide(t)).collect();
    verify::preflight(tensors, &decisions, &selector)?;
    validate(tensors, &decisions)?;
    Ok(decisions)
}

/// The bytes of tensor data a quantization of these tensors writes: the same
/// decisions and layout `run` uses, without reading a weight (`sous plan`).
pub fn planned_bytes(
    config: &serde_json::Map<String, Value>,
    tensors: &[SourceTensor],
    format: QuantFormat,
    ignore: &[String],
) -> Result<u64, QuantizeError> {
    let tensors = &experts::split(config, tensors.to_vec())?;
    let decisions = decide(config, tensors, ignore, false)?;
    let layout = Layout::plan(tensors, &decisions, format, u64::MAX, &HashMap::new(), false)?;
    Ok(layout.data_bytes())
}

/// The names of the `tensors` that a quantization with `ignore` would write unchanged
/// (not as NVFP4).
pub fn planned_kept(
    config: &serde_json::Map<String, Value>,
    tensors: &[SourceTensor],
    ignore: &[String],
) -> Result<Vec<String>, QuantizeError> {
    let tensors = &experts::split(config, tensors.to_vec())?;
    let decisions = decide(config, tensors, ignore, false)?;
    Ok(tensors
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| **d != Decision::Quantize)
        .map(|(t, _)| t.name.clone())
        .collect())
}

/// Every quantized weight must be a float type the kernels read, with whole blocks.
fn validate(tensors: &[SourceTensor], decisions: &[Decision]) -> Result<(), QuantizeError> {
    for (t, d) in tensors.iter().zip(decisions) {
        if *d != Decision::Quantize {
            continue;
        }
        if write::kernel_dtype(t.dtype).is_none() {
            return Err(QuantizeError::UnsupportedDtype {
                tensor: t.name.clone(),
                dtype: format!("{:?}", t.dtype),
            });
        }
        if !t.shape[1].is_multiple_of(sous_kernels::BLOCK) {
            return Err(QuantizeError::NotBlockAligned {
                tensor: t.name.clone(),
                cols: t.shape[1],
            });
        }
    }
    Ok(())
}

/// What the output depends on, for the rerun check.
fn inputs(source: &Source, request: &Request) -> Value {
    let mut inputs = json!({
        "sous": env!("CARGO_PKG_VERSION"),
        "scheme": checkpoint::scheme_name(request.scheme),
        "format": checkpoint::format_name(request.format),
        "flavor": format!("{:?}", checkpoint::flavor(request.format, request.modelopt_export)),
        "ignore": request.ignore,
        "max_shard_bytes": request.max_shard_bytes,
        "digests": request.digests,
        "calibration": request.calibration.as_ref().filter(|_| request.scheme == QuantScheme::Nvfp4).map(|c| {
            json!([c.source, c.format.as_str(), hex::encode(Sha256::digest(c.text.as_bytes())), c.samples, c.seq_len])
        }),
        "provenance": request.provenance.as_ref().map(|p| (&p.repo, &p.commit)),
        "config_sha256": hex::encode(Sha256::digest(&source.config_bytes)),
        "shards": source.shards.iter().map(|s| json!([s.name, s.size, s.mtime_ns.to_string()])).collect::<Vec<_>>(),
        "files": other_files(&source.dir).iter().map(|p| {
            let meta = std::fs::metadata(p).ok();
            let name = p.strip_prefix(&source.dir).unwrap_or(p).to_string_lossy().into_owned();
            json!([name, meta.map(|m| m.len())])
        }).collect::<Vec<_>>(),
    });
    // Only when set, so that every other quantization keeps its fingerprint.
    if request.linear_attention {
        inputs["linear_attention"] = Value::Bool(true);
    }
    inputs
}

/// Provenance for every shard header. safetensors metadata values are strings.
fn metadata(request: &Request, provenance: &Provenance) -> HashMap<String, String> {
    let mut meta = HashMap::new();
    // What transformers and vLLM expect to find.
    meta.insert("format".into(), "pt".into());
    meta.insert("sous.version".into(), env!("CARGO_PKG_VERSION").into());
    meta.insert(
        "sous.scheme".into(),
        checkpoint::scheme_name(request.scheme).into(),
    );
    meta.insert(
        "sous.format".into(),
        checkpoint::format_name(request.format).into(),
    );
    if let Some(repo) = &provenance.repo {
        meta.insert("sous.source_repo".into(), repo.clone());
    }
    if let Some(commit) = &provenance.commit {
        meta.insert("sous.source_commit".into(), commit.clone());
    }
    meta
}

#[cfg(test)]
mod tests {
    use sous_engine::recipe::ByteSize;

    #[test]
    fn the_default_shard_size_is_one_size() {
        assert_eq!(
            super::DEFAULT_MAX_SHARD_SIZE.parse::<ByteSize>(),
            Ok(ByteSize(super::DEFAULT_MAX_SHARD_BYTES))
        );
    }
}

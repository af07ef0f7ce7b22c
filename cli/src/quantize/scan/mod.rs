//! `sous quantize --scan`: which layers to keep in 16 bits, chosen by measurement.
//!
//! The scan quantizes the whole model once (linear attention too), then runs it in the
//! native engine over the built-in text with one group of layers at a time in NVFP4
//! (`groups`: per layer and kind, or per kind) and measures each group's KL divergence
//! from the unquantized model (`measure`). It then measures whole configurations:
//! everything quantized, the reference tools' default (their examples' rules: linear
//! attention kept), the recipe's own `quantize.ignore`, and the proposal: the default
//! with the groups that cost most kept in 16 bits, as few as meet `--max-kld` (found by
//! bisection over the groups ordered by their own divergence, each probe measured) or
//! as many as fit `--max-size`.
//!
//! Each configuration's size is the checkpoint's tensor bytes (the source's for a kept
//! weight, codes and scales for an NVFP4 one). The proposal is written as `quantize.ignore`
//! entries and checked against the quantizer's own selection before it is reported.

mod groups;
mod measure;
mod render;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sous_engine::checkpoint::names;
use sous_engine::native::config::ModelConfig;
use sous_engine::native::text::TextModel;
use sous_engine::recipe::{QuantFormat, QuantScheme};
use sous_engine::reporter::{Reporter, Task};

pub use groups::{Group, Grouping};
pub use measure::Divergence;
pub use render::{render, write_ignore};

use super::error::QuantizeError;
use super::select::Decision;
use super::source::SourceTensor;
use super::{Device, ModelOptExport, Request, decide};

/// A scan to run.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    /// The source model directory.
    pub source: PathBuf,
    /// The checkpoint format the proposal is for.
    pub format: QuantFormat,
    /// How layers are grouped.
    pub grouping: Grouping,
    /// Largest mean KL divergence the proposal may have (nats per token).
    pub max_kld: Option<f64>,
    /// Largest checkpoint the proposal may make (tensor bytes).
    pub max_bytes: Option<u64>,
    /// Tokens of the built-in text to measure on (at least).
    pub tokens: usize,
    /// Tokens per window the model reads at once.
    pub window: usize,
    /// The recipe's own `quantize.ignore`, measured beside the others.
    pub current: Vec<String>,
    /// A directory for the NVFP4 copy of the model, removed when the scan ends.
    pub work: PathBuf,
}

/// One group's own cost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupCost {
    /// The group.
    #[serde(flatten)]
    pub group: Group,
    /// The divergence with only this group in NVFP4.
    pub alone: Divergence,
}

/// A whole configuration, measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Configuration {
    /// What it is.
    pub name: String,
    /// Groups kept in 16 bits that the default rules quantize.
    pub kept: Vec<String>,
    /// Checkpoint tensor bytes.
    pub bytes: u64,
    /// Its divergence.
    pub divergence: Divergence,
}

/// What the scan proposes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proposal {
    /// The `quantize.ignore` entries.
    pub ignore: Vec<String>,
    /// Whether it meets every target given.
    pub met: bool,
    /// The configuration.
    pub configuration: Configuration,
}

/// What a scan found; the `--json` output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    /// The source directory.
    pub model: PathBuf,
    /// Its architecture.
    pub architecture: String,
    /// Positions measured.
    pub tokens: usize,
    /// Grouping.
    pub grouping: Grouping,
    /// Each group, most costly first.
    pub groups: Vec<GroupCost>,
    /// Everything quantized, the default rules, the recipe's list.
    pub configurations: Vec<Configuration>,
    /// Every configuration the search measured, fewest kept groups first.
    pub probes: Vec<Configuration>,
    /// The proposal, when a target was given.
    pub proposal: Option<Proposal>,
    /// `--max-kld`.
    pub max_kld: Option<f64>,
    /// `--max-size`, in bytes.
    pub max_bytes: Option<u64>,
    /// Wall time.
    pub seconds: f64,
}

/// Removes the scan's NVFP4 copy however the scan ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a scan, reporting progress to `reporter`.
pub fn scan(request: &ScanRequest, reporter: &dyn Reporter) -> Result<ScanReport, QuantizeError> {
    let started = Instant::now();
    // The architecture first: a model the native engine cannot run is named before any work.
    let config = ModelConfig::read(&request.source).map_err(|e| QuantizeError::Scan {
        message: format!("the scan runs the model in the native engine, which cannot: {e}"),
    })?;
    let windows = windows(&request.source, &config, request.tokens, request.window)?;
    let source = super::open_source(&request.source)?;
    let everything = decide(&source.config, &source.tensors, &[], true)?;
    let default = decide(&source.config, &source.tensors, &[], false)?;
    let quantize = |d: &[Decision]| d.iter().map(|d| *d == Decision::Quantize).collect::<Vec<_>>();
    let (all_flags, default_flags) = (quantize(&everything), quantize(&default));
    let groups = groups::groups(&source.tensors, &all_flags, &default_flags, request.grouping);
    if groups.is_empty() {
        return Err(QuantizeError::Scan {
            message: "the model has no layer to quantize".into(),
        });
    }

    let scratch = Scratch(request.work.clone());
    let twin = scratch.0.join("nvfp4");
    let request_all = Request {
        source: request.source.clone(),
        out: twin.clone(),
        scheme: QuantScheme::Nvfp4a16,
        format: request.format,
        modelopt_export: ModelOptExport::Gpu,
        ignore: Vec::new(),
        max_shard_bytes: super::DEFAULT_MAX_SHARD_BYTES,
        force: true,
        digests: false,
        provenance: None,
        window_bytes: super::DEFAULT_WINDOW,
        calibration: None,
        device: Device::Cpu,
        linear_attention: true,
    };
    super::run(&request_all, reporter)?;
    reporter.status(
        "measuring",
        &format!("{} groups on the built-in text", groups.len()),
    );
    let mut measurer = measure::Measurer::new(&request.source, &twin, windows)?;

    let progress = reporter.progress(Task::count("scan", "groups", groups.len() as u64));
    let mut costs = Vec::with_capacity(groups.len());
    for (i, group) in groups.into_iter().enumerate() {
        let alone = measurer.measure(&group.modules.iter().cloned().collect())?;
        costs.push(GroupCost { group, alone });
        progress.set(i as u64 + 1);
    }
    progress.finish(None);
    // Most costly first: the order the proposal keeps them in.
    costs.sort_by(|a, b| {
        b.alone
            .kld
            .total_cmp(&a.alone.kld)
            .then(a.group.name.cmp(&b.group.name))
    });

    let sizes = Sizes::new(&source.tensors);
    let mut configure = |name: &str, quantized: HashSet<String>, kept: Vec<String>| {
        measurer.measure(&quantized).map(|divergence| Configuration {
            name: name.to_owned(),
            kept,
            bytes: sizes.bytes(&quantized),
            divergence,
        })
    };
    let all: HashSet<String> = costs
        .iter()
        .flat_map(|c| c.group.modules.iter().cloned())
        .collect();
    let candidates: Vec<&GroupCost> = costs.iter().filter(|c| c.group.default_quantized).collect();
    let with_kept = |k: usize| -> HashSet<String> {
        candidates[k..]
            .iter()
            .flat_map(|c| c.group.modules.iter().cloned())
            .collect()
    };
    let mut configurations = if candidates.len() == costs.len() {
        // Nothing the default keeps that the scan could quantize: one configuration.
        vec![configure(
            "everything quantized (the reference default)",
            all,
            Vec::new(),
        )?]
    } else {
        vec![
            configure("everything quantized (linear attention too)", all, Vec::new())?,
            configure(
                "reference default (linear attention kept)",
                with_kept(0),
                Vec::new(),
            )?,
        ]
    };
    if !request.current.is_empty() {
        let recipe = decide(&source.config, &source.tensors, &request.current, false)?;
        configurations.push(configure(
            "the recipe's quantize.ignore",
            modules_of(&source.tensors, &recipe),
            Vec::new(),
        )?);
    }

    // The proposal: keep the k most costly default-quantized groups.
    let names_of = |k: usize| {
        candidates[..k]
            .iter()
            .map(|c| c.group.name.clone())
            .collect::<Vec<_>>()
    };
    let mut probes: Vec<Configuration> = Vec::new();
    let mut probe = |k: usize| -> Result<Configuration, QuantizeError> {
        if let Some(done) = probes.iter().find(|p| p.kept.len() == k) {
            return Ok(done.clone());
        }
        let c = configure(
            &format!("the {k} costliest groups kept"),
            with_kept(k),
            names_of(k),
        )?;
        probes.push(c.clone());
        Ok(c)
    };
    let n = candidates.len();
    let fits = |k: usize| {
        request
            .max_bytes
            .is_none_or(|max| sizes.bytes(&with_kept(k)) <= max)
    };
    // The most groups the size budget allows (sizes need no measuring).
    let k_size = (0..=n).rev().find(|&k| fits(k));
    let proposal = match (request.max_kld, request.max_bytes) {
        (None, None) => None,
        (Some(max_kld), _) => {
            // The fewest groups kept that meet the divergence: bisection, on the
            // divergence falling as groups are kept (all kept: nothing moves).
            let (mut lo, mut hi) = (0, n);
            if probe(0)?.divergence.kld <= max_kld {
                hi = 0;
            }
            while lo + 1 < hi {
                let mid = (lo + hi) / 2;
                if probe(mid)?.divergence.kld <= max_kld {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            let k = hi;
            let met = k_size.is_some_and(|most| k <= most);
            Some((if met { k } else { k_size.unwrap_or(0) }, met))
        }
        (None, Some(_)) => Some((k_size.unwrap_or(0), k_size.is_some())),
    };
    let proposal = match proposal {
        Some((k, met)) => {
            let configuration = probe(k)?;
            let ignore: Vec<String> = candidates[..k]
                .iter()
                .flat_map(|c| c.group.ignore.clone())
                .collect();
            // The entries must keep exactly the groups chosen, as the quantizer reads them.
            let check = decide(&source.config, &source.tensors, &ignore, false)?;
            if modules_of(&source.tensors, &check) != with_kept(k) {
                return Err(QuantizeError::Bug(format!(
                    "the proposed ignore list {ignore:?} does not keep the groups chosen"
                )));
            }
            Some(Proposal {
                ignore,
                met,
                configuration,
            })
        }
        None => None,
    };
    probes.sort_by_key(|p| p.kept.len());
    drop(scratch);
    Ok(ScanReport {
        model: request.source.clone(),
        architecture: config.architecture.clone(),
        tokens: measurer.positions(),
        grouping: request.grouping,
        groups: costs,
        configurations,
        probes,
        proposal,
        max_kld: request.max_kld,
        max_bytes: request.max_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The modules a selection quantizes.
fn modules_of(tensors: &[SourceTensor], decisions: &[Decision]) -> HashSet<String> {
    tensors
        .iter()
        .zip(decisions)
        .filter(|(_, d)| **d == Decision::Quantize)
        .map(|(t, _)| names::module_of(&t.name).to_owned())
        .collect()
}

/// Checkpoint sizes of configurations.
struct Sizes {
    /// (module, source bytes, NVFP4 bytes) of every 2-D weight; and the other bytes.
    weights: Vec<(String, u64, u64)>,
    rest: u64,
}

impl Sizes {
    fn new(tensors: &[SourceTensor]) -> Sizes {
        let mut weights = Vec::new();
        let mut rest = 0;
        for t in tensors {
            if t.shape.len() == 2 && t.name.ends_with(".weight") {
                let module = names::module_of(&t.name).to_owned();
                weights.push((module, t.len, groups::nvfp4_bytes(&t.shape)));
            } else {
                rest += t.len;
            }
        }
        Sizes { weights, rest }
    }

    fn bytes(&self, quantized: &HashSet<String>) -> u64 {
        self.rest
            + self
                .weights
                .iter()
                .map(|(m, source, nvfp4)| if quantized.contains(m) { *nvfp4 } else { *source })
                .sum::<u64>()
    }
}

/// Windows of the built-in text, `window` tokens each, enough for `tokens`.
fn windows(
    dir: &Path,
    config: &ModelConfig,
    tokens: usize,
    window: usize,
) -> Result<Vec<Vec<u32>>, QuantizeError> {
    let text = TextModel::load(dir, &config.eos_token_ids).map_err(|e| QuantizeError::Scan {
        message: format!("the scan tokenizes the built-in text with the model's tokenizer: {e}"),
    })?;
    let ids = text
        .encode(super::calibrate::BUILTIN, false)
        .map_err(|message| QuantizeError::Scan { message })?;
    let window = window.clamp(2, config.max_position_embeddings.max(2));
    let wanted = tokens.div_ceil(window).max(1);
    let windows: Vec<Vec<u32>> = ids
        .chunks_exact(window)
        .take(wanted)
        .map(<[u32]>::to_vec)
        .collect();
    if windows.len() < wanted {
        return Err(QuantizeError::Scan {
            message: format!(
                "the built-in text is {} tokens for this tokenizer, fewer than the {} asked for",
                ids.len(),
                wanted * window
            ),
        });
    }
    Ok(windows)
}

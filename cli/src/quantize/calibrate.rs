//! Calibration for W4A4 NVFP4: the native engine runs the source model over
//! calibration samples and records the largest magnitude reaching every quantized
//! Linear's input, from which the checkpoint's activation scales are computed.
//!
//! The rules are llm-compressor 0.14.0.1's with compressed-tensors 0.19.0
//! (`docs/nvfp4.md`, "W4A4"): one sample per forward, no padding; the input
//! observer of the NVFP4 scheme is `static_minmax`, a running min/max over every
//! token of every sample; the scale is `2688 / amax` computed in the activations'
//! dtype. q/k/v (and gate/up) read one input, so theirs are equal.
//!
//! The model runs layer by layer (every sample through a layer, then the next), so
//! calibration holds one layer's weights and every sample's hidden states, not the
//! whole model; the ranges are those of whole passes, bit for bit.
//!
//! Samples, `chat` (the default): paragraphs of a text file (split at blank lines,
//! whitespace joined; paragraphs of 200 characters or fewer are skipped), the first N,
//! each as one user message through the model's chat template (no generation prompt),
//! tokenized without added special tokens and cut to `seq_len` tokens: how
//! llm-compressor's examples prepare chat data (`examples/quantization_w4a4_fp4/`,
//! ultrachat through `apply_chat_template`). `text`: the whole file tokenized once
//! without special tokens and cut into consecutive windows of exactly `seq_len` tokens,
//! the first N: how calibration on a plain corpus is prepared (AutoAWQ's
//! `get_calib_dataset` concatenates its samples and splits them into blocks of the
//! sequence length), and what a base model without a chat template needs. `builtin` is
//! chapter I of Lewis Carroll's *Alice's Adventures in Wonderland* (1865, public domain;
//! Project Gutenberg eBook #11).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sous_engine::chat::RenderOptions;
use sous_engine::native::config::{Family, ModelConfig};
use sous_engine::native::model::{LayerInputs, Model};
use sous_engine::native::text::TextModel;
use sous_engine::native::weights::{Checkpoint, Precision};
use sous_engine::recipe::{CalibrationFormat, CalibrationText};
use sous_engine::reporter::{Reporter, Task};

use super::error::QuantizeError;

/// The builtin calibration text.
pub const BUILTIN: &str = include_str!("../../../scripts/bench/data/alice-chapter1.txt");

/// Paragraphs this short are headings or dialogue scraps, not calibration text.
const MIN_PARAGRAPH_CHARS: usize = 200;

/// What to calibrate on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalibrationSet {
    /// The text; see the module doc for how it becomes samples.
    pub text: String,
    /// Where it came from (`builtin` or a path), for the summary.
    pub source: String,
    /// Paragraphs through the chat template, or windows of the plain text.
    pub format: CalibrationFormat,
    /// Samples to take.
    pub samples: usize,
    /// Longest sample, in tokens.
    pub seq_len: usize,
}

impl CalibrationSet {
    /// The set a recipe's `quantize.calibration`, `samples` and `seq_len` (or the flags
    /// that stand for them) describe; reads the file, if it is one.
    pub fn load(spec: &sous_engine::recipe::Calibration) -> Result<CalibrationSet, QuantizeError> {
        let text = match &spec.text {
            CalibrationText::Builtin => BUILTIN.to_owned(),
            CalibrationText::File(path) => {
                std::fs::read_to_string(path).map_err(|e| QuantizeError::CalibrationText {
                    path: path.clone(),
                    message: e.to_string(),
                })?
            }
        };
        Ok(CalibrationSet {
            text,
            source: spec.text.as_arg(),
            format: spec.format,
            samples: spec.samples,
            seq_len: spec.seq_len,
        })
    }
}

/// What calibration measured: the largest input magnitude per quantized module.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    /// `builtin` or the file's path.
    pub source: String,
    /// Samples run.
    pub samples: usize,
    /// Tokens run.
    pub tokens: usize,
    /// Whether the pass rounded as a bf16 model does.
    pub bf16: bool,
    /// Seconds it took.
    pub seconds: f64,
    /// The process's peak resident memory once calibration was over (Linux's `VmHWM`;
    /// `None` where the system does not say).
    pub peak_rss_bytes: Option<u64>,
    /// Module name (`model.layers.0.self_attn.q_proj`) to the largest magnitude of its
    /// input, in the activations' dtype.
    pub input_amax: BTreeMap<String, f32>,
}

/// The calibration samples of `set` for the model in `dir`, as token ids.
pub fn samples(dir: &Path, set: &CalibrationSet) -> Result<Vec<Vec<u32>>, QuantizeError> {
    let config = ModelConfig::read(dir).map_err(engine_error(dir))?;
    let text = TextModel::load(dir, &config.eos_token_ids).map_err(engine_error(dir))?;
    match set.format {
        CalibrationFormat::Chat => chat_samples(dir, &text, set),
        CalibrationFormat::Text => text_windows(&text, set),
    }
}

/// Consecutive windows of exactly `seq_len` tokens of the whole text, the first N.
fn text_windows(text: &TextModel, set: &CalibrationSet) -> Result<Vec<Vec<u32>>, QuantizeError> {
    let ids = text
        .encode(&set.text, false)
        .map_err(|message| QuantizeError::Calibration { message })?;
    let windows: Vec<Vec<u32>> = ids
        .chunks_exact(set.seq_len)
        .take(set.samples)
        .map(<[u32]>::to_vec)
        .collect();
    if windows.len() < set.samples {
        let held = ids.len() / set.seq_len;
        return Err(QuantizeError::Calibration {
            message: format!(
                "the calibration text `{}` is {} tokens long: {held} windows of {} tokens, fewer than the {} samples \
                 asked for; \
                 give a longer text, fewer --samples{}",
                set.source,
                ids.len(),
                set.seq_len,
                set.samples,
                match ids.len() / set.samples {
                    0 => String::new(),
                    len => format!(
                        ", or --seq-len {len} (the longest window that gives {} samples)",
                        set.samples
                    ),
                }
            ),
        });
    }
    Ok(windows)
}

/// The first N long paragraphs, each a user message through the chat template.
fn chat_samples(dir: &Path, text: &TextModel, set: &CalibrationSet) -> Result<Vec<Vec<u32>>, QuantizeError> {
    let no_template = |why: &str| QuantizeError::Calibration {
        message: format!(
            "the model in `{}` cannot calibrate on chat samples: {why}; calibrate on plain text instead \
             (`--calibration-format text`, `quantize.calibration_format = \"text\"`)",
            dir.display(),
        ),
    };
    let templates = text
        .chat
        .as_ref()
        .ok_or_else(|| no_template(text.chat_missing.as_deref().unwrap_or("it has no chat template")))?;
    let template = templates.select(false).map_err(|e| no_template(&e.to_string()))?;
    let paragraphs: Vec<String> = set
        .text
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| p.chars().count() > MIN_PARAGRAPH_CHARS)
        .take(set.samples)
        .collect();
    if paragraphs.len() < set.samples {
        return Err(QuantizeError::Calibration {
            message: format!(
                "{} has {} paragraphs longer than {MIN_PARAGRAPH_CHARS} characters, fewer than the {} samples asked for: \
                 give a longer text or fewer --samples",
                set.source,
                paragraphs.len(),
                set.samples
            ),
        });
    }
    let options = RenderOptions::default();
    paragraphs
        .iter()
        .map(|p| {
            let messages = serde_json::json!([{"role": "user", "content": p}]);
            let chat = template
                .render(&messages, &options)
                .map_err(|e| QuantizeError::Calibration {
                    message: format!("the chat template failed: {e}"),
                })?;
            let mut ids = text
                .encode(&chat, false)
                .map_err(|message| QuantizeError::Calibration { message })?;
            ids.truncate(set.seq_len);
            Ok(ids)
        })
        .collect()
}

/// Runs the model in `dir` over `samples` and returns the input ranges of every
/// layer's projections; `bf16` rounds as a bf16 model does (for bf16 weights).
pub fn calibrate(
    dir: &Path,
    source: &str,
    samples: &[Vec<u32>],
    bf16: bool,
    reporter: &dyn Reporter,
) -> Result<Calibration, QuantizeError> {
    let started = Instant::now();
    let config = ModelConfig::read(dir).map_err(engine_error(dir))?;
    let checkpoint = Checkpoint::open(dir, &config).map_err(engine_error(dir))?;
    let layers = config.layers;
    let (family, prefix) = (config.family, config.prefix.clone());
    let longest = samples.iter().map(Vec::len).max().unwrap_or(1).max(1);
    // The products accumulate in f32 (as PyTorch's bf16 products do): the bf16 dot
    // product instructions pair their sums differently, which moves more scales by a
    // bf16 step (136 of 210 equal instead of 150 on SmolLM2).
    //
    // Layer by layer, as llm-compressor's sequential pipeline goes: every sample
    // through one layer, then the next, so that one layer's weights are held (beside
    // the embedding and output projection) and every sample's hidden states, not the
    // whole model. The ranges are the whole pass's, bit for bit.
    let mut stem =
        Model::load_stem(config, &checkpoint, Precision::Stored, longest).map_err(engine_error(dir))?;
    // On the instruction set the user chose (`SOUS_KERNELS_ISA`), as the engine runs:
    // the ranges are the same bits on every one, which the test suite checks.
    stem.set_tuning(sous_engine::native::kernel_choices().tuning());
    checkpoint.release_pages();
    // One step per layer of every sample: a large model's layer takes a while.
    let progress = reporter.progress(Task::count(
        "calibrate",
        "layers",
        (samples.len() * layers) as u64,
    ));
    let mut ranges = vec![LayerInputs::default(); layers];
    let mut hidden = vec![Vec::new(); samples.len()];
    for li in 0..layers {
        let layer = stem
            .with_layers(&checkpoint, li..li + 1)
            .map_err(engine_error(dir))?;
        // What the layer was packed from is not needed again.
        checkpoint.release_pages();
        for (i, (sample, hidden)) in samples.iter().zip(&mut hidden).enumerate() {
            layer
                .observe_inputs(sample, hidden, &mut ranges[li..=li], bf16, &|_| {})
                .map_err(engine_error(dir))?;
            progress.add(1);
            progress.note(&format!(
                "layer {}/{layers}, sample {}/{}",
                li + 1,
                i + 1,
                samples.len()
            ));
        }
    }
    let peak_rss_bytes = peak_rss_bytes();
    progress.finish(Some(&format!(
        "calibrated on {} samples ({} tokens){}",
        samples.len(),
        samples.iter().map(Vec::len).sum::<usize>(),
        peak_rss_bytes
            .map(|b| format!(", peak memory {}", sous_engine::size::human(b)))
            .unwrap_or_default()
    )));
    let mut input_amax = BTreeMap::new();
    for (i, r) in ranges.iter().enumerate() {
        for (module, amax) in r.modules(family == Family::Mixtral) {
            input_amax.insert(format!("{prefix}.layers.{i}.{module}"), amax);
        }
    }
    Ok(Calibration {
        source: source.to_owned(),
        samples: samples.len(),
        tokens: samples.iter().map(Vec::len).sum(),
        bf16,
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_bytes,
        input_amax,
    })
}

fn engine_error(dir: &Path) -> impl Fn(sous_engine::native::NativeError) -> QuantizeError + '_ {
    move |e| QuantizeError::Calibration {
        message: format!(
            "the native engine cannot run the model in `{}` for calibration: {e}",
            dir.display()
        ),
    }
}

/// Peak resident memory of this process so far, from `/proc/self/status` (Linux).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

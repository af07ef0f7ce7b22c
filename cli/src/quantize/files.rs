//! The files of a quantized checkpoint besides its weight shards: those written
//! (`config.json` with its `quantization_config`, the index, ModelOpt's
//! `hf_quant_config.json`; their contents are [`super::checkpoint`]'s) and those copied
//! from the source model as they are (tokenizer, chat templates, generation config,
//! README, ...).
//!
//! Not here: the shards ([`super::write`]) or their layout ([`super::layout`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sous_engine::checkpoint::index::INDEX;
use sous_engine::recipe::QuantFormat;

use super::QuantizeError;
use super::checkpoint;
use super::error::io;
use super::layout::Layout;
use super::select::{self, Decision};
use super::source::Source;

/// config.json with `quantization_config`, the index, and for ModelOpt
/// `hf_quant_config.json`. JSON is written as transformers and compressed-tensors
/// write it: two-space indent, sorted keys.
pub(super) fn write_configs(
    source: &Source,
    decisions: &[Decision],
    format: QuantFormat,
    layout: &Layout,
    dir: &Path,
    w4a4: bool,
) -> Result<(), QuantizeError> {
    let kept = |include: &dyn Fn(&select::Kept) -> bool| -> Vec<String> {
        let mut names: BTreeSet<String> = source
            .tensors
            .iter()
            .zip(decisions)
            .filter_map(|(t, d)| match d {
                Decision::Keep(k) if include(k) => t.name.strip_suffix(".weight").map(str::to_owned),
                _ => None,
            })
            .collect();
        // A tied lm_head has no tensor of its own but is still a Linear module the
        // tools list (llm-compressor writes `"ignore": ["lm_head"]` for SmolLM2).
        if !names.iter().any(|n| n == "lm_head" || n.ends_with(".lm_head")) && tied(&source.config) {
            names.insert("lm_head".into());
        }
        names.into_iter().collect()
    };
    let ignore = match format {
        QuantFormat::CompressedTensors => kept(&|k| k.is_linear()),
        QuantFormat::Modelopt => kept(&|k| !matches!(k, select::Kept::NotLinear)),
    };
    let mut config = source.config.clone();
    config.insert(
        "quantization_config".into(),
        checkpoint::quantization_config(format, &ignore, w4a4),
    );
    write_json(&dir.join("config.json"), &Value::Object(config))?;
    if format == QuantFormat::Modelopt {
        write_json(
            &dir.join("hf_quant_config.json"),
            &checkpoint::hf_quant_config(&ignore, w4a4),
        )?;
    }
    if let Some(index) = &layout.index {
        write_json(&dir.join(INDEX), &index.to_json())?;
    }
    Ok(())
}

/// Whether the output embedding is tied to the input one (transformers' default).
fn tied(config: &serde_json::Map<String, Value>) -> bool {
    let text = config.get("text_config").and_then(Value::as_object);
    [text, Some(config)]
        .into_iter()
        .flatten()
        .find_map(|c| c.get("tie_word_embeddings").and_then(Value::as_bool))
        .unwrap_or(true)
}

fn write_json(path: &Path, value: &Value) -> Result<(), QuantizeError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| QuantizeError::Bug(e.to_string()))?;
    text.push('\n');
    std::fs::write(path, text).map_err(io(path))
}

/// Files weights do not live in: tokenizer, chat templates (named ones in
/// `additional_chat_templates/`, where transformers saves them), generation config,
/// processor configs, README and licence. Weights in other formats, the old index and
/// config, hidden files and other subdirectories are left behind.
pub(super) fn other_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = top_level_files(dir);
    let templates = dir.join(sous_engine::chat::TEMPLATES_DIR);
    let mut named: Vec<PathBuf> = std::fs::read_dir(&templates)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    named.sort();
    files.extend(named);
    files
}

fn top_level_files(dir: &Path) -> Vec<PathBuf> {
    const WEIGHTS: &[&str] = &[
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".gguf",
        ".h5",
        ".msgpack",
        ".onnx",
    ];
    const REPLACED: &[&str] = &[
        "config.json",
        INDEX,
        "pytorch_model.bin.index.json",
        "hf_quant_config.json",
    ];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.')
                && !WEIGHTS.iter().any(|w| name.ends_with(w))
                && !REPLACED.contains(&name.as_str())
                && e.path().is_file()
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

pub(super) fn copy_other_files(from: &Path, to: &Path) -> Result<(), QuantizeError> {
    for path in other_files(from) {
        let Ok(relative) = path.strip_prefix(from) else {
            continue;
        };
        let target = to.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::copy(&path, &target).map_err(io(&path))?;
    }
    Ok(())
}

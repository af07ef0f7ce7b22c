//! `sous import gguf`: a GGUF file (llama.cpp, Ollama) to a Hugging Face model directory
//! that transformers and vLLM load as is: `config.json`, `generation_config.json`,
//! dequantized safetensors weights under HF names, `tokenizer.json` and
//! `tokenizer_config.json`.
//!
//! One file per idea: [`gguf`] opens and checks the file, [`config`] reads the
//! hyperparameters, [`tensors`] names, un-permutes and dequantizes, [`tokenizer`]
//! rebuilds the tokenizer ([`sentencepiece`] for SentencePiece vocabularies),
//! [`write`] lays the directory out atomically. This module only sequences them and
//! reports each step to a [`Reporter`]; it never prints.

pub mod config;
pub mod gguf;
pub mod sentencepiece;
pub mod tensors;
pub mod tokenizer;
pub mod write;

use std::path::PathBuf;

use serde::Serialize;
use sous_engine::diagnose::{Class, Diagnose, user_unless};
use sous_engine::reporter::Reporter;

use self::config::LlamaConfig;
use self::gguf::Gguf;
use sous_engine::checkpoint::index::INDEX;

/// The dtype of the written weights: bf16 (what Llama-family checkpoints ship in),
/// f16, or f32 (exactly the dequantized values, no rounding).
pub use sous_kernels::Dtype;

/// What to import and where.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The GGUF file.
    pub file: PathBuf,
    /// The model directory to create.
    pub out: PathBuf,
    /// Weight dtype.
    pub dtype: Dtype,
    /// Largest shard, in bytes, before the weights are split over several files.
    pub max_shard_bytes: u64,
    /// Replace `out` if it exists.
    pub replace: bool,
}

/// What an import produced.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The GGUF file read.
    pub source: PathBuf,
    /// The model directory written.
    pub out: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    /// `general.name`, when set.
    pub name: Option<String>,
    /// Weight dtype, in lower case (`bf16`).
    #[serde(serialize_with = "lower_case")]
    pub dtype: Dtype,
    /// Tensors written.
    pub tensors: usize,
    /// Parameters written.
    pub parameters: u64,
    /// Safetensors files, in order.
    pub shards: Vec<String>,
    /// Bytes of tensor data.
    pub total_size: u64,
    /// GGUF tokenizer model (`gpt2` or `llama`).
    pub tokenizer: String,
    /// Tokens in the vocabulary, special tokens included.
    pub vocab_size: usize,
    /// Whether a chat template was carried over.
    pub chat_template: bool,
}

fn lower_case<S: serde::Serializer>(dtype: &Dtype, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&dtype.name().to_ascii_lowercase())
}

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file does not start with the GGUF magic.
    #[error("{path} is not a GGUF file: it starts with {found}, not \"GGUF\"")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What it starts with.
        found: String,
    },
    /// The header cannot be parsed.
    #[error("{path} is not a valid GGUF file: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's data runs past the end of the file.
    #[error("{path} is truncated: tensor `{tensor}` ends at byte {needed} but the file has only {len} bytes")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The first tensor found out of bounds.
        tensor: String,
        /// Where its data ends.
        needed: u64,
        /// The file's size.
        len: u64,
    },
    /// `general.architecture` is not one sous converts.
    #[error(
        "{path}: architecture `{arch}` is not supported (sous imports: {})",
        config::SUPPORTED_ARCHITECTURES.join(", ")
    )]
    UnsupportedArchitecture {
        /// The file.
        path: PathBuf,
        /// Its architecture.
        arch: String,
    },
    /// A supported architecture with a feature sous cannot convert faithfully.
    #[error("{path}: {what} is not supported")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The feature.
        what: String,
    },
    /// A required metadata key is absent.
    #[error("{path}: metadata key `{key}` is missing")]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A metadata value has the wrong type or an impossible value.
    #[error("{path}: metadata key `{key}` should be {expected}, found {found}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A tensor the architecture requires is absent.
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// A tensor whose HF name sous does not know.
    #[error("{path}: tensor `{name}` has no known Hugging Face name for this architecture")]
    UnknownTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// The tokenizer metadata cannot be turned into a `tokenizer.json`.
    #[error("{path}: cannot rebuild the tokenizer: {reason}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The output directory exists.
    #[error("{path} already exists")]
    OutputExists {
        /// The directory.
        path: PathBuf,
    },
    /// The output path has no directory name (e.g. `/` or `..`).
    #[error("{path} cannot be used as the output directory")]
    BadOutput {
        /// The path.
        path: PathBuf,
    },
    /// The GGUF file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An output file cannot be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// candle failed on a tensor (reading its blocks or dequantizing them). The cause is
    /// the error's source, which the binary prints after this message.
    #[error("tensor `{name}`")]
    Tensor {
        /// The GGUF tensor name.
        name: String,
        /// candle's error.
        source: candle_core::Error,
    },
}

impl Diagnose for ImportError {
    /// Only candle failing on a tensor is sous's fault; the file or the output
    /// directory otherwise.
    fn class(&self) -> Class {
        user_unless(matches!(self, ImportError::Tensor { .. }))
    }

    fn hint(&self) -> Option<String> {
        self.hint_text().map(str::to_owned)
    }
}

impl ImportError {
    fn hint_text(&self) -> Option<&'static str> {
        match self {
            ImportError::NotGguf { .. } => {
                Some("pass the .gguf file itself (llama.cpp and Ollama model files)")
            }
            ImportError::Malformed { .. } | ImportError::Truncated { .. } => {
                Some("the file is damaged or incompletely downloaded: fetch it again and check its checksum")
            }
            ImportError::UnsupportedArchitecture { .. } | ImportError::Unsupported { .. } => Some(
                "convert the original Hugging Face checkpoint instead, or open an issue with the file's architecture",
            ),
            ImportError::OutputExists { .. } => Some("pick another --out, or pass --force to replace it"),
            _ => None,
        }
    }
}

/// Imports a GGUF file, reporting each step to `reporter`. Nothing exists at
/// `options.out` unless this returns `Ok`.
pub fn import_gguf(options: &ImportOptions, reporter: &dyn Reporter) -> Result<Summary, ImportError> {
    if options.out.exists() && !options.replace {
        // Checked again when the staging directory is made; this only fails fast.
        return Err(ImportError::OutputExists {
            path: options.out.clone(),
        });
    }
    let mut gguf = Gguf::open(&options.file)?;
    let arch = gguf.string("general.architecture")?.to_owned();
    reporter.status(
        "reading",
        &format!(
            "{} ({arch}, {} tensors)",
            options.file.display(),
            gguf.tensor_names().len()
        ),
    );
    let config = LlamaConfig::from_gguf(&gguf)?;
    let planned = tensors::plan(&gguf, &config)?;
    let tok = tokenizer::Rebuilt::from_gguf(&gguf)?;
    if tok.vocab_size() as u64 > config.vocab_size {
        return Err(ImportError::Tokenizer {
            path: options.file.clone(),
            reason: format!(
                "{} tokens but the embedding has only {} rows",
                tok.vocab_size(),
                config.vocab_size
            ),
        });
    }

    let staging = write::staging(&options.out, options.replace)?;
    let dir = staging.path();
    write::write_json(dir, "config.json", &config.to_hf_config(options.dtype))?;
    write::write_json(dir, "generation_config.json", &config.to_generation_config())?;
    write::write_bytes(dir, "tokenizer.json", tok.tokenizer_json().as_bytes())?;
    write::write_json(dir, "tokenizer_config.json", &tok.tokenizer_config())?;

    let shards = write::shard(&planned, options.dtype, options.max_shard_bytes);
    for (i, shard) in shards.iter().enumerate() {
        reporter.status(
            "writing",
            &format!(
                "{} ({}/{}, {:.1} MB)",
                shard.file,
                i + 1,
                shards.len(),
                shard.bytes as f64 / 1e6
            ),
        );
        let mut converted = Vec::with_capacity(shard.tensors.len());
        for &t in &shard.tensors {
            let tensor = &planned[t];
            converted.push((
                tensor.hf_name.clone(),
                tensors::convert(&mut gguf, tensor, options.dtype)?,
            ));
        }
        write::write_safetensors(&dir.join(&shard.file), converted)?;
    }
    if shards.len() > 1 {
        write::write_json(dir, INDEX, &write::index(&planned, &shards).to_json())?;
    }
    let out = staging.commit()?;

    Ok(Summary {
        source: options.file.clone(),
        out,
        architecture: arch,
        name: gguf.opt_string("general.name")?.map(str::to_owned),
        dtype: options.dtype,
        tensors: planned.len(),
        parameters: planned
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum(),
        shards: shards.iter().map(|s| s.file.clone()).collect(),
        total_size: shards.iter().map(|s| s.bytes).sum(),
        tokenizer: tok.model().to_owned(),
        vocab_size: tok.vocab_size(),
        chat_template: tok.has_chat_template(),
    })
}

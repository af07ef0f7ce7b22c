//! `sous import gguf FILE --out DIR`: a GGUF file to a Hugging Face model directory.
//! The work is in [`sous::import`]; this file parses the flags, says what happened
//! and prints the `--json` summary on stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand, ValueEnum};
use sous::error::Diagnose;
use sous_engine::recipe::ByteSize;

use crate::shell::Shell;
use sous::import::{self, Dtype, ImportOptions};
use sous::quantize::DEFAULT_MAX_SHARD_SIZE;

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Convert a GGUF file (llama.cpp, Ollama) into a Hugging Face model directory:
    /// config.json, dequantized safetensors weights, tokenizer.json, tokenizer_config.json
    /// (with the chat template) and generation_config.json.
    Gguf(GgufArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  sous import gguf SmolLM2-135M-Instruct.Q8_0.gguf --out models/smollm2 --dtype bf16"
)]
pub struct GgufArgs {
    /// The .gguf file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The model directory to create (written atomically: it appears complete or not at all).
    #[arg(long, short = 'o', value_name = "DIR")]
    out: PathBuf,
    /// Dtype of the written weights.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DtypeArg,
    /// Largest safetensors file before the weights are split into shards with an index,
    /// e.g. `5GB`, `500MB`, or a byte count.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_SHARD_SIZE, value_parser = shard_size)]
    max_shard_size: u64,
    /// Replace DIR if it already exists.
    #[arg(long)]
    force: bool,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
}

pub fn exec(cmd: ImportCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cmd {
        ImportCommand::Gguf(args) => gguf(args, shell),
    }
}

fn gguf(args: GgufArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let options = ImportOptions {
        file: args.file,
        out: args.out,
        dtype: args.dtype.into(),
        max_shard_bytes: args.max_shard_size,
        replace: args.force,
    };
    let started = Instant::now();
    // Mistakes in the file or the output are the user's and say so themselves; a
    // failure of sous gets the file as context.
    let file = options.file.display().to_string();
    let summary = import::import_gguf(&options, shell).map_err(|e| {
        if e.is_internal() {
            anyhow::Error::new(e).context(format!("importing {file}"))
        } else {
            e.into()
        }
    })?;
    shell.status(
        "imported",
        &format!(
            "{} ({} parameters, {} in {}) in {:.1}s",
            summary.out.display(),
            summary.parameters,
            summary.dtype.torch_name(),
            summary.shards.join(", "),
            started.elapsed().as_secs_f64()
        ),
    );
    if args.json {
        shell.data(&serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DtypeArg {
    Bf16,
    F16,
    F32,
}

impl From<DtypeArg> for Dtype {
    fn from(arg: DtypeArg) -> Dtype {
        match arg {
            DtypeArg::Bf16 => Dtype::Bf16,
            DtypeArg::F16 => Dtype::F16,
            DtypeArg::F32 => Dtype::F32,
        }
    }
}

/// A shard size: any size sous reads (`5GB`, `500MB`, `64KiB`, bytes), but not zero.
fn shard_size(text: &str) -> Result<u64, String> {
    match text.parse::<ByteSize>() {
        Ok(ByteSize(0)) => Err("the shard size must be positive".to_owned()),
        Ok(size) => Ok(size.bytes()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::shard_size as parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("GB").is_err());
        assert!(parse_size("0").is_err());
    }
}

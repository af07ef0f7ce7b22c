//! `sous import gguf FILE --out DIR`: a GGUF file to a Hugging Face model directory.
//! The work is in [`crate::import`]; this file parses the flags, shows progress on
//! stderr and prints the `--json` summary on stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand};

use crate::failure::UserError;
use crate::import::{self, Dtype, ImportOptions, Progress};
use crate::shell::Shell;

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Convert a GGUF file (llama.cpp, Ollama) into a Hugging Face model directory:
    /// config.json, dequantized safetensors weights, tokenizer.json, tokenizer_config.json
    /// (with the chat template) and generation_config.json.
    Gguf(GgufArgs),
}

#[derive(Debug, Args)]
pub struct GgufArgs {
    /// The .gguf file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The model directory to create (written atomically: it appears complete or not at all).
    #[arg(long, short = 'o', value_name = "DIR")]
    out: PathBuf,
    /// Dtype of the written weights.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: Dtype,
    /// Largest safetensors file before the weights are split into shards with an index,
    /// e.g. `5GB`, `500MB`, or a byte count.
    #[arg(long, value_name = "SIZE", default_value = "5GB", value_parser = parse_size)]
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
        dtype: args.dtype,
        max_shard_bytes: args.max_shard_size,
        replace: args.force,
    };
    let started = Instant::now();
    let mut on_progress = |p: Progress<'_>| match p {
        Progress::Opened { arch, tensors } => {
            shell.status(
                "reading",
                &format!("{} ({arch}, {tensors} tensors)", options.file.display()),
            );
        }
        Progress::Shard {
            index,
            count,
            file,
            bytes,
        } => shell.status(
            "writing",
            &format!("{file} ({index}/{count}, {:.1} MB)", bytes as f64 / 1e6),
        ),
    };
    let summary = match import::import_gguf(&options, &mut on_progress) {
        Ok(summary) => summary,
        Err(err) if err.is_user_error() => {
            let hint = err.hint();
            return Err(UserError::new(err.to_string(), hint).into());
        }
        Err(err) => {
            return Err(anyhow::Error::new(err).context(format!("importing {}", options.file.display())));
        }
    };
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

/// `5GB`, `500MB`, `64KiB`, `1000`: decimal units as transformers' `max_shard_size`,
/// binary ones with `i`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 5GB or 500MB"))?;
    let factor: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let size = n
        .checked_mul(factor)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if size == 0 {
        return Err("the shard size must be positive".to_owned());
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

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

//! `sous quantize MODEL_DIR --out DIR` and `sous quantize --recipe FILE`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use sous_engine::recipe::{
    ByteSize, Calibration, CalibrationFormat, CalibrationText, DEFAULT_CALIBRATION_SAMPLES,
    DEFAULT_CALIBRATION_SEQ_LEN, DEFAULT_REVISION, QuantFormat, QuantScheme,
};
use sous_engine::size::human;

use super::{OverrideArgs, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;
use sous::hub::cache::RepoCache;
use sous::quantize::scan::{Grouping, ScanRequest};
use sous::quantize::{
    CalibrationSet, DEFAULT_MAX_SHARD_SIZE, DEFAULT_WINDOW, Device, ModelOptExport, Provenance, Request,
    Summary, run,
};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous quantize --recipe recipes/local/smollm2-135m-nvfp4.toml\n  sous quantize MODEL_DIR --out OUT_DIR --format modelopt\n  sous quantize MODEL_DIR --out OUT_DIR --scheme nvfp4 --calibration builtin --device cuda"
)]
pub struct QuantizeArgs {
    /// The model to quantize: a directory with config.json and *.safetensors.
    #[arg(
        value_name = "MODEL_DIR",
        required_unless_present = "recipe",
        conflicts_with = "recipe"
    )]
    model: Option<PathBuf>,
    /// Quantize as a recipe's `[quantize]` says: the model is `model.path`, or
    /// `model.repo` at `model.revision` from the Hub cache (`sous pull` it first).
    #[arg(long, short = 'r', value_name = "FILE")]
    recipe: Option<PathBuf>,
    /// `nvfp4a16`: FP4 weights, 16-bit activations. `nvfp4`: FP4 weights and
    /// activations (W4A4), with activation scales calibrated by running the model in the
    /// native engine over `--calibration`.
    #[arg(long, value_enum, default_value_t = SchemeArg::Nvfp4a16, conflicts_with = "recipe")]
    scheme: SchemeArg,
    /// W4A4 calibration text: `builtin` (chapter I of Alice's Adventures in Wonderland,
    /// public domain) or a UTF-8 text file. Default: the recipe's
    /// `quantize.calibration`, else `builtin`.
    #[arg(long, value_name = "builtin|FILE")]
    calibration: Option<String>,
    /// W4A4: how the text becomes samples. `chat`: paragraphs (split at blank lines)
    /// longer than 200 characters, each a user message through the model's chat
    /// template. `text`: the text tokenized whole, without special tokens, in
    /// consecutive windows of --seq-len tokens (base models, plain corpora). Default:
    /// the recipe's `quantize.calibration_format`, else `chat`.
    #[arg(long, value_enum, value_name = "chat|text")]
    calibration_format: Option<CalibrationFormatArg>,
    /// W4A4: calibration samples (the first N paragraphs or windows). Default: the
    /// recipe's `quantize.samples`, else 16.
    #[arg(long, value_name = "N")]
    samples: Option<usize>,
    /// W4A4: longest calibration sample (`chat`), or every window (`text`), in tokens.
    /// Default: the recipe's `quantize.seq_len`, else 512.
    #[arg(long, value_name = "TOKENS")]
    seq_len: Option<usize>,
    /// Where the kernels run: `cpu`, or `cuda` / `cuda:N` (an NVIDIA GPU through its
    /// driver and NVRTC; the same bytes). Default: the recipe's `quantize.device`, else
    /// `cpu`.
    #[arg(long, value_name = "cpu|cuda[:N]")]
    device: Option<Device>,
    /// Checkpoint format: compressed-tensors (llm-compressor's) or modelopt (NVIDIA ModelOpt's).
    #[arg(long, value_enum, default_value_t = FormatArg::CompressedTensors, conflicts_with = "recipe")]
    format: FormatArg,
    /// With `--format modelopt`: reproduce ModelOpt's export on a `gpu` (the usual case,
    /// what published checkpoints hold) or on a `cpu`, bit for bit (they round
    /// `weight_scale_2` differently).
    #[arg(long, value_enum, default_value_t = ExportArg::Gpu)]
    modelopt_export: ExportArg,
    /// Keep this module unquantized: an exact name (`model.layers.0.mlp.down_proj`) or
    /// `re:` and a regular expression (repeatable; the recipe's `quantize.ignore`).
    #[arg(long, value_name = "NAME", conflicts_with = "recipe")]
    ignore: Vec<String>,
    /// Output directory. Default with --recipe: `~/.cache/sous/quantized/<recipe name>`
    /// (`SOUS_CACHE_DIR`, `XDG_CACHE_HOME`).
    #[arg(long, short = 'o', value_name = "DIR", required_unless_present_any = ["recipe", "scan"])]
    out: Option<PathBuf>,
    /// Largest output shard (`5GB`, `2GiB`, bytes).
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_SHARD_SIZE)]
    max_shard_size: ByteSize,
    /// Replace the output directory if it holds something else.
    #[arg(long)]
    force: bool,
    /// Print a JSON summary on stdout, with per-tensor error statistics.
    #[arg(long)]
    json: bool,
    /// Add to the JSON summary the SHA-256 of every quantized tensor and of its bf16
    /// dequantization (for comparing with other tools).
    #[arg(long)]
    digests: bool,
    /// Then measure what the quantization costs: serve the source and the output on
    /// this machine with the native engine, one after the other, and report `sous
    /// eval`'s figures of the output against the source (perplexity, KL divergence,
    /// top-token agreement). For models that fit this machine's memory; for a GPU
    /// recipe, `sous eval --recipe Q.toml --baseline B.toml`.
    #[arg(long)]
    eval: bool,
    /// Instead of quantizing, choose what to keep in 16 bits by measurement: quantize
    /// one group of layers at a time, run the model in the native engine over the
    /// built-in text, and report each group's KL divergence from the unquantized model,
    /// then the configurations (everything, the reference tools' default, the recipe's
    /// list, the proposal). Writes nothing but, with --write, the recipe.
    #[arg(long)]
    scan: bool,
    /// --scan: group layers by `layer` (each layer's q/k/v, o_proj, MLP or experts
    /// apart) or by `kind` (each kind over all layers).
    #[arg(long, value_enum, default_value_t = ByArg::Layer, requires = "scan")]
    by: ByArg,
    /// --scan: propose the fewest groups kept in 16 bits for which the mean KL
    /// divergence (nats per token) is at most this.
    #[arg(long, value_name = "NATS", requires = "scan")]
    max_kld: Option<f64>,
    /// --scan: propose the most groups kept in 16 bits that fit this checkpoint size
    /// (`20GB`, `12GiB`, bytes).
    #[arg(long, value_name = "SIZE", requires = "scan")]
    max_size: Option<ByteSize>,
    /// --scan: tokens of the built-in text to measure on, in windows of 256.
    #[arg(long, value_name = "N", default_value_t = 512, requires = "scan")]
    tokens: usize,
    /// --scan with --recipe: write the proposed list into the recipe's
    /// `quantize.ignore` (the rest of the file is kept as it is).
    #[arg(long, requires = "scan")]
    write: bool,
    /// No progress on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ByArg {
    Layer,
    Kind,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SchemeArg {
    Nvfp4a16,
    Nvfp4,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CalibrationFormatArg {
    Chat,
    Text,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExportArg {
    Gpu,
    Cpu,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    CompressedTensors,
    Modelopt,
}

pub fn exec(args: QuantizeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let window_bytes = match sous_engine::env::QUANTIZE_WINDOW.get() {
        Some(v) => v.parse().map_err(|_| {
            UserError::new(
                format!("SOUS_QUANTIZE_WINDOW=`{v}` is not a number of bytes"),
                Some("unset it, or give bytes, e.g. 67108864"),
            )
        })?,
        None => DEFAULT_WINDOW,
    };
    let modelopt_export = match args.modelopt_export {
        ExportArg::Gpu => ModelOptExport::Gpu,
        ExportArg::Cpu => ModelOptExport::Cpu,
    };
    let request = match (&args.model, &args.recipe) {
        (Some(model), _) => Request {
            source: model.clone(),
            out: args.out.clone().unwrap_or_default(),
            scheme: match args.scheme {
                SchemeArg::Nvfp4a16 => QuantScheme::Nvfp4a16,
                SchemeArg::Nvfp4 => QuantScheme::Nvfp4,
            },
            format: match args.format {
                FormatArg::CompressedTensors => QuantFormat::CompressedTensors,
                FormatArg::Modelopt => QuantFormat::Modelopt,
            },
            modelopt_export,
            ignore: args.ignore.clone(),
            max_shard_bytes: args.max_shard_size.bytes(),
            force: args.force,
            digests: args.digests,
            provenance: None,
            window_bytes,
            calibration: calibration_set(
                &args,
                matches!(args.scheme, SchemeArg::Nvfp4).then(default_calibration),
                "--scheme nvfp4",
            )?,
            device: args.device.unwrap_or_default(),
            linear_attention: false,
        },
        (None, Some(file)) => from_recipe(file, &args, window_bytes, modelopt_export)?,
        (None, None) => {
            return Err(
                UserError::new("nothing to quantize", Some("give MODEL_DIR or `--recipe FILE`")).into(),
            );
        }
    };
    let reporter = if args.quiet { shell.quiet() } else { shell.clone() };
    if args.scan {
        return scan(&args, &request, &reporter, shell);
    }
    let summary = run(&request, &reporter)?;
    report(shell, &summary);
    let eval = if args.eval {
        match super::runtime()?.block_on(sous::eval::evaluate::source_against_output(
            &summary.source,
            &summary.output,
            Arc::new(shell.clone()),
            super::shutdown_signal,
        ))? {
            Some(report) => Some(report),
            None => return Ok(ExitCode::from(130)),
        }
    } else {
        None
    };
    if args.json {
        let mut value = serde_json::to_value(&summary)?;
        if let Some(report) = &eval {
            value["eval"] = serde_json::to_value(report)?;
        }
        shell.data(&serde_json::to_string_pretty(&value)?)?;
    } else {
        shell.data(&summary.output.display().to_string())?;
        if let Some(report) = &eval {
            shell.data(&sous::eval::report::table(report))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--scan`: measure, report, and with `--write` put the proposal in the recipe.
fn scan(args: &QuantizeArgs, request: &Request, reporter: &Shell, shell: &Shell) -> anyhow::Result<ExitCode> {
    if request.scheme != QuantScheme::Nvfp4a16 {
        return Err(UserError::new(
            "--scan measures weight-only NVFP4 (nvfp4a16), and this quantization is W4A4",
            Some("scan with `--scheme nvfp4a16` (the kept layers are the same choice for both)"),
        )
        .into());
    }
    let recipe = match (args.write, &args.recipe) {
        (true, None) => {
            return Err(UserError::new(
                "--write needs --recipe: it writes the recipe's `quantize.ignore`",
                None,
            )
            .into());
        }
        (true, Some(_)) if args.max_kld.is_none() && args.max_size.is_none() => {
            return Err(UserError::new(
                "--write writes the proposal, and there is none without a target",
                Some("give --max-kld or --max-size"),
            )
            .into());
        }
        (_, recipe) => recipe.as_deref(),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let work = sous_engine::paths::cache_dir()
        .join("scan")
        .join(format!("{}-{nanos}", std::process::id()));
    let scan = ScanRequest {
        source: request.source.clone(),
        format: request.format,
        grouping: match args.by {
            ByArg::Layer => Grouping::Layer,
            ByArg::Kind => Grouping::Kind,
        },
        max_kld: args.max_kld,
        max_bytes: args.max_size.map(|s| s.bytes()),
        tokens: args.tokens,
        window: 256,
        current: request.ignore.clone(),
        work,
    };
    let report = sous::quantize::scan::scan(&scan, reporter)?;
    if let (Some(file), Some(proposal)) = (recipe.filter(|_| args.write), &report.proposal) {
        sous::quantize::scan::write_ignore(file, &proposal.ignore)?;
        reporter.status(
            "wrote",
            &format!(
                "quantize.ignore ({} entries) into {}",
                proposal.ignore.len(),
                display(file)
            ),
        );
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(sous::quantize::scan::render(&report).trim_end())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The request a recipe describes.
fn from_recipe(
    file: &Path,
    args: &QuantizeArgs,
    window_bytes: u64,
    modelopt_export: ModelOptExport,
) -> anyhow::Result<Request> {
    let recipe = load_recipe(file, &args.overrides)?.recipe;
    // Where `sous serve` looks for the checkpoint, and the cache it pulls into.
    let setup = sous::pipeline::session::setup();
    let default_out = setup.quantized_dir(&recipe);
    let quantize = recipe.quantize.ok_or_else(|| {
        UserError::new(
            format!("recipe {} has no `[quantize]` section", display(file)),
            Some("add `[quantize]` with `scheme = \"nvfp4a16\"`"),
        )
    })?;
    let model = recipe.model;
    let (source, provenance) = if let Some(path) = &model.path {
        (PathBuf::from(path), None)
    } else if let Some(repo) = &model.repo {
        let revision = model.revision.as_deref().unwrap_or(DEFAULT_REVISION);
        let cache = RepoCache::new(&setup.hub.cache_dir, repo);
        let commit = cache.read_ref(revision).ok_or_else(|| {
            UserError::new(
                format!(
                    "{repo}@{revision} is not in the Hub cache ({})",
                    cache.dir().display()
                ),
                Some(&format!("run `sous pull --recipe {}` first", display(file))),
            )
        })?;
        let provenance = Provenance {
            repo: Some(repo.to_string()),
            commit: Some(commit.clone()),
        };
        (cache.snapshot(&commit), Some(provenance))
    } else {
        return Err(UserError::new(
            format!("recipe {} names no model", display(file)),
            Some("set `model.repo` or `model.path`"),
        )
        .into());
    };
    Ok(Request {
        source,
        out: args.out.clone().unwrap_or(default_out),
        scheme: quantize.scheme,
        format: quantize.format,
        modelopt_export,
        ignore: quantize.ignore,
        max_shard_bytes: args.max_shard_size.bytes(),
        force: args.force,
        digests: args.digests,
        provenance,
        window_bytes,
        calibration: calibration_set(
            args,
            quantize.calibration,
            "`quantize.scheme = \"nvfp4\"` in the recipe",
        )?,
        device: args.device.unwrap_or(quantize.device),
        linear_attention: false,
    })
}

/// The calibration of a W4A4 quantization: `base` (the recipe's, or the defaults for
/// `--scheme nvfp4`; `None` when the scheme needs none) with the flags laid over it.
fn calibration_set(
    args: &QuantizeArgs,
    base: Option<Calibration>,
    needs: &str,
) -> anyhow::Result<Option<CalibrationSet>> {
    let flags = args.calibration.is_some()
        || args.calibration_format.is_some()
        || args.samples.is_some()
        || args.seq_len.is_some();
    let Some(mut spec) = base else {
        if flags {
            return Err(UserError::new(
                "--calibration, --calibration-format, --samples and --seq-len are for W4A4 (scheme nvfp4), which \
                 calibrates activation scales",
                Some(&format!("drop them, or use {needs}")),
            )
            .into());
        }
        return Ok(None);
    };
    if let Some(text) = &args.calibration {
        spec.text = match text.as_str() {
            "builtin" => CalibrationText::Builtin,
            file => CalibrationText::File(file.into()),
        };
    }
    if let Some(format) = args.calibration_format {
        spec.format = match format {
            CalibrationFormatArg::Chat => CalibrationFormat::Chat,
            CalibrationFormatArg::Text => CalibrationFormat::Text,
        };
    }
    spec.samples = args.samples.unwrap_or(spec.samples);
    spec.seq_len = args.seq_len.unwrap_or(spec.seq_len);
    if spec.samples == 0 || spec.seq_len == 0 {
        return Err(UserError::new(
            "--samples and --seq-len must be at least 1",
            Some(&format!(
                "the defaults are {DEFAULT_CALIBRATION_SAMPLES} samples of up to {DEFAULT_CALIBRATION_SEQ_LEN} tokens"
            )),
        )
        .into());
    }
    Ok(Some(CalibrationSet::load(&spec)?))
}

fn default_calibration() -> Calibration {
    Calibration {
        text: CalibrationText::Builtin,
        format: CalibrationFormat::default(),
        samples: DEFAULT_CALIBRATION_SAMPLES,
        seq_len: DEFAULT_CALIBRATION_SEQ_LEN,
    }
}

/// One status line on stderr.
fn report(shell: &Shell, summary: &Summary) {
    let what = summary
        .repo
        .clone()
        .unwrap_or_else(|| summary.source.display().to_string());
    if summary.up_to_date {
        shell.status(
            "up to date",
            &format!(
                "{what}: {} weights already in {} ({})",
                summary.quantized,
                summary.output.display(),
                summary.format
            ),
        );
        return;
    }
    let worst = summary
        .tensors
        .iter()
        .max_by(|a, b| a.relative_rms_error.total_cmp(&b.relative_rms_error))
        .map(|t| {
            format!(
                "; largest relative RMS error {:.3} ({})",
                t.relative_rms_error, t.name
            )
        })
        .unwrap_or_default();
    shell.status(
        "quantized",
        &format!(
            "{what}: {} weights to NVFP4 ({}, {}), {} kept, {} -> {} in {} shard(s), {:.1} s ({:.2} GB/s){worst}",
            summary.quantized,
            summary.scheme,
            summary.format,
            summary.kept.len(),
            human(summary.bytes_in),
            human(summary.bytes_out),
            summary.shards,
            summary.seconds,
            summary.gb_per_s,
        ),
    );
}

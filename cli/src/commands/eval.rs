//! `sous eval`: what a recipe costs in quality. Serves `--recipe` (or takes `--url`),
//! and `--baseline` one after the other, scores the same windows of a text on each,
//! runs lm-evaluation-harness tasks against each when asked, and reports perplexity,
//! the KL divergence and top-token agreement against the baseline, and task accuracy.
//! The eval itself is `sous::eval::evaluate`'s; this file reads the flags and prints.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{ArgGroup, Args};
use sous::eval::evaluate::{Options, Side, builtin_text, evaluate};
use sous::eval::harness;
use sous::eval::report;
use sous::eval::windows::Shape;
use sous_engine::reporter::Reporter;

use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(group = ArgGroup::new("baseline_any").args(["baseline", "baseline_url"]))]
#[command(after_help = "Examples:
  sous eval --recipe recipes/local/smollm2-135m.toml
  sous eval --recipe recipes/local/smollm2-135m-nvfp4.toml --baseline recipes/local/smollm2-135m.toml
  sous eval --url http://127.0.0.1:8000 --tasks sous_capitals,hellaswag --limit 200
  sous eval --recipe q.toml --baseline b.toml --max-kld 0.05 --json > eval.json")]
pub struct EvalArgs {
    /// Serve this recipe (`sous serve --recipe`) for the eval, and stop it afterwards.
    #[arg(long, short = 'r', value_name = "FILE", required_unless_present = "url")]
    recipe: Option<PathBuf>,
    /// Evaluate the server at this base URL instead (any OpenAI-compatible server that
    /// returns vLLM's `prompt_logprobs`).
    #[arg(long, conflicts_with = "recipe")]
    url: Option<String>,
    #[command(flatten)]
    overrides: super::OverrideArgs,
    /// The baseline recipe, served and stopped before the candidate, over the same
    /// windows: adds Δ perplexity, KL divergence and top-token agreement.
    #[arg(long, value_name = "FILE", conflicts_with = "baseline_url")]
    baseline: Option<PathBuf>,
    /// Override a value of the baseline recipe (as --set does for the candidate;
    /// repeatable).
    #[arg(long = "baseline-set", value_name = "KEY=VALUE", requires = "baseline")]
    baseline_set: Vec<String>,
    /// A baseline server already running, at this base URL.
    #[arg(long, value_name = "URL")]
    baseline_url: Option<String>,
    /// The text perplexity is measured over (default: chapter I of Alice's Adventures in
    /// Wonderland, shipped with sous).
    #[arg(long, value_name = "FILE")]
    text: Option<PathBuf>,
    /// Tokens per window (llama.cpp's `-c`).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Tokens of each window that are context only (default: half the window, as
    /// llama.cpp scores the second half).
    #[arg(long, value_name = "N")]
    score_from: Option<usize>,
    /// One window holding the whole text, scored from its second token: the figure of a
    /// single `prompt_logprobs` request over the text.
    #[arg(long, conflicts_with_all = ["ctx", "score_from", "chunks"])]
    whole: bool,
    /// At most this many windows (llama.cpp's `--chunks`).
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Top log-probabilities asked per position, for the KL divergence (vLLM serves at
    /// most `--max-logprobs`, 20 by default).
    #[arg(long, default_value_t = sous::eval::DEFAULT_TOP_K)]
    top_k: usize,
    /// lm-evaluation-harness tasks to run against each server, comma-separated
    /// (`sous_capitals` ships with sous; public tasks download their data).
    #[arg(long, value_delimiter = ',', value_name = "TASK")]
    tasks: Vec<String>,
    /// Documents per task at most (the harness's `--limit`).
    #[arg(long, value_name = "N", requires = "tasks")]
    limit: Option<usize>,
    /// A folder of task YAML files of your own (the harness's `--include_path`;
    /// repeatable).
    #[arg(long = "include-path", value_name = "DIR", requires = "tasks")]
    include: Vec<PathBuf>,
    /// The `lm_eval` program (default: the first on PATH).
    #[arg(long = "lm-eval", value_name = "PATH", requires = "tasks")]
    lm_eval: Option<PathBuf>,
    /// The model name to send (default: the first one in /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// The tokenizer (a tokenizer.json or a model directory; default: the served model's).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Environment variable holding the API key of --url servers.
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// Fail (exit 1) when the mean KL divergence from the baseline exceeds this (nats).
    #[arg(long, value_name = "NATS", requires = "baseline_any")]
    max_kld: Option<f64>,
    /// Write eval.json (and the harness's output) into this directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Discard the scores an interrupted run of the same eval left, and start over.
    #[arg(long)]
    fresh: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn exec(args: EvalArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let options = options(&args)?;
    let reporter: Arc<dyn Reporter> = Arc::new(shell.clone());
    let evaluated = super::runtime()?.block_on(evaluate(&options, reporter, super::shutdown_signal))?;
    let Some((report, kept)) = evaluated else {
        return Ok(ExitCode::from(130));
    };
    let json = serde_json::to_string_pretty(&report).context("writing the report as JSON")?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("eval.json");
        std::fs::write(&path, format!("{json}\n")).with_context(|| format!("writing {}", path.display()))?;
        shell.status("wrote", &path.display().to_string());
    }
    if args.json {
        shell.data(&json)?;
    } else {
        shell.data(&report::table(&report))?;
    }
    // Reported: a rerun starts afresh. (Until here, a failure of the second side keeps
    // the first side's scores for the rerun.)
    for saved in kept {
        saved.remove()?;
    }
    if let (Some(limit), Some(c)) = (args.max_kld, &report.comparison)
        && c.kld_mean.value > limit
    {
        shell.warn(&format!(
            "quality gate: mean KL divergence {:.6} exceeds --max-kld {limit}",
            c.kld_mean.value
        ));
        return Ok(ExitCode::from(sous::error::Class::User.exit_code()));
    }
    Ok(ExitCode::SUCCESS)
}

/// What the flags ask for, checked: the sides, the text (read here), the windows and
/// the harness's program.
fn options(args: &EvalArgs) -> anyhow::Result<Options> {
    if args.top_k == 0 && (args.baseline.is_some() || args.baseline_url.is_some()) {
        return Err(UserError::new(
            "--top-k 0 leaves nothing to compare with the baseline",
            Some("pass --top-k 20"),
        )
        .into());
    }
    let (text_name, text) = match &args.text {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path).with_context(|| format!("reading --text {}", path.display()))?,
        ),
        None => builtin_text(),
    };
    let candidate = match (&args.recipe, &args.url) {
        (Some(file), _) => Side::Recipe {
            file: file.clone(),
            set: args.overrides.set.clone(),
        },
        (None, Some(url)) => Side::Url {
            url: url.clone(),
            api_key_env: args.api_key_env.clone(),
        },
        (None, None) => return Err(UserError::new("pass --recipe FILE or --url URL", None).into()),
    };
    let baseline = match (&args.baseline, &args.baseline_url) {
        (Some(file), _) => Some(Side::Recipe {
            file: file.clone(),
            set: args.baseline_set.clone(),
        }),
        (None, Some(url)) => Some(Side::Url {
            url: url.clone(),
            api_key_env: args.api_key_env.clone(),
        }),
        (None, None) => None,
    };
    let harness = if args.tasks.is_empty() {
        None
    } else {
        Some(harness::find_program(args.lm_eval.as_deref())?)
    };
    let shape = if args.whole {
        Shape::Whole
    } else {
        Shape::Windows {
            ctx: args.ctx,
            score_from: args.score_from,
            chunks: args.chunks,
        }
    };
    Ok(Options {
        candidate,
        baseline,
        text_name,
        text,
        shape,
        top_k: args.top_k,
        harness,
        tasks: args.tasks.clone(),
        limit: args.limit,
        include: args.include.clone(),
        model: args.model.clone(),
        tokenizer: args.tokenizer.clone(),
        out: args.out.clone(),
        fresh: args.fresh,
    })
}

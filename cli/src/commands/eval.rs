//! `sous eval`: what a recipe costs in quality. Serves `--recipe` (or takes `--url`),
//! and `--baseline` one after the other, scores the same windows of a text on each,
//! runs lm-evaluation-harness tasks against each when asked, and reports perplexity,
//! the KL divergence and top-token agreement against the baseline, and task accuracy.
//! The figures are `sous::eval`'s; this file serves, asks and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{ArgGroup, Args};
use sha2::Digest;

use crate::failure::UserError;
use crate::shell::Shell;
use sous::bench::discover;
use sous::eval::Scoring;
use sous::eval::harness::{self, Harness};
use sous::eval::quality::{self, Position};
use sous::eval::report::{self, Report, Run, TextInfo};
use sous::eval::resume::Saved;
use sous::eval::score::Server;
use sous::eval::windows::Shape;

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

/// One side of the eval, before it runs.
enum Side<'a> {
    Recipe {
        file: &'a Path,
        overrides: super::OverrideArgs,
    },
    Url(&'a str),
}

pub fn exec(args: EvalArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let Some((report, kept)) = evaluate(&args, shell)? else {
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

/// `sous quantize --eval`: the quantized checkpoint `output` against its `source`, each
/// served on this machine by the native engine with the same settings, over the default
/// windows. `None` when interrupted.
pub(super) fn source_against_output(
    source: &Path,
    output: &Path,
    shell: &Shell,
) -> anyhow::Result<Option<Report>> {
    let dir = sous_engine::paths::state_dir().join(format!("evals/quantize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let recipe = |name: &str, model: &Path| -> anyhow::Result<PathBuf> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("finding a free port")?;
        let path = dir.join(format!("{name}.toml"));
        let text = format!(
            "name = {}\n[model]\npath = {}\nserved_name = {}\n[engine]\nkind = \"native\"\n\
             [memory]\nkv_cache_bytes = \"512MiB\"\n[serving]\nmax_model_len = 2048\n\
             [server]\nhost = \"127.0.0.1\"\nport = {port}\n",
            toml::Value::String(name.to_owned()),
            toml::Value::String(model.display().to_string()),
            toml::Value::String(name.to_owned()),
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let (base, quantized) = (recipe("source", source)?, recipe("quantized", output)?);
    #[derive(clap::Parser)]
    struct Line {
        #[command(flatten)]
        args: EvalArgs,
    }
    let line = <Line as clap::Parser>::try_parse_from([
        "eval".as_ref(),
        "--recipe".as_ref(),
        quantized.as_os_str(),
        "--baseline".as_ref(),
        base.as_os_str(),
    ])
    .context("the eval's arguments")?;
    let evaluated = evaluate(&line.args, shell);
    let _ = std::fs::remove_dir_all(&dir);
    let Some((report, kept)) = evaluated? else {
        return Ok(None);
    };
    for saved in kept {
        saved.remove()?;
    }
    Ok(Some(report))
}

/// Runs the eval `args` describe: the report, and the saved scores to forget once it is
/// out. `None` when interrupted (what was scored is kept and said).
fn evaluate(args: &EvalArgs, shell: &Shell) -> anyhow::Result<Option<(Report, Vec<Saved>)>> {
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
        None => (
            "builtin (Alice's Adventures in Wonderland, chapter I)".to_owned(),
            sous::quantize::calibrate::BUILTIN.to_owned(),
        ),
    };
    let candidate = match (&args.recipe, &args.url) {
        (Some(file), _) => Side::Recipe {
            file,
            overrides: args.overrides.clone(),
        },
        (None, Some(url)) => Side::Url(url),
        (None, None) => return Err(UserError::new("pass --recipe FILE or --url URL", None).into()),
    };
    let baseline = match (&args.baseline, &args.baseline_url) {
        (Some(file), _) => Some(Side::Recipe {
            file,
            overrides: super::OverrideArgs {
                set: args.baseline_set.clone(),
            },
        }),
        (None, Some(url)) => Some(Side::Url(url)),
        (None, None) => None,
    };
    let harness = if args.tasks.is_empty() {
        None
    } else {
        Some(harness::find_program(args.lm_eval.as_deref())?)
    };
    let runtime = super::runtime()?;
    runtime.block_on(async {
        let mut ctx = Eval {
            args,
            shell,
            text_name,
            text,
            prepared: None,
            harness,
            scoring: None,
        };
        let mut runs = Vec::new();
        let mut scores = Vec::new();
        let mut kept = Vec::new();
        for side in baseline.iter().chain([&candidate]) {
            let interrupted = tokio::select! {
                done = ctx.side(side) => Some(done?),
                () = super::shutdown_signal() => None,
            };
            match interrupted {
                Some((run, positions, saved)) => {
                    runs.push(run);
                    scores.push(positions);
                    kept.push(saved);
                }
                None => {
                    let how_far = match &ctx.scoring {
                        Some((saved, windows, label)) => so_far(saved, *windows, label),
                        None => "nothing scored yet".into(),
                    };
                    shell.warn(&format!("interrupted: {how_far}"));
                    return Ok(None);
                }
            }
        }
        let prepared = ctx.prepared.take().context("no side was scored")?;
        let comparison = match scores.as_slice() {
            [base, cand] => {
                Some(quality::compare(base, cand, args.top_k).map_err(sous::eval::EvalError::from)?)
            }
            _ => None,
        };
        let report = Report {
            report: "eval".into(),
            date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            text: prepared.info,
            cut: prepared.job.cut,
            windows: prepared.job.windows.len(),
            top_k: args.top_k,
            runs,
            comparison,
        };
        Ok(Some((report, kept)))
    })
}

/// The tokens and windows, made from the first server's tokenizer and used for both.
struct Prepared {
    info: TextInfo,
    job: Scoring,
    tokenizer_dir: Option<PathBuf>,
}

struct Eval<'a> {
    args: &'a EvalArgs,
    shell: &'a Shell,
    text_name: String,
    text: String,
    prepared: Option<Prepared>,
    harness: Option<PathBuf>,
    /// The side being scored: its saved scores, its windows and its label.
    scoring: Option<(Saved, usize, String)>,
}

impl Eval<'_> {
    /// Serves (or reaches) one side, scores it, runs its tasks, and stops it.
    async fn side(&mut self, side: &Side<'_>) -> anyhow::Result<(Run, Vec<Position>, Saved)> {
        match side {
            Side::Url(url) => {
                let key = super::api_key(self.args.api_key_env.as_deref())?;
                let url = url.trim_end_matches('/').to_owned();
                self.measure(url.clone(), key, url, None, String::new()).await
            }
            Side::Recipe { file, overrides } => {
                let recipe = super::load_recipe(file, overrides)?.recipe;
                let key = super::recipe_api_key(&recipe);
                let (instance, url) =
                    sous::pipeline::session::for_session(&recipe, Arc::new(self.shell.clone())).await?;
                let measured = self
                    .measure(
                        url,
                        key,
                        recipe.name.clone(),
                        Some(file.display().to_string()),
                        format!("{recipe:?}"),
                    )
                    .await;
                // The recipe's server stops whether the eval succeeded or not.
                instance.stop().await?;
                measured
            }
        }
    }

    async fn measure(
        &mut self,
        url: String,
        api_key: Option<String>,
        label: String,
        recipe: Option<String>,
        recipe_identity: String,
    ) -> anyhow::Result<(Run, Vec<Position>, Saved)> {
        let args = self.args;
        let client = reqwest::Client::new();
        let served = discover::models(&client, &url, api_key.as_deref()).await?;
        let model = args.model.clone().unwrap_or(served.id.clone());
        if self.prepared.is_none() {
            let (tokenizer, path) =
                discover::tokenizer(args.tokenizer.as_deref(), served.root.as_deref(), &served.id)?;
            let shape = if args.whole {
                Shape::Whole
            } else {
                Shape::Windows {
                    ctx: args.ctx,
                    score_from: args.score_from,
                    chunks: args.chunks,
                }
            };
            let (job, tokens) = sous::eval::scoring(&tokenizer, &self.text, shape, args.top_k)?;
            self.prepared = Some(Prepared {
                info: TextInfo {
                    name: self.text_name.clone(),
                    sha256: hex::encode(sha2::Sha256::digest(self.text.as_bytes())),
                    tokens,
                },
                job,
                tokenizer_dir: path.parent().map(Path::to_path_buf),
            });
        }
        let Some(prepared) = self.prepared.as_ref() else {
            unreachable!("prepared above")
        };
        if let Some(limit) = served.max_model_len
            && prepared.job.cut.ctx >= limit
        {
            return Err(sous::eval::EvalError::TooLong {
                ctx: prepared.job.cut.ctx,
                limit,
            }
            .into());
        }
        let server = Server {
            url: url.clone(),
            model: model.clone(),
            api_key,
        };
        let identity = serde_json::json!({
            "server": if recipe_identity.is_empty() { format!("{url} {model} {:?}", served.root) } else { recipe_identity },
            "text": prepared.info.sha256,
            "cut": prepared.job.cut,
            "top_k": args.top_k,
        })
        .to_string();
        let saved = Saved::new(&sous_engine::paths::state_dir().join("evals"), &identity);
        if args.fresh {
            saved.remove()?;
        }
        self.scoring = Some((saved.clone(), prepared.job.windows.len(), label.clone()));
        let positions = sous::eval::score_all(&client, &server, &prepared.job, &saved, self.shell, &label)
            .await
            .with_context(|| so_far(&saved, prepared.job.windows.len(), &label))?;
        let perplexity = quality::perplexity(&positions);
        self.shell.status(
            "scored",
            &format!(
                "{label}: perplexity {:.4} ± {:.4} over {} tokens",
                perplexity.perplexity.value, perplexity.perplexity.stderr, perplexity.tokens
            ),
        );
        let tasks = match &self.harness {
            None => Vec::new(),
            Some(program) => {
                let out = match &args.out {
                    Some(dir) => dir.join("lm_eval").join(safe(&label)),
                    None => sous_engine::paths::state_dir()
                        .join("evals/lm_eval")
                        .join(safe(&label)),
                };
                self.shell.status(
                    "lm_eval",
                    &format!(
                        "{} against {label} (log: {})",
                        args.tasks.join(","),
                        out.join("lm_eval.log").display()
                    ),
                );
                let h = Harness {
                    program: program.clone(),
                    tasks: args.tasks.clone(),
                    limit: args.limit,
                    include: args.include.clone(),
                    out,
                    tokenizer_dir: prepared.tokenizer_dir.clone(),
                };
                h.run(&client, &server).await?
            }
        };
        Ok((
            Run {
                label,
                recipe,
                url,
                model,
                perplexity,
                tasks,
            },
            positions,
            saved,
        ))
    }
}

/// How far the scoring of `label` got, and how to go on.
fn so_far(saved: &Saved, windows: usize, label: &str) -> String {
    let done = saved
        .load()
        .map_or(0, |w| w.iter().filter(|w| w.is_some()).count());
    if done == 0 {
        format!("no window of {label} was scored")
    } else {
        format!(
            "{done} of {windows} windows of {label} are scored and kept in {}; the same command resumes from there",
            saved.path().display()
        )
    }
}

/// `label` as a folder name.
fn safe(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

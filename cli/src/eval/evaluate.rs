//! An eval run end to end: each side served for the length of the eval (a recipe,
//! through [`crate::pipeline::session`]) or reached at its URL, scored over the same
//! windows, its lm-evaluation-harness tasks run, and the report put together
//! ([`evaluate()`]). `sous eval` parses its flags into [`Options`];
//! `sous quantize --eval` asks for [`source_against_output()`].

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use sha2::Digest;
use sous_engine::reporter::Reporter;

use super::harness::Harness;
use super::quality::{self, Position};
use super::report::{Report, Run, TextInfo};
use super::resume::Saved;
use super::score::Server;
use super::windows::Shape;
use super::{DEFAULT_TOP_K, EvalError, Scoring};
use crate::pipeline::session;
use crate::served;

/// One side of an eval.
#[derive(Debug, Clone)]
pub enum Side {
    /// A recipe file, served for the eval (with `--set` overrides) and stopped after.
    Recipe {
        /// The recipe file.
        file: PathBuf,
        /// Overrides, `KEY=VALUE`.
        set: Vec<String>,
    },
    /// A server already running at this base URL.
    Url {
        /// The base URL.
        url: String,
        /// The environment variable holding its API key, if any.
        api_key_env: Option<String>,
    },
}

/// What an eval runs: the sides, the text and its windows, and the harness's tasks.
#[derive(Debug, Clone)]
pub struct Options {
    /// The side measured.
    pub candidate: Side,
    /// The side compared against, scored first.
    pub baseline: Option<Side>,
    /// The text's name, as the report gives it.
    pub text_name: String,
    /// The text perplexity is measured over.
    pub text: String,
    /// How the text is cut into windows.
    pub shape: Shape,
    /// Top log-probabilities asked per position.
    pub top_k: usize,
    /// The `lm_eval` program, when tasks are run.
    pub harness: Option<PathBuf>,
    /// lm-evaluation-harness tasks.
    pub tasks: Vec<String>,
    /// Documents per task at most.
    pub limit: Option<usize>,
    /// Folders of task YAML files.
    pub include: Vec<PathBuf>,
    /// The model name to send (default: the first one the server lists).
    pub model: Option<String>,
    /// The tokenizer (default: the served model's).
    pub tokenizer: Option<PathBuf>,
    /// Where the harness's output goes (default: under the state directory).
    pub out: Option<PathBuf>,
    /// Discard saved scores of an interrupted run and start over.
    pub fresh: bool,
}

/// The text an eval scores by default: its name and its text.
pub fn builtin_text() -> (String, String) {
    (
        "builtin (Alice's Adventures in Wonderland, chapter I)".to_owned(),
        crate::quantize::calibrate::BUILTIN.to_owned(),
    )
}

/// Runs the eval `options` describe, the baseline first: the report, and the saved
/// scores to forget once it is out. `None` when `shutdown()` resolves first (what was
/// scored is kept, and said as a warning).
pub async fn evaluate<F: Future<Output = ()>>(
    options: &Options,
    reporter: Arc<dyn Reporter>,
    shutdown: impl Fn() -> F,
) -> anyhow::Result<Option<(Report, Vec<Saved>)>> {
    let mut ctx = Eval {
        options,
        reporter: reporter.clone(),
        prepared: None,
        scoring: None,
    };
    let mut runs = Vec::new();
    let mut scores = Vec::new();
    let mut kept = Vec::new();
    for side in options.baseline.iter().chain([&options.candidate]) {
        let interrupted = tokio::select! {
            done = ctx.side(side) => Some(done?),
            () = shutdown() => None,
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
                reporter.warn(&format!("interrupted: {how_far}"));
                return Ok(None);
            }
        }
    }
    let prepared = ctx.prepared.take().context("no side was scored")?;
    let comparison = match scores.as_slice() {
        [base, cand] => Some(quality::compare(base, cand, options.top_k).map_err(EvalError::from)?),
        _ => None,
    };
    let report = Report {
        report: "eval".into(),
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        text: prepared.info,
        cut: prepared.job.cut,
        windows: prepared.job.windows.len(),
        top_k: options.top_k,
        runs,
        comparison,
    };
    Ok(Some((report, kept)))
}

/// `sous quantize --eval`: the quantized checkpoint `output` against its `source`, each
/// served on this machine by the native engine with the same settings, over the default
/// windows. `None` when `shutdown()` resolves first.
pub async fn source_against_output<F: Future<Output = ()>>(
    source: &Path,
    output: &Path,
    reporter: Arc<dyn Reporter>,
    shutdown: impl Fn() -> F,
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
    let (text_name, text) = builtin_text();
    // `sous eval --recipe QUANTIZED --baseline SOURCE`, every other flag at its default.
    let options = Options {
        candidate: Side::Recipe {
            file: quantized,
            set: Vec::new(),
        },
        baseline: Some(Side::Recipe {
            file: base,
            set: Vec::new(),
        }),
        text_name,
        text,
        shape: Shape::Windows {
            ctx: 512,
            score_from: None,
            chunks: None,
        },
        top_k: DEFAULT_TOP_K,
        harness: None,
        tasks: Vec::new(),
        limit: None,
        include: Vec::new(),
        model: None,
        tokenizer: None,
        out: None,
        fresh: false,
    };
    let evaluated = evaluate(&options, reporter, shutdown).await;
    let _ = std::fs::remove_dir_all(&dir);
    let Some((report, kept)) = evaluated? else {
        return Ok(None);
    };
    for saved in kept {
        saved.remove()?;
    }
    Ok(Some(report))
}

/// The tokens and windows, made from the first server's tokenizer and used for both.
struct Prepared {
    info: TextInfo,
    job: Scoring,
    tokenizer_dir: Option<PathBuf>,
}

struct Eval<'a> {
    options: &'a Options,
    reporter: Arc<dyn Reporter>,
    prepared: Option<Prepared>,
    /// The side being scored: its saved scores, its windows and its label.
    scoring: Option<(Saved, usize, String)>,
}

impl Eval<'_> {
    /// Serves (or reaches) one side, scores it, runs its tasks, and stops it.
    async fn side(&mut self, side: &Side) -> anyhow::Result<(Run, Vec<Position>, Saved)> {
        match side {
            Side::Url { url, api_key_env } => {
                let key = match api_key_env {
                    None => None,
                    Some(var) => {
                        Some(sous_engine::env::named(var).ok_or_else(|| EvalError::ApiKeyEnv(var.clone()))?)
                    }
                };
                let url = url.trim_end_matches('/').to_owned();
                self.measure(url.clone(), key, url, None, String::new()).await
            }
            Side::Recipe { file, set } => {
                let recipe = session::load_recipe(file, set)?.recipe;
                let key = session::api_key(&recipe);
                let (instance, url) = session::for_session(&recipe, self.reporter.clone()).await?;
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
        let args = self.options;
        let client = reqwest::Client::new();
        let served = served::models(&client, &url, api_key.as_deref()).await?;
        let model = args.model.clone().unwrap_or(served.id.clone());
        if self.prepared.is_none() {
            let (tokenizer, path) =
                served::tokenizer(args.tokenizer.as_deref(), served.root.as_deref(), &served.id)?;
            let (job, tokens) = super::scoring(&tokenizer, &args.text, args.shape, args.top_k)?;
            self.prepared = Some(Prepared {
                info: TextInfo {
                    name: args.text_name.clone(),
                    sha256: hex::encode(sha2::Sha256::digest(args.text.as_bytes())),
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
            return Err(EvalError::TooLong {
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
        let positions = super::score_all(
            &client,
            &server,
            &prepared.job,
            &saved,
            self.reporter.as_ref(),
            &label,
        )
        .await
        .with_context(|| so_far(&saved, prepared.job.windows.len(), &label))?;
        let perplexity = quality::perplexity(&positions);
        self.reporter.status(
            "scored",
            &format!(
                "{label}: perplexity {:.4} ± {:.4} over {} tokens",
                perplexity.perplexity.value, perplexity.perplexity.stderr, perplexity.tokens
            ),
        );
        let tasks = match &args.harness {
            None => Vec::new(),
            Some(program) => {
                let out = match &args.out {
                    Some(dir) => dir.join("lm_eval").join(safe(&label)),
                    None => sous_engine::paths::state_dir()
                        .join("evals/lm_eval")
                        .join(safe(&label)),
                };
                self.reporter.status(
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

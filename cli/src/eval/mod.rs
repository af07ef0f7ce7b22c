//! `sous eval`: what a recipe costs in quality. Perplexity of a served model over a
//! text, cut into windows as llama.cpp cuts it ([`windows`]), from the server's prompt
//! log-probabilities ([`score`]); against a baseline served over the same tokens, the
//! change in perplexity, the KL divergence of the next-token distributions and the
//! agreement of their most likely tokens ([`quality`]); task accuracy from
//! lm-evaluation-harness run against the same endpoint ([`harness`]). Scores are kept
//! as they come, so an interrupted eval resumes ([`resume`]); [`report`] holds the
//! report and its table. [`evaluate`] runs an eval end to end, serving the recipes it
//! names through the pipeline's sessions.

pub mod evaluate;
pub mod harness;
pub mod quality;
pub mod report;
pub mod resume;
pub mod score;
pub mod windows;

/// Top log-probabilities asked per position by default: vLLM's `--max-logprobs`
/// default, and the native engine's cap.
pub const DEFAULT_TOP_K: usize = 20;

use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose, user_unless};
use sous_engine::reporter::{Reporter, Task};

use quality::Position;
use resume::Saved;
use score::Server;
use windows::Cut;

/// Why an eval could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The text cannot be cut into windows.
    #[error("{0}")]
    Cut(#[from] windows::CutError),
    /// A window does not fit the server's context.
    #[error("--ctx {ctx} does not fit the server's max_model_len {limit} (a window and one output token)")]
    TooLong {
        /// Tokens per window.
        ctx: usize,
        /// The server's limit.
        limit: usize,
    },
    /// The text could not be tokenized.
    #[error("tokenizing the text: {0}")]
    Tokenize(String),
    /// A request did not get an answer.
    #[error("POST {url}: {error}")]
    Request {
        /// The endpoint.
        url: String,
        /// What the client said.
        error: reqwest::Error,
    },
    /// A request got an error status.
    #[error("POST {url} answered {status}: {body}")]
    Status {
        /// The endpoint.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
        /// The start of the body.
        body: String,
    },
    /// An answer without what an eval needs.
    #[error("{url}: {message}")]
    Answer {
        /// The endpoint.
        url: String,
        /// What is missing or wrong.
        message: String,
    },
    /// The variable meant to hold a server's API key is not set.
    #[error("--api-key-env: `{0}` is not set")]
    ApiKeyEnv(String),
    /// The two runs cannot be compared.
    #[error("comparing with the baseline: {0}")]
    Compare(#[from] quality::CompareError),
    /// Saved scores or the harness's files cannot be read or written.
    #[error("{}: {source}", path.display())]
    State {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// lm-evaluation-harness is not installed.
    #[error("lm-evaluation-harness is not installed (looked for {looked})")]
    NoHarness {
        /// Where.
        looked: String,
    },
    /// The harness did not start.
    #[error("starting {}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The harness failed.
    #[error("lm_eval failed (log: {}):\n{tail}", log.display())]
    Harness {
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
}

impl Diagnose for EvalError {
    /// Saved scores that cannot be written are the machine's business; the rest is the
    /// user's: the server, the text, the flags, the harness they run.
    fn class(&self) -> Class {
        user_unless(matches!(self, EvalError::State { .. }))
    }

    fn hint(&self) -> Option<String> {
        Some(match self {
            EvalError::Cut(windows::CutError::TooShort { .. }) => {
                "pass a longer --text, or a smaller --ctx".into()
            }
            EvalError::Cut(_) => "lower --score-from, or raise --ctx".into(),
            EvalError::TooLong { .. } => "pass a smaller --ctx, or serve with a larger serving.max_model_len".into(),
            EvalError::Answer { message, .. } if message.contains("prompt_logprobs") => {
                "serve the model with vLLM, SGLang's OpenAI API or sous's native engine, which return prompt log-probabilities".into()
            }
            EvalError::Status { status, .. } if status.as_u16() == 400 => {
                "the server refused the request: vLLM caps top-k at --max-logprobs (20 by default); pass a smaller --top-k".into()
            }
            EvalError::NoHarness { .. } => {
                "pip install 'lm_eval[api]' (or pass --lm-eval PATH to its `lm_eval` program)".into()
            }
            EvalError::Harness { .. } => "the harness's log says why; --limit 10 tries a task quickly".into(),
            EvalError::ApiKeyEnv(var) => format!("export {var}=..."),
            _ => return None,
        })
    }
}

/// What every server of an eval scores: the windows, how they are cut, and k.
#[derive(Debug, Clone)]
pub struct Scoring {
    /// The windows' tokens.
    pub windows: Vec<Vec<u32>>,
    /// How they were cut.
    pub cut: Cut,
    /// Top log-probabilities asked per position.
    pub top_k: usize,
}

/// The positions `server` scores over `job`'s windows, from saved scores where an
/// earlier run left them, the rest asked for one window at a time and saved as it
/// comes. Reports progress as windows, under `label`.
pub async fn score_all(
    client: &reqwest::Client,
    server: &Server,
    job: &Scoring,
    saved: &Saved,
    reporter: &dyn Reporter,
    label: &str,
) -> Result<Vec<Position>, EvalError> {
    let (windows, cut, top_k) = (&job.windows, &job.cut, job.top_k);
    let mut done = saved.load()?;
    done.resize(windows.len(), None);
    let already = done.iter().filter(|w| w.is_some()).count();
    if already > 0 {
        reporter.status(
            "resuming",
            &format!(
                "{label}: {already} of {} windows already scored ({}; --fresh starts over)",
                windows.len(),
                saved.path().display()
            ),
        );
    }
    let progress = reporter.progress(Task::count(
        format!("scoring {label}"),
        "windows",
        windows.len() as u64,
    ));
    progress.set(already as u64);
    let mut positions = Vec::with_capacity(windows.len() * cut.scored_per_window());
    for (i, window) in windows.iter().enumerate() {
        let scores = match done[i].take() {
            Some(s) => s,
            None => {
                let s = score::window(client, server, window, cut.scored(), top_k).await?;
                saved.append(i, &s)?;
                progress.add(1);
                s
            }
        };
        positions.extend(scores);
    }
    progress.finish(None);
    Ok(positions)
}

/// `text` tokenized by `tokenizer` and cut as `shape` says, for `top_k`; with the
/// text's length in tokens.
pub fn scoring(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    shape: windows::Shape,
    top_k: usize,
) -> Result<(Scoring, usize), EvalError> {
    let tokens = tokens(tokenizer, text)?;
    let cut = shape.cut(tokens.len(), bos(tokenizer));
    let job = Scoring {
        windows: cut.windows(&tokens)?,
        cut,
        top_k,
    };
    Ok((job, tokens.len()))
}

/// The BOS token `tokenizer` starts every sequence with, if any: what encoding with its
/// special tokens puts in front of the plain encoding.
pub fn bos(tokenizer: &tokenizers::Tokenizer) -> Option<u32> {
    let plain = tokenizer.encode("a", false).ok()?;
    let special = tokenizer.encode("a", true).ok()?;
    let (plain, special) = (plain.get_ids(), special.get_ids());
    (special.len() > plain.len() && special[1..].starts_with(plain)).then(|| special[0])
}

/// The text's tokens, without special tokens (each window gets its BOS from the cut).
pub fn tokens(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, EvalError> {
    tokenizer
        .encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| EvalError::Tokenize(e.to_string()))
}

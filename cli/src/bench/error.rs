//! Why an active benchmark (`sous bench probe|sweep|prefix|agent`) could not run or
//! report, one variant per thing a caller may handle. Not here: the errors of `logs` and
//! `scrape`, which have their own.

use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose, user_unless};

/// Why a benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server did not answer `/v1/models`.
    #[error("cannot reach {url}/v1/models: {error}")]
    Unreachable {
        /// The server's base URL.
        url: String,
        /// What the client said.
        error: reqwest::Error,
    },
    /// `/v1/models` answered with an error status.
    #[error("{url}/v1/models answered {status}")]
    ModelsStatus {
        /// The server's base URL.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
    },
    /// `/v1/models` answered something that is not its JSON.
    #[error("reading /v1/models")]
    ModelsBody(#[source] reqwest::Error),
    /// A tokenizer file does not load.
    #[error("cannot read the tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// No tokenizer was given and none was found for the served model.
    #[error(
        "no tokenizer found for model `{id}`{}",
        root.as_ref().map_or(String::new(), |r| format!(" (root `{r}`)"))
    )]
    NoTokenizer {
        /// The served model's name.
        id: String,
        /// Its root, as `/v1/models` gave it.
        root: Option<String>,
    },
    /// The tokenizer cannot make prompts.
    #[error("{0}")]
    Prompts(String),
    /// A sweep without levels, or with a level of 0.
    #[error("--concurrency needs levels of at least 1")]
    NoConcurrency,
    /// An open-loop sweep capped at 0 requests in flight.
    #[error("--max-concurrency needs at least 1")]
    NoMaxConcurrency,
    /// An open-loop level's rate or burstiness is not a positive number (the flags'
    /// parsers let none through; a caller of the library may).
    #[error("no arrival times at request rate {rate} with burstiness {burstiness}: both must be positive")]
    Traffic {
        /// Requests per second.
        rate: f64,
        /// The gamma shape of the gaps.
        burstiness: f64,
    },
    /// A request would not fit the server's context.
    #[error(
        "a request of {longest} tokens (prompt + output) does not fit the server's max_model_len {limit}"
    )]
    TooLong {
        /// The longest request's prompt and output tokens.
        longest: usize,
        /// The server's `max_model_len`.
        limit: usize,
    },
    /// The report does not serialize (a bug).
    #[error("writing the report as JSON")]
    Json(#[source] serde_json::Error),
    /// The output directory cannot be created.
    #[error("creating {}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A report file cannot be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A chart cannot be drawn.
    #[error("drawing the charts: {0}")]
    Charts(String),
}

impl Diagnose for BenchError {
    /// Writing the report is sous's (or the machine's) business; the server, the
    /// tokenizer and the flags are the user's.
    fn class(&self) -> Class {
        user_unless(matches!(
            self,
            BenchError::ModelsBody(_)
                | BenchError::Json(_)
                | BenchError::Create { .. }
                | BenchError::Write { .. }
                | BenchError::Charts(_)
        ))
    }

    fn hint(&self) -> Option<String> {
        self.hint_text().map(str::to_owned)
    }
}

impl BenchError {
    fn hint_text(&self) -> Option<&'static str> {
        match self {
            BenchError::Unreachable { .. } => Some("check --url, and that the server is up"),
            BenchError::ModelsStatus { .. } => Some("pass --api-key-env if the server needs a key"),
            BenchError::NoTokenizer { .. } => Some(
                "pass --tokenizer DIR_OR_FILE (a model directory with tokenizer.json), or `sous pull` the model",
            ),
            BenchError::Prompts(_) => Some("pass --tokenizer"),
            BenchError::TooLong { .. } => {
                Some("use shorter --input-len/--output-len (or --prefix-len, --max-context)")
            }
            _ => None,
        }
    }
}

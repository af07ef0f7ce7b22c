//! Why an active benchmark (`sous bench probe|sweep|prefix|agent`) could not run or
//! report, one variant per thing a caller may handle. Not here: the errors of `logs` and
//! `scrape`, which have their own.

use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose, user_unless};

/// Why a benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server's model or its tokenizer could not be found.
    #[error(transparent)]
    Served(#[from] crate::served::ServedError),
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
        if let BenchError::Served(e) = self {
            return e.class();
        }
        user_unless(matches!(
            self,
            BenchError::Json(_)
                | BenchError::Create { .. }
                | BenchError::Write { .. }
                | BenchError::Charts(_)
        ))
    }

    fn hint(&self) -> Option<String> {
        if let BenchError::Served(e) = self {
            return e.hint();
        }
        self.hint_text().map(str::to_owned)
    }
}

impl BenchError {
    fn hint_text(&self) -> Option<&'static str> {
        match self {
            BenchError::Prompts(_) => Some("pass --tokenizer"),
            BenchError::TooLong { .. } => {
                Some("use shorter --input-len/--output-len (or --prefix-len, --max-context)")
            }
            _ => None,
        }
    }
}

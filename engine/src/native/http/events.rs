//! Reading one request's events from the engine loop into what a response sends: text
//! detokenized a piece at a time, stop strings applied, logprobs collected, and the
//! finish reason. Whole responses (`generate`) and streamed ones (`stream`) both read
//! through [`next_piece`].

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::App;
use super::openai::{ApiError, prompt_logprobs_json};
use crate::native::core::Event;
use crate::native::metrics::FinishReason;
use crate::native::sampling::TokenLogprobs;
use crate::native::text::{Detokenizer, StopWatch};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// The per-request output state: text so far, logprobs, counts.
pub(super) struct Output {
    pub(super) detok: Detokenizer,
    pub(super) stops: StopWatch,
    pub(super) tokens: usize,
    pub(super) cached: usize,
    /// Chat: `[{token, logprob, bytes, top_logprobs}]`; completions: built from the same.
    pub(super) logprobs: Vec<(String, TokenLogprobs)>,
    pub(super) prompt_logprobs: Option<Value>,
    /// The prompt's log-probabilities as the engine gave them (for `echo`).
    pub(super) prompt_raw: Vec<Option<TokenLogprobs>>,
}

/// Reads events until a piece of text can be sent or the request ends. Returns the
/// text delta, the logprobs of the tokens it covers and the finish reason, if finished.
pub(super) async fn next_piece(
    app: &App,
    rx: &mut UnboundedReceiver<Event>,
    out: &mut Output,
    stopped: &AtomicBool,
) -> Result<(String, Vec<(String, TokenLogprobs)>, Option<FinishReason>), ApiError> {
    let mut lps = Vec::new();
    loop {
        let Some(event) = rx.recv().await else {
            return Ok((out.stops.flush(), lps, Some(FinishReason::Abort)));
        };
        match event {
            Event::PromptLogprobs(lp) => {
                out.prompt_logprobs = Some(prompt_logprobs_json(app, &lp));
                out.prompt_raw = lp;
            }
            Event::Token {
                id,
                logprobs,
                cached_tokens,
            } => {
                out.tokens += 1;
                out.cached = cached_tokens;
                if let Some(lp) = logprobs {
                    let entry = (app.text.token_text(id), lp);
                    out.logprobs.push(entry.clone());
                    lps.push(entry);
                }
                let delta = out.detok.push(&app.text, id);
                let (text, hit) = out.stops.push(&delta);
                if hit {
                    stopped.store(true, Ordering::Relaxed);
                    rx.close();
                    return Ok((text, lps, Some(FinishReason::Stop)));
                }
                if !text.is_empty() || !lps.is_empty() {
                    return Ok((text, lps, None));
                }
            }
            Event::Finished(reason) => return Ok((out.stops.flush(), lps, Some(reason))),
            Event::Failed(message) => {
                return Err(ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message,
                    param: None,
                });
            }
        }
    }
}

//! Running one checked job: submitting it to the engine loop, reading its token events
//! into text (detokenized, stop strings applied, logprobs collected), and answering
//! with the whole completion once it finishes. Streamed requests are handed to
//! `stream` after submission; the request checks are `params`'.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::openai::{
    ApiError, chat_logprobs_json, completion_logprobs_json, echo_logprobs_json, prompt_logprobs_json, usage,
};
use super::params::Job;
use super::stream::stream;
use super::{App, now_secs};
use crate::native::core::{Command, Event, Request};
use crate::native::metrics::FinishReason;
use crate::native::sampling::TokenLogprobs;
use crate::native::text::{Detokenizer, StopWatch};

impl App {
    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}{n:08x}", self.created)
    }

    fn submit(&self, job: &Job) -> Result<(UnboundedReceiver<Event>, Arc<AtomicBool>), ApiError> {
        let (tx, rx) = unbounded_channel();
        let stopped = Arc::new(AtomicBool::new(false));
        let request = Request {
            prompt: job.prompt.clone(),
            params: job.params.clone(),
            events: tx,
            stopped: stopped.clone(),
            arrival: Instant::now(),
        };
        self.engine.send(Command::Submit(request)).map_err(|_| ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the engine is shutting down".into(),
            param: None,
        })?;
        Ok((rx, stopped))
    }
}

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

pub(super) async fn generate(app: Arc<App>, job: Job, kind: Kind) -> Result<Response, ApiError> {
    let (rx, stopped) = app.submit(&job)?;
    let out = Output {
        detok: Detokenizer::default(),
        stops: StopWatch::new(job.stops.clone()),
        tokens: 0,
        cached: 0,
        logprobs: Vec::new(),
        prompt_logprobs: None,
        prompt_raw: Vec::new(),
    };
    let (id, created) = (
        app.id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }),
        now_secs(),
    );
    if job.stream {
        return Ok(stream(app, job, kind, rx, stopped, out, id, created));
    }
    let (mut rx, mut out) = (rx, out);
    let mut text = String::new();
    let reason = loop {
        let (piece, _, finished) = next_piece(&app, &mut rx, &mut out, &stopped).await?;
        text.push_str(&piece);
        if let Some(r) = finished {
            break r;
        }
    };
    let finish = reason.as_str();
    let choice = match kind {
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": job.params.logprobs.map(|_| chat_logprobs_json(&app, &out.logprobs)),
            "finish_reason": finish,
            "stop_reason": null,
        }),
        Kind::Completion => json!({
            "index": 0,
            "text": match &job.echo {
                Some(prompt) => format!("{prompt}{text}"),
                None => text,
            },
            "logprobs": job.params.logprobs.map(|_| match &job.echo {
                Some(_) => echo_logprobs_json(&app, &job.prompt, &out.prompt_raw, &out.logprobs),
                None => completion_logprobs_json(&app, &out.logprobs, 0),
            }),
            "finish_reason": finish,
            "stop_reason": null,
            "prompt_logprobs": out.prompt_logprobs,
        }),
    };
    let object = if kind == Kind::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    Ok(axum::Json(json!({
        "id": id,
        "object": object,
        "created": created,
        "model": app.served_name,
        "choices": [choice],
        "usage": usage(job.prompt.len(), out.tokens, out.cached),
    }))
    .into_response())
}

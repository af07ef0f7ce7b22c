//! Running one checked job: submitting it to the engine loop and answering with the
//! whole completion once it finishes (its events read into text by `events`). Streamed
//! requests are handed to `stream` after submission; the request checks are
//! `params`'.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::events::{Kind, Output, next_piece};
use super::openai::{ApiError, chat_logprobs_json, completion_logprobs_json, echo_logprobs_json, usage};
use super::params::Job;
use super::stream::stream;
use super::{App, now_secs};
use crate::native::core::{Command, Event, Request};
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

//! The streamed response: server-sent events in OpenAI's chunk format (a role chunk
//! first for chat, one chunk per piece of text, an optional usage chunk, then
//! `[DONE]`), with an error reported as a last event since the status line is already
//! sent. Reading the engine's events is `events`' `next_piece`, shared with whole
//! responses.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::App;
use super::events::{Kind, Output, next_piece};
use super::openai::{chat_logprobs_json, completion_logprobs_json, usage};
use super::params::Job;
use crate::native::core::Event;
use crate::native::metrics::FinishReason;

#[allow(clippy::too_many_arguments)]
pub(super) fn stream(
    app: Arc<App>,
    job: Job,
    kind: Kind,
    rx: UnboundedReceiver<Event>,
    stopped: Arc<AtomicBool>,
    out: Output,
    id: String,
    created: u64,
) -> Response {
    let object = if kind == Kind::Chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let model = app.served_name.clone();
    let chunk = move |choices: Value, usage_value: Option<Value>| -> Bytes {
        let mut body =
            json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
        if let Some(u) = usage_value {
            body["usage"] = u;
        }
        Bytes::from(format!("data: {body}\n\n"))
    };
    struct St {
        rx: UnboundedReceiver<Event>,
        out: Output,
        started: bool,
        done: bool,
        text_len: usize,
    }
    let st = St {
        rx,
        out,
        started: false,
        done: false,
        text_len: 0,
    };
    let prompt_len = job.prompt.len();
    let include_usage = job.include_usage;
    let want_logprobs = job.params.logprobs.is_some();
    let app_for = app;
    let s = futures_util::stream::unfold((st, chunk), move |(mut st, chunk)| {
        let app = app_for.clone();
        let stopped = stopped.clone();
        async move {
            if st.done {
                return None;
            }
            let mut frames = Vec::new();
            if !st.started && kind == Kind::Chat {
                st.started = true;
                frames.push(chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                    None,
                ));
            }
            match next_piece(&app, &mut st.rx, &mut st.out, &stopped).await {
                Err(e) => {
                    frames.push(Bytes::from(format!("data: {}\n\n", e.body())));
                    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    st.done = true;
                }
                Ok((text, lps, finished)) => {
                    let finish = finished.map(FinishReason::as_str);
                    if !text.is_empty() || !lps.is_empty() || finish.is_some() {
                        let lp = want_logprobs.then(|| match kind {
                            Kind::Chat => chat_logprobs_json(&app, &lps),
                            Kind::Completion => completion_logprobs_json(&app, &lps, st.text_len),
                        });
                        st.text_len += text.len();
                        let choice = match kind {
                            Kind::Chat => {
                                json!([{"index": 0, "delta": if text.is_empty() { json!({}) } else { json!({"content": text}) }, "logprobs": lp, "finish_reason": finish}])
                            }
                            Kind::Completion => {
                                json!([{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish,
                                        "prompt_logprobs": if finish.is_some() { st.out.prompt_logprobs.take() } else { None }}])
                            }
                        };
                        frames.push(chunk(choice, None));
                    }
                    if finished.is_some() {
                        if include_usage {
                            frames.push(chunk(
                                json!([]),
                                Some(usage(prompt_len, st.out.tokens, st.out.cached)),
                            ));
                        }
                        frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
                        st.done = true;
                    }
                }
            }
            let joined: Vec<u8> = frames.concat();
            Some((Ok::<Bytes, Infallible>(Bytes::from(joined)), (st, chunk)))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(s))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

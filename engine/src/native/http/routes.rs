//! The router and its handlers: the API key on `/v1` routes, health, version,
//! metrics, the model list, and the two completion endpoints up to the point where a
//! checked job goes to `generate`. How parameters are checked is `params`'; how a
//! response is produced is `generate`'s and `stream`'s.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::App;
use super::events::Kind;
use super::generate::generate;
use super::openai::{ApiError, ChatBody, CompletionBody, parse};
use crate::chat::RenderOptions;

pub(super) fn router(app: Arc<App>) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    Router::new()
        .route("/health", get(health))
        .route("/ping", get(health).post(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(super::tokenize::tokenize))
        .route("/detokenize", post(super::tokenize::detokenize))
        .route("/tokenizer_info", get(super::tokenize::tokenizer_info))
        .merge(v1)
        .fallback(not_found)
        .with_state(app)
}

async fn authorize(State(app): State<Arc<App>>, request: HttpRequest, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "Unauthorized: send the API key as `Authorization: Bearer <key>`".into(),
                param: None,
            }
            .into_response();
        }
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "Not Found".into(),
        param: None,
    }
}

async fn health(State(app): State<Arc<App>>) -> StatusCode {
    if app.ready.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn version() -> axum::Json<Value> {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION"), "engine": "sous-native"}))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.metrics.render(),
    )
        .into_response()
}

async fn models(State(app): State<Arc<App>>) -> axum::Json<Value> {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.served_name,
            "object": "model",
            "created": app.created,
            "owned_by": "sous",
            "root": app.root,
            "parent": null,
            "max_model_len": app.max_model_len,
        }]
    }))
}

/// Message content: a string, or a list of parts of which only text is supported.
fn flatten_content(messages: &mut [Value]) -> Result<(), ApiError> {
    for (i, m) in messages.iter_mut().enumerate() {
        let Some(obj) = m.as_object_mut() else {
            return Err(ApiError::field(
                "messages",
                format!("messages[{i}] is not an object"),
            ));
        };
        if !obj.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::field(
                "messages",
                format!("messages[{i}] has no `role`"),
            ));
        }
        if let Some(Value::Array(parts)) = obj.get("content") {
            let mut texts = Vec::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => texts.push(t.to_owned()),
                    (kind, _) => {
                        return Err(ApiError::field(
                            "messages",
                            format!(
                                "messages[{i}] has a `{}` content part; the native engine takes text only",
                                kind.unwrap_or("untyped")
                            ),
                        ));
                    }
                }
            }
            obj.insert("content".into(), Value::String(texts.join("\n")));
        }
    }
    Ok(())
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    match chat_inner(app, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(app: Arc<App>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let mut req: ChatBody = parse(&headers, &body)?;
    app.check_model(&req.common.model)?;
    if req.messages.is_empty() {
        return Err(ApiError::field("messages", "`messages` is empty"));
    }
    flatten_content(&mut req.messages)?;
    let Some(templates) = &app.text.chat else {
        return Err(ApiError::bad(format!(
            "{}; use /v1/completions",
            app.text
                .chat_missing
                .as_deref()
                .unwrap_or("this model has no chat template")
        )));
    };
    // vLLM refuses a template sent with the request unless its server trusts them
    // (`--trust-request-chat-template`, `renderers/online_renderer.py`
    // `validate_chat_template` of 0.32); the native engine has no such switch.
    let kwargs = req.chat_template_kwargs.take().unwrap_or_default();
    if req.chat_template.is_some() || kwargs.get("chat_template").is_some_and(|t| !t.is_none()) {
        return Err(ApiError::field(
            "chat_template",
            "Chat template is passed with request, but the native engine only renders the model's own \
             templates. Refused request with untrusted chat template.",
        ));
    }
    let template = templates
        .select(req.tools.is_some())
        .map_err(|e| ApiError::field("messages", e.to_string()))?;
    let options = RenderOptions {
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        tools: req.tools.take(),
        documents: None,
        kwargs,
    };
    let prompt_text = template
        .render(&req.messages, &options)
        .map_err(|e| ApiError::field("messages", format!("the chat template failed: {e}")))?;
    let prompt = app.text.encode(&prompt_text, false).map_err(ApiError::bad)?;
    let logprobs = if req.logprobs {
        Some(match req.top_logprobs {
            None => 0,
            Some(n) if (0..=20).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::field(
                    "top_logprobs",
                    format!("top_logprobs must be between 0 and 20, got {n}."),
                ));
            }
        })
    } else {
        None
    };
    let job = app.job(&req.common, prompt, logprobs)?;
    generate(app, job, Kind::Chat).await
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    match completions_inner(app, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(app: Arc<App>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionBody = parse(&headers, &body)?;
    app.check_model(&req.common.model)?;
    if req.echo && req.common.stream {
        return Err(ApiError::field(
            "echo",
            "the native engine echoes the prompt in whole responses only; send `stream: false`",
        ));
    }
    let one = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(s) => app.text.encode(s, true).map_err(ApiError::bad),
            Value::Array(ids) if ids.iter().all(Value::is_u64) => {
                let vocab = app.text.tokenizer.get_vocab_size(true) as u64;
                ids.iter()
                    .map(|id| match id.as_u64() {
                        Some(n) if n < vocab => Ok(n as u32),
                        _ => Err(ApiError::field(
                            "prompt",
                            format!("token id {id} is outside the vocabulary"),
                        )),
                    })
                    .collect()
            }
            _ => Err(ApiError::field(
                "prompt",
                "`prompt` must be a string or a list of token ids",
            )),
        }
    };
    let prompt_text = match &req.prompt {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) if items.len() == 1 => items[0].as_str().map(str::to_owned),
        _ => None,
    };
    let prompt = match &req.prompt {
        Value::Array(items) if !items.is_empty() && !items[0].is_u64() => {
            if items.len() != 1 {
                return Err(ApiError::field(
                    "prompt",
                    "the native engine takes one prompt per request",
                ));
            }
            one(&items[0])?
        }
        other => one(other)?,
    };
    let logprobs = match req.logprobs {
        None => None,
        Some(n) if (0..=20).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::field(
                "logprobs",
                format!("logprobs must be between 0 and 20, got {n}."),
            ));
        }
    };
    let mut job = app.job(&req.common, prompt, logprobs)?;
    if req.echo {
        // vLLM answers `echo` with the prompt as given, or decoded when given as ids, and
        // scores the prompt tokens at the `logprobs` asked for
        // (`vllm@0.33.0:vllm/entrypoints/openai/completion/serving.py`).
        job.echo = Some(match prompt_text {
            Some(text) => text,
            None => app.text.tokenizer.decode(&job.prompt, false).unwrap_or_default(),
        });
        if let Some(n) = logprobs {
            let asked = job.params.prompt_logprobs.unwrap_or(0);
            job.params.prompt_logprobs = Some(asked.max(n));
        }
    }
    generate(app, job, Kind::Completion).await
}

//! The native engine's HTTP API: OpenAI's chat and text completions (streamed or not),
//! the model list, health, version and Prometheus metrics, with vLLM's behaviour where
//! OpenAI says nothing (`vllm@0.33.0:vllm/entrypoints/openai/`): the extra sampling
//! fields (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
//! `prompt_logprobs`), `max_tokens` defaulting to what the context has left, the
//! context-length error messages, and the API key checked on `/v1` routes only.
//!
//! Request bodies are parsed by hand from JSON so that every malformed body gets an
//! OpenAI error object (`{"error": {"message", "type", "param", "code"}}`) naming the
//! field, never a framework's plain-text rejection.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::core::{Command, Event, Request};
use super::metrics::{FinishReason, Metrics};
use super::sampling::{SamplingParams, TokenLogprobs};
use super::text::{Detokenizer, StopWatch, TextModel};
use super::{Engine, NativeError};
use crate::chat::RenderOptions;

/// What the server tells its owner.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    /// A log line, vLLM-style.
    Log(String),
    /// Listening and ready.
    Ready {
        /// Base URL.
        url: String,
        /// The bound port.
        port: u16,
    },
}

struct App {
    text: Arc<TextModel>,
    served_name: String,
    root: String,
    max_model_len: usize,
    engine: UnboundedSender<Command>,
    metrics: Arc<Metrics>,
    api_key: Option<String>,
    ready: AtomicBool,
    created: u64,
    next_id: AtomicU64,
}

/// An OpenAI-style error response.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    fn field(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
        }
    }

    fn body(&self) -> Value {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status.as_u16()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Listens on `addr` with `SO_REUSEPORT`, as vLLM does, so that `sous serve --replace`
/// can start a new instance on the port while the old one still answers.
async fn listen(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for resolved in tokio::net::lookup_host(addr).await? {
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        match socket.bind(resolved).and_then(|()| socket.listen(1024)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")))
}

/// Runs the engine: starts its loop, binds the listen address, serves until `shutdown`
/// resolves, then lets in-flight requests finish for the recipe's grace period before
/// aborting them.
pub async fn serve(
    engine: Engine,
    on_event: Arc<dyn Fn(ServerEvent) + Send + Sync>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NativeError> {
    let settings = engine.settings.clone();
    let (tx, rx) = unbounded_channel();
    let core = engine.core;
    let worker = std::thread::Builder::new()
        .name("sous-native-engine".into())
        .spawn(move || core.run(rx))
        .map_err(|e| NativeError::Internal(format!("cannot start the engine thread: {e}")))?;
    let app = Arc::new(App {
        text: engine.text,
        served_name: settings.served_name.clone(),
        root: settings.model_dir.display().to_string(),
        max_model_len: engine.max_model_len,
        engine: tx.clone(),
        metrics: engine.metrics,
        api_key: settings.api_key.clone(),
        ready: AtomicBool::new(false),
        created: now_secs(),
        next_id: AtomicU64::new(0),
    });
    let addr = format!("{}:{}", settings.host, settings.port);
    let listener = listen(&addr).await.map_err(|source| NativeError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(settings.port);
    let router = router(app.clone());
    app.ready.store(true, Ordering::SeqCst);
    let shown_host = if settings.host == "0.0.0.0" || settings.host == "::" {
        "localhost".to_owned()
    } else {
        settings.host.clone()
    };
    on_event(ServerEvent::Log(format!(
        "Starting vLLM-compatible API server on http://{addr}"
    )));
    on_event(ServerEvent::Ready {
        url: format!("http://{shown_host}:{port}"),
        port,
    });
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let grace = settings.stop_grace;
    let abort = tx.clone();
    let events = on_event.clone();
    let ready = app.clone();
    let signal = async move {
        shutdown.await;
        ready.ready.store(false, Ordering::SeqCst);
        events(ServerEvent::Log(format!(
            "Shutting down: no new requests; in-flight requests have {} s to finish",
            grace.as_secs()
        )));
        let _ = stopping_tx.send(());
    };
    let (served_tx, served_rx) = tokio::sync::oneshot::channel::<()>();
    let timer = tokio::spawn(async move {
        if stopping_rx.await.is_ok() {
            tokio::select! {
                _ = tokio::time::sleep(grace) => { let _ = abort.send(Command::AbortAll); }
                _ = served_rx => {}
            }
        }
    });
    drop(tx);
    // Tokens go out as they are made: no Nagle delay on small SSE writes (uvicorn, in
    // front of vLLM, sets TCP_NODELAY on every connection too).
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        let _ = stream.set_nodelay(true);
    });
    let result = axum::serve(listener, router).with_graceful_shutdown(signal).await;
    let _ = served_tx.send(());
    let _ = timer.await;
    drop(app);
    // Every sender is gone once the router is: the loop drains and exits.
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    result.map_err(|e| NativeError::Internal(format!("the HTTP server failed: {e}")))
}

fn router(app: Arc<App>) -> Router {
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

/// A string or a list of strings (`stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The sampling fields shared by both endpoints.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    #[serde(default)]
    stop_token_ids: Vec<u32>,
    #[serde(default)]
    ignore_eos: bool,
    n: Option<i64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    prompt_logprobs: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<Value>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
    add_generation_prompt: Option<bool>,
    tools: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Value,
    logprobs: Option<i64>,
    #[serde(default)]
    echo: bool,
    #[serde(flatten)]
    common: Common,
}

fn parse<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<T, ApiError> {
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.starts_with("application/json"));
    if !json_type {
        return Err(ApiError::bad(
            "the request body must be JSON (`Content-Type: application/json`)",
        ));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("the request body is not valid: {e}")))
}

/// What both endpoints hand to the generation path.
struct Job {
    prompt: Vec<u32>,
    params: SamplingParams,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
}

impl App {
    fn check_model(&self, model: &Option<String>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != &self.served_name => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "The model `{m}` does not exist. This server serves `{}`.",
                    self.served_name
                ),
                param: Some("model"),
            }),
            _ => Ok(()),
        }
    }

    /// Sampling parameters from a request's fields, the model's defaults and the
    /// context left after the prompt; the checks of vLLM's `SamplingParams._verify_args`.
    fn params(
        &self,
        c: &Common,
        prompt_len: usize,
        logprobs: Option<usize>,
    ) -> Result<SamplingParams, ApiError> {
        let d = &self.text.defaults;
        if c.n.is_some_and(|n| n != 1) {
            return Err(ApiError::field(
                "n",
                "the native engine generates one choice per request (`n` = 1)",
            ));
        }
        if prompt_len == 0 {
            return Err(ApiError::field("prompt", "the prompt is empty"));
        }
        if prompt_len >= self.max_model_len {
            return Err(ApiError::bad(format!(
                "This model's maximum context length is {} tokens. However, your request has {prompt_len} input \
                 tokens. Please reduce the length of the input messages.",
                self.max_model_len
            )));
        }
        let room = self.max_model_len - prompt_len;
        let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
            None => room,
            Some(m) if m < 1 => {
                return Err(ApiError::field(
                    "max_tokens",
                    format!("max_tokens must be at least 1, got {m}."),
                ));
            }
            Some(m) if m as u64 > room as u64 => {
                return Err(ApiError::field(
                    "max_tokens",
                    format!(
                        "'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum context \
                         length is {} tokens and your request has {prompt_len} input tokens ({m} > {} - {prompt_len}).",
                        self.max_model_len, self.max_model_len
                    ),
                ));
            }
            Some(m) => m as usize,
        };
        let temperature = c.temperature.or(d.temperature).unwrap_or(1.0);
        if temperature.is_nan() || temperature < 0.0 {
            return Err(ApiError::field(
                "temperature",
                format!("temperature must be non-negative, got {temperature}."),
            ));
        }
        let top_p = c.top_p.or(d.top_p).unwrap_or(1.0);
        if top_p.is_nan() || top_p <= 0.0 || top_p > 1.0 {
            return Err(ApiError::field(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}."),
            ));
        }
        let top_k = c.top_k.or(d.top_k).unwrap_or(0);
        if top_k < -1 {
            return Err(ApiError::field(
                "top_k",
                format!("top_k must be 0 or -1 (disable), or at least 1, got {top_k}."),
            ));
        }
        let min_p = c.min_p.or(d.min_p).unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_p) {
            return Err(ApiError::field(
                "min_p",
                format!("min_p must be in [0, 1], got {min_p}."),
            ));
        }
        for (name, value) in [
            ("presence_penalty", c.presence_penalty),
            ("frequency_penalty", c.frequency_penalty),
        ] {
            if let Some(v) = value
                && !(-2.0..=2.0).contains(&v)
            {
                return Err(ApiError {
                    status: StatusCode::BAD_REQUEST,
                    message: format!("{name} must be in [-2, 2], got {v}."),
                    param: Some(if name == "presence_penalty" {
                        "presence_penalty"
                    } else {
                        "frequency_penalty"
                    }),
                });
            }
        }
        let repetition_penalty = c.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0);
        if repetition_penalty.is_nan() || repetition_penalty <= 0.0 {
            return Err(ApiError::field(
                "repetition_penalty",
                format!("repetition_penalty must be greater than zero, got {repetition_penalty}."),
            ));
        }
        let top = |v: Option<i64>, name: &'static str| -> Result<Option<usize>, ApiError> {
            match v {
                None => Ok(None),
                Some(n) if (0..=20).contains(&n) => Ok(Some(n as usize)),
                Some(n) => Err(ApiError::field(
                    name,
                    format!("{name} must be between 0 and 20, got {n}."),
                )),
            }
        };
        Ok(SamplingParams {
            temperature,
            top_p,
            top_k: top_k.max(0) as usize,
            min_p,
            repetition_penalty,
            presence_penalty: c.presence_penalty.unwrap_or(0.0),
            frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
            seed: c.seed.map(|s| s as u64),
            max_tokens,
            ignore_eos: c.ignore_eos,
            stop_token_ids: c.stop_token_ids.clone(),
            logprobs,
            prompt_logprobs: top(c.prompt_logprobs, "prompt_logprobs")?,
        })
    }

    fn job(&self, c: &Common, prompt: Vec<u32>, logprobs: Option<usize>) -> Result<Job, ApiError> {
        let params = self.params(c, prompt.len(), logprobs)?;
        let stops = match &c.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        Ok(Job {
            prompt,
            params,
            stops,
            stream: c.stream,
            include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }

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
    let Some(template) = &app.text.chat else {
        return Err(ApiError::bad(format!(
            "this model has no chat template ({}); use /v1/completions",
            app.text.chat_missing.as_deref().unwrap_or("none")
        )));
    };
    let options = RenderOptions {
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        tools: req
            .tools
            .as_ref()
            .map(|t| minijinja::Value::from(minijinja::value::Serde(t))),
        documents: None,
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
    if req.echo {
        return Err(ApiError::field(
            "echo",
            "`echo` is not supported by the native engine",
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
    let job = app.job(&req.common, prompt, logprobs)?;
    generate(app, job, Kind::Completion).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// The per-request output state: text so far, logprobs, counts.
struct Output {
    detok: Detokenizer,
    stops: StopWatch,
    tokens: usize,
    cached: usize,
    /// Chat: `[{token, logprob, bytes, top_logprobs}]`; completions: built from the same.
    logprobs: Vec<(String, TokenLogprobs)>,
    prompt_logprobs: Option<Value>,
}

/// Reads events until a piece of text can be sent or the request ends. Returns the
/// text delta, the logprobs of the tokens it covers and the finish reason, if finished.
async fn next_piece(
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
            Event::PromptLogprobs(lp) => out.prompt_logprobs = Some(prompt_logprobs_json(app, &lp)),
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

fn prompt_logprobs_json(app: &App, lp: &[Option<TokenLogprobs>]) -> Value {
    Value::Array(
        lp.iter()
            .map(|entry| match entry {
                None => Value::Null,
                Some(t) => {
                    let mut map = serde_json::Map::new();
                    map.insert(
                        t.token.to_string(),
                        json!({"logprob": t.logprob, "rank": t.rank, "decoded_token": app.text.token_text(t.token)}),
                    );
                    for (id, logprob) in &t.top {
                        map.entry(id.to_string()).or_insert_with(|| {
                            json!({"logprob": logprob, "rank": 0, "decoded_token": app.text.token_text(*id)})
                        });
                    }
                    Value::Object(map)
                }
            })
            .collect(),
    )
}

fn chat_logprobs_json(app: &App, lps: &[(String, TokenLogprobs)]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|(text, lp)| {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|(id, l)| {
                    let t = app.text.token_text(*id);
                    json!({"token": t, "logprob": l, "bytes": t.as_bytes()})
                })
                .collect();
            json!({"token": text, "logprob": lp.logprob, "bytes": text.as_bytes(), "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

fn completion_logprobs_json(app: &App, lps: &[(String, TokenLogprobs)], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::new();
    for (text, _) in lps {
        offsets.push(at);
        at += text.len();
    }
    json!({
        "tokens": lps.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|(_, l)| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|(_, l)| {
            let mut m = serde_json::Map::new();
            for (id, v) in &l.top {
                m.insert(app.text.token_text(*id), json!(v));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

async fn generate(app: Arc<App>, job: Job, kind: Kind) -> Result<Response, ApiError> {
    let (rx, stopped) = app.submit(&job)?;
    let out = Output {
        detok: Detokenizer::default(),
        stops: StopWatch::new(job.stops.clone()),
        tokens: 0,
        cached: 0,
        logprobs: Vec::new(),
        prompt_logprobs: None,
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
            "text": text,
            "logprobs": job.params.logprobs.map(|_| completion_logprobs_json(&app, &out.logprobs, 0)),
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

#[allow(clippy::too_many_arguments)]
fn stream(
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

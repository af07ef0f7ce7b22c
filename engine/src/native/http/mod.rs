//! The native engine's HTTP API: OpenAI's chat and text completions (streamed or not),
//! the model list, health, version, Prometheus metrics and the tokenizer endpoints, with vLLM's behaviour where
//! OpenAI says nothing (`vllm@0.33.0:vllm/entrypoints/openai/`): the extra sampling
//! fields (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
//! `prompt_logprobs`), `max_tokens` defaulting to what the context has left, the
//! context-length error messages, and the API key checked on `/v1` routes only.
//!
//! Request bodies are parsed by hand from JSON so that every malformed body gets an
//! OpenAI error object (`{"error": {"message", "type", "param", "code"}}`) naming the
//! field, never a framework's plain-text rejection.
//!
//! This file holds the state every handler shares (`App`) and the entry point; the
//! rest is one idea per file:
//!
//! - `server`: binding, serving, graceful shutdown and the events the owner sees.
//! - `routes`: the router, the API-key check and the handlers.
//! - `openai`: OpenAI's request bodies, error objects and response pieces.
//! - `params`: request fields checked and turned into sampling settings.
//! - `events`: a request's engine events read into text pieces, logprobs and its end.
//! - `generate`: submitting a request to the engine loop and the whole-body response.
//! - `stream`: the server-sent-events response.
//! - `tokenize`: vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info`.
//!
//! Scheduling, sampling and the model are not here: they belong to the engine loop
//! ([`super::core`]), which the API reaches only through its command channel.

mod events;
mod generate;
mod openai;
mod params;
mod routes;
mod server;
mod stream;
mod tokenize;

pub use server::serve;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::UnboundedSender;

use super::core::Command;
use super::metrics::Metrics;
use super::text::TextModel;

/// What every handler shares: the model's text side, the engine loop's command
/// channel, the metrics and the settings the API reports.
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

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

//! vLLM's tokenizer endpoints (`vllm@0.33.0:vllm/entrypoints/serve/tokenize/`):
//! `POST /tokenize` (text to ids), `POST /detokenize` (ids to text) and
//! `GET /tokenizer_info` (the tokenizer's settings). Clients that must count or cut
//! tokens exactly as the server does use them instead of a tokenizer of their own;
//! lm-evaluation-harness's `local-completions` does when all three answer. Like vLLM's,
//! they sit outside `/v1` and so outside the API key. Chat-message tokenization
//! (`messages` instead of `prompt`) is not served here.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::App;
use super::openai::{ApiError, parse};

#[derive(Debug, Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Value>,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    #[serde(default)]
    return_token_strs: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<Value>,
}

pub(super) async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = || -> Result<Value, ApiError> {
        let req: TokenizeBody = parse(&headers, &body)?;
        app.check_model(&req.model)?;
        let Some(prompt) = req.prompt else {
            return Err(ApiError::field(
                "prompt",
                if req.messages.is_some() {
                    "the native engine's /tokenize takes a `prompt`, not chat `messages`"
                } else {
                    "`prompt` is required"
                },
            ));
        };
        let tokens = app
            .text
            .encode(&prompt, req.add_special_tokens)
            .map_err(ApiError::bad)?;
        let mut out = json!({"count": tokens.len(), "max_model_len": app.max_model_len, "tokens": tokens});
        if req.return_token_strs {
            out["token_strs"] = tokens
                .iter()
                .map(|&t| Value::String(app.text.token_text(t)))
                .collect();
        }
        Ok(out)
    };
    match answer() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = || -> Result<Value, ApiError> {
        let req: DetokenizeBody = parse(&headers, &body)?;
        app.check_model(&req.model)?;
        let vocab = app.text.tokenizer.get_vocab_size(true) as u64;
        let ids = req
            .tokens
            .iter()
            .map(|id| match id.as_u64() {
                Some(n) if n < vocab => Ok(n as u32),
                _ => Err(ApiError::field(
                    "tokens",
                    format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
                )),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        // Special tokens kept, as transformers' `decode` does by default.
        let text = app
            .text
            .tokenizer
            .decode(&ids, false)
            .map_err(|e| ApiError::bad(format!("the tokens could not be decoded: {e}")))?;
        Ok(json!({"prompt": text}))
    };
    match answer() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn tokenizer_info(State(app): State<Arc<App>>) -> axum::Json<Value> {
    axum::Json(app.text.info.clone())
}

//! OpenAI's wire format as the native engine speaks it: the request bodies of the
//! chat and text completion endpoints (with vLLM's extra sampling fields), the error
//! object every failure is answered with, and the JSON pieces shared by whole and
//! streamed responses (logprobs, usage). Whether the values make sense is `params`'
//! concern, not this file's.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::App;
use crate::native::sampling::TokenLogprobs;

/// An OpenAI-style error response.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) param: Option<&'static str>,
}

impl ApiError {
    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    pub(super) fn field(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
        }
    }

    pub(super) fn body(&self) -> Value {
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

/// A string or a list of strings (`stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

/// The sampling fields shared by both endpoints.
#[derive(Debug, Deserialize)]
pub(super) struct Common {
    pub(super) model: Option<String>,
    pub(super) max_tokens: Option<i64>,
    pub(super) max_completion_tokens: Option<i64>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) top_k: Option<i64>,
    pub(super) min_p: Option<f32>,
    pub(super) presence_penalty: Option<f32>,
    pub(super) frequency_penalty: Option<f32>,
    pub(super) repetition_penalty: Option<f32>,
    pub(super) seed: Option<i64>,
    pub(super) stop: Option<OneOrMany>,
    #[serde(default)]
    pub(super) stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub(super) ignore_eos: bool,
    pub(super) n: Option<i64>,
    #[serde(default)]
    pub(super) stream: bool,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) prompt_logprobs: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ChatBody {
    pub(super) messages: Vec<Value>,
    #[serde(default)]
    pub(super) logprobs: bool,
    pub(super) top_logprobs: Option<i64>,
    pub(super) add_generation_prompt: Option<bool>,
    /// Read straight into template values, which keep the client's key order (a tool's
    /// JSON schema is printed into the prompt as sent, as transformers prints it).
    pub(super) tools: Option<minijinja::Value>,
    /// Variables for the chat template (vLLM's extra field), e.g. `enable_thinking`.
    pub(super) chat_template_kwargs: Option<std::collections::BTreeMap<String, minijinja::Value>>,
    /// A template sent with the request: refused, as vLLM refuses it by default.
    pub(super) chat_template: Option<String>,
    #[serde(flatten)]
    pub(super) common: Common,
}

#[derive(Debug, Deserialize)]
pub(super) struct CompletionBody {
    pub(super) prompt: Value,
    pub(super) logprobs: Option<i64>,
    #[serde(default)]
    pub(super) echo: bool,
    #[serde(flatten)]
    pub(super) common: Common,
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ApiError> {
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

pub(super) fn prompt_logprobs_json(app: &App, lp: &[Option<TokenLogprobs>]) -> Value {
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
                    for (rank, (id, logprob)) in (1..).zip(&t.top) {
                        map.entry(id.to_string()).or_insert_with(|| {
                            json!({"logprob": logprob, "rank": rank, "decoded_token": app.text.token_text(*id)})
                        });
                    }
                    Value::Object(map)
                }
            })
            .collect(),
    )
}

pub(super) fn chat_logprobs_json(app: &App, lps: &[(String, TokenLogprobs)]) -> Value {
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

pub(super) fn completion_logprobs_json(app: &App, lps: &[(String, TokenLogprobs)], offset: usize) -> Value {
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

/// The `logprobs` of an echoed completion, as vLLM gives them: the prompt's tokens first
/// (the first without a log-probability), then the output's, each position's top entries
/// including the token itself.
pub(super) fn echo_logprobs_json(
    app: &App,
    prompt: &[u32],
    prompt_lps: &[Option<TokenLogprobs>],
    output: &[(String, TokenLogprobs)],
) -> Value {
    let mut tokens = Vec::new();
    let mut values = Vec::new();
    let mut tops = Vec::new();
    let top_map = |lp: &TokenLogprobs| {
        let mut m = serde_json::Map::new();
        for (id, v) in &lp.top {
            m.insert(app.text.token_text(*id), json!(v));
        }
        m.entry(app.text.token_text(lp.token))
            .or_insert(json!(lp.logprob));
        Value::Object(m)
    };
    for (i, &id) in prompt.iter().enumerate() {
        tokens.push(app.text.token_text(id));
        match prompt_lps.get(i).and_then(Option::as_ref) {
            Some(lp) => {
                values.push(json!(lp.logprob));
                tops.push(top_map(lp));
            }
            None => {
                values.push(Value::Null);
                tops.push(Value::Null);
            }
        }
    }
    for (text, lp) in output {
        tokens.push(text.clone());
        values.push(json!(lp.logprob));
        tops.push(top_map(lp));
    }
    let mut at = 0;
    let offsets: Vec<usize> = tokens
        .iter()
        .map(|t| {
            let here = at;
            at += t.len();
            here
        })
        .collect();
    json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}

pub(super) fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

//! A request's fields checked and turned into what the engine runs: the model name,
//! the sampling settings (request, then the model's `generation_config.json`
//! defaults, then vLLM's), `max_tokens` against the context left, and stop strings.
//! The checks and messages are those of vLLM's `SamplingParams._verify_args` and its
//! OpenAI serving layer. Parsing the body is `openai`'s; running the job is
//! `generate`'s.

use axum::http::StatusCode;

use super::App;
use super::openai::{ApiError, Common, OneOrMany};
use crate::native::sampling::SamplingParams;

/// What both endpoints hand to the generation path.
pub(super) struct Job {
    pub(super) prompt: Vec<u32>,
    pub(super) params: SamplingParams,
    pub(super) stops: Vec<String>,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    /// Completions with `echo`: the prompt's text, which the answer starts with (and,
    /// with `logprobs`, the prompt tokens' log-probabilities before the output's).
    pub(super) echo: Option<String>,
}

impl App {
    pub(super) fn check_model(&self, model: &Option<String>) -> Result<(), ApiError> {
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

    pub(super) fn job(&self, c: &Common, prompt: Vec<u32>, logprobs: Option<usize>) -> Result<Job, ApiError> {
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
            echo: None,
        })
    }
}

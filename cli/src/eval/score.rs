//! Scoring windows on a server: one `/v1/completions` request per window with the
//! window's token ids as the prompt, one output token, and vLLM's `prompt_logprobs`
//! extension (`vllm@0.33.0:vllm/entrypoints/openai/completion/protocol.py`), which
//! returns, for every prompt position after the first, a map from token id to
//! `{logprob, rank, decoded_token}` holding the prompt's token and the top k. The native
//! engine answers the same request. Servers that do not (OpenAI's, llama-server's)
//! are refused with the field they left out.

use std::time::Duration;

use serde_json::{Value, json};

use super::EvalError;
use super::quality::Position;

/// A server to score windows on.
#[derive(Debug, Clone)]
pub struct Server {
    /// Base URL, without `/v1`.
    pub url: String,
    /// The model name requests carry.
    pub model: String,
    /// The API key, if the server wants one.
    pub api_key: Option<String>,
}

/// The log-probabilities of `window`'s positions `scored` under `server`, with the top
/// `top_k` of each.
pub async fn window(
    client: &reqwest::Client,
    server: &Server,
    window: &[u32],
    scored: std::ops::Range<usize>,
    top_k: usize,
) -> Result<Vec<Position>, EvalError> {
    let url = format!("{}/v1/completions", server.url);
    let body = json!({
        "model": server.model,
        "prompt": window,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": top_k,
    });
    let mut request = client.post(&url).json(&body).timeout(Duration::from_secs(1800));
    if let Some(key) = &server.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|error| EvalError::Request {
        url: url.clone(),
        error,
    })?;
    let status = response.status();
    let text = response.text().await.map_err(|error| EvalError::Request {
        url: url.clone(),
        error,
    })?;
    if !status.is_success() {
        return Err(EvalError::Status {
            url,
            status,
            body: text.chars().take(600).collect(),
        });
    }
    let value: Value = serde_json::from_str(&text).map_err(|e| EvalError::Answer {
        url: url.clone(),
        message: format!("not JSON: {e}"),
    })?;
    parse(&value, window, scored, top_k).map_err(|message| EvalError::Answer { url, message })
}

/// The scored positions of one answer.
pub fn parse(
    answer: &Value,
    window: &[u32],
    scored: std::ops::Range<usize>,
    top_k: usize,
) -> Result<Vec<Position>, String> {
    let Some(entries) = answer["choices"][0]["prompt_logprobs"].as_array() else {
        return Err(if answer["choices"][0].is_object() {
            "the answer has no choices[0].prompt_logprobs: the server does not return prompt \
             log-probabilities (vLLM's `prompt_logprobs` request field)"
                .into()
        } else {
            format!("the answer has no choices: {}", short(answer))
        });
    };
    if entries.len() != window.len() {
        return Err(format!(
            "prompt_logprobs has {} entries for a prompt of {} tokens",
            entries.len(),
            window.len()
        ));
    }
    scored
        .map(|i| {
            let token = window[i];
            let Some(map) = entries[i].as_object() else {
                return Err(format!("prompt_logprobs[{i}] is not an object"));
            };
            let mut all = Vec::with_capacity(map.len());
            for (id, entry) in map {
                let id: u32 = id
                    .parse()
                    .map_err(|_| format!("prompt_logprobs[{i}] has the key `{id}`, not a token id"))?;
                let logprob = entry["logprob"]
                    .as_f64()
                    .ok_or_else(|| format!("prompt_logprobs[{i}][\"{id}\"] has no logprob"))?;
                all.push((id, logprob));
            }
            let logprob = all
                .iter()
                .find(|(id, _)| *id == token)
                .map(|(_, l)| *l)
                .ok_or_else(|| format!("prompt_logprobs[{i}] does not hold the prompt's token {token}"))?;
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all.truncate(top_k);
            Ok(Position {
                token,
                logprob,
                top: all,
            })
        })
        .collect()
}

fn short(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_prompt_logprobs() {
        // The shape vLLM answers: null first, then the prompt token and the top k, keyed
        // by token id as a string.
        let answer = json!({"choices": [{"text": "x", "prompt_logprobs": [
            null,
            {"7": {"logprob": -2.5, "rank": 3, "decoded_token": "b"},
             "4": {"logprob": -0.5, "rank": 1, "decoded_token": "c"},
             "9": {"logprob": -1.5, "rank": 2, "decoded_token": "d"}},
            {"8": {"logprob": -0.1, "rank": 1, "decoded_token": "e"},
             "2": {"logprob": -3.0, "rank": 2, "decoded_token": "f"}}
        ]}]});
        let ps = parse(&answer, &[1, 7, 8], 1..3, 2).expect("parsed");
        assert_eq!(ps[0].token, 7);
        assert_eq!(ps[0].logprob, -2.5);
        assert_eq!(ps[0].top, vec![(4, -0.5), (9, -1.5)]);
        assert_eq!(ps[1].top, vec![(8, -0.1), (2, -3.0)]);
    }

    #[test]
    fn a_server_without_prompt_logprobs_is_named() {
        let answer = json!({"choices": [{"text": "x", "logprobs": null}]});
        let err = parse(&answer, &[1, 2], 1..2, 1).expect_err("refused");
        assert!(err.contains("prompt_logprobs"), "{err}");
    }
}

//! Streamed completions with injected, known delays, for measuring a benchmark client:
//! the first token `FAKE_TTFT_MS` after the request arrives, then one token every
//! `FAKE_ITL_MS`, each delay jittered uniformly by ±`FAKE_JITTER_MS` (seeded by
//! `FAKE_SEED` and the request's number). With `FAKE_DELAYS_LOG=FILE`, every request
//! appends the delays it was given as a JSON line, so a test can compare what a client
//! measured with what was injected.
//!
//! Tokens are written on a schedule of absolute instants by a thread per request
//! (`std::thread::sleep` keeps to tens of microseconds, tokio's timer to a
//! millisecond); the chunks follow vLLM's OpenAI server: a `data:` line per token, the
//! last with `finish_reason`, a usage chunk when `stream_options.include_usage` is set,
//! then `data: [DONE]`. Chat streams begin with vLLM's role chunk.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// The engine's `--max-num-seqs`, when given (for `FAKE_TTFT_MS_PER_SEQ`).
pub static MAX_NUM_SEQS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

fn env_ms(name: &str) -> f64 {
    super::env_f64(name).unwrap_or(0.0)
}

/// A small xorshift generator: the jitter needs reproducible numbers, not a crate.
struct Jitter(u64);

impl Jitter {
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn around(&mut self, ms: f64, spread: f64) -> f64 {
        (ms + spread * (2.0 * self.next_unit() - 1.0)).max(0.0)
    }
}

/// Answers `/v1/completions` (`chat` false) or `/v1/chat/completions`.
pub fn complete(model: &str, body: &Value, chat: bool) -> Response {
    let arrived = Instant::now();
    let max_tokens = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .unwrap_or(16)
        .max(1) as usize;
    let prompt_tokens = if chat {
        body["messages"][0]["content"].as_str()
    } else {
        body["prompt"].as_str()
    }
    .map_or(0, |p| p.split_whitespace().count());
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens});
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    if body["stream"].as_bool() != Some(true) {
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": " ok".repeat(max_tokens)}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": " ok".repeat(max_tokens), "finish_reason": "length"})
        };
        return axum::Json(
            json!({"id": "cmpl-fake", "object": object, "model": model, "choices": [choice], "usage": usage}),
        )
        .into_response();
    }
    let number = REQUESTS.fetch_add(1, Ordering::Relaxed);
    let seed = std::env::var("FAKE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1u64);
    let mut jitter = Jitter((seed ^ (number.wrapping_mul(0x9E37_79B9_7F4A_7C15))) | 1);
    let spread = env_ms("FAKE_JITTER_MS");
    let per_seq = env_ms("FAKE_TTFT_MS_PER_SEQ") * MAX_NUM_SEQS.get().copied().unwrap_or(0.0);
    let ttft = jitter.around(env_ms("FAKE_TTFT_MS") + per_seq, spread);
    let itl: Vec<f64> = (1..max_tokens)
        .map(|_| jitter.around(env_ms("FAKE_ITL_MS"), spread))
        .collect();
    if let Ok(path) = std::env::var("FAKE_DELAYS_LOG")
        && let Ok(mut log) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let _ = writeln!(
            log,
            "{}",
            json!({"request": number, "ttft_ms": ttft, "itl_ms": itl})
        );
    }
    let include_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let model = model.to_owned();
    std::thread::spawn(move || {
        let id = format!("cmpl-fake-{number}");
        let chunk = |choices: Value, usage: Value| {
            let mut c = json!({"id": id, "object": format!("{object}.chunk"), "created": 0, "model": model, "choices": choices});
            if !usage.is_null() {
                c["usage"] = usage;
            }
            Bytes::from(format!("data: {c}\n\n"))
        };
        if chat && tx.blocking_send(chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), Value::Null)).is_err() {
            return;
        }
        let mut at = arrived + Duration::from_secs_f64(ttft / 1000.0);
        for i in 0..max_tokens {
            if i > 0 {
                at += Duration::from_secs_f64(itl[i - 1] / 1000.0);
            }
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            let finish = if i + 1 == max_tokens {
                json!("length")
            } else {
                Value::Null
            };
            let choice = if chat {
                json!([{"index": 0, "delta": {"content": " tok"}, "logprobs": null, "finish_reason": finish}])
            } else {
                json!([{"index": 0, "text": " tok", "logprobs": null, "finish_reason": finish}])
            };
            if tx.blocking_send(chunk(choice, Value::Null)).is_err() {
                return;
            }
        }
        if include_usage && tx.blocking_send(chunk(json!([]), usage)).is_err() {
            return;
        }
        let _ = tx.blocking_send(Bytes::from_static(b"data: [DONE]\n\n"));
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

//! The load generator: streamed OpenAI requests, timed the way `vllm bench serve`
//! times them (`vllm/benchmarks/lib/endpoint_request_func.py`: a timestamp per `data:`
//! line as it is read, the first line with a choice is the first token, every later
//! one adds a gap), run as sessions of consecutive requests with at most N sessions in
//! flight (a sweep's requests are sessions of one), all at once or each at its arrival
//! time (open loop, [`super::arrivals`]).
//!
//! The SSE stream is parsed here rather than with an SSE crate: one split on newlines
//! and a `data:` prefix, with a chunk's JSON read into a struct that skips everything
//! but `choices` and `usage`, keeps the client far from being the bottleneck
//! (`scripts/bench/bench-overhead.sh`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::sync::Semaphore;

use super::stats::RequestRecord;

/// Which OpenAI endpoint to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `/v1/completions` with the prompt as text (what `vllm bench serve` uses by default).
    Completions,
    /// `/v1/chat/completions` with the prompt as one user message.
    Chat,
}

impl Endpoint {
    /// The path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

/// The server under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:8000`.
    pub base: String,
    /// The model name to send.
    pub model: String,
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Bearer token.
    pub api_key: Option<String>,
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Job {
    /// The prompt.
    pub prompt: Arc<str>,
    /// Its length in tokens of the model's tokenizer.
    pub prompt_len: usize,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// Generate `max_tokens` even past the end-of-sequence token (vLLM's `ignore_eos`).
    pub ignore_eos: bool,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<IgnoredAny>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

fn body(target: &Target, job: &Job) -> serde_json::Value {
    let mut body = match target.endpoint {
        Endpoint::Completions => serde_json::json!({
            "model": target.model,
            "prompt": &*job.prompt,
            "max_tokens": job.max_tokens,
        }),
        Endpoint::Chat => serde_json::json!({
            "model": target.model,
            "messages": [{"role": "user", "content": &*job.prompt}],
            "max_completion_tokens": job.max_tokens,
        }),
    };
    body["temperature"] = 0.into();
    body["stream"] = true.into();
    body["stream_options"] = serde_json::json!({"include_usage": true});
    if job.ignore_eos {
        body["ignore_eos"] = true.into();
    }
    body
}

/// Sends one request and times it; never fails: a failure is a record with `error`.
pub async fn send(client: &reqwest::Client, target: &Target, job: &Job, run_start: Instant) -> RequestRecord {
    let mut record = RequestRecord {
        prompt_len: job.prompt_len,
        ..Default::default()
    };
    // A server may close a kept-alive connection just as it is reused (llama.cpp's
    // cpp-httplib does after a few requests): a request that failed before any response
    // came back never reached the model, so it is sent once more on a new connection,
    // and timed from then.
    for attempt in 0..2 {
        let started = Instant::now();
        record.start = started.duration_since(run_start).as_secs_f64();
        match stream(client, target, job, started, &mut record).await {
            Ok(()) => return record,
            Err(Failure::NotSent(_)) if attempt == 0 => continue,
            Err(Failure::NotSent(error) | Failure::Failed(error)) => {
                record.success = false;
                record.error = Some(error);
                return record;
            }
        }
    }
    record
}

/// Why a request failed: before the server answered at all, or after.
enum Failure {
    NotSent(String),
    Failed(String),
}

impl From<String> for Failure {
    fn from(error: String) -> Failure {
        Failure::Failed(error)
    }
}

impl From<&str> for Failure {
    fn from(error: &str) -> Failure {
        Failure::Failed(error.to_owned())
    }
}

async fn stream(
    client: &reqwest::Client,
    target: &Target,
    job: &Job,
    started: Instant,
    record: &mut RequestRecord,
) -> Result<(), Failure> {
    let mut request = client
        .post(format!("{}{}", target.base, target.endpoint.path()))
        .json(&body(target, job));
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| {
        let error = format!("request failed: {e}");
        if e.is_request() || e.is_connect() {
            Failure::NotSent(error)
        } else {
            Failure::Failed(error)
        }
    })?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        return Err(format!("HTTP {}: {}", status.as_u16(), message.trim()).into());
    }
    let mut bytes = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut last: Option<Instant> = None;
    let mut chunks = 0u64;
    let mut done = false;
    while let Some(read) = bytes.next().await {
        let read = read.map_err(|e| format!("the stream broke: {e}"))?;
        pending.extend_from_slice(&read);
        let mut consumed = 0;
        while let Some(newline) = pending[consumed..].iter().position(|b| *b == b'\n') {
            let line = &pending[consumed..consumed + newline];
            consumed += newline + 1;
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let chunk: Chunk =
                serde_json::from_slice(data).map_err(|e| format!("a chunk is not JSON ({e})"))?;
            if let Some(error) = chunk.error {
                return Err(format!("the server sent an error: {error}").into());
            }
            if !chunk.choices.is_empty() {
                // Stamped as each line is read, as vLLM's client stamps each line.
                let now = Instant::now();
                match last {
                    None => record.ttft = now.duration_since(started).as_secs_f64(),
                    Some(previous) => record.itl.push(now.duration_since(previous).as_secs_f64()),
                }
                last = Some(now);
                chunks += 1;
            }
            if let Some(usage) = chunk.usage {
                record.output_tokens = usage.completion_tokens.unwrap_or(0);
                record.prompt_tokens = usage.prompt_tokens;
                record.cached_tokens = usage.prompt_tokens_details.and_then(|d| d.cached_tokens);
            }
        }
        pending.drain(..consumed);
    }
    let Some(last) = last else {
        return Err("the stream ended without a token".into());
    };
    if !done {
        return Err("the stream ended before [DONE]".into());
    }
    if record.output_tokens == 0 {
        // No usage chunk: count chunks (one token each, as most servers stream).
        record.output_tokens = chunks;
    }
    record.latency = last.duration_since(started).as_secs_f64();
    record.success = true;
    Ok(())
}

/// Runs `sessions` (each a list of requests sent one after the other) with at most
/// `concurrency` sessions in flight; every record with its session and step, and the
/// wall time from the start to the last response.
///
/// With `arrivals` (open loop), session i arrives `arrivals[i]` seconds after the
/// start and then waits for one of the `concurrency` permits, as vLLM's client waits
/// on its semaphore (vllm-project/vllm vllm/benchmarks/serve.py get_request and
/// `limited_request_func`): the semaphore is fair, so waiting sessions go in order of
/// arrival, and a request is timed from when it is sent, not from its arrival. The
/// wall time then starts before the first arrival, as vLLM's does.
pub async fn run(
    client: &reqwest::Client,
    target: &Target,
    sessions: Vec<Vec<Job>>,
    concurrency: usize,
    arrivals: Option<&[f64]>,
    on_done: Arc<dyn Fn(&RequestRecord) + Send + Sync>,
) -> (Vec<(usize, usize, RequestRecord)>, f64) {
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let run_start = Instant::now();
    let mut tasks = Vec::with_capacity(sessions.len());
    for (session, jobs) in sessions.into_iter().enumerate() {
        if let Some(at) = arrivals.and_then(|a| a.get(session)) {
            let after = Duration::try_from_secs_f64(*at).unwrap_or_default();
            tokio::time::sleep_until((run_start + after).into()).await;
        }
        let (gate, client, target, on_done) = (gate.clone(), client.clone(), target.clone(), on_done.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(_permit) = gate.acquire_owned().await else {
                return Vec::new();
            };
            let mut records = Vec::with_capacity(jobs.len());
            for (step, job) in jobs.iter().enumerate() {
                let record = send(&client, &target, job, run_start).await;
                on_done(&record);
                records.push((session, step, record));
            }
            records
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        if let Ok(records) = task.await {
            all.extend(records);
        }
    }
    let duration = run_start.elapsed().as_secs_f64();
    all.sort_by_key(|(session, step, _)| (*session, *step));
    (all, duration)
}

/// An HTTP client for load: no overall timeout (a long generation is not an error),
/// connections kept and reused.
pub fn http_client(concurrency: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(concurrency.max(1))
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default()
}

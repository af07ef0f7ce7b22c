//! `sous run --recipe R [PROMPT]` / `sous run --url URL [PROMPT]`: a chat in the
//! terminal, streamed token by token, like `ollama run`. With a prompt (or text piped on
//! stdin) it answers once; without, on a terminal, it keeps a conversation until `/exit`
//! or end of input. A recipe whose instance runs (`sous ps`) is talked to there; else
//! it is served for the length of the session and stopped after.

use std::io::{BufRead, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use futures_util::StreamExt;
use serde_json::{Value, json};
use sous::instances;
use sous_engine::paths;

use super::{OverrideArgs, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous run --recipe recipes/local/smollm2-135m.toml \"Why is the sky blue?\"\n  sous run --recipe recipes/local/smollm2-135m.toml          (a conversation; /exit ends it)\n  echo \"Summarize: ...\" | sous run --url http://127.0.0.1:8000"
)]
pub struct RunArgs {
    /// The recipe: its running instance, else served for this session.
    #[arg(
        long,
        short = 'r',
        value_name = "FILE",
        required_unless_present = "url",
        conflicts_with = "url"
    )]
    recipe: Option<PathBuf>,
    /// An OpenAI-compatible server already running, e.g. `http://127.0.0.1:8000`.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// One prompt to answer; without it, a conversation (or stdin when it is not a terminal).
    prompt: Option<String>,
    /// The model name to ask for (default: the recipe's `model.served_name`, or the
    /// server's first model).
    #[arg(long)]
    model: Option<String>,
    /// A system message placed before the conversation.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 512)]
    max_tokens: u32,
    /// Sampling temperature (0 for greedy).
    #[arg(long)]
    temperature: Option<f64>,
    /// Sampling seed.
    #[arg(long)]
    seed: Option<u64>,
    /// One-shot only: print {"content", "usage", "ttft_seconds", ...} as JSON instead of streaming.
    #[arg(long, requires = "prompt")]
    json: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

/// What one answer took.
#[derive(Debug, Default)]
struct Answer {
    content: String,
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    finish_reason: Option<String>,
    ttft: Option<f64>,
    seconds: f64,
}

pub fn exec(args: RunArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let runtime = super::runtime()?;
    runtime.block_on(chat(args, shell))
}

async fn chat(args: RunArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let mut session = None;
    let (url, model, key) = match (&args.recipe, &args.url) {
        (Some(file), _) => {
            let recipe = load_recipe(file, &args.overrides)?.recipe;
            let key = super::recipe_api_key(&recipe);
            let running = instances::scan(&paths::state_dir())?
                .into_iter()
                .find(|e| e.name == recipe.name)
                .and_then(|e| e.live().cloned());
            let url = match running {
                Some(state) if state.healthy().await => {
                    shell.status(
                        "using",
                        &format!("the running instance `{}` at {}", recipe.name, state.url),
                    );
                    state.url
                }
                _ => {
                    let (instance, url) =
                        sous::pipeline::session::for_session(&recipe, Arc::new(shell.clone())).await?;
                    session = Some(instance);
                    url
                }
            };
            let model = args
                .model
                .clone()
                .unwrap_or_else(|| recipe.model.served_name.clone());
            (url, model, key)
        }
        (None, Some(url)) => {
            let url = url.trim_end_matches('/').to_owned();
            let key = sous_engine::env::OPENAI_API_KEY.get();
            let model = match &args.model {
                Some(m) => m.clone(),
                None => first_model(&url, key.as_deref()).await?,
            };
            (url, model, key)
        }
        (None, None) => {
            return Err(UserError::new("which server?", Some("pass --recipe FILE or --url URL")).into());
        }
    };
    let result = converse(&args, &url, &model, key.as_deref(), shell).await;
    if let Some(instance) = session {
        instance.stop().await?;
    }
    result
}

async fn converse(
    args: &RunArgs,
    url: &str,
    model: &str,
    key: Option<&str>,
    shell: &Shell,
) -> anyhow::Result<ExitCode> {
    let client = reqwest::Client::new();
    let mut messages: Vec<Value> = args
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let stdin = std::io::stdin();
    let one_shot = match &args.prompt {
        Some(p) => Some(p.clone()),
        None if !stdin.is_terminal() => {
            let mut text = String::new();
            stdin
                .lock()
                .read_to_string(&mut text)
                .context("reading the prompt from stdin")?;
            Some(text)
        }
        None => None,
    };
    if let Some(prompt) = one_shot {
        messages.push(json!({"role": "user", "content": prompt}));
        let answer = ask(&client, url, model, key, &messages, args, shell, !args.json).await?;
        if args.json {
            shell.data(&serde_json::to_string_pretty(&json!({
                "model": model,
                "url": url,
                "content": answer.content,
                "finish_reason": answer.finish_reason,
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
                "ttft_seconds": answer.ttft,
                "seconds": answer.seconds,
            }))?)?;
        } else {
            footer(&answer, shell);
        }
        return Ok(ExitCode::SUCCESS);
    }
    shell.status(
        "chat",
        &format!("with {model} at {url}; /clear forgets the conversation, /exit ends it"),
    );
    let mut lines = stdin.lock().lines();
    loop {
        shell.prompt(">>> ")?;
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        match line.trim() {
            "" => continue,
            "/exit" | "/bye" | "/quit" => break,
            "/clear" => {
                messages.retain(|m| m["role"] == "system");
                shell.status("cleared", "the conversation");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        match ask(&client, url, model, key, &messages, args, shell, true).await {
            Ok(answer) => {
                footer(&answer, shell);
                messages.push(json!({"role": "assistant", "content": answer.content}));
            }
            Err(e) => {
                // The turn is dropped; the conversation goes on.
                messages.pop();
                shell.error(&format!("{e:#}"), None);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn footer(answer: &Answer, shell: &Shell) {
    let tokens = answer.completion_tokens.map_or("?".to_owned(), |t| t.to_string());
    let rate = match (answer.completion_tokens, answer.ttft) {
        (Some(t), Some(first)) if t > 1 && answer.seconds > first => {
            format!(
                ", {:.1} tok/s after the first",
                (t - 1) as f64 / (answer.seconds - first)
            )
        }
        _ => String::new(),
    };
    let first = answer
        .ttft
        .map_or(String::new(), |t| format!(", first token after {:.2} s", t));
    let why = match answer.finish_reason.as_deref() {
        Some("length") => " (cut at --max-tokens)",
        _ => "",
    };
    shell.status(
        "done",
        &format!("{tokens} tokens in {:.2} s{first}{rate}{why}", answer.seconds),
    );
}

/// Sends the conversation and streams the answer to stdout when `stream_out`.
#[allow(clippy::too_many_arguments)]
async fn ask(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    key: Option<&str>,
    messages: &[Value],
    args: &RunArgs,
    shell: &Shell,
    stream_out: bool,
) -> anyhow::Result<Answer> {
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": args.max_tokens,
    });
    if let Some(t) = args.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(s) = args.seed {
        body["seed"] = json!(s);
    }
    let endpoint = format!("{url}/v1/chat/completions");
    let mut request = client.post(&endpoint).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let started = Instant::now();
    let response = request.send().await.with_context(|| format!("POST {endpoint}"))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(UserError::new(
            format!(
                "POST {endpoint} answered HTTP {}: {}",
                status.as_u16(),
                text.trim()
            ),
            None,
        )
        .into());
    }
    let mut answer = Answer::default();
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.with_context(|| format!("reading the answer from {endpoint}"))?;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let event: Value = serde_json::from_str(data)
                .with_context(|| format!("{endpoint} sent an event that is not JSON: {data}"))?;
            if let Some(message) = event["error"]["message"].as_str() {
                return Err(UserError::new(format!("the server stopped the answer: {message}"), None).into());
            }
            let choice = &event["choices"][0];
            if let Some(text) = choice["delta"]["content"].as_str()
                && !text.is_empty()
            {
                answer.ttft.get_or_insert(started.elapsed().as_secs_f64());
                answer.content.push_str(text);
                if stream_out {
                    shell.raw(text.as_bytes())?;
                }
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                answer.finish_reason = Some(reason.to_owned());
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                answer.completion_tokens = Some(n);
                answer.prompt_tokens = event["usage"]["prompt_tokens"].as_u64();
            }
        }
    }
    if stream_out {
        shell.raw(b"\n")?;
    }
    answer.seconds = started.elapsed().as_secs_f64();
    Ok(answer)
}

/// The first model a server lists at `/v1/models`.
async fn first_model(url: &str, key: Option<&str>) -> anyhow::Result<String> {
    let endpoint = format!("{url}/v1/models");
    let mut request = reqwest::Client::new().get(&endpoint);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let value: Value = request
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET {endpoint}"))?
        .json()
        .await
        .with_context(|| format!("GET {endpoint}: not a model list"))?;
    value["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| UserError::new(format!("{endpoint} lists no model"), Some("pass --model NAME")).into())
}

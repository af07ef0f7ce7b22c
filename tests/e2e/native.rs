//! `sous serve` with the native engine, end to end on the SmolLM2 test model: the
//! OpenAI API as the official `openai` package sees it, raw SSE and error bodies,
//! vLLM-named metrics, shutdown; the NVFP4 recipe from Hub mirror to answer; and 200
//! requests from 32 concurrent clients with cancellations and malformed bodies; the
//! engine process under the supervisor (a killed engine restarts, `--replace` swaps
//! instances with no gap in `/health`).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Mirror, Poller, Running, alive, cpu_exclusive, free_port, python, root, smollm2};

pub(crate) struct Server {
    pub(crate) running: Running,
    pub(crate) url: String,
    _dir: tempfile::TempDir,
}

/// `sous serve` on a recipe serving `model` with `extra` TOML, ready.
pub(crate) fn serve(model: &Path, extra: &str, server_extra: &str, envs: &[(&str, &str)]) -> Server {
    serve_with_memory(model, "kv_cache_bytes = \"256MiB\"", extra, server_extra, envs)
}

/// [`serve`] with `memory` as the recipe's `[memory]` table.
fn serve_with_memory(
    model: &Path,
    memory: &str,
    extra: &str,
    server_extra: &str,
    envs: &[(&str, &str)],
) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let recipe = dir.path().join("native.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"native-test\"\n[model]\npath = \"{}\"\nserved_name = \"smollm2\"\n\n[engine]\nkind = \"native\"\n\n\
             [memory]\n{memory}\n\n[server]\nhost = \"127.0.0.1\"\nport = {port}\nstop_grace = \"3s\"\n{server_extra}\n\n{extra}\n",
            model.display()
        ),
    )
    .expect("recipe");
    let state = dir.path().join("state");
    let state = state.to_str().expect("utf-8 path");
    let mut envs: Vec<(&str, &str)> = envs.to_vec();
    envs.push(("SOUS_STATE_DIR", state));
    let running = Running::start(
        &["serve", "--recipe", recipe.to_str().expect("utf-8 path")],
        &envs,
    );
    assert!(
        running.wait_for("ready http://", Duration::from_secs(120)),
        "the native engine did not become ready:\n{}",
        running.stderr()
    );
    // The ready line gives the phases the engine logged (`Model loading took`, `init
    // engine ... took`).
    let stderr = running.stderr();
    assert!(
        stderr.contains(" s (model loading ") && stderr.contains(" s, engine init "),
        "{stderr}"
    );
    Server {
        running,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn post(client: &reqwest::Client, url: &str, body: &str, key: Option<&str>) -> (u16, String) {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("a body"))
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The data lines of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            frame
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("an SSE frame without `data: `: {frame:?}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn the_native_engine_speaks_openai_and_vllm() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let server = serve(
        &model,
        "[serving]\nmax_model_len = 512\nprefix_caching = true",
        "api_key_env = \"NATIVE_TEST_KEY\"",
        &[("NATIVE_TEST_KEY", "sesame")],
    );
    let stderr = server.running.stderr();
    assert!(
        stderr.contains("CPU KV cache size: ")
            && stderr.contains("Maximum concurrency for 512 tokens per request: "),
        "vLLM's capacity line: {stderr}"
    );

    // The official client (it sends one conversation twice: the prefix-cache hit the
    // metrics are checked for below).
    let openai = python("the openai package check");
    if let Some(python) = &openai {
        let out = std::process::Command::new(python)
            .arg(root().join("tests/e2e/openai_client.py"))
            .args([&server.url, "smollm2", "sesame"])
            .output()
            .expect("python runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r = json_of(&String::from_utf8_lossy(&out.stdout));
        let chat = r["chat"]["content"].as_str().expect("chat content");
        assert!(chat.contains("Paris"), "{r}");
        assert_eq!(r["chat"]["object"], "chat.completion");
        assert_eq!(
            r["stream"]["content"], r["chat"]["content"],
            "streamed = not streamed: {r}"
        );
        assert_eq!(r["stream"]["roles"], json!(["assistant"]));
        for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(
                r["stream"]["usage"][field], r["chat"]["usage"][field],
                "{field}: {r}"
            );
        }
        // The same conversation again: its full blocks came from the prefix cache.
        assert_eq!(
            r["stream"]["usage"]["prompt_tokens_details"]["cached_tokens"], 32,
            "{r}"
        );
        assert_eq!(r["stream"]["finish_reason"], "stop");
        assert_eq!(r["completion"]["finish_reason"], "length");
        assert_eq!(r["completion"]["tokens"], 8);
        assert_eq!(r["completion"]["usage"]["completion_tokens"], 8);
        assert_eq!(r["completion_stream"], r["completion"]["text"]);
        for (case, status) in [
            ("unknown_model", 404),
            ("bad_temperature", 400),
            ("too_long", 400),
            ("bad_key", 401),
        ] {
            assert_eq!(r["errors"][case][0], status, "{case}: {r}");
        }
        assert!(
            r["errors"]["too_long"][1]
                .as_str()
                .is_some_and(|m| m.contains("maximum context length is 512"))
        );
        assert_eq!(r["models"], json!(["smollm2"]));
    }

    let rt = runtime();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let url = |p: &str| format!("{}{p}", server.url);
        let key = Some("sesame");
        assert_eq!(client.get(url("/health")).send().await.expect("health").status(), 200);
        assert_eq!(client.get(url("/v1/models")).send().await.expect("models").status(), 401);
        let version = json_of(&client.get(url("/version")).send().await.expect("v").text().await.expect("t"));
        assert!(version["version"].is_string());

        // Malformed bodies and bad fields: OpenAI error objects naming the problem.
        for (body, status, needle) in [
            ("{not json", 400, "not valid"),
            (r#"{"messages": "hi"}"#, 400, "not valid"),
            (r#"{"messages": []}"#, 400, "empty"),
            (r#"{"messages": [{"content": "x"}]}"#, 400, "role"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#, 400, "one choice"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}"#, 400, "too large"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "top_p": 0}"#, 400, "top_p"),
            (r#"{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}"#, 404, "gpt-9"),
        ] {
            let (got, text) = post(&client, &url("/v1/chat/completions"), body, key).await;
            assert_eq!(got, status, "{body}: {text}");
            let err = json_of(&text);
            assert_eq!(err["error"]["code"], status);
            assert!(err["error"]["message"].as_str().is_some_and(|m| m.contains(needle)), "{body}: {text}");
        }

        // Raw SSE: a role chunk, content chunks, a finish chunk, usage, [DONE].
        let body = json!({
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24, "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
        });
        let (status, text) = post(&client, &url("/v1/chat/completions"), &body.to_string(), key).await;
        assert_eq!(status, 200, "{text}");
        let frames = sse_data(&text);
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| json_of(f)).collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
        let usage = chunks.last().expect("usage chunk");
        assert_eq!(usage["choices"], json!([]));
        let finish: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0].get("finish_reason")).filter(|f| !f.is_null()).collect();
        assert_eq!(finish, vec![&json!("stop")]);

        // Stop strings end generation and are not returned.
        let body = json!({"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 40, "temperature": 0, "stop": [" 7"], "ignore_eos": true});
        let (status, text) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        assert_eq!(status, 200, "{text}");
        let done = json_of(&text);
        let completion = done["choices"][0]["text"].as_str().expect("text");
        assert_eq!(done["choices"][0]["finish_reason"], "stop", "{text}");
        assert!(completion.contains(" 6") && !completion.contains(" 7"), "{completion:?}");

        // Prompt log-probabilities (vLLM's extension, for perplexity).
        let body = json!({"prompt": "The capital of France is Paris.", "max_tokens": 1, "prompt_logprobs": 0});
        let (_, text) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        let lp = &json_of(&text)["choices"][0]["prompt_logprobs"];
        let n = json_of(&text)["usage"]["prompt_tokens"].as_u64().expect("prompt tokens") as usize;
        assert_eq!(lp.as_array().map(Vec::len), Some(n), "{text}");
        assert!(lp[0].is_null() && lp[1].is_object(), "{text}");
        let body = json!({"prompt": "The capital of France is Paris.", "max_tokens": 1, "prompt_logprobs": 3});
        let (_, text) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        let entry = json_of(&text)["choices"][0]["prompt_logprobs"][2].clone();
        let mut ranks: Vec<u64> = entry.as_object().expect("entry").values().filter_map(|v| v["rank"].as_u64()).collect();
        ranks.sort_unstable();
        ranks.dedup();
        assert!(ranks.starts_with(&[1, 2, 3]), "the top entries rank 1..=3, as vLLM's: {entry}");

        // Echo with log-probabilities, as lm-evaluation-harness scores a choice: the prompt
        // first, its tokens' log-probabilities (none for the first), then the output's.
        let body = json!({"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": true});
        let (status, text) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        assert_eq!(status, 200, "{text}");
        let choice = &json_of(&text)["choices"][0];
        assert!(choice["text"].as_str().is_some_and(|t| t.starts_with("The capital of France is") && t.len() > 24), "{text}");
        let values = choice["logprobs"]["token_logprobs"].as_array().expect("token_logprobs");
        let tokens = choice["logprobs"]["tokens"].as_array().expect("tokens");
        assert_eq!(values.len(), tokens.len());
        assert_eq!(tokens[0], "The");
        assert!(values[0].is_null() && values[1..].iter().all(Value::is_f64), "{text}");
        // The prompt's log-probabilities are those prompt_logprobs gives.
        let body = json!({"prompt": "The capital of France is", "max_tokens": 1, "prompt_logprobs": 0});
        let (_, plain) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        let first = json_of(&plain)["choices"][0]["prompt_logprobs"][1].as_object().expect("entry").values().next().expect("one")["logprob"].clone();
        assert_eq!(values[1], first);
        let body = json!({"prompt": "x", "max_tokens": 1, "echo": true, "stream": true});
        let (status, text) = post(&client, &url("/v1/completions"), &body.to_string(), key).await;
        assert_eq!((status, json_of(&text)["error"]["param"].as_str()), (400, Some("echo")), "{text}");

        // vLLM's tokenizer endpoints, outside /v1 and its key (lm-evaluation-harness's
        // `tokenizer_backend=remote` reads them).
        let tokens = client.post(url("/tokenize")).json(&json!({"prompt": "Hello world"})).send().await.expect("tokenize");
        let tokens: Value = tokens.json().await.expect("json");
        let ids = tokens["tokens"].as_array().expect("tokens").clone();
        assert_eq!(tokens["count"].as_u64(), Some(ids.len() as u64));
        assert!(tokens["max_model_len"].as_u64().is_some(), "{tokens}");
        let text: Value = client.post(url("/detokenize")).json(&json!({"tokens": ids})).send().await.expect("detokenize").json().await.expect("json");
        assert_eq!(text["prompt"], "Hello world");
        let info: Value = client.get(url("/tokenizer_info")).send().await.expect("info").json().await.expect("json");
        assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
        assert!(info["chat_template"].as_str().is_some_and(|t| t.contains("im_start")), "{info}");
        assert!(info.get("added_tokens_decoder").is_none());
        let bad = client.post(url("/detokenize")).json(&json!({"tokens": [1u64 << 40]})).send().await.expect("detokenize");
        assert_eq!(bad.status(), 400);

        // vLLM's metric names, read back after the requests above.
        let metrics = client.get(url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        for name in [
            "vllm:num_requests_running{engine=\"0\",model_name=\"smollm2\"} 0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"smollm2\"} 0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"smollm2\"} 0",
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",",
            "vllm:inter_token_latency_seconds_count{",
            "vllm:e2e_request_latency_seconds_sum{",
            "vllm:request_queue_time_seconds_bucket{le=\"0.3\",",
            "vllm:prefix_cache_queries_total{",
            "vllm:request_success_total{finished_reason=\"stop\",",
            "vllm:cache_config_info{block_size=\"16\",",
        ] {
            assert!(metrics.contains(name), "`{name}` missing from /metrics:\n{metrics}");
        }
        let hits = metrics
            .lines()
            .find(|l| l.starts_with("vllm:prefix_cache_hits_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .expect("hits");
        if openai.is_some() {
            assert!(hits > 0.0, "the repeated chat prompt hit the prefix cache:\n{metrics}");
        }
    });

    // SIGTERM: stops within the grace period, exit code 0.
    let mut server = server;
    server.running.signal("TERM");
    assert_eq!(
        server.running.wait(Duration::from_secs(10)),
        Some(0),
        "{}",
        server.running.stderr()
    );
}

#[test]
fn the_nvfp4_recipe_pulls_quantizes_and_answers() {
    let _cpu = cpu_exclusive();
    let Some(_) = smollm2() else { return };
    let mirror = Mirror::start(&root().join("target/models"), &[], &[]);
    let work = tempfile::tempdir().expect("tempdir");
    let (cache, sous_cache) = (work.path().join("hub"), work.path().join("sous-cache"));
    let port = free_port().to_string();
    let envs = [
        ("HF_ENDPOINT", mirror.url.as_str()),
        ("HF_HUB_CACHE", cache.to_str().expect("utf-8")),
        ("SOUS_CACHE_DIR", sous_cache.to_str().expect("utf-8")),
        ("SOUS_STATE_DIR", work.path().to_str().expect("utf-8")),
    ];
    let set_port = format!("server.port={port}");
    let args = [
        "serve",
        "--recipe",
        "recipes/local/smollm2-135m-nvfp4.toml",
        "--set",
        set_port.as_str(),
    ];
    let mut first = Running::start(&args, &envs);
    assert!(
        first.wait_for("ready http://", Duration::from_secs(180)),
        "{}",
        first.stderr()
    );
    let log = first.stderr();
    assert!(
        log.contains("pulled HuggingFaceTB/SmolLM2-135M-Instruct"),
        "{log}"
    );
    assert!(log.contains("quantized ") && log.contains("weights to "), "{log}");
    assert!(log.contains("Nvfp4CompressedTensors"), "{log}");
    let answer = capital_of_france(&port);
    assert!(answer.contains("Paris"), "the NVFP4 model's answer: {answer:?}");
    first.signal("INT");
    assert_eq!(first.wait(Duration::from_secs(10)), Some(0), "{}", first.stderr());

    // A second start rebuilds nothing.
    let second = Running::start(&args, &envs);
    assert!(
        second.wait_for("ready http://", Duration::from_secs(120)),
        "{}",
        second.stderr()
    );
    let log = second.stderr();
    assert!(
        log.contains("is on disk") && log.contains("is up to date"),
        "{log}"
    );
}

/// The server's greedy answer to "What is the capital of France?".
fn capital_of_france(port: &str) -> String {
    runtime().block_on(async {
        let client = reqwest::Client::new();
        let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0});
        let (status, text) = post(&client, &format!("http://127.0.0.1:{port}/v1/chat/completions"), &body.to_string(), None).await;
        assert_eq!(status, 200, "{text}");
        json_of(&text)["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
    })
}

#[test]
fn the_w4a4_recipe_calibrates_quantizes_and_answers() {
    let _cpu = cpu_exclusive();
    let Some(_) = smollm2() else { return };
    let mirror = Mirror::start(&root().join("target/models"), &["--quiet"], &[]);
    let work = tempfile::tempdir().expect("tempdir");
    let (cache, sous_cache) = (work.path().join("hub"), work.path().join("sous-cache"));
    let envs = [
        ("HF_ENDPOINT", mirror.url.as_str()),
        ("HF_HUB_CACHE", cache.to_str().expect("utf-8")),
        ("SOUS_CACHE_DIR", sous_cache.to_str().expect("utf-8")),
        ("SOUS_STATE_DIR", work.path().to_str().expect("utf-8")),
    ];
    // The recipe's compressed-tensors checkpoint, then the same model in ModelOpt's
    // format (`input_scale`, quant_algo `NVFP4`), each served by the native engine.
    for format in ["compressed-tensors", "modelopt"] {
        let port = free_port().to_string();
        let set_port = format!("server.port={port}");
        let set_format = format!("quantize.format={format}");
        let args = [
            "serve",
            "--recipe",
            "recipes/local/smollm2-135m-w4a4.toml",
            "--set",
            set_port.as_str(),
            "--set",
            set_format.as_str(),
        ];
        let mut server = Running::start(&args, &envs);
        assert!(
            server.wait_for("ready http://", Duration::from_secs(240)),
            "{format}: {}",
            server.stderr()
        );
        let log = server.stderr();
        assert!(log.contains("calibrated on 16 samples"), "{log}");
        let checkpoint = sous_cache.join("quantized/smollm2-135m-w4a4");
        let config: Value =
            serde_json::from_slice(&std::fs::read(checkpoint.join("config.json")).expect("config"))
                .expect("JSON");
        let q = &config["quantization_config"];
        if format == "modelopt" {
            assert!(log.contains("Nvfp4W4a4ModelOpt"), "{log}");
            assert_eq!(q["quant_algo"], "NVFP4");
        } else {
            assert!(log.contains("Nvfp4W4a4CompressedTensors"), "{log}");
            assert_eq!(
                q["config_groups"]["group_0"]["input_activations"]["dynamic"],
                "local"
            );
        }
        let answer = capital_of_france(&port);
        // FP4 activations cost a 135M model a good deal (perplexity 22.6 with FP4
        // weights, 27.5 with FP4 activations too, as transformers gives for
        // llm-compressor's own W4A4 checkpoint: benchmarks/quantize.md): it still answers on
        // topic, not always right.
        assert!(
            answer.contains("France"),
            "{format}: the W4A4 model's answer: {answer:?}"
        );
        server.signal("INT");
        assert_eq!(
            server.wait(Duration::from_secs(10)),
            Some(0),
            "{}",
            server.stderr()
        );
    }
}

/// A small deterministic generator for the load test (no dependency for one test).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn two_hundred_requests_from_thirty_two_clients() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let server = serve(
        &model,
        "[serving]\nmax_model_len = 1024\nmax_num_seqs = 16\nprefix_caching = true",
        "",
        &[],
    );
    let rt = runtime();
    let url = server.url.clone();
    let outcomes = rt.block_on(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .expect("client");
        let words = [
            "alpha", "river", "stone", "cloud", "north", "paper", "seven", "light",
        ];
        let mut tasks = Vec::new();
        for worker in 0..32u64 {
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Lcg(worker + 1);
                let mut seen = Vec::new();
                for i in 0..(200 / 32 + u64::from(worker < 200 % 32)) {
                    let len = 1 + rng.next(120) as usize;
                    let prompt: Vec<&str> = (0..len).map(|_| words[rng.next(8) as usize]).collect();
                    let max_tokens = 1 + rng.next(24);
                    let kind = rng.next(10);
                    let stream = kind.is_multiple_of(2);
                    let body = match kind {
                        0 => "{\"prompt\": ".to_owned(), // malformed
                        1 => json!({"prompt": prompt.join(" "), "max_tokens": 0}).to_string(), // invalid
                        _ => json!({"prompt": prompt.join(" "), "max_tokens": max_tokens, "temperature": 0,
                                    "ignore_eos": true, "stream": stream})
                        .to_string(),
                    };
                    let request = client
                        .post(format!("{url}/v1/completions"))
                        .header("content-type", "application/json")
                        .body(body);
                    if kind == 9 {
                        // Cancelled: the client goes away mid-stream or before the answer.
                        let _ =
                            tokio::time::timeout(Duration::from_millis(50 + rng.next(200)), request.send())
                                .await;
                        seen.push(("cancelled", 0, 0));
                        continue;
                    }
                    let resp = request.send().await.expect("the server answers");
                    let status = resp.status().as_u16();
                    let text = resp.text().await.expect("a body");
                    let tokens = if status == 200 && stream {
                        let frames = sse_data(&text);
                        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"), "{text}");
                        frames.len() as u64 // not exact tokens; checked below for non-streamed
                    } else if status == 200 {
                        let v = json_of(&text);
                        assert_eq!(
                            v["usage"]["completion_tokens"], max_tokens,
                            "worker {worker} request {i}: {text}"
                        );
                        assert_eq!(v["choices"][0]["finish_reason"], "length");
                        max_tokens
                    } else {
                        assert_eq!(status, 400, "{text}");
                        assert!(json_of(&text)["error"]["message"].is_string());
                        0
                    };
                    let expected = if kind <= 1 { 400 } else { 200 };
                    assert_eq!(status, expected, "kind {kind}: {text}");
                    seen.push(("done", status, tokens));
                }
                seen
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("a client task"));
        }
        // Everything finished or freed: nothing running, no block in use.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let metrics = client
                .get(format!("{url}/metrics"))
                .send()
                .await
                .expect("metrics")
                .text()
                .await
                .expect("t");
            let idle = metrics.contains("vllm:num_requests_running{engine=\"0\",model_name=\"smollm2\"} 0\n")
                && metrics.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"smollm2\"} 0\n")
                && metrics.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"smollm2\"} 0\n");
            if idle {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the engine did not drain:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        all
    });
    assert_eq!(outcomes.len(), 200);
    assert!(outcomes.iter().any(|o| o.0 == "cancelled"));
    assert!(
        outcomes.iter().filter(|o| o.1 == 200).count() > 100,
        "{outcomes:?}"
    );
    let stderr = server.running.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        crate::util::alive(u64::from(server.running.child.id())),
        "still serving: {stderr}"
    );
}

#[test]
fn a_native_engine_is_restarted_when_killed_and_replaced_without_a_gap() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let recipe = dir.path().join("swap.toml");
    let write = |seqs: u32| {
        std::fs::write(
            &recipe,
            format!(
                "name = \"native-swap\"\n[model]\npath = \"{}\"\nserved_name = \"smollm2\"\n\n[engine]\nkind = \"native\"\n\n\
                 [memory]\nkv_cache_bytes = \"64MiB\"\n\n[serving]\nmax_model_len = 1024\nmax_num_seqs = {seqs}\n\n\
                 [server]\nhost = \"127.0.0.1\"\nport = {port}\nstop_grace = \"3s\"\n",
                model.display()
            ),
        )
        .expect("recipe");
    };
    write(4);
    let state = dir.path().join("state");
    let envs = [("SOUS_STATE_DIR", state.to_str().expect("utf-8"))];
    let recipe_arg = recipe.to_str().expect("utf-8");
    let mut old = Running::start(&["serve", "--recipe", recipe_arg], &envs);
    let ready = Duration::from_secs(120);
    assert!(old.wait_for("ready http://", ready), "{}", old.stderr());
    let record = || -> Value {
        serde_json::from_slice(
            &std::fs::read(state.join("native-swap/instance.json")).expect("instance.json"),
        )
        .expect("json")
    };

    // The engine runs in a process of its own; killing it is a crash, and it restarts.
    let engine = record()["engine_pid"].as_u64().expect("engine pid");
    assert_ne!(engine, u64::from(old.child.id()));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &engine.to_string()])
        .status();
    assert!(
        old.wait_for("the engine exited with code 137; restarting in 1 s", ready),
        "{}",
        old.stderr()
    );
    let deadline = std::time::Instant::now() + ready;
    while old.stderr().matches("ready http://").count() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        old.stderr().matches("ready http://").count(),
        2,
        "{}",
        old.stderr()
    );
    let restarted = record()["engine_pid"].as_u64().expect("engine pid");
    assert!(restarted != engine && alive(restarted));

    // A changed recipe swaps instances on the same port; /health never fails.
    let poller = Poller::start(port);
    std::thread::sleep(Duration::from_millis(300));
    write(8);
    let mut new = Running::start(&["serve", "--replace", "--recipe", recipe_arg], &envs);
    assert!(new.wait_for("replaced", ready), "{}", new.stderr());
    assert_eq!(old.wait(Duration::from_secs(20)), Some(0), "{}", old.stderr());
    std::thread::sleep(Duration::from_millis(300));
    let seen = poller.finish();
    let failures: Vec<_> = seen.iter().filter(|r| !matches!(r, Ok((200, _)))).collect();
    assert!(
        seen.len() > 20 && failures.is_empty(),
        "/health during the swap: {failures:?} of {}",
        seen.len()
    );
    assert!(!alive(restarted), "the old engine process is gone");
    assert_eq!(record()["sous_pid"].as_u64(), Some(u64::from(new.child.id())));
    let answer = runtime().block_on(async {
        let body = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
        post(
            &reqwest::Client::new(),
            &format!("http://127.0.0.1:{port}/v1/completions"),
            &body.to_string(),
            None,
        )
        .await
    });
    assert_eq!(answer.0, 200, "{}", answer.1);
    new.signal("TERM");
    assert_eq!(new.wait(Duration::from_secs(20)), Some(0), "{}", new.stderr());
}

/// A model folder as transformers 5 saves it (the template in chat_template.jinja, a
/// named `tool_use` template in additional_chat_templates/, none in
/// tokenizer_config.json) is served chat as vLLM serves it: the default template for a
/// conversation, `tool_use` for one with tools, `chat_template_kwargs` passed to the
/// template, and a template sent with the request refused. The prompt token counts are
/// those of the text transformers rendered (`tests/fixtures/chat-templates/cases.json`).
#[test]
fn a_folder_saved_by_transformers_5_is_served_chat() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let cases: Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/chat-templates/cases.json")).expect("cases"),
    )
    .expect("cases JSON");
    let tokenizer = tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).expect("tokenizer");
    let rendered_tokens = |folder: &str, tools: bool, kwargs: Value| {
        let case = cases["folders"][folder]["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .find(|c| c["conversation"] == "user" && c["tools"] == tools && c["kwargs"] == kwargs)
            .expect("case");
        let text = case["rendered"].as_str().expect("rendered");
        tokenizer.encode(text, false).expect("encode").len() as u64
    };
    let user = json!([{"role": "user", "content": "What is the capital of France?"}]);
    // The fixture's tool with its keys in the fixture's order (serde_json's maps sort
    // them, and the template prints the schema as the client sent it).
    let weather = r#"{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, now.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Paris"}}, "required": ["city"]}}}"#;
    assert_eq!(json_of(weather), cases["weather_tool"]);
    let rt = runtime();
    let client = reqwest::Client::new();
    for folder in ["named", "thinking"] {
        let saved = crate::util::saved_by_transformers(&model, folder);
        let server = serve(saved.path(), "[serving]\nmax_model_len = 512", "", &[]);
        let url = format!("{}/v1/chat/completions", server.url);
        let ask = |body: Value| rt.block_on(post(&client, &url, &body.to_string(), None));
        let base = json!({"model": "smollm2", "messages": user, "max_tokens": 4, "temperature": 0});

        let (status, body) = ask(base.clone());
        assert_eq!(status, 200, "{folder}: {body}");
        let want = rendered_tokens(folder, false, json!({}));
        assert_eq!(json_of(&body)["usage"]["prompt_tokens"], want, "{folder}: {body}");

        let with_tools = format!(
            "{{\"model\": \"smollm2\", \"messages\": {user}, \"max_tokens\": 4, \"temperature\": 0, \"tools\": [{weather}]}}"
        );
        let (status, body) = rt.block_on(post(&client, &url, &with_tools, None));
        assert_eq!(status, 200, "{folder}: {body}");
        let want = rendered_tokens(folder, true, json!({}));
        assert_eq!(
            json_of(&body)["usage"]["prompt_tokens"],
            want,
            "{folder} with tools: {body}"
        );

        let mut thinking_off = base.clone();
        thinking_off["chat_template_kwargs"] = json!({"enable_thinking": false});
        let (status, body) = ask(thinking_off);
        assert_eq!(status, 200, "{folder}: {body}");
        let want = rendered_tokens(folder, false, json!({"enable_thinking": false}));
        assert_eq!(
            json_of(&body)["usage"]["prompt_tokens"],
            want,
            "{folder} with kwargs: {body}"
        );

        let mut own = base.clone();
        own["chat_template"] = json!("{{ messages }}");
        let (status, body) = ask(own);
        assert_eq!(status, 400, "{folder}: {body}");
        assert!(body.contains("untrusted chat template"), "{body}");
        drop(server);
    }
    // The two tool-less renderings differ only where the kwargs reach the template.
    assert_ne!(
        rendered_tokens("thinking", false, json!({})),
        rendered_tokens("thinking", false, json!({"enable_thinking": false}))
    );
    assert_ne!(
        rendered_tokens("named", false, json!({})),
        rendered_tokens("named", true, json!({}))
    );
}

/// The native engine's memory fraction is of the host's memory: one the host does not
/// have available is passed over before the start, for the first fallback it has.
#[test]
fn a_fraction_of_more_memory_than_is_available_is_passed_over_up_front() {
    let Some(model) = smollm2() else { return };
    let _cpu = cpu_exclusive();
    let server = serve_with_memory(
        &model,
        "gpu_utilization = 1.0\noom_fallback = [0.05]",
        "",
        "",
        &[],
    );
    let stderr = server.running.stderr();
    assert!(
        stderr.contains("`memory.gpu_utilization = 1` asks for ")
            && stderr.contains("is available (page cache ")
            && stderr.contains("starting at 0.05 from `memory.oom_fallback`"),
        "{stderr}"
    );
    assert!(stderr.contains("memory fraction 0.05"), "{stderr}");
    assert_eq!(
        stderr.matches("starting native").count(),
        1,
        "one start, no out-of-memory first: {stderr}"
    );
}

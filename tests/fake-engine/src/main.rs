//! `fake-engine`: imitates what `sous serve` observes of vLLM, SGLang and trtllm-serve,
//! for tests on machines without a GPU. It is not an engine: it answers `/health`,
//! `/v1/models`, a canned completion and `/metrics`.
//!
//! What it imitates, from the engines' sources:
//! - the command lines: `vllm serve MODEL --flag ...` (argparse, vLLM 0.33
//!   `vllm/utils/argparse_utils.py` and `vllm/engine/arg_utils.py`: unknown arguments
//!   exit 2 with "unrecognized arguments"), `python3 -m sglang.launch_server
//!   --model-path ...` (argparse, SGLang 0.5.23 `python/sglang/srt/server_args.py`),
//!   `trtllm-serve MODEL --flag ...` (click, TensorRT-LLM
//!   `tensorrt_llm/commands/serve.py`: "No such option", exit 2), accepting the flags
//!   those parsers declare that sous renders, and common others;
//! - start-up: connection refused while "loading" (vLLM 0.33
//!   `vllm/entrypoints/launchers/api_server/entry.py` binds before the engine is up but
//!   only listens after), SGLang's 503 during warm-up (SGLang 0.5.23
//!   `python/sglang/srt/entrypoints/http_server.py`), the start-up log lines with the KV
//!   capacity (vLLM 0.33 `vllm/v1/core/kv_cache_utils.py`, SGLang
//!   `python/sglang/srt/managers/scheduler.py`, TensorRT-LLM's `[MemUsageChange]`), the
//!   out-of-memory messages above a memory fraction.
//!
//! Its lines and metric names are typed out here rather than taken from
//! `sous_engine::dialect`: a test double that shared sous's spelling would agree with a
//! wrong spelling, and the engine crate would add candle and tokenizers to a binary
//! that needs neither.
//!
//! Controlled by the environment:
//! - `FAKE_RECORD=FILE`: write `{"argv": [...], "env": {...}, "pid": N}` there at start.
//! - `FAKE_LAUNCH_LOG=FILE`: append one line `{"argv": [...], "pid": N}` per start (how
//!   many launches a command made, and with what).
//! - `FAKE_LOAD_SECS` (default 0.3): time before listening; `FAKE_WARMUP_SECS`
//!   (SGLang, default 0.3): time answering 503.
//! - `FAKE_OOM_ABOVE=F`: die of out-of-memory at start-up when the memory fraction is
//!   above F.
//! - `FAKE_HOG_ABOVE=F` with `FAKE_HOG_BYTES=N`: at start-up, when the memory fraction
//!   is above F, allocate and touch N bytes of host memory, 64 MiB every 10 ms (an
//!   engine overshooting its budget on unified memory), hold them, and start anyway;
//!   with `FAKE_HOG_UNTIL=M`, stop allocating once the host's `MemAvailable` is below M
//!   bytes (the same overshoot whatever other processes free or take meanwhile).
//! - `FAKE_CRASH_AFTER=SECS`, `FAKE_CRASH_CODE` (default 3): exit that long after
//!   becoming ready; `FAKE_CRASH_TIMES=N` with `FAKE_COUNTER=FILE`: only the first N
//!   launches crash.
//! - `FAKE_COMPILE_SECS=S` (vLLM): compile graphs for S seconds at start-up, or read
//!   them back from `$VLLM_CACHE_ROOT` in a tenth of that when an earlier start left
//!   them there.
//! - `FAKE_IGNORE_SIGTERM=1`: ignore SIGTERM.
//! - `FAKE_TTFT_MS`, `FAKE_ITL_MS`, `FAKE_JITTER_MS`, `FAKE_SEED`, `FAKE_DELAYS_LOG`:
//!   streamed completions with known delays (see `stream.rs`); `FAKE_TTFT_MS_PER_SEQ`
//!   adds that much TTFT per `--max-num-seqs` (a larger batch, a longer step before the
//!   first token: a lever that can break a latency SLO).
//! - `FAKE_FORK=1`: start a worker child process (like vLLM's EngineCore), its pid
//!   in the record as `worker_pid`.
//!
//! The port is bound as each engine binds it (vLLM early with `SO_REUSEPORT`,
//! trtllm-serve early without, SGLang when it listens), and `/health` answers carry an
//! `x-fake-pid` header naming the process that answered.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod stream;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::json;

use args::{Kind, Parsed, fail, parse};

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = parse(&args);
    let kind = parsed.kind;
    let pid = std::process::id();

    let worker = (std::env::var("FAKE_FORK").as_deref() == Ok("1"))
        .then(|| std::process::Command::new("sleep").arg("600").spawn().ok())
        .flatten();
    if let Ok(path) = std::env::var("FAKE_RECORD") {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let record = json!({
            "argv": std::env::args().collect::<Vec<_>>(),
            "env": env,
            "pid": pid,
            "worker_pid": worker.as_ref().map(std::process::Child::id),
        });
        let _ = std::fs::write(path, record.to_string());
    }
    if let Ok(path) = std::env::var("FAKE_LAUNCH_LOG")
        && let Ok(mut log) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        use std::io::Write as _;
        let _ = writeln!(
            log,
            "{}",
            json!({"argv": std::env::args().collect::<Vec<_>>(), "pid": std::process::id()})
        );
    }

    let served = match kind {
        Kind::Vllm | Kind::Sglang => parsed.values.get("--served-model-name").cloned(),
        Kind::Trtllm => parsed.values.get("--served_model_name").cloned(),
    }
    .unwrap_or_else(|| parsed.model.clone());
    let port: u16 = parsed
        .values
        .get("--port")
        .and_then(|p| p.parse().ok())
        .unwrap_or(if kind == Kind::Sglang { 30000 } else { 8000 });
    let host = parsed.values.get("--host").cloned().unwrap_or_else(|| {
        if kind == Kind::Vllm {
            "0.0.0.0".into()
        } else {
            "127.0.0.1".into()
        }
    });

    // The memory fraction, with each engine's default.
    let fraction = match kind {
        Kind::Vllm => parsed
            .values
            .get("--gpu-memory-utilization")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.92),
        Kind::Sglang => parsed
            .values
            .get("--mem-fraction-static")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.88),
        Kind::Trtllm => trt_fraction(&parsed).unwrap_or(0.9),
    };
    let max_len: u64 = ["--max-model-len", "--context-length", "--max_seq_len"]
        .iter()
        .find_map(|f| parsed.values.get(*f))
        .and_then(|v| v.parse().ok())
        .unwrap_or(32768);
    let tokens = (fraction * 500_000.0) as u64;
    if let Some(seqs) = parsed
        .values
        .get("--max-num-seqs")
        .and_then(|v| v.parse::<f64>().ok())
    {
        let _ = stream::MAX_NUM_SEQS.set(seqs);
    }

    // Start-up lines, as the real engines print them.
    match kind {
        Kind::Vllm => {
            println!(
                "(APIServer pid={pid}) INFO 11-29 23:22:03 [api_utils.py:347]  version 0.33.0 model {}",
                parsed.model
            );
            println!(
                "(APIServer pid={pid}) INFO 11-29 23:22:03 [api_utils.py:286] non-default args: {:?}",
                parsed.values
            );
        }
        Kind::Sglang => println!(
            "[2026-11-29 23:22:03] server_args=ServerArgs(model_path='{}', port={port})",
            parsed.model
        ),
        Kind::Trtllm => println!("[TensorRT-LLM] TensorRT LLM version: 1.3.0"),
    }
    // vLLM and trtllm-serve bind before loading the model and listen after; SGLang's
    // uvicorn binds when it starts listening.
    let early = match kind {
        Kind::Vllm | Kind::Trtllm => Some(bind(kind, &host, port)),
        Kind::Sglang => None,
    };
    tokio::time::sleep(Duration::from_secs_f64(env_f64("FAKE_LOAD_SECS").unwrap_or(0.3))).await;
    if let Some(limit) = env_f64("FAKE_OOM_ABOVE")
        && fraction > limit
    {
        match kind {
            Kind::Vllm => {
                eprintln!(
                    "(EngineCore pid={pid}) ERROR 11-29 23:22:09 [core.py:1010] EngineCore failed to start."
                );
                eprintln!(
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 119.70 GiB of which 1.02 GiB is free."
                );
            }
            Kind::Sglang => eprintln!(
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. torch.OutOfMemoryError: CUDA out of memory."
            ),
            Kind::Trtllm => eprintln!(
                "[TensorRT-LLM][ERROR] CUDA runtime error in cudaMalloc: out of memory (cudaErrorMemoryAllocation)"
            ),
        }
        if let Some(mut w) = worker {
            let _ = w.kill();
        }
        std::process::exit(1);
    }
    // Held until the process ends.
    let _hog = match (env_f64("FAKE_HOG_ABOVE"), std::env::var("FAKE_HOG_BYTES")) {
        (Some(limit), Ok(bytes)) if fraction > limit => {
            let until = std::env::var("FAKE_HOG_UNTIL").ok().and_then(|u| u.parse().ok());
            hog(bytes.parse().unwrap_or(0), until).await
        }
        _ => Vec::new(),
    };
    let load = env_f64("FAKE_LOAD_SECS").unwrap_or(0.3);
    if kind == Kind::Vllm {
        // vLLM's format (`vllm/model_executor/model_loader/default_loader.py`).
        println!(
            "(Worker pid={pid}) INFO 11-29 23:22:17 [default_loader.py:501] Loading weights took {load:.2} seconds"
        );
    }
    if kind == Kind::Vllm
        && let Some(compile) = env_f64("FAKE_COMPILE_SECS")
    {
        compile_graphs(pid, compile, max_len).await;
    }
    match kind {
        Kind::Vllm => println!(
            "(EngineCore pid={pid}) INFO 11-29 23:22:19 [kv_cache_utils.py:2327] GPU KV cache size: {tokens} tokens, Maximum concurrency for {max_len} tokens per request: {:.2}x",
            tokens as f64 / max_len as f64
        ),
        Kind::Sglang => println!(
            "max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=16, context_len={max_len}, available_gpu_mem=12.10 GB"
        ),
        Kind::Trtllm => println!(
            "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 1.01 GiB for max tokens in paged KV cache ({tokens})."
        ),
    }
    if kind == Kind::Vllm {
        // vLLM's format (`vllm/v1/engine/core.py`, `_initialize_kv_caches`).
        println!(
            "(EngineCore pid={pid}) INFO 11-29 23:22:22 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.12 seconds"
        );
    }

    let warming = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(kind == Kind::Sglang));
    let served_for_models = served.clone();
    let served_for_completions = served.clone();
    let served_for_chat = served.clone();
    let root = parsed.model.clone();
    let ready_flag = warming.clone();
    let app = Router::new()
        .route(
            "/health",
            get(move || {
                let warming = ready_flag.clone();
                // Which process answered, for tests of instance swaps.
                let who = [("x-fake-pid", std::process::id().to_string())];
                async move {
                    if warming.load(std::sync::atomic::Ordering::Relaxed) {
                        (StatusCode::SERVICE_UNAVAILABLE, who)
                    } else {
                        (StatusCode::OK, who)
                    }
                }
            }),
        )
        .route(
            "/v1/models",
            get(move || {
                let id = served_for_models.clone();
                let root = root.clone();
                async move { axum::Json(json!({"object": "list", "data": [{"id": id, "object": "model", "root": root, "max_model_len": max_len}]})) }
            }),
        )
        .route("/metrics", get(|| async { "vllm:num_requests_running{model_name=\"fake\"} 0.0\n" }))
        .route(
            "/v1/completions",
            axum::routing::post(move |body: axum::Json<serde_json::Value>| {
                let model = served_for_completions.clone();
                async move { stream::complete(&model, &body, false) }
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |body: axum::Json<serde_json::Value>| {
                let model = served_for_chat.clone();
                async move { stream::complete(&model, &body, true) }
            }),
        );
    let socket = early.unwrap_or_else(|| bind(kind, &host, port));
    let listener = socket.listen(1024).unwrap_or_else(|e| {
        eprintln!("OSError: listen on ('{host}', {port}): {e}");
        std::process::exit(1);
    });
    match kind {
        Kind::Vllm => println!(
            "(APIServer pid={pid}) INFO 11-29 23:22:23 [entry.py:140] Starting vLLM server on http://{host}:{port}"
        ),
        Kind::Sglang => println!("INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
        Kind::Trtllm => println!("INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
    }
    if kind == Kind::Sglang {
        let warming = warming.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(
                env_f64("FAKE_WARMUP_SECS").unwrap_or(0.3),
            ))
            .await;
            warming.store(false, std::sync::atomic::Ordering::Relaxed);
            println!("The server is fired up and ready to roll!");
        });
    }
    println!("INFO:     Application startup complete.");

    if let Some(after) = env_f64("FAKE_CRASH_AFTER")
        && should_crash()
    {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(after)).await;
            eprintln!(
                "RuntimeError: Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."
            );
            std::process::exit(
                std::env::var("FAKE_CRASH_CODE")
                    .ok()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(3),
            );
        });
    }
    let ignore_term = std::env::var("FAKE_IGNORE_SIGTERM").as_deref() == Ok("1");
    let shutdown = async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            return std::future::pending().await;
        };
        loop {
            term.recv().await;
            if ignore_term {
                println!("(APIServer) received SIGTERM; ignoring it");
                continue;
            }
            println!("INFO:     Shutting down");
            return;
        }
    };
    // uvicorn (vLLM, SGLang, trtllm-serve) sets TCP_NODELAY on its connections.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        let _ = stream.set_nodelay(true);
    });
    let _ = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    if let Some(mut w) = worker {
        let _ = w.kill();
        let _ = w.wait();
    }
}

/// Binds the listening address the way each engine does: vLLM with `SO_REUSEADDR` and
/// `SO_REUSEPORT` (`api_server.py` `create_server_socket`), SGLang's uvicorn with
/// `SO_REUSEADDR`, trtllm-serve with neither; exits with the engine's message when the
/// port is taken.
fn bind(kind: Kind, host: &str, port: u16) -> tokio::net::TcpSocket {
    let ip: std::net::IpAddr = if host == "0.0.0.0" || host == "localhost" {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        host.parse().unwrap_or(std::net::Ipv4Addr::LOCALHOST.into())
    };
    let socket = if ip.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    };
    let bound = socket.and_then(|s| {
        if kind != Kind::Trtllm {
            s.set_reuseaddr(true)?;
        }
        if kind == Kind::Vllm {
            s.set_reuseport(true)?;
        }
        s.bind((ip, port).into())?;
        Ok(s)
    });
    bound.unwrap_or_else(|e| {
        match kind {
            Kind::Trtllm => eprintln!("RuntimeError: Failed to bind socket to {host}:{port}: {e}"),
            _ => eprintln!(
                "OSError: [Errno 98] error while attempting to bind on address ('{host}', {port}): {e}"
            ),
        }
        std::process::exit(1);
    })
}

/// TensorRT-LLM's fraction: the YAML options file wins over the flag.
fn trt_fraction(parsed: &Parsed) -> Option<f64> {
    let file = parsed
        .values
        .get("--config")
        .or_else(|| parsed.values.get("--extra_llm_api_options"));
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| fail(Kind::Trtllm, &format!("cannot read {path}: {e}")));
        let yaml: serde_json::Value = serde_yaml_ng::from_str(&text)
            .unwrap_or_else(|e| fail(Kind::Trtllm, &format!("invalid YAML in {path}: {e}")));
        if let Some(f) = yaml["kv_cache_config"]["free_gpu_memory_fraction"].as_f64() {
            return Some(f);
        }
    }
    parsed
        .values
        .get("--free_gpu_memory_fraction")
        .and_then(|v| v.parse().ok())
}

/// `bytes` of host memory, allocated and touched 64 MiB at a time, every 10 ms.
async fn hog(bytes: u64, until: Option<u64>) -> Vec<Vec<u8>> {
    const CHUNK: usize = 64 << 20;
    let mut held = Vec::new();
    let mut left = bytes as usize;
    while left > 0 && until.is_none_or(|u| mem_available().is_none_or(|a| a >= u)) {
        let n = left.min(CHUNK);
        // Non-zero bytes: every page is written, not left to the zero page.
        held.push(vec![1u8; n]);
        left -= n;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (the kernel writes kB).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// vLLM's torch.compile step and its cache (`vllm/compilation/backends.py`): graphs
/// compiled once are written under `$VLLM_CACHE_ROOT/torch_compile_cache/` and read
/// back by the next start in a fraction of the time; `monitor.py` then logs the total.
/// Without `VLLM_CACHE_ROOT` every start compiles.
async fn compile_graphs(pid: u32, seconds: f64, max_len: u64) {
    let graph = std::env::var_os("VLLM_CACHE_ROOT")
        .map(|root| std::path::PathBuf::from(root).join("torch_compile_cache/fake/rank_0_0/backbone/graph"));
    let took = match &graph {
        Some(graph) if graph.is_file() => {
            let took = seconds / 10.0;
            tokio::time::sleep(Duration::from_secs_f64(took)).await;
            println!(
                "(EngineCore pid={pid}) INFO 11-29 23:22:18 [backends.py:252] Directly load the compiled graph(s) for compile range (1, {max_len}) from the cache, took {took:.3} s"
            );
            took
        }
        _ => {
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
            if let Some(graph) = &graph {
                let written = graph
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(graph, b"compiled"));
                if let Err(e) = written {
                    eprintln!("fake engine: cannot write {}: {e}", graph.display());
                    std::process::exit(1);
                }
            }
            println!(
                "(EngineCore pid={pid}) INFO 11-29 23:22:18 [backends.py:283] Compiling a graph for compile range (1, {max_len}) takes {seconds:.2} s"
            );
            seconds
        }
    };
    println!(
        "(EngineCore pid={pid}) INFO 11-29 23:22:18 [monitor.py:34] torch.compile takes {took:.2} s in total"
    );
}

/// With `FAKE_CRASH_TIMES=N` and `FAKE_COUNTER=FILE`, only the first N launches crash.
fn should_crash() -> bool {
    let (Some(times), Ok(counter)) = (
        std::env::var("FAKE_CRASH_TIMES")
            .ok()
            .and_then(|t| t.parse::<u32>().ok()),
        std::env::var("FAKE_COUNTER"),
    ) else {
        return true;
    };
    let launches: u32 = std::fs::read_to_string(&counter)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
        + 1;
    let _ = std::fs::write(&counter, launches.to_string());
    launches <= times
}

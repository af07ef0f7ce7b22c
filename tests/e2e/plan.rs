//! `sous plan` on the test model, read from the Hub mirror by range requests: the
//! native engine's plan is the line the engine logs at start-up (and `sous serve`
//! shows both), the vLLM CPU-backend plan is the line a real vLLM 0.32 logged for the
//! same budget, a planned NVFP4 checkpoint weighs what the quantizer writes, and bad
//! input says what to pass.

use std::path::Path;

use serde_json::Value;
use sous_engine::recipe::EngineKind;
use sous_engine::serve::logscan;

use crate::util::{Mirror, Running, free_port, root, run, smollm2, sous};

const SMOLLM2: &str = "recipes/local/smollm2-135m.toml";
const SMOLLM2_NVFP4: &str = "recipes/local/smollm2-135m-nvfp4.toml";

/// `sous plan ARGS` against `mirror` with an empty Hub cache.
fn plan(mirror: &Mirror, args: &[&str]) -> (i32, String, String) {
    let cache = tempfile::tempdir().expect("tempdir");
    run(sous()
        .arg("plan")
        .args(args)
        .env("HF_ENDPOINT", &mirror.url)
        .env("HF_HUB_CACHE", cache.path())
        .env_remove("HF_HUB_OFFLINE"))
}

fn plan_json(mirror: &Mirror, args: &[&str]) -> Value {
    let (code, stdout, stderr) = plan(mirror, &[args, &["--json"]].concat());
    assert_eq!(code, 0, "sous plan {args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn mirror() -> Option<Mirror> {
    smollm2().map(|_| Mirror::start(&root().join("target/models"), &[], &[]))
}

#[test]
fn the_native_plan_is_the_line_the_engine_logs_and_serve_shows_both() {
    let Some(mirror) = mirror() else { return };
    let predicted = plan_json(&mirror, &["--recipe", SMOLLM2]);
    // 30 layers × 2 × 3 KV heads × 64 × 4 bytes (f32) = 46,080 B per token; 1 GiB /
    // (46,080 × 16) = 1,456 blocks = 23,296 tokens; 8,192-token requests: 2.84x.
    assert_eq!(predicted["kv_tokens"], 23_296);
    assert_eq!(predicted["engine"], "native");
    // The weights were never downloaded: their file was only asked for header ranges.
    let shard: Vec<String> = mirror
        .requests()
        .into_iter()
        .filter(|r| r.contains("model.safetensors"))
        .collect();
    assert!(
        !shard.is_empty() && shard.iter().all(|r| r.contains("206")),
        "{shard:?}"
    );

    let _cpu = crate::util::cpu_exclusive();
    let work = tempfile::tempdir().expect("tempdir");
    let port = free_port().to_string();
    let hub = work.path().join("hub");
    let state = work.path().join("state");
    let mut serving = Running::start(
        &[
            "serve",
            "--recipe",
            SMOLLM2,
            "--set",
            &format!("server.port={port}"),
        ],
        &[
            ("HF_ENDPOINT", mirror.url.as_str()),
            ("HF_HUB_CACHE", hub.to_str().expect("utf-8")),
            ("SOUS_STATE_DIR", state.to_str().expect("utf-8")),
            (
                "SOUS_CACHE_DIR",
                work.path().join("cache").to_str().expect("utf-8"),
            ),
        ],
    );
    assert!(
        serving.wait_for("ready", std::time::Duration::from_secs(120)),
        "{}",
        serving.stderr()
    );
    let log = serving.stderr();
    let logged = log
        .lines()
        .find_map(|l| logscan::capacity(EngineKind::Native, l))
        .unwrap_or_else(|| panic!("no capacity line in {log}"));
    assert_eq!(Some(logged.tokens), predicted["kv_tokens"].as_u64(), "{log}");
    let concurrency = predicted["max_concurrency"].as_f64().expect("f64");
    assert!(
        (logged.max_concurrency.expect("concurrency") - concurrency).abs() < 0.01,
        "{log}"
    );
    assert!(log.contains("KV cache 23296 tokens (plan: 23296)"), "{log}");
    assert!(!log.contains("`sous plan` predicted"), "{log}");
    serving.signal("TERM");
    assert_eq!(serving.wait(std::time::Duration::from_secs(30)), Some(0));
}

#[test]
fn the_vllm_cpu_plan_is_what_a_real_vllm_logged() {
    let Some(mirror) = mirror() else { return };
    // The fixture: vLLM 0.32.0's CPU build serving SmolLM2 with `--dtype float32
    // --max-model-len 2048` and VLLM_CPU_KVCACHE_SPACE=2 (GiB).
    let fixture = std::fs::read_to_string(root().join("tests/fixtures/vllm-logs/vllm-0.32-cpu-serve.log"))
        .expect("fixture");
    let logged = fixture
        .lines()
        .find_map(|l| logscan::capacity(EngineKind::Vllm, l))
        .expect("the capacity line");
    let predicted = plan_json(
        &mirror,
        &[
            "--recipe",
            SMOLLM2,
            "--gpu",
            "cpu",
            "--set",
            "engine.kind=vllm",
            "--set",
            "serving.dtype=float32",
            "--set",
            "serving.max_model_len=2048",
            "--set",
            "memory.kv_cache_bytes=2GiB",
        ],
    );
    // 2 × 3 × 64 × 4 = 1,536 B per token per layer; a 128-token page is 196,608 B;
    // 2 GiB / 196,608 / 30 layers = 364 blocks = 46,592 tokens; 2,048 tokens need 16
    // blocks: 22.75x.
    assert_eq!(predicted["block_size"], 128);
    assert_eq!(predicted["kv_tokens"].as_u64(), Some(logged.tokens));
    assert_eq!(predicted["max_concurrency"].as_f64(), logged.max_concurrency);
}

/// The bytes of tensor data in a checkpoint's safetensors headers.
fn checkpoint_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        if !entry.path().to_string_lossy().ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(entry.path()).expect("shard");
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
        for (name, info) in header.as_object().expect("object") {
            if name == "__metadata__" {
                continue;
            }
            let offsets = info["data_offsets"].as_array().expect("offsets");
            total += offsets[1].as_u64().expect("end") - offsets[0].as_u64().expect("start");
        }
    }
    total
}

#[test]
fn a_planned_quantization_weighs_what_the_quantizer_writes() {
    let Some(model) = smollm2() else { return };
    let Some(mirror) = mirror() else { return };
    let predicted = plan_json(&mirror, &["--recipe", SMOLLM2_NVFP4]);
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("out");
    let (code, _, stderr) = run(sous().args([
        "quantize",
        model.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
        "--quiet",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(predicted["weight_bytes"].as_u64(), Some(checkpoint_bytes(&out)));
    // And the unquantized model weighs its headers.
    let plain = plan_json(&mirror, &["--recipe", SMOLLM2]);
    assert_eq!(plain["weight_bytes"].as_u64(), Some(checkpoint_bytes(&model)));
}

#[test]
fn the_plan_reads_as_a_table_and_says_what_to_do_when_it_does_not_fit() {
    let Some(mirror) = mirror() else { return };
    let (code, table, stderr) = plan(&mirror, &["--recipe", SMOLLM2]);
    assert_eq!(code, 0, "{stderr}");
    let mut settings = insta::Settings::clone_current();
    // This machine's RAM and the mirror's commit.
    settings.add_filter(
        r"this machine's CPU and RAM, [0-9.]+ GiB",
        "this machine's CPU and RAM, RAM",
    );
    settings.add_filter(r"@[0-9a-f]{12}", "@COMMIT");
    settings.bind(|| insta::assert_snapshot!("smollm2-native", table));

    // 32K tokens do not fit in 64 MiB: the largest length that does is named.
    let (code, out, _) = plan(
        &mirror,
        &[
            "--recipe",
            SMOLLM2,
            "--set",
            "engine.kind=vllm",
            "--gpu",
            "cpu",
            "--set",
            "memory.kv_cache_bytes=64MiB",
            "--set",
            "serving.max_model_len=32768",
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Does not fit"), "{out}");
    let advised: u64 = out
        .split("set `serving.max_model_len` to ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no length advised: {out}"));
    let fits = |len: u64| {
        let (code, _, _) = plan(
            &mirror,
            &[
                "--recipe",
                SMOLLM2,
                "--set",
                "engine.kind=vllm",
                "--gpu",
                "cpu",
                "--set",
                "memory.kv_cache_bytes=64MiB",
                "--set",
                &format!("serving.max_model_len={len}"),
            ],
        );
        code == 0
    };
    assert!(fits(advised), "the advised {advised} does not fit");
    assert!(!fits(advised + 128), "{advised} + 128 fits too: not the largest");
}

#[test]
fn what_the_plan_cannot_know_is_asked_for() {
    let Some(mirror) = mirror() else { return };
    let (code, _, stderr) = plan(&mirror, &["--recipe", SMOLLM2, "--gpu", "h300"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("sous knows no GPU called `h300`"), "{stderr}");
    assert!(
        stderr.contains("did you mean `h200`?") && stderr.contains("--gpu-memory"),
        "{stderr}"
    );
    let (code, _, stderr) = plan(&mirror, &["--recipe", SMOLLM2, "--set", "engine.kind=vllm"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("which machine?") && stderr.contains("--gpu NAME"),
        "{stderr}"
    );
    let (code, _, stderr) = plan(
        &mirror,
        &[
            "--recipe",
            SMOLLM2,
            "--set",
            "engine.kind=sglang",
            "--gpu",
            "h100",
        ],
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot plan for SGLang yet"), "{stderr}");
    let offline = tempfile::tempdir().expect("tempdir");
    let (code, _, stderr) = run(sous()
        .args(["plan", "--recipe", SMOLLM2])
        .env("HF_HUB_CACHE", offline.path())
        .env("HF_HUB_OFFLINE", "1"));
    assert_eq!(code, 1);
    assert!(
        stderr.contains("not on this machine and the Hub is offline"),
        "{stderr}"
    );
    assert!(stderr.contains("sous pull --recipe"), "{stderr}");
}

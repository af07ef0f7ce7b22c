//! `sous plan` on the test model, read from the Hub mirror by range requests: the
//! native engine's plan is the line the engine logs at start-up (and `sous serve`
//! shows both), the vLLM CPU-backend plan is the line a real vLLM 0.32 logged for the
//! same budget, a planned NVFP4 checkpoint weighs what the quantizer writes (less what a
//! Q8_0 embedding saves), and bad input says what to pass.

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
    // 30 layers × 2 × 3 KV heads × 64 × 2 bytes (the recipe's bf16 cache) = 23,040 B per
    // token; 1 GiB / (23,040 × 16) = 2,912 blocks = 46,592 tokens; 8,192-token requests:
    // 5.69x.
    assert_eq!(predicted["kv_tokens"], 46_592);
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
    assert!(log.contains("KV cache 46592 tokens (plan: 46592)"), "{log}");
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

    // The budget as the real run gave it, and as vLLM's docs give it: the variable in
    // `[env]`, with no `memory.kv_cache_bytes`. The plan counts what the engine reads.
    let work = tempfile::tempdir().expect("tempdir");
    let recipe = work.path().join("vllm-cpu.toml");
    std::fs::write(
        &recipe,
        "name = \"smollm2-vllm-cpu\"\n[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n\
         [engine]\nkind = \"vllm\"\nversion = \"0.32.0\"\n[serving]\ndtype = \"float32\"\nmax_model_len = 2048\n\
         [env]\nVLLM_CPU_KVCACHE_SPACE = \"2\"\n",
    )
    .expect("recipe");
    let from_env = plan_json(
        &mirror,
        &["--recipe", recipe.to_str().expect("utf-8"), "--gpu", "cpu"],
    );
    assert_eq!(from_env["kv_tokens"].as_u64(), Some(logged.tokens), "{from_env}");
    assert_eq!(from_env["budget"]["exact"], true);
    assert!(
        from_env["budget"]["steps"][0]
            .to_string()
            .contains("VLLM_CPU_KVCACHE_SPACE"),
        "{from_env}"
    );
    // What `sous serve` would run passes the same variable.
    let (code, dry, stderr) = run(sous()
        .args(["serve", "--dry-run", "--json", "--recipe"])
        .arg(&recipe));
    assert_eq!(code, 0, "{stderr}");
    let dry: Value = serde_json::from_str(&dry).expect("json");
    assert_eq!(dry["env"]["VLLM_CPU_KVCACHE_SPACE"], "2");
    // Unset on vLLM 0.20 and later: the utilization's share of RAM, an estimate.
    let auto = plan_json(
        &mirror,
        &[
            "--recipe",
            recipe.to_str().expect("utf-8"),
            "--gpu",
            "cpu",
            "--set",
            "env.VLLM_CPU_KVCACHE_SPACE=4",
        ],
    );
    assert_eq!(auto["kv_tokens"].as_u64(), Some(2 * logged.tokens), "{auto}");
}

/// Weights and a fixed KV budget that do not fit the card: the verdict names them and
/// by how much, and the ways out lead the advice (a fixed budget once hid the weights).
#[test]
fn weights_and_a_fixed_budget_larger_than_the_card_do_not_fit() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = model_dir(&work.path().join("qwen3-32b"), "qwen3-32b.json", true);
    let path = format!("model.path={model}");
    let args = [
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--gpu",
        "h100",
        "--set",
        &path,
        "--set",
        "serving.max_model_len=32768",
    ];
    let (code, out, stderr) = offline_plan(&args);
    assert_eq!(code, 1, "{out}\n{stderr}");
    for line in [
        "Does not fit: the weights per GPU 61.",
        "the fixed KV budget per GPU 14.50 GiB need",
        "more than the 74.51 GiB of one GPU.",
        "`serving.tensor_parallel = 2`",
        "`memory.kv_cache_bytes` of at most",
        "nvfp4a16",
    ] {
        assert!(out.contains(line), "no {line:?} in\n{out}");
    }
    let (code, json, _) = offline_plan(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 1);
    let json: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["fits"], false);
    assert!(json["shortfall"]["needed_bytes"].as_u64() > json["shortfall"]["memory_bytes"].as_u64());
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
    // The recipe holds the tied bf16 embedding as Q8_0 (`memory.embedding_dtype`): a
    // byte per value and an f16 scale per 32 instead of two bytes per value.
    let config: Value =
        serde_json::from_slice(&std::fs::read(model.join("config.json")).expect("config")).expect("JSON");
    let values =
        config["vocab_size"].as_u64().expect("vocab") * config["hidden_size"].as_u64().expect("hidden");
    let saved = 2 * values - (values + values / 32 * 2);
    assert_eq!(saved, 26_542_080);
    assert_eq!(
        predicted["weight_bytes"].as_u64(),
        Some(checkpoint_bytes(&out) - saved)
    );
    let stored = plan_json(
        &mirror,
        &["--recipe", SMOLLM2_NVFP4, "--set", "memory.embedding_dtype=auto"],
    );
    assert_eq!(stored["weight_bytes"].as_u64(), Some(checkpoint_bytes(&out)));
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
    // The ceiling this machine's read bandwidth, measured by the plan, gives.
    settings.add_filter(
        r"at most \d+ tok/s single stream at a full context \(read bandwidth [0-9.]+ GB/s",
        "at most N tok/s single stream at a full context (read bandwidth B GB/s",
    );
    settings.bind(|| insta::assert_snapshot!("smollm2-native", table));
    // The JSON, whose fields docs/plan.md documents.
    let (code, json, stderr) = plan(&mirror, &["--recipe", SMOLLM2_NVFP4, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r#""memory_bytes": \d+"#, r#""memory_bytes": RAM"#);
    settings.add_filter(r#""bandwidth_gbs": [0-9.e+-]+"#, r#""bandwidth_gbs": B"#);
    settings.add_filter(
        r#""decode_ceiling_tok_s": [0-9.e+-]+"#,
        r#""decode_ceiling_tok_s": N"#,
    );
    settings.add_filter(r"@[0-9a-f]{12}", "@COMMIT");
    settings.bind(|| insta::assert_snapshot!("smollm2-nvfp4-json", json));

    // 32K tokens do not fit in 64 MiB: the largest length that does is named.
    let at_length = |len: u64| {
        let length = format!("serving.max_model_len={len}");
        plan(
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
                &length,
            ],
        )
    };
    let (code, out, _) = at_length(32_768);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Does not fit"), "{out}");
    let advised: u64 = out
        .split("set `serving.max_model_len` to ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no length advised: {out}"));
    let fits = |len: u64| at_length(len).0 == 0;
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
    if !sous_kernels::cuda::driver_present() {
        assert!(
            stderr.contains("this one's GPU cannot be asked (no CUDA driver (libcuda.so) on this machine)"),
            "{stderr}"
        );
    }
    // SGLang's pool: 0.88 (assumed) of 80 GB less 0.25 GiB of weights and 1 GiB; a
    // token is 30 × 2 × 3 × 64 × 2 = 23,040 B.
    let work = tempfile::tempdir().expect("tempdir");
    let sglang_recipe = work.path().join("sglang.toml");
    std::fs::write(
        &sglang_recipe,
        "[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n[engine]\nkind = \"sglang\"\n[serving]\nmax_model_len = 8192\n",
    )
    .expect("recipe");
    let sglang_path = sglang_recipe.to_str().expect("utf-8");
    let sglang = plan_json(&mirror, &["--recipe", sglang_path, "--gpu", "h100"]);
    let expected = ((80e9 * 0.88 - sglang["weight_bytes"].as_f64().expect("weights") - (1u64 << 30) as f64)
        as u64)
        / 23_040;
    assert_eq!(sglang["kv_tokens"].as_u64(), Some(expected), "{sglang}");
    // TensorRT-LLM: 0.9 of what the weights leave, in blocks of 32 tokens.
    let trtllm_recipe = work.path().join("trtllm.toml");
    std::fs::write(
        &trtllm_recipe,
        "[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n[engine]\nkind = \"trtllm\"\n[serving]\nmax_model_len = 8192\n",
    )
    .expect("recipe");
    let trtllm = plan_json(
        &mirror,
        &[
            "--recipe",
            trtllm_recipe.to_str().expect("utf-8"),
            "--gpu",
            "h100",
        ],
    );
    assert_eq!(trtllm["block_size"], 32);
    let free = 80_000_000_000 - trtllm["weight_bytes"].as_u64().expect("weights") - (1 << 30);
    assert_eq!(
        trtllm["kv_tokens"].as_u64(),
        Some((free as f64 * 0.9) as u64 / 23_040 / 32 * 32),
        "{trtllm}"
    );
    // A hybrid model is not modelled for SGLang: said, not guessed.
    let next = model_dir(&work.path().join("next"), "qwen3-next-80b-a3b.json", false);
    let (code, _, stderr) = offline_plan(&[
        "--recipe",
        sglang_path,
        "--gpu",
        "h200",
        "--set",
        &format!("model.path={next}"),
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cannot plan for SGLang with sliding-window or linear-attention layers yet"),
        "{stderr}"
    );
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

/// A model directory with `config.json` from the fixtures and, with `weights`, a
/// safetensors file whose header describes a dense Qwen3-style checkpoint of that shape
/// in bf16 (the planner reads headers only, so the data is not written).
fn model_dir(dir: &Path, config: &str, weights: bool) -> String {
    let text = std::fs::read_to_string(root().join("tests/fixtures/plan").join(config)).expect("fixture");
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("config.json"), &text).expect("config");
    if weights {
        let c: Value = serde_json::from_str(&text).expect("json");
        let n = |k: &str| c[k].as_u64().expect(k) as usize;
        let (h, i, v, layers) = (
            n("hidden_size"),
            n("intermediate_size"),
            n("vocab_size"),
            n("num_hidden_layers"),
        );
        let (heads, kv, d) = (n("num_attention_heads"), n("num_key_value_heads"), n("head_dim"));
        let mut tensors: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
        for l in 0..layers {
            let p = format!("model.layers.{l}");
            for (name, shape) in [
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("self_attn.q_proj.weight", vec![heads * d, h]),
                ("self_attn.k_proj.weight", vec![kv * d, h]),
                ("self_attn.v_proj.weight", vec![kv * d, h]),
                ("self_attn.o_proj.weight", vec![h, heads * d]),
                ("self_attn.q_norm.weight", vec![d]),
                ("self_attn.k_norm.weight", vec![d]),
                ("mlp.gate_proj.weight", vec![i, h]),
                ("mlp.up_proj.weight", vec![i, h]),
                ("mlp.down_proj.weight", vec![h, i]),
            ] {
                tensors.push((format!("{p}.{name}"), shape));
            }
        }
        tensors.push(("model.norm.weight".into(), vec![h]));
        tensors.push(("lm_head.weight".into(), vec![v, h]));
        let mut header = serde_json::Map::new();
        let mut at = 0usize;
        for (name, shape) in tensors {
            let len = shape.iter().product::<usize>() * 2;
            header.insert(
                name,
                serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + len]}),
            );
            at += len;
        }
        let json = Value::Object(header).to_string();
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend(json.as_bytes());
        std::fs::write(dir.join("model.safetensors"), bytes).expect("header");
    }
    dir.to_str().expect("utf-8").to_owned()
}

fn offline_plan(args: &[&str]) -> (i32, String, String) {
    let empty = tempfile::tempdir().expect("tempdir");
    run(sous()
        .arg("plan")
        .args(args)
        .env("HF_HUB_CACHE", empty.path())
        .env("HF_HUB_OFFLINE", "1"))
}

#[test]
fn the_titan_recipe_explains_where_its_kv_budget_goes() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = model_dir(&work.path().join("qwen3-next"), "qwen3-next-80b-a3b.json", false);
    let path = format!("model.path={model}");
    let args = [
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--gpu",
        "rtx-pro-6000",
        "--set",
        &path,
    ];
    let (code, out, stderr) = offline_plan(&args);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "12 attention layers (full): 2,048 B per token each",
        "36 linear-attention layers: a fixed state of 1,097,728 B per request each",
        "attention blocks of 544 tokens, so that one page (1,114,112 B) holds a state",
        "4 group(s) of 12 layers share 12 pools: 15,569,256,448 B / 1,114,112 B / 12 = 1,164 blocks",
        "one request of 524,288 tokens needs 967 blocks in every pool: 1.20 at once",
        "1,164 blocks // 4 group(s) × 544 tokens = 158,304 tokens",
        "631,097 tokens of context at full concurrency",
    ] {
        assert!(out.contains(line), "no {line:?} in\n{out}");
    }
    // The fixed budget makes the KV figure exact even without the weights.
    assert!(
        out.contains("14.50 GiB\n") || out.contains("KV budget     14.50 GiB"),
        "{out}"
    );
    assert!(
        stderr.contains("prefix caching only reuses whole blocks"),
        "{stderr}"
    );
    assert!(stderr.contains("no *.safetensors"), "{stderr}");
}

#[test]
fn the_host_tier_is_counted_and_checked_against_the_hosts_memory() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = model_dir(&work.path().join("qwen3-next"), "qwen3-next-80b-a3b.json", false);
    let path = format!("model.path={model}");
    let titan = |extra: &[&str]| {
        let args = [
            &[
                "--recipe",
                "recipes/titan/qwen3.8-flash-next.toml",
                "--set",
                &path,
                "--set",
                "memory.kv_offload_bytes=100GiB",
            ][..],
            extra,
        ]
        .concat();
        offline_plan(&args)
    };
    let (code, out, stderr) = titan(&["--gpu", "rtx-pro-6000", "--host-memory", "128GiB"]);
    assert_eq!(code, 0, "{stderr}");
    // 100 GiB at the GPU cache's own ratio (158,304 tokens in 14.5 GiB).
    let tokens = (100u64 << 30) as u128 * 158_304 / 15_569_256_448;
    let line = format!(
        "host tier     {} tokens more in 100.00 GiB of host memory",
        thousands(tokens as u64)
    );
    assert!(out.contains(&line), "no {line:?} in\n{out}");
    // 524,288 tokens × 12 layers × 2,048 B.
    assert!(out.contains("is 12.00 GiB to load back"), "{out}");
    assert!(
        out.contains("host memory   100.00 GiB for the host tier per instance, of 128.00 GiB"),
        "{out}"
    );
    let json: Value = serde_json::from_str(&titan(&["--gpu", "rtx-pro-6000", "--json"]).1).expect("json");
    assert_eq!(json["host_tier"]["kv_tokens"].as_u64(), Some(tokens as u64));
    assert_eq!(json["host_tier"]["host_memory"], Value::Null);
    assert!(json["host_tier"]["request_bytes"].as_u64() == Some(524_288 * 12 * 2_048));
    // More than the host has: the plan does not fit, and says what to lower.
    let (code, out, _) = titan(&["--gpu", "rtx-pro-6000", "--host-memory", "64GiB"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("lower `memory.kv_offload_bytes`"), "{out}");
    // Unknown host memory is said; on unified memory the tier adds nothing.
    let (_, _, stderr) = titan(&["--gpu", "rtx-pro-6000"]);
    assert!(stderr.contains("pass `--host-memory SIZE`"), "{stderr}");
    let (_, _, stderr) = titan(&["--gpu", "dgx-spark"]);
    assert!(
        stderr.contains("the host tier is the same memory as the GPU's cache"),
        "{stderr}"
    );
    // Weights the engine keeps on the host leave the GPU's count for the host's.
    let dense = model_dir(&work.path().join("qwen3-32b"), "qwen3-32b.json", true);
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/plan/qwen3-32b.json")).expect("fixture"),
    )
    .expect("json");
    let embed =
        config["vocab_size"].as_u64().expect("vocab") * config["hidden_size"].as_u64().expect("hidden") * 2;
    let plan_of = |extra: &[&str]| {
        let dense_path = format!("model.path={dense}");
        plan_json_offline(
            &[
                &[
                    "--recipe",
                    "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
                    "--gpu",
                    "rtx-pro-6000",
                    "--set",
                    &dense_path,
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let on_gpu = plan_of(&[]);
    let moved = plan_of(&["--set", "memory.host_weights=[\"model.embed_tokens.*\"]"]);
    assert_eq!(moved["host_weight_bytes"].as_u64(), Some(embed));
    assert_eq!(
        moved["weight_bytes"].as_u64(),
        on_gpu["weight_bytes"].as_u64().map(|w| w - embed)
    );
    assert!(on_gpu.get("host_weight_bytes").is_none(), "{on_gpu}");
    let (code, _, stderr) = offline_plan(&[
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
        "--set",
        "memory.host_weights=[\"model.[\"]",
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("is not a tensor-name glob"), "{stderr}");
    // Without the offload, no tier.
    let (_, out, _) = offline_plan(&[
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--set",
        &path,
        "--gpu",
        "rtx-pro-6000",
    ]);
    assert!(!out.contains("host tier"), "{out}");
}

fn plan_json_offline(args: &[&str]) -> Value {
    let (code, out, stderr) = offline_plan(&[args, &["--json"]].concat());
    assert!(code == 0 || code == 1, "{stderr}");
    serde_json::from_str(&out).expect("json")
}

/// `604705` → `604,705`, as the plan prints it.
fn thousands(n: u64) -> String {
    sous_engine::dialect::log::vllm::thousands(n as usize)
}

#[test]
fn on_a_dgx_spark_0_90_of_the_gpu_holds_far_more_than_0_45() {
    // The report's checkpoint is not published; Qwen3-32B's config is the nearest
    // published dense shape, quantized to NVFP4 by the plan as `sous quantize` would.
    let work = tempfile::tempdir().expect("tempdir");
    let model = model_dir(&work.path().join("qwen3-32b"), "qwen3-32b.json", true);
    let plan_of = |recipe: &str, extra: &[&str]| -> Value {
        let path = format!("model.path={model}");
        let mut args = vec![
            "--recipe",
            recipe,
            "--gpu",
            "dgx-spark",
            "--json",
            "--set",
            &path,
            "--set",
            "quantize.scheme=nvfp4a16",
        ];
        args.extend(extra);
        let (code, out, stderr) = offline_plan(&args);
        assert!(code == 0 || code == 1, "{stderr}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {stderr}"))
    };
    let baseline = plan_of("recipes/dgx-spark/qwen3.8-27b-nvfp4-baseline.toml", &[]);
    let tuned = plan_of("recipes/dgx-spark/qwen3.8-27b-nvfp4.toml", &[]);
    let tokens = |p: &Value| p["kv_tokens"].as_u64().expect("tokens");
    // Weights: 32B parameters' linear layers in NVFP4 (about 0.56 B each), the rest bf16.
    let weights = baseline["weight_bytes"].as_u64().expect("weights");
    assert!((15 << 30..25 << 30).contains(&weights), "{weights}");
    // 0.45 → 0.90 more than doubles the cache: the weights and activations come out of
    // the smaller share too.
    assert!(
        tokens(&tuned) > 2 * tokens(&baseline),
        "{} vs {}",
        tokens(&tuned),
        tokens(&baseline)
    );
    assert!(
        baseline["advice"].to_string().contains("gpu_utilization"),
        "{baseline}"
    );
    // fp8 KV (both recipes) against bf16: half the bytes, twice the tokens.
    let bf16 = plan_of(
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
        &["--set", "memory.kv_cache_dtype=auto"],
    );
    let ratio = tokens(&tuned) as f64 / tokens(&bf16) as f64;
    assert!((ratio - 2.0).abs() < 0.01, "{ratio}");
    assert!(
        tuned["warnings"]
            .to_string()
            .contains("shares its memory with the CPU"),
        "{tuned}"
    );
    // The text names the memory as the CPU's too.
    let path = format!("model.path={model}");
    let (code, out, stderr) = offline_plan(&[
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
        "--gpu",
        "dgx-spark",
        "--set",
        &path,
        "--set",
        "quantize.scheme=nvfp4a16",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        out.contains("machine       gb10 (NVIDIA DGX Spark (GB10 Grace Blackwell superchip), 119.21 GiB of unified memory, shared with the CPU and the OS)"),
        "{out}"
    );
    // 65 GB of bf16 weights on a 32 GB GPU: no cache at all, and the ways out (two
    // GPUs would still hold 30.5 GiB of weights each: four).
    let path = format!("model.path={model}");
    let (code, out, _) = offline_plan(&[
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
        "--gpu",
        "rtx-5090",
        "--set",
        &path,
    ]);
    assert_eq!(code, 1, "{out}");
    for fix in [
        "Does not fit",
        "[quantize] scheme",
        "serving.tensor_parallel = 4",
        "towards 0.95",
    ] {
        assert!(out.contains(fix), "no {fix:?} in {out}");
    }
}

/// Planned for this machine, the memory fraction is checked against what the host has
/// available now, as `sous serve` checks it before a start: the native engine's
/// fraction is of the host's memory.
#[test]
fn the_fraction_is_checked_against_the_memory_there_is_now() {
    let Some(mirror) = mirror() else { return };
    let (code, stdout, stderr) = plan(
        &mirror,
        &[
            "--recipe",
            SMOLLM2,
            "--set",
            "memory.gpu_utilization=0.01",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let p = &v["preflight"];
    assert_eq!(p["fraction"], 0.01);
    assert_eq!(p["fits"], true, "{p}");
    assert_eq!(p["pool"]["whose"], "this host's");
    let total = p["pool"]["total_bytes"].as_u64().expect("total");
    assert_eq!(
        p["asks_bytes"].as_u64(),
        Some((total as f64 * 0.01).ceil() as u64)
    );
    assert_eq!(v["devices"], serde_json::json!([]));
    // All of the host's memory is never available: `sous serve` would refuse, and so
    // does the plan, saying why.
    let (code, stdout, stderr) = plan(
        &mirror,
        &["--recipe", SMOLLM2, "--set", "memory.gpu_utilization=1.0"],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("memory now"))
        .unwrap_or_else(|| panic!("no preflight line: {stdout}"));
    assert!(
        line.contains("1 asks for")
            && line.contains("of this host's")
            && line.ends_with("does not fit, and no `memory.oom_fallback` value does"),
        "{line}"
    );
    // Planned for another machine, this one's memory is not asked.
    let (_, stdout, _) = plan(&mirror, &["--recipe", SMOLLM2, "--gpu", "h100", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert!(v["preflight"].is_null(), "{}", v["preflight"]);
}

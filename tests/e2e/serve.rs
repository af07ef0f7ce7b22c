//! `sous serve --dry-run`: the shipped recipes render, flag for flag, the command lines
//! of the DGX Spark and Titán field reports (`docs/field-reports.md`).

use serde_json::Value;
use sous_engine::launch::caches;
use sous_engine::recipe::EngineKind;

use crate::util::{run, sous};

fn dry_run_json(args: &[&str]) -> (Value, String) {
    let mut cmd = sous();
    cmd.args(["serve", "--dry-run", "--json"]).args(args);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    (serde_json::from_str(&stdout).expect("JSON on stdout"), stderr)
}

/// The launch's environment without the compile-cache variables every GPU engine is
/// given (`serve_run` tests those): what the recipe itself sets.
fn recipe_env(launch: &Value) -> Value {
    let cache_vars: Vec<&str> = [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Trtllm]
        .into_iter()
        .flat_map(|kind| caches::variables(kind, std::path::Path::new("/")))
        .map(|(name, _)| name)
        .collect();
    let mut env = launch["env"].as_object().cloned().unwrap_or_default();
    env.retain(|name, _| !cache_vars.contains(&name.as_str()));
    Value::Object(env)
}

fn argv(launch: &Value) -> Vec<String> {
    launch["argv"]
        .as_array()
        .expect("argv array")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect()
}

#[test]
fn dgx_spark_tuned_recipe_renders_the_reports_command_line() {
    let (launch, stderr) = dry_run_json(&["--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml"]);
    let expected = [
        "vllm",
        "serve",
        // The report's clients call the model by this path: no --served-model-name.
        "/models/qwen3.8-27b-inferact-nvfp4",
        "--max-model-len",
        "262144",
        "--gpu-memory-utilization",
        "0.9",
        "--kv-cache-dtype",
        "fp8",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--max-num-seqs",
        "4",
        "--speculative-config",
        r#"{"method":"qwen3_next_mtp","num_speculative_tokens":2}"#,
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "qwen3_coder",
        "--enable-auto-tool-choice",
    ];
    assert_eq!(argv(&launch), expected);
    assert_eq!(recipe_env(&launch), serde_json::json!({}));
    assert_eq!(launch["version"], "0.27.1");
    assert_eq!(launch["image"], "vllm/vllm-openai:v0.27.1");
    assert!(stderr.is_empty(), "no warnings expected: {stderr}");
}

#[test]
fn dgx_spark_baseline_differs_only_by_the_three_levers() {
    let (tuned, _) = dry_run_json(&["--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml"]);
    let (base, _) = dry_run_json(&["--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4-baseline.toml"]);
    let base = argv(&base);
    assert!(base.windows(2).any(|w| w == ["--gpu-memory-utilization", "0.45"]));
    assert!(
        !base
            .iter()
            .any(|a| a.contains("prefix-caching") || a == "--speculative-config")
    );
    let mut tuned: Vec<String> = argv(&tuned);
    // Remove the three levers: what remains is the baseline with 0.9 in place of 0.45.
    let spec = tuned
        .iter()
        .position(|a| a == "--speculative-config")
        .expect("MTP");
    tuned.drain(spec..spec + 2);
    tuned.retain(|a| a != "--enable-prefix-caching");
    let util = tuned.iter().position(|a| a == "0.9").expect("utilization");
    tuned[util] = "0.45".into();
    assert_eq!(tuned, base);
}

#[test]
fn titan_recipe_renders_the_production_command_line() {
    let (launch, stderr) = dry_run_json(&["--recipe", "recipes/titan/qwen3.8-flash-next.toml"]);
    let expected = [
        "vllm",
        "serve",
        "/model",
        "--served-model-name",
        "qwen3.8-flash-next",
        "--max-model-len",
        "524288",
        "--gpu-memory-utilization",
        "0.97",
        "--kv-cache-memory-bytes",
        "15569256448",
        "--enable-prefix-caching",
        "--max-num-seqs",
        "16",
        "--tensor-parallel-size",
        "1",
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "qwen3_coder",
        "--enable-auto-tool-choice",
    ];
    assert_eq!(argv(&launch), expected);
    assert_eq!(
        recipe_env(&launch),
        serde_json::json!({"VLLM_PLE_CPU_OFFLOAD": "1", "VLLM_PLE_OFFLOAD_READY_TIMEOUT": "1800"})
    );
    assert!(
        stderr.contains("vLLM ignores `memory.gpu_utilization` (0.97)"),
        "{stderr}"
    );
    assert!(stderr.contains("rendered for vLLM 0.33.0"), "{stderr}");
}

#[test]
fn shell_output_is_quoted_and_runnable() {
    // A fixed cache directory (a dry run creates nothing); the GPU part of its key is
    // this machine's, so it is filtered.
    let (code, stdout, _) = run(sous().env("SOUS_CACHE_DIR", "/cache").args([
        "serve",
        "--dry-run",
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
    ]));
    assert_eq!(code, 0);
    insta::with_settings!({filters => vec![(r"(/cache/engines/[^/]+)/[^/]+/", "$1/[GPU]/")]}, {
        insta::assert_snapshot!(stdout);
    });
    // The script runs: with `vllm` defined as a function that prints its arguments and
    // one of the variables set before it, the shell reads back the JSON argv and env.
    let (_, json, _) = run(sous().args([
        "serve",
        "--dry-run",
        "--json",
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
    ]));
    let launch: Value = serde_json::from_str(&json).expect("json");
    let script = format!("vllm() {{ printf '%s\\n' \"PLE=$VLLM_PLE_CPU_OFFLOAD\" vllm \"$@\"; }}\n{stdout}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh runs");
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let mut expected = vec!["PLE=1".to_owned()];
    expected.extend(argv(&launch));
    assert_eq!(words, expected);
}

#[test]
fn speculative_json_survives_shell_quoting() {
    let (code, stdout, _) = run(sous().args([
        "serve",
        "--dry-run",
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
    ]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains(r#"--speculative-config '{"method":"qwen3_next_mtp","num_speculative_tokens":2}'"#),
        "{stdout}"
    );
}

#[test]
fn newer_vllm_renders_generic_mtp() {
    let (launch, _) = dry_run_json(&[
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
        "--set",
        "engine.version=0.33.0",
    ]);
    assert!(argv(&launch).contains(&r#"{"method":"mtp","num_speculative_tokens":2}"#.to_owned()));
}

#[test]
fn set_beats_environment_beats_file() {
    let recipe = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
    let util = |launch: &Value| {
        let a = argv(launch);
        let i = a
            .iter()
            .position(|x| x == "--gpu-memory-utilization")
            .expect("flag");
        a[i + 1].clone()
    };
    let mut cmd = sous();
    cmd.env("SOUS_MEMORY__GPU_UTILIZATION", "0.88")
        .env("SOUS_MEMORY__OOM_FALLBACK", "[0.8]");
    cmd.args(["serve", "--dry-run", "--json", "--recipe", recipe]);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(util(&serde_json::from_str(&stdout).expect("json")), "0.88");

    let mut cmd = sous();
    cmd.env("SOUS_MEMORY__GPU_UTILIZATION", "0.88")
        .env("SOUS_MEMORY__OOM_FALLBACK", "[0.8]");
    cmd.args([
        "serve",
        "--dry-run",
        "--json",
        "--recipe",
        recipe,
        "--set",
        "memory.gpu_utilization=0.86",
    ]);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(util(&serde_json::from_str(&stdout).expect("json")), "0.86");

    // `[env]` keys keep their case when set from the environment.
    let mut cmd = sous();
    cmd.env("SOUS_ENV__VLLM_LOGGING_LEVEL", "DEBUG");
    cmd.args(["serve", "--dry-run", "--json", "--recipe", recipe]);
    let (_, stdout, _) = run(&mut cmd);
    let launch: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(launch["env"]["VLLM_LOGGING_LEVEL"], "DEBUG");
}

#[test]
fn api_keys_are_referenced_never_expanded() {
    let (launch, _) = dry_run_json(&[
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--set",
        "server.api_key_env=TITAN_KEY",
    ]);
    assert_eq!(launch["env"]["VLLM_API_KEY"], "${TITAN_KEY}");
    let mut cmd = sous();
    cmd.env("TITAN_KEY", "sk-secret-value");
    cmd.args([
        "serve",
        "--dry-run",
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--set",
        "server.api_key_env=TITAN_KEY",
    ]);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0);
    assert!(stdout.contains("VLLM_API_KEY=\"$TITAN_KEY\""), "{stdout}");
    assert!(!stdout.contains("sk-secret-value") && !stderr.contains("sk-secret-value"));
}

#[test]
fn trtllm_writes_its_options_file_into_the_state_directory() {
    let (launch, _) = dry_run_json(&[
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--set",
        "engine.kind=trtllm",
    ]);
    let a = argv(&launch);
    assert_eq!(a[..2], ["trtllm-serve", "/model"]);
    assert!(
        a.windows(2)
            .any(|w| w == ["--config", "/state/qwen3.8-flash-next-titan/trtllm-options.yaml"]),
        "{a:?}"
    );
    let contents = launch["files"][0]["contents"].as_str().expect("yaml");
    assert!(
        contents.contains("max_gpu_total_bytes: 15569256448"),
        "{contents}"
    );
    assert!(contents.contains("enable_block_reuse: true"), "{contents}");
}

#[test]
fn native_engine_runs_as_a_sous_process_and_refuses_what_it_cannot_run() {
    let (code, stdout, stderr) = run(sous().env("SOUS_STATE_DIR", "/state").args([
        "serve",
        "--dry-run",
        "--recipe",
        "recipes/local/smollm2-135m.toml",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("  --engine-process \\\n  --recipe /state/smollm2-135m/native-recipe.toml"),
        "{stdout}"
    );
    assert!(
        stdout.contains("repo = \"HuggingFaceTB/SmolLM2-135M-Instruct\""),
        "the resolved recipe is written for the engine process: {stdout}"
    );

    // A recipe written for vLLM, moved to the native engine: its parsers are refused by
    // key, not dropped.
    let (code, _, stderr) = run(sous().args([
        "serve",
        "--recipe",
        "recipes/titan/qwen3.8-flash-next.toml",
        "--set",
        "engine.kind=native",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the native engine cannot honour `serving.reasoning_parser`")
            && stderr.contains("remove `serving.reasoning_parser`"),
        "{stderr}"
    );

    // A native recipe whose model is not there.
    let dir = tempfile::tempdir().expect("tempdir");
    let recipe = dir.path().join("native.toml");
    let write_recipe = |model: &std::path::Path| {
        std::fs::write(
            &recipe,
            format!(
                "name = \"native-check\"\n[model]\npath = \"{}\"\n[engine]\nkind = \"native\"\n",
                model.display()
            ),
        )
        .expect("recipe");
    };
    write_recipe(std::path::Path::new("/model"));
    let (code, _, stderr) = run(sous().args(["serve", "--recipe"]).arg(&recipe));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("`model.path` `/model` does not exist"),
        "{stderr}"
    );

    // A model of an architecture the native engine does not run: refused by name.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).expect("model dir");
    std::fs::write(
        model.join("config.json"),
        r#"{"architectures": ["GptOssForCausalLM"], "hidden_size": 8}"#,
    )
    .expect("config");
    write_recipe(&model);
    let (code, _, stderr) = run(sous().args(["serve", "--recipe"]).arg(&recipe));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the native engine cannot run architecture `GptOssForCausalLM`")
            && stderr.contains("serve this model with vLLM or SGLang"),
        "{stderr}"
    );
}

#[test]
fn docker_runtime_wraps_the_same_command() {
    let mut cmd = sous();
    cmd.env("HF_HUB_CACHE", "/hub");
    let (host, _) = dry_run_json(&["--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml"]);
    let mut cmd_args = vec![
        "serve",
        "--dry-run",
        "--json",
        "--recipe",
        "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml",
    ];
    cmd_args.extend([
        "--set",
        "engine.runtime=docker",
        "--set",
        "env.VLLM_LOGGING_LEVEL=INFO",
    ]);
    let (code, stdout, stderr) = run(cmd.args(&cmd_args));
    assert_eq!(code, 0, "{stderr}");
    let launch: Value = serde_json::from_str(&stdout).expect("json");
    let docker = argv(&launch);
    let at = docker
        .iter()
        .position(|a| a == "vllm/vllm-openai:v0.27.1")
        .expect("image");
    assert_eq!(docker[..4], ["docker", "run", "--rm", "--init"]);
    assert_eq!(docker[at - 2..at], ["--entrypoint", "vllm"]);
    assert_eq!(
        docker[at + 1..],
        argv(&host)[1..],
        "the engine's own arguments are unchanged"
    );
    let joined = docker.join(" ");
    for part in [
        "--name sous-qwen3.8-27b-dgx-spark",
        "--gpus all",
        "--ipc host",
        "--publish 0.0.0.0:8000:8000",
        "--volume /hub:/root/.cache/huggingface/hub",
        "--volume /models/qwen3.8-27b-inferact-nvfp4:/models/qwen3.8-27b-inferact-nvfp4:ro",
        "--env VLLM_LOGGING_LEVEL",
        "--env HF_HUB_CACHE",
    ] {
        assert!(joined.contains(part), "{part} in {joined}");
    }
    assert_eq!(launch["env"]["VLLM_LOGGING_LEVEL"], "INFO");
}

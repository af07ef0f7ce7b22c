//! Log lines that imitate an engine follow the engine's rules as `sous plan` models
//! them: the capacity lines of the three hand-written Titan instances
//! (`tests/fixtures/vllm-logs/instance-*.log`) are what vLLM's allocator gives the Titan
//! recipe, and the SGLang capacity line the log scanner's test reads is what SGLang's
//! pool gives a recipe the plan can size. The Titan report's own 604,705 stays a quote
//! in the docs: vLLM's rules do not give it for that budget.

use std::path::PathBuf;

use sous_engine::plan::{Hardware, Model, Shape, plan};
use sous_engine::recipe::{EngineKind, Overrides, load};
use sous_engine::serve::logscan;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model(config: &str, weight_bytes: u64) -> Model {
    let text = std::fs::read_to_string(root().join("tests/fixtures/plan").join(config)).expect("fixture");
    let config = serde_json::from_str(&text).expect("JSON");
    Model {
        shape: Shape::from_config(&config).expect("shape"),
        weight_bytes,
        expert_bytes: 0,
        native_kv_per_token: None,
        native_state_per_sequence: 0,
        host_weight_bytes: 0,
    }
}

#[test]
fn the_titan_instances_log_what_vllm_gives_the_titan_recipe() {
    let recipe = load(
        &root().join("recipes/titan/qwen3.8-flash-next.toml"),
        &Overrides::new(),
    )
    .expect("recipe")
    .recipe;
    let hw = Hardware::named("rtx-pro-6000").expect("hardware");
    // The budget is fixed, so the weights do not change the cache; the report's weights
    // are not published.
    let p = plan(&recipe, &model("qwen3-next-80b-a3b.json", 0), &hw).expect("plan");
    let mut lines = 0;
    for i in 0..3 {
        let path = root().join(format!("tests/fixtures/vllm-logs/instance-{i}.log"));
        let log = std::fs::read_to_string(&path).expect("log");
        for capacity in log.lines().filter_map(|l| logscan::capacity(EngineKind::Vllm, l)) {
            lines += 1;
            assert_eq!(
                capacity.tokens,
                p.kv_tokens,
                "{}: {}",
                path.display(),
                capacity.line
            );
            if let Some(concurrency) = capacity.max_concurrency {
                // vLLM prints it with two decimals.
                assert_eq!(
                    format!("{concurrency:.2}"),
                    format!("{:.2}", p.max_concurrency),
                    "{}",
                    capacity.line
                );
            }
        }
    }
    assert_eq!(lines, 4, "every start-up of the three instances");
}

#[test]
fn the_sglang_capacity_line_is_what_sglang_gives_a_planned_recipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("llama.toml");
    std::fs::write(
        &path,
        "[model]\npath = \"/model\"\n[engine]\nkind = \"sglang\"\n[memory]\ngpu_utilization = 0.88\n\
         [serving]\nmax_model_len = 131072\nmax_num_seqs = 16\n",
    )
    .expect("recipe");
    let recipe = load(&path, &Overrides::new()).expect("recipe").recipe;
    // Llama-3.1-8B: `total_size` 16,060,522,496 B in its model.safetensors.index.json.
    let p = plan(
        &recipe,
        &model("llama-3.1-8b.json", 16_060_522_496),
        &Hardware::named("h100").expect("hardware"),
    )
    .expect("plan");
    let line = format!(
        "max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=16, context_len=131072, available_gpu_mem=12.1 GB",
        p.kv_tokens
    );
    assert_eq!(
        logscan::capacity(EngineKind::Sglang, &line).map(|c| c.tokens),
        Some(p.kv_tokens)
    );
    // The number the log scanner's own unit test reads.
    assert_eq!(
        p.kv_tokens, 406_385,
        "update engine/src/serve/logscan.rs's SGLang line"
    );
}

//! `sous plan`'s memory verdict: weights and a fixed KV budget compared with the card in
//! every path (a fixed budget once let 171 GiB of weights "fit" a 96 GB card), with the
//! smallest changes that would fit; and the engines' memory settings read as the engines
//! read them (`launch::memory`): SGLang's `--max-total-tokens` and TensorRT-LLM's
//! smaller-of rule.

use std::path::PathBuf;

use sous_engine::plan::{Hardware, Model, Shape, plan};
use sous_engine::recipe::{Overrides, Recipe, load};

const GIB: u64 = 1 << 30;

fn recipe(toml: &str) -> Recipe {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.toml");
    std::fs::write(&path, toml).expect("write");
    load(&path, &Overrides::new()).expect("recipe").recipe
}

fn model(config: &str, weight_bytes: u64) -> Model {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/plan")
        .join(config);
    let config = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    Model {
        shape: Shape::from_config(&config).expect("shape"),
        weight_bytes,
        expert_bytes: 0,
        native_kv_per_token: None,
        native_state_per_sequence: 0,
        host_weight_bytes: 0,
    }
}

const TITAN_LIKE: &str = "[model]\npath = \"/model\"\n[engine]\nkind = \"vllm\"\n\
    [memory]\nkv_cache_bytes = \"14.5GiB\"\n[serving]\nmax_model_len = 32768\n";

#[test]
fn weights_larger_than_the_card_never_fit_with_a_fixed_budget() {
    let hw = Hardware::named("rtx-pro-6000").expect("hardware");
    let p = plan(&recipe(TITAN_LIKE), &model("qwen3-32b.json", 171 * GIB), &hw).expect("plan");
    assert!(!p.fits, "{p:?}");
    let short = p.shortfall.as_ref().expect("what does not fit");
    assert_eq!(short.memory_bytes, hw.memory);
    assert_eq!(short.parts[0].bytes, 171 * GIB);
    assert_eq!(short.parts[0].what, "the weights per GPU");
    assert!(
        short
            .parts
            .iter()
            .any(|p| p.what.contains("fixed KV budget") && p.bytes == 14.5 as u64 * GIB + GIB / 2)
    );
    assert_eq!(
        short.needed_bytes,
        short.parts.iter().map(|p| p.bytes).sum::<u64>()
    );
    // 171 / 2 + 14.5 + the rest is more than 96 GB; a quarter of the weights is not.
    let advice = p.advice.join("\n");
    assert!(advice.contains("`serving.tensor_parallel = 4`"), "{advice}");
    assert!(advice.contains("nvfp4a16"), "{advice}");
    assert!(
        !advice.contains("kv_cache_bytes` of at most"),
        "no budget helps: {advice}"
    );
    // The same model split over four cards fits.
    let split = recipe(&format!("{TITAN_LIKE}tensor_parallel = 4\n"));
    let p = plan(&split, &model("qwen3-32b.json", 171 * GIB), &hw).expect("plan");
    assert!(p.fits && p.shortfall.is_none(), "{p:?}");
}

#[test]
fn weights_that_fit_alone_but_not_with_the_budget_get_a_smaller_budget() {
    // Qwen3-32B in bf16 on an H100: 61 GiB of weights, 14.5 GiB of fixed cache.
    let hw = Hardware::named("h100").expect("hardware");
    let p = plan(&recipe(TITAN_LIKE), &model("qwen3-32b.json", 61 * GIB), &hw).expect("plan");
    assert!(!p.fits);
    let short = p.shortfall.as_ref().expect("shortfall");
    assert!(short.needed_bytes > hw.memory);
    let advice = p.advice.join("\n");
    assert!(advice.contains("`serving.tensor_parallel = 2`"), "{advice}");
    assert!(advice.contains("`memory.kv_cache_bytes` of at most"), "{advice}");
    // Without the fixed budget the same weights leave vLLM a cache of its own.
    let fraction =
        recipe("[model]\npath = \"/model\"\n[engine]\nkind = \"vllm\"\n[serving]\nmax_model_len = 16384\n");
    let p = plan(&fraction, &model("qwen3-32b.json", 61 * GIB), &hw).expect("plan");
    assert!(p.shortfall.is_none(), "{p:?}");
    assert!(p.fits, "{p:?}");
    // vLLM 0.20 and later default to 0.92 of the card, earlier releases to 0.9.
    assert!(p.budget.steps[0].starts_with("0.92 of"), "{:?}", p.budget.steps);
    let old = recipe(
        "[model]\npath = \"/model\"\n[engine]\nkind = \"vllm\"\nversion = \"0.13.0\"\n[serving]\nmax_model_len = 16384\n",
    );
    let p = plan(&old, &model("qwen3-32b.json", 61 * GIB), &hw).expect("plan");
    assert!(p.budget.steps[0].starts_with("0.9 of"), "{:?}", p.budget.steps);
}

#[test]
fn the_engines_own_caps_are_counted() {
    let hw = Hardware::named("h100").expect("hardware");
    let m = || model("llama-3.1-8b.json", 16 * GIB);
    // SGLang: `--max-total-tokens` caps the pool the fraction gives.
    let free = plan(
        &recipe("[model]\npath = \"/model\"\n[engine]\nkind = \"sglang\"\n[memory]\ngpu_utilization = 0.9\n[serving]\nmax_model_len = 8192\n"),
        &m(),
        &hw,
    )
    .expect("plan");
    assert!(free.kv_tokens > 100_000, "{}", free.kv_tokens);
    let capped = plan(
        &recipe("[model]\npath = \"/model\"\n[engine]\nkind = \"sglang\"\nextra_args = [\"--max-total-tokens\", \"65536\"]\n[memory]\ngpu_utilization = 0.9\n[serving]\nmax_model_len = 8192\n"),
        &m(),
        &hw,
    )
    .expect("plan");
    assert_eq!(capped.kv_tokens, 65_536);
    assert!(
        capped
            .budget
            .steps
            .iter()
            .any(|s| s.contains("--max-total-tokens"))
    );
    // TensorRT-LLM: the smaller of `max_gpu_total_bytes` and the fraction's share, in
    // 32-token blocks. 128 KiB a token: 4 GiB is 32,768 tokens.
    let trt = plan(
        &recipe("[model]\npath = \"/model\"\n[engine]\nkind = \"trtllm\"\n[memory]\nkv_cache_bytes = \"4GiB\"\n[serving]\nmax_model_len = 8192\n"),
        &m(),
        &hw,
    )
    .expect("plan");
    assert_eq!(trt.kv_tokens, 32_768);
    assert!(trt.budget.exact);
    let small_share = plan(
        &recipe("[model]\npath = \"/model\"\n[engine]\nkind = \"trtllm\"\n[memory]\nkv_cache_bytes = \"60GiB\"\ngpu_utilization = 0.1\n[serving]\nmax_model_len = 8192\n"),
        &m(),
        &hw,
    )
    .expect("plan");
    assert!(small_share.budget.kv_bytes < 7 * GIB, "{:?}", small_share.budget);
    assert!(!small_share.budget.exact);
}

//! The imported SmolLM2-135M-Instruct checked against transformers' reading of the same
//! GGUF (`tests/fixtures/smollm2/`, made by `scripts/reference/smollm2_reference.py`).
//!
//! Weights are compared exactly: transformers and candle dequantize Q4_1 (`d * q + m`)
//! and Q8_0 (`d * q`) with the same f32 operations in the same order and no fused
//! multiply-add, the Q/K un-permutation only moves rows, and both casts to bfloat16
//! round to nearest-even. So the SHA-256 of every tensor's bytes must match, in f32 and
//! in bf16; the sums and sampled values make a mismatch readable.
//!
//! The model is made by `scripts/fetch-test-model.sh`. Without it these tests fail under
//! `CI=true` and are skipped, loudly, elsewhere.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::support::{
    check_f32, check_names_and_shapes, check_tokenizer_cases, fixture, import, read_weights, root, sha256_hex,
};
use serde_json::Value;

fn model_dir() -> PathBuf {
    root().join("target/models/HuggingFaceTB/SmolLM2-135M-Instruct")
}

fn gguf_path() -> PathBuf {
    let cache =
        std::env::var_os("SOUS_TEST_CACHE").map_or_else(|| root().join("target/cache"), PathBuf::from);
    cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The test model's directory, or `None` (after saying so) when it is absent outside CI.
fn require_model() -> Option<PathBuf> {
    let dir = model_dir();
    let gguf = gguf_path();
    if dir.join("model.safetensors").is_file() && gguf.is_file() {
        return Some(dir);
    }
    let missing = format!(
        "test model missing ({} or {}), run scripts/fetch-test-model.sh",
        dir.display(),
        gguf.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{missing}");
    }
    // Written to the stderr handle itself, past libtest's capture, so it shows in a
    // normal `cargo test` run.
    let _ = writeln!(std::io::stderr(), "\n!!!!!!!! SKIPPED: {missing} !!!!!!!!\n");
    None
}

fn fixture_tensors() -> Vec<Value> {
    let weights = fixture("weights.json");
    assert_eq!(weights["tie_word_embeddings"], true);
    weights["tensors"].as_array().expect("tensors").clone()
}

#[test]
fn bf16_weights_are_transformers_weights() {
    let Some(dir) = require_model() else { return };
    let got = read_weights(&dir);
    let want = fixture_tensors();
    check_names_and_shapes(&got, &want);
    let mut wrong = Vec::new();
    for t in &want {
        let name = t["name"].as_str().expect("name");
        let (dtype, _, bytes) = &got[name];
        assert_eq!(*dtype, safetensors::Dtype::BF16, "{name}");
        if sha256_hex(bytes) != t["sha256_bf16"] {
            wrong.push(name.to_owned());
        }
    }
    assert!(
        wrong.is_empty(),
        "bf16 bytes differ from transformers' for {wrong:?}"
    );
}

#[test]
fn f32_weights_are_transformers_weights() {
    let Some(_) = require_model() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("f32");
    import(&gguf_path(), &out, "f32");
    check_f32(&read_weights(&out), &fixture_tensors());
}

#[test]
fn config_matches_the_gguf() {
    let Some(dir) = require_model() else { return };
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config")).expect("json");
    // SmolLM2-135M's published configuration.
    for (key, want) in [
        ("hidden_size", serde_json::json!(576)),
        ("intermediate_size", serde_json::json!(1536)),
        ("num_hidden_layers", serde_json::json!(30)),
        ("num_attention_heads", serde_json::json!(9)),
        ("num_key_value_heads", serde_json::json!(3)),
        ("head_dim", serde_json::json!(64)),
        ("vocab_size", serde_json::json!(49152)),
        ("max_position_embeddings", serde_json::json!(8192)),
        ("rope_theta", serde_json::json!(100000.0)),
        ("rms_norm_eps", serde_json::json!(1e-5)),
        ("tie_word_embeddings", serde_json::json!(true)),
        ("bos_token_id", serde_json::json!(1)),
        ("eos_token_id", serde_json::json!(2)),
        ("torch_dtype", serde_json::json!("bfloat16")),
    ] {
        assert_eq!(config[key], want, "config.json {key}");
    }
}

fn tokenizer(dir: &Path) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer.json loads")
}

#[test]
fn tokenizer_gives_transformers_ids() {
    let Some(dir) = require_model() else { return };
    check_tokenizer_cases(&tokenizer(&dir), &fixture("tokenizer_cases.json"));
}

#[test]
fn generation_prompts_tokenize_and_render_alike() {
    let Some(dir) = require_model() else { return };
    let tok = tokenizer(&dir);
    let generation = fixture("generation.json");
    assert_eq!(generation["imported_tokenizer_agrees"], true);
    assert_eq!(generation["imported_chat_template_agrees"], true);
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).expect("tokenizer_config"))
            .expect("json");
    let templates = sous_engine::chat::ChatTemplates::load(&dir, Some(&config)).expect("template compiles");
    assert_eq!(templates.origin(), "tokenizer_config.json");
    let template = templates.select(false).expect("one template");
    let chat = fixture("chat_template_cases.json");
    assert_eq!(
        config["chat_template"], chat["template"],
        "the GGUF's template is carried over as is"
    );
    for prompt in generation["prompts"].as_array().expect("prompts") {
        let text = prompt["text"].as_str().expect("text");
        let ids: Vec<u32> = serde_json::from_value(prompt["input_ids"].clone()).expect("ids");
        assert_eq!(
            tok.encode(text, true).expect("encode").get_ids(),
            ids.as_slice(),
            "{text:?}"
        );
        for label in ["imported_f32", "imported_bf16"] {
            assert_eq!(prompt[format!("{label}_agrees")], true, "{label} on {text:?}");
        }
        if prompt["name"] == "chat" {
            let messages = serde_json::json!([{"role": "user", "content": "What is the capital of France?"}]);
            let options = sous_engine::chat::RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            };
            assert_eq!(template.render(&messages, &options).expect("renders"), text);
        }
    }
}

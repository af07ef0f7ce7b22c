//! A SentencePiece-vocabulary llama (`tests/fixtures/smollm2/sentencepiece-tiny/`, a
//! tiny GGUF written by `scripts/reference/sentencepiece_reference.py`) imported by
//! sous and checked against transformers' reading of the same file: the ids and decoded
//! text of a corpus (merges recovered from scores, byte fallback, control and
//! user-defined tokens, BOS added), and every weight bit for bit (grouped-query
//! attention with one KV head, an untied output projection).

use crate::support::{check_f32, check_tokenizer_cases, fixture, import, read_weights, root};

const DIR: &str = "sentencepiece-tiny";

#[test]
fn sentencepiece_vocabulary_matches_transformers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("model");
    let gguf = root()
        .join("tests/fixtures/smollm2")
        .join(DIR)
        .join("tiny-llama-sentencepiece.gguf");
    import(&gguf, &out, "f32");

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).expect("tokenizer.json loads");
    check_tokenizer_cases(&tok, &fixture(&format!("{DIR}/tokenizer_cases.json")));

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config")).expect("json");
    assert_eq!(config["tie_word_embeddings"], false);
    assert_eq!(config["num_key_value_heads"], 1);
    let tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("tokenizer_config.json")).expect("tokenizer_config"))
            .expect("json");
    assert_eq!(tc["add_bos_token"], true);
    assert_eq!(tc["bos_token"], "<s>");

    let weights = fixture(&format!("{DIR}/weights.json"));
    assert_eq!(weights["tie_word_embeddings"], false);
    check_f32(
        &read_weights(&out),
        weights["tensors"].as_array().expect("tensors"),
    );
}

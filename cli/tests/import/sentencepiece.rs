//! A SentencePiece-vocabulary llama (`tests/fixtures/smollm2/sentencepiece-tiny/`, a
//! tiny GGUF written by `scripts/reference/sentencepiece_reference.py`) imported by
//! sous and checked against transformers' reading of the same file: the ids and decoded
//! text of a corpus (merges recovered from scores, byte fallback, control and
//! user-defined tokens, BOS added), and every weight bit for bit (grouped-query
//! attention with one KV head, an untied output projection).

use crate::support::{check_f32, fixture, import, read_weights, root};

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
    let cases = fixture(&format!("{DIR}/tokenizer_cases.json"));
    for case in cases["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
        let enc = tok.encode(text, true).expect("encode");
        assert_eq!(enc.get_ids(), want.as_slice(), "encoding {text:?}");
        let decoded = tok.decode(&want, false).expect("decode");
        assert_eq!(
            decoded,
            case["decoded"].as_str().expect("decoded"),
            "decoding {text:?}"
        );
    }

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

//! Helpers shared by the import tests: paths, fixtures, and reading safetensors
//! directories back for comparison with transformers' state dicts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// A JSON fixture under `tests/fixtures/smollm2/`.
pub fn fixture(name: &str) -> Value {
    let path = root().join("tests/fixtures/smollm2").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One tensor read back: dtype, shape, raw little-endian bytes.
pub type Weights = HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// Every tensor in a model directory's safetensors files.
pub fn read_weights(dir: &Path) -> Weights {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(dir).expect("model dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read shard");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        for (name, view) in st.tensors() {
            out.insert(name, (view.dtype(), view.shape().to_vec(), view.data().to_vec()));
        }
    }
    out
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The same tensor names and shapes as transformers' state dict (`want`, from a
/// `weights.json` fixture), less `lm_head.weight` when the embeddings are tied.
pub fn check_names_and_shapes(got: &Weights, want: &[Value]) {
    let mut missing = Vec::new();
    for t in want {
        let name = t["name"].as_str().expect("name");
        match got.get(name) {
            Some((_, shape, _)) => {
                let want_shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).expect("shape");
                assert_eq!(shape, &want_shape, "{name}");
            }
            None => missing.push(name.to_owned()),
        }
    }
    assert!(
        missing.is_empty(),
        "tensors transformers has and we lack: {missing:?}"
    );
    assert_eq!(
        got.len(),
        want.len(),
        "we wrote tensors transformers does not have"
    );
}

/// f32 tensors equal to transformers' bit for bit: sampled values first (readable), then
/// the sum (to rounding: PyTorch sums pairwise), then the SHA-256 of all the bytes.
pub fn check_f32(got: &Weights, want: &[Value]) {
    check_names_and_shapes(got, want);
    for t in want {
        let name = t["name"].as_str().expect("name");
        let (dtype, _, bytes) = &got[name];
        assert_eq!(*dtype, safetensors::Dtype::F32, "{name}");
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for sample in t["samples"].as_array().expect("samples") {
            let index = sample[0].as_u64().expect("index") as usize;
            let value = sample[1].as_f64().expect("value") as f32;
            assert_eq!(values[index], value, "{name}[{index}]");
        }
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let want_sum = t["sum"].as_f64().expect("sum");
        assert!(
            (sum - want_sum).abs() <= 1e-9 * values.len() as f64 * (1.0 + want_sum.abs()),
            "{name}: sum {sum} vs {want_sum}"
        );
        assert_eq!(sha256_hex(bytes), t["sha256_f32"], "{name}: f32 bytes differ");
    }
}

/// Runs `sous import gguf FILE --out OUT --dtype DTYPE` and checks it succeeded.
pub fn import(gguf: &Path, out: &Path, dtype: &str) {
    let output = assert_cmd::Command::cargo_bin("sous")
        .expect("sous")
        .env("NO_COLOR", "1")
        .args(["import", "gguf"])
        .arg(gguf)
        .arg("--out")
        .arg(out)
        .args(["--dtype", dtype])
        .output()
        .expect("sous runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every case of a tokenizer fixture (`{"cases": [{"text", "ids", "decoded"}]}`, made
/// with transformers): `tok` encodes the text to the ids and decodes the ids back.
pub fn check_tokenizer_cases(tok: &tokenizers::Tokenizer, cases: &Value) {
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
}

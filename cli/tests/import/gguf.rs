//! `sous import gguf` on small GGUF files written here with candle's GGUF writer: a
//! one-layer llama whose weights are known, so the output can be checked value by value,
//! and broken variants of it (wrong magic, truncated, unsupported architecture), run
//! through the real binary.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FFN: usize = 128;

/// Special tokens appended after the 256 byte tokens.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

fn sous() -> Command {
    let mut cmd = Command::cargo_bin("sous").expect("the sous binary is built");
    cmd.env("NO_COLOR", "1").env_remove("SOUS_LOG");
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("sous runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// GPT-2's byte alphabet, written out independently of the importer's copy.
fn byte_tokens() -> Vec<String> {
    let mut printable: Vec<u32> = (0x21..=0x7e).chain(0xa1..=0xac).chain(0xae..=0xff).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table: Vec<(u32, u32)> = printable.into_iter().zip(chars).collect();
    table.sort();
    table
        .into_iter()
        .map(|(_, c)| char::from_u32(c).expect("valid char").to_string())
        .collect()
}

/// llama.cpp's rotary permutation (`convert_hf_to_gguf.py`, `LlamaModel.permute`) of a
/// row index: the HF row that GGUF row `g` holds.
fn hf_row_of_gguf_row(g: usize, heads: usize, rows: usize) -> usize {
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let (h, within) = (g / head_dim, g % head_dim);
    let (i, j) = (within / 2, within % 2);
    h * head_dim + j * half + i
}

/// A `rows × cols` F32 tensor whose HF row `r` is filled with `r + col / 1000`, stored
/// with its rows permuted when `heads` is given.
fn rows_tensor(rows: usize, cols: usize, permute_heads: Option<usize>) -> QTensor {
    let mut data = Vec::with_capacity(rows * cols);
    for g in 0..rows {
        let r = permute_heads.map_or(g, |h| hf_row_of_gguf_row(g, h, rows));
        for c in 0..cols {
            data.push(r as f32 + c as f32 / 1000.0);
        }
    }
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, GgmlDType::F32).expect("f32 qtensor")
}

fn q8(rows: usize, cols: usize, seed: f32) -> QTensor {
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as f32 + seed) * 0.37).sin())
        .collect();
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, GgmlDType::Q8_0).expect("q8_0 qtensor")
}

fn ones(n: usize) -> QTensor {
    let t = Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, GgmlDType::F32).expect("f32 qtensor")
}

/// Metadata and tensors of a GGUF file being built.
type Parts = (Vec<(String, Value)>, Vec<(String, QTensor)>);

/// Writes a one-layer llama GGUF; `arch` is its `general.architecture`.
fn write_gguf(path: &Path, arch: &str) {
    write_gguf_with(path, arch, |_| {});
}

/// [`write_gguf`], with `tweak` applied to the metadata and tensors before writing.
fn write_gguf_with(path: &Path, arch: &str, tweak: impl FnOnce(&mut Parts)) {
    let mut tokens = byte_tokens();
    tokens.extend(SPECIALS.iter().map(|s| s.to_string()));
    // One merge: "a" + "b" -> "ab".
    tokens.push("ab".to_owned());
    let vocab = tokens.len();
    let mut types = vec![Value::I32(1); vocab];
    for t in types.iter_mut().skip(256).take(SPECIALS.len()) {
        *t = Value::I32(3);
    }
    let key = |k: &str| format!("{arch}.{k}");
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String("tiny test llama".into())),
        (key("block_count"), Value::U32(1)),
        (key("context_length"), Value::U32(256)),
        (key("embedding_length"), Value::U32(HIDDEN as u32)),
        (key("feed_forward_length"), Value::U32(FFN as u32)),
        (key("attention.head_count"), Value::U32(HEADS as u32)),
        (key("attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (key("rope.freq_base"), Value::F32(100000.0)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| Value::String(t.clone())).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String("a b".into())]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(257)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(258)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(258)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    .into(),
            ),
        ),
    ];
    let tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q8(vocab, HIDDEN, 0.0)),
        ("blk.0.attn_norm.weight".into(), ones(HIDDEN)),
        (
            "blk.0.attn_q.weight".into(),
            rows_tensor(HIDDEN, HIDDEN, Some(HEADS)),
        ),
        (
            "blk.0.attn_k.weight".into(),
            rows_tensor(KV_HEADS * HEAD_DIM, HIDDEN, Some(KV_HEADS)),
        ),
        (
            "blk.0.attn_v.weight".into(),
            rows_tensor(KV_HEADS * HEAD_DIM, HIDDEN, None),
        ),
        ("blk.0.attn_output.weight".into(), q8(HIDDEN, HIDDEN, 1.0)),
        ("blk.0.ffn_norm.weight".into(), ones(HIDDEN)),
        ("blk.0.ffn_gate.weight".into(), q8(FFN, HIDDEN, 2.0)),
        ("blk.0.ffn_up.weight".into(), q8(FFN, HIDDEN, 3.0)),
        ("blk.0.ffn_down.weight".into(), q8(HIDDEN, FFN, 4.0)),
        ("output_norm.weight".into(), ones(HIDDEN)),
    ];
    let mut parts = (meta, tensors);
    tweak(&mut parts);
    let (meta, tensors) = parts;
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).expect("create gguf");
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).expect("write gguf");
}

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    write_gguf(&path, "llama");
    path
}

/// Nothing but `keep` in `dir`: no output, no staging directory left behind.
fn assert_only(dir: &Path, keep: &[&str]) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, keep, "unexpected files in {}", dir.display());
}

fn load_safetensors(dir: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    for file in files {
        let bytes = std::fs::read(&file).expect("read shard");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            out.push((name, view.shape().to_vec(), values));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn imports_a_tiny_llama() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny(tmp.path());
    let out = tmp.path().join("model");
    let (code, stdout, stderr) = run(sous()
        .args(["import", "gguf"])
        .arg(&gguf)
        .arg("--out")
        .arg(&out)
        .args(["--dtype", "f32", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("imported"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(summary["architecture"], "llama");
    assert_eq!(summary["tensors"], 11);
    assert_eq!(summary["shards"], serde_json::json!(["model.safetensors"]));
    assert_eq!(summary["chat_template"], true);

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config.json")).expect("json");
    assert_eq!(config["architectures"], serde_json::json!(["LlamaForCausalLM"]));
    assert_eq!(config["hidden_size"], HIDDEN);
    assert_eq!(config["num_attention_heads"], HEADS);
    assert_eq!(config["num_key_value_heads"], KV_HEADS);
    assert_eq!(config["head_dim"], HEAD_DIM);
    assert_eq!(config["intermediate_size"], FFN);
    assert_eq!(config["rms_norm_eps"], 1e-5);
    assert_eq!(config["rope_theta"], 100000.0);
    assert_eq!(config["vocab_size"], 260);
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["bos_token_id"], 257);
    assert_eq!(config["eos_token_id"], 258);
    assert_eq!(config["torch_dtype"], "float32");

    let tensors = load_safetensors(&out);
    let names: Vec<&str> = tensors.iter().map(|t| t.0.as_str()).collect();
    assert!(
        names.contains(&"model.layers.0.self_attn.q_proj.weight"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"lm_head.weight"),
        "tied embeddings are not duplicated"
    );
    for (name, rows) in [
        ("model.layers.0.self_attn.q_proj.weight", HIDDEN),
        ("model.layers.0.self_attn.k_proj.weight", KV_HEADS * HEAD_DIM),
        ("model.layers.0.self_attn.v_proj.weight", KV_HEADS * HEAD_DIM),
    ] {
        let (_, shape, values) = tensors.iter().find(|t| t.0 == name).expect(name);
        assert_eq!(shape, &vec![rows, HIDDEN], "{name}");
        for r in 0..rows {
            for c in [0, HIDDEN - 1] {
                let want = r as f32 + c as f32 / 1000.0;
                assert_eq!(
                    values[r * HIDDEN + c],
                    want,
                    "{name} row {r} col {c}: rows not in HF order"
                );
            }
        }
    }

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).expect("tokenizer.json loads");
    let enc = tok.encode("ab c<|im_end|>", true).expect("encode");
    // "ab" merges; " " is `Ġ` (byte 32), `c` is byte 99; the special token stays whole.
    let ab = 256 + SPECIALS.len() as u32;
    let space = byte_tokens().iter().position(|t| t == "Ġ").expect("Ġ") as u32;
    let c = byte_tokens().iter().position(|t| t == "c").expect("c") as u32;
    assert_eq!(enc.get_ids(), &[ab, space, c, 258]);
    assert_eq!(
        tok.decode(enc.get_ids(), false).expect("decode"),
        "ab c<|im_end|>"
    );

    let tc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("tokenizer_config.json")).expect("tokenizer_config"))
            .expect("json");
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["added_tokens_decoder"]["258"]["special"], true);
    assert!(
        tc["chat_template"]
            .as_str()
            .is_some_and(|t| t.contains("messages"))
    );
    assert!(out.join("generation_config.json").is_file());
    assert_only(tmp.path(), &["model", "tiny.gguf"]);
}

#[test]
fn shards_past_the_size_limit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny(tmp.path());
    let whole = tmp.path().join("whole");
    let sharded = tmp.path().join("sharded");
    let (code, _, stderr) = run(sous()
        .args(["import", "gguf"])
        .arg(&gguf)
        .arg("--out")
        .arg(&whole)
        .args(["--dtype", "f32"]));
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run(sous()
        .args(["import", "gguf"])
        .arg(&gguf)
        .arg("--out")
        .arg(&sharded)
        .args(["--dtype", "f32", "--max-shard-size", "40KB", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let shards: Vec<String> = serde_json::from_value(summary["shards"].clone()).expect("shard list");
    assert!(shards.len() > 2, "{shards:?}");
    assert_eq!(
        shards[0],
        format!("model-00001-of-{:05}.safetensors", shards.len())
    );

    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(sharded.join("model.safetensors.index.json")).expect("index written"),
    )
    .expect("json");
    let map = index["weight_map"].as_object().expect("weight_map");
    assert_eq!(map.len(), 11);
    for file in map.values() {
        assert!(shards.iter().any(|s| Some(s.as_str()) == file.as_str()), "{file}");
    }
    for shard in &shards {
        let size = std::fs::metadata(sharded.join(shard)).expect("shard").len();
        // 40 kB of tensor data at most, unless one tensor alone is larger (the embedding).
        assert!(
            size < 40_000 + 2_000 || shard == &shards[0],
            "{shard} is {size} bytes"
        );
    }
    let total: u64 = index["metadata"]["total_size"].as_u64().expect("total_size");
    assert_eq!(total, summary["total_size"].as_u64().expect("total_size"));
    // Same tensors, same values, whichever way they are split.
    assert_eq!(load_safetensors(&whole), load_safetensors(&sharded));
}

#[test]
fn refuses_a_file_that_is_not_gguf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bogus = tmp.path().join("model.gguf");
    std::fs::write(&bogus, b"<!DOCTYPE html><html>404</html>").expect("write");
    let out = tmp.path().join("out");
    let (code, _, stderr) = run(sous().args(["import", "gguf"]).arg(&bogus).arg("--out").arg(&out));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not a GGUF file"), "{stderr}");
    assert!(stderr.contains("3c 21 44 4f"), "shows the bytes found: {stderr}");
    assert!(stderr.contains("hint:"), "{stderr}");
    assert_only(tmp.path(), &["model.gguf"]);

    let empty = tmp.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    let (code, _, stderr) = run(sous().args(["import", "gguf"]).arg(&empty).arg("--out").arg(&out));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("an empty file"), "{stderr}");

    let (code, _, stderr) = run(sous()
        .args(["import", "gguf"])
        .arg(tmp.path().join("missing.gguf"))
        .arg("--out")
        .arg(&out));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("missing.gguf"), "{stderr}");
}

#[test]
fn refuses_truncated_files_and_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny(tmp.path());
    let bytes = std::fs::read(&gguf).expect("read");
    let out = tmp.path().join("out");
    let cut_file = tmp.path().join("cut.gguf");
    // In the fixed header, in the metadata, in the tensor table, in the tensor data.
    for cut in [6, 30, 2_000, bytes.len() / 2, bytes.len() - 4_000] {
        std::fs::write(&cut_file, &bytes[..cut]).expect("write");
        let (code, _, stderr) = run(sous()
            .args(["import", "gguf"])
            .arg(&cut_file)
            .arg("--out")
            .arg(&out));
        assert_eq!(code, 1, "cut at {cut}: {stderr}");
        assert!(
            stderr.contains("cut.gguf"),
            "cut at {cut}: names the file: {stderr}"
        );
        assert!(stderr.contains("truncated"), "cut at {cut}: {stderr}");
        assert_only(tmp.path(), &["cut.gguf", "tiny.gguf"]);
    }
}

#[test]
fn refuses_unsupported_architectures_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tmp.path().join("mamba.gguf");
    write_gguf(&gguf, "mamba");
    let out = tmp.path().join("out");
    let (code, _, stderr) = run(sous().args(["import", "gguf"]).arg(&gguf).arg("--out").arg(&out));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("architecture `mamba` is not supported"),
        "{stderr}"
    );
    assert!(stderr.contains("llama"), "lists what is supported: {stderr}");
    assert_only(tmp.path(), &["mamba.gguf"]);
}

#[test]
fn does_not_overwrite_without_force() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny(tmp.path());
    let out = tmp.path().join("model");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::write(out.join("keep.txt"), "mine").expect("write");
    let (code, _, stderr) = run(sous().args(["import", "gguf"]).arg(&gguf).arg("--out").arg(&out));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("already exists") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(out.join("keep.txt").is_file());

    let (code, _, stderr) = run(sous()
        .args(["import", "gguf"])
        .arg(&gguf)
        .arg("--out")
        .arg(&out)
        .arg("--force"));
    assert_eq!(code, 0, "{stderr}");
    assert!(!out.join("keep.txt").exists());
    assert!(out.join("model.safetensors").is_file());
    assert_only(tmp.path(), &["model", "tiny.gguf"]);
}

#[test]
fn bf16_is_the_default_dtype_and_f16_is_offered() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tiny(tmp.path());
    // Row 5, column 0 of q_proj holds 5.0: 0x40a0 in bfloat16, 0x4500 in IEEE half.
    for (flag, dtype, bits, torch) in [
        (None, safetensors::Dtype::BF16, 0x40a0u16, "bfloat16"),
        (Some("f16"), safetensors::Dtype::F16, 0x4500u16, "float16"),
    ] {
        let out = tmp.path().join(flag.unwrap_or("default"));
        let mut cmd = sous();
        cmd.args(["import", "gguf"]).arg(&gguf).arg("--out").arg(&out);
        if let Some(flag) = flag {
            cmd.args(["--dtype", flag]);
        }
        let (code, _, stderr) = run(&mut cmd);
        assert_eq!(code, 0, "{stderr}");
        let bytes = std::fs::read(out.join("model.safetensors")).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let q = st
            .tensor("model.layers.0.self_attn.q_proj.weight")
            .expect("q_proj");
        assert_eq!(q.dtype(), dtype);
        let at = 5 * HIDDEN * 2;
        assert_eq!(&q.data()[at..at + 2], &bits.to_le_bytes(), "{dtype:?}");
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config")).expect("json");
        assert_eq!(config["torch_dtype"], torch);
    }
}

#[test]
fn refuses_what_it_cannot_convert_faithfully() {
    type Tweak = Box<dyn FnOnce(&mut Parts)>;
    let set = |key: &'static str, value: Value| -> Tweak {
        Box::new(move |(meta, _): &mut Parts| {
            meta.retain(|(k, _)| k != key);
            meta.push((key.to_owned(), value));
        })
    };
    let add_tensor = |name: &'static str| -> Tweak {
        Box::new(move |(_, tensors): &mut Parts| tensors.push((name.to_owned(), ones(HIDDEN))))
    };
    let cases: Vec<(&str, Tweak, &str)> = vec![
        (
            "bert-vocab",
            set("tokenizer.ggml.model", Value::String("bert".into())),
            "tokenizer model `bert`",
        ),
        (
            "moe",
            set("llama.expert_count", Value::U32(8)),
            "a mixture of experts (8 experts",
        ),
        (
            "rope-freqs",
            add_tensor("rope_freqs.weight"),
            "Llama 3.1 style RoPE scaling",
        ),
        (
            "bias",
            add_tensor("blk.0.attn_q.bias"),
            "tensor `blk.0.attn_q.bias` has no known Hugging Face name",
        ),
    ];
    for (name, tweak, message) in cases {
        let tmp = tempfile::tempdir().expect("tempdir");
        let gguf = tmp.path().join("in.gguf");
        write_gguf_with(&gguf, "llama", tweak);
        let (code, _, stderr) = run(sous()
            .args(["import", "gguf"])
            .arg(&gguf)
            .arg("--out")
            .arg(tmp.path().join("out")));
        assert_eq!(code, 1, "{name}: {stderr}");
        assert!(stderr.contains(message), "{name}: {stderr}");
        assert!(stderr.contains("in.gguf"), "{name}: names the file: {stderr}");
        assert_only(tmp.path(), &["in.gguf"]);
    }
}

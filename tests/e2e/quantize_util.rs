//! What the `sous quantize` tests share: running the command, reading its `--json`
//! summary, hashing tensor bytes, and writing generated bf16 models (safetensors
//! shards with an index, a config and a tokenizer file). No test lives here.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::util::{run, sous};

pub fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

pub fn quantize(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = sous();
    cmd.arg("quantize").args(args).envs(envs.iter().copied());
    run(&mut cmd)
}

pub fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes `specs` as bf16 safetensors shards (random values of a weight-like spread,
/// streamed to disk) with an index, config.json and a tokenizer file.
pub fn write_model(dir: &Path, specs: &[(String, Vec<usize>)], shards: usize, seed: u64) {
    std::fs::create_dir_all(dir).expect("model dir");
    let per_shard = specs.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    let mut total = 0u64;
    for (s, chunk) in specs.chunks(per_shard).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", s + 1)
        };
        let mut header = serde_json::Map::new();
        let mut at = 0u64;
        for (name, shape) in chunk {
            let len = shape.iter().product::<usize>() as u64 * 2;
            header.insert(
                name.clone(),
                json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + len]}),
            );
            weight_map.insert(name.clone(), Value::String(file.clone()));
            at += len;
        }
        total += at;
        let mut text = Value::Object(header).to_string();
        while !text.len().is_multiple_of(8) {
            text.push(' ');
        }
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(dir.join(&file)).expect("shard"),
        );
        out.write_all(&(text.len() as u64).to_le_bytes()).expect("write");
        out.write_all(text.as_bytes()).expect("write");
        let mut buffer = Vec::with_capacity(1 << 20);
        for (name, shape) in chunk {
            let n: usize = shape.iter().product();
            let norm = name.contains("norm");
            for i in 0..n {
                // xorshift64*: a weight-like spread with an outlier now and then.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                let v = if norm {
                    1.0
                } else if i % 4093 == 0 {
                    r * 2.0
                } else {
                    r * 0.08
                };
                buffer.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
                if buffer.len() >= 1 << 20 {
                    out.write_all(&buffer).expect("write");
                    buffer.clear();
                }
            }
        }
        out.write_all(&buffer).expect("write");
        out.flush().expect("flush");
    }
    if shards > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    }
    let hidden = specs[0].1[1];
    let config = json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                        "num_hidden_layers": 2, "tie_word_embeddings": false, "torch_dtype": "bfloat16"});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    std::fs::write(dir.join("tokenizer.json"), b"{\"version\": \"1.0\"}").expect("tokenizer");
}

/// Copies the model in `src` to `dst` with every BF16 tensor widened to F32 (exactly:
/// a bf16 value is the top half of its f32) and `torch_dtype` set to `float32`; other
/// tensors and files are copied as they are. The same weights, in a checkpoint whose
/// activations and scales are f32.
pub fn widen_to_f32(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("f32 model dir");
    for entry in std::fs::read_dir(src).expect("read model dir") {
        let from = entry.expect("entry").path();
        let name = from.file_name().expect("file name").to_owned();
        let to = dst.join(&name);
        if from.extension().is_some_and(|e| e == "safetensors") {
            widen_shard(&from, &to);
        } else if name == "config.json" {
            let mut config: Value =
                serde_json::from_slice(&std::fs::read(&from).expect("config")).expect("config JSON");
            for key in ["torch_dtype", "dtype"] {
                if config.get(key).is_some() {
                    config[key] = json!("float32");
                }
            }
            std::fs::write(&to, serde_json::to_vec_pretty(&config).expect("JSON")).expect("config");
        } else if from.is_file() {
            std::fs::copy(&from, &to).expect("copy");
        }
    }
}

fn widen_shard(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).expect("read shard");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("safetensors header");
    let parsed = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut header = serde_json::Map::new();
    if let Some(m) = meta.metadata() {
        header.insert("__metadata__".into(), json!(m));
    }
    // In the source's order of offsets, so the copy is laid out as the source is.
    let mut names: Vec<(usize, String)> = meta
        .tensors()
        .iter()
        .map(|(name, info)| (info.data_offsets.0, name.clone()))
        .collect();
    names.sort();
    let mut data = Vec::new();
    for (_, name) in &names {
        let view = parsed.tensor(name).expect("tensor");
        let (dtype, start) = (format!("{:?}", view.dtype()), data.len());
        let dtype = if view.dtype() == safetensors::Dtype::BF16 {
            for pair in view.data().chunks_exact(2) {
                data.extend_from_slice(
                    &(u32::from(u16::from_le_bytes([pair[0], pair[1]])) << 16).to_le_bytes(),
                );
            }
            "F32".to_owned()
        } else {
            data.extend_from_slice(view.data());
            dtype
        };
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": view.shape(), "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(to).expect("shard"));
    out.write_all(&(text.len() as u64).to_le_bytes()).expect("write");
    out.write_all(text.as_bytes()).expect("write");
    out.write_all(&data).expect("write");
    out.flush().expect("flush");
}

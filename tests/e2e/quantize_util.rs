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

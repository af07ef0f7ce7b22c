//! `sous quantize` end to end: the real binary on the SmolLM2 test model (bytes
//! compared with llm-compressor's, from the digest fixture made by
//! scripts/reference/nvfp4_reference.py) and on generated models: the ModelOpt format,
//! reruns, interruption, refusals, recipes, and a multi-shard model several times
//! larger than the address space the process is allowed.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale, fast};

use crate::util::{root, run, smollm2, sous};

/// One tensor of a safetensors file, as stored.
struct Stored {
    dtype: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Every tensor of every `*.safetensors` file in `dir`, and each file's metadata.
fn read_tensors(dir: &Path) -> (BTreeMap<String, Stored>, Vec<BTreeMap<String, String>>) {
    let mut tensors = BTreeMap::new();
    let mut metadata = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    for path in files {
        let bytes = std::fs::read(&path).expect("read shard");
        // The safetensors crate validates the header and the offsets.
        let parsed = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("metadata");
        metadata.push(meta.metadata().clone().unwrap_or_default().into_iter().collect());
        for (name, view) in parsed.tensors() {
            tensors.insert(
                name,
                Stored {
                    dtype: format!("{:?}", view.dtype()),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            );
        }
    }
    (tensors, metadata)
}

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn quantize(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = sous();
    cmd.arg("quantize").args(args).envs(envs.iter().copied());
    run(&mut cmd)
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn smollm2_is_bit_identical_to_llm_compressor() {
    let Some(model) = smollm2() else { return };
    let fixture = fixture("smollm2-135m-instruct.llmcompressor.json", &model);
    let out = tempfile::tempdir().expect("tempdir");
    let target = out.path().join("smollm2-nvfp4a16");
    let (code, stdout, stderr) = quantize(
        &[
            path(&model),
            "--out",
            path(&target),
            "--json",
            "--digests",
            "--quiet",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let summary = json(&stdout);

    // Every quantized tensor, byte for byte, against llm-compressor 0.14.0.1.
    let (tensors, metadata) = read_tensors(&target);
    let expected = fixture["tensors"].as_object().expect("tensors");
    assert_eq!(expected.len(), 630);
    let mut same = 0;
    for (name, want) in expected {
        let got = tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from the output"));
        assert_eq!(got.dtype, want["dtype"].as_str().expect("dtype"), "{name}");
        assert_eq!(json!(got.shape), want["shape"], "{name}");
        assert_eq!(sha256(&got.data), want["sha256"].as_str().expect("sha"), "{name}");
        same += 1;
    }
    assert_eq!(same, 630);
    // Nothing else was quantized, and what was kept is the source's bytes.
    let (source, _) = read_tensors(&model);
    for (name, t) in &tensors {
        if expected.contains_key(name) {
            continue;
        }
        let original = source
            .get(name)
            .unwrap_or_else(|| panic!("{name} is neither quantized nor in the source"));
        assert_eq!(sha256(&t.data), sha256(&original.data), "{name} was changed");
    }
    assert_eq!(
        tensors.len() - 630,
        fixture["unquantized_tensors"].as_array().expect("list").len()
    );
    // The summary's digests are the written bytes'.
    for t in summary["tensors"].as_array().expect("tensors") {
        for (name, digest) in t["sha256"].as_object().expect("digests") {
            assert_eq!(Some(digest), expected[name].get("sha256"), "{name}");
        }
    }

    // config.json: llm-compressor's quantization_config without scale_dtype and
    // zp_dtype (left out for compressed-tensors <= 0.12, see checkpoint.rs).
    let config: Value = serde_json::from_slice(&std::fs::read(target.join("config.json")).expect("config"))
        .expect("config JSON");
    let mut want = fixture["quantization_config"].clone();
    for key in ["scale_dtype", "zp_dtype"] {
        want["config_groups"]["group_0"]["weights"]
            .as_object_mut()
            .expect("weights")
            .remove(key);
    }
    assert_eq!(config["quantization_config"], want);
    let source_config: Value =
        serde_json::from_slice(&std::fs::read(model.join("config.json")).expect("config")).expect("JSON");
    for (key, value) in source_config.as_object().expect("object") {
        assert_eq!(&config[key], value, "config.json {key}");
    }
    // Tokenizer and generation config copied; provenance in every header.
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            crate::util::sha256(&target.join(file)),
            crate::util::sha256(&model.join(file)),
            "{file}"
        );
    }
    for meta in &metadata {
        assert_eq!(meta["format"], "pt");
        assert_eq!(meta["sous.scheme"], "nvfp4a16");
        assert_eq!(meta["sous.format"], "compressed-tensors");
        assert_eq!(meta["sous.version"], env!("CARGO_PKG_VERSION"));
    }
    // Statistics are there and plausible for 4-bit weights.
    for t in summary["tensors"].as_array().expect("tensors") {
        let rel = t["relative_rms_error"].as_f64().expect("relative error");
        assert!(rel > 0.01 && rel < 0.2, "{t}");
        assert!(t["saturated_block_share"].as_f64().expect("share") < 0.01, "{t}");
    }
    // q/k/v and gate/up share their global scale.
    let scale = |n: &str| sha256(&tensors[&format!("model.layers.7.{n}.weight_global_scale")].data);
    assert_eq!(scale("self_attn.q_proj"), scale("self_attn.k_proj"));
    assert_eq!(scale("self_attn.q_proj"), scale("self_attn.v_proj"));
    assert_eq!(scale("mlp.gate_proj"), scale("mlp.up_proj"));
}

/// The fixture of a real ModelOpt export, checked against the test model.
fn fixture(name: &str, model: &Path) -> Value {
    let fixture: Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/nvfp4").join(name)).expect("fixture"),
    )
    .expect("fixture JSON");
    let source_sha = crate::util::sha256(&model.join("model.safetensors"));
    assert_eq!(
        fixture["source"]["model.safetensors"].as_str(),
        Some(source_sha.as_str()),
        "the test model is not the one {name} was made from: rerun \
         scripts/reference/nvfp4_reference.py (see its docstring)"
    );
    fixture
}

#[test]
fn smollm2_modelopt_checkpoint() {
    let Some(model) = smollm2() else { return };
    let out = tempfile::tempdir().expect("tempdir");

    // Bit for bit against ModelOpt 0.47's own CPU export of the same weights.
    let fixture = fixture("smollm2-135m-instruct.modelopt-cpu.json", &model);
    let cpu = out.path().join("smollm2-modelopt-cpu");
    let (code, _, stderr) = quantize(
        &[
            path(&model),
            "--format",
            "modelopt",
            "--modelopt-export",
            "cpu",
            "--out",
            path(&cpu),
            "--quiet",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let (tensors, _) = read_tensors(&cpu);
    let expected = fixture["tensors"].as_object().expect("tensors");
    assert_eq!(expected.len(), 630);
    for (name, want) in expected {
        let got = tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from the output"));
        assert_eq!(got.dtype, want["dtype"].as_str().expect("dtype"), "{name}");
        assert_eq!(json!(got.shape), want["shape"], "{name}");
        assert_eq!(sha256(&got.data), want["sha256"].as_str().expect("sha"), "{name}");
    }
    assert_eq!(
        tensors.len() - 630,
        fixture["unquantized_tensors"].as_array().expect("list").len()
    );
    let read_json =
        |p: PathBuf| -> Value { serde_json::from_slice(&std::fs::read(p).expect("read")).expect("JSON") };
    let hf_quant = read_json(cpu.join("hf_quant_config.json"));
    assert_eq!(
        hf_quant["quantization"],
        fixture["hf_quant_config"]["quantization"]
    );
    // Everything but the producer, which is sous and says so.
    let mut config = read_json(cpu.join("config.json"))["quantization_config"].clone();
    let mut want = fixture["quantization_config"].clone();
    assert_eq!(config["producer"]["name"], "sous");
    config.as_object_mut().expect("object").remove("producer");
    want.as_object_mut().expect("object").remove("producer");
    assert_eq!(config, want);

    let target = out.path().join("smollm2-modelopt");
    let (code, stdout, stderr) = quantize(
        &[
            path(&model),
            "--format",
            "modelopt",
            "--out",
            path(&target),
            "--json",
            "--quiet",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let summary = json(&stdout);
    assert_eq!(summary["format"], "modelopt");
    let hf_quant = read_json(target.join("hf_quant_config.json"));
    assert_eq!(
        hf_quant["quantization"],
        json!({"quant_algo": "W4A16_NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
               "exclude_modules": ["lm_head", "model.embed_tokens"]})
    );

    // The default reproduces ModelOpt's GPU export: one weight_scale_2 per fused
    // group, amax * f32(1/2688), recomputed here from the source weights.
    let (tensors, _) = read_tensors(&target);
    let (source, _) = read_tensors(&model);
    let amax = |name: &str| {
        let s = &source[name];
        fast::amax(&Matrix::new(Dtype::Bf16, s.shape[0], s.shape[1], &s.data).expect("matrix"))
    };
    let layer = "model.layers.3";
    let group = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];
    let group_amax = group
        .iter()
        .map(|m| amax(&format!("{layer}.{m}.weight")))
        .fold(0.0f32, f32::max);
    for m in group {
        let weight = &tensors[&format!("{layer}.{m}.weight")];
        let source_shape = &source[&format!("{layer}.{m}.weight")].shape;
        assert_eq!(weight.dtype, "U8");
        assert_eq!(weight.shape, vec![source_shape[0], source_shape[1] / 2]);
        assert_eq!(tensors[&format!("{layer}.{m}.weight_scale")].dtype, "F8_E4M3");
        let s2 = &tensors[&format!("{layer}.{m}.weight_scale_2")];
        assert_eq!(
            (s2.dtype.as_str(), s2.shape.len()),
            ("F32", 0),
            "a 0-d f32 scalar"
        );
        let value = f32::from_le_bytes(s2.data[..4].try_into().expect("4 bytes"));
        assert_eq!(value, group_amax * f32::from_bits(0x39C3_0C31), "{m}");
        let s = &source[&format!("{layer}.{m}.weight")];
        let q = fast::quantize(
            &Matrix::new(Dtype::Bf16, s.shape[0], s.shape[1], &s.data).expect("matrix"),
            &TensorScale::from_amax(Flavor::ModelOptGpu, Dtype::Bf16, group_amax),
        );
        assert_eq!(sha256(&weight.data), sha256(&q.packed), "{m}");
    }
    assert!(!tensors.contains_key(&format!("{layer}.self_attn.q_proj.weight_packed")));
}

/// A small Llama-like bf16 model with deterministic weights; `cols` overrides
/// `hidden` as the input size of `down_proj` (for the block-size refusal).
fn small_model(dir: &Path, hidden: usize, down_in: usize, shards: usize) {
    let layers = 2;
    let mut specs: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![256, hidden])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![hidden]),
            ("self_attn.q_proj.weight", vec![hidden, hidden]),
            ("self_attn.k_proj.weight", vec![hidden / 2, hidden]),
            ("self_attn.v_proj.weight", vec![hidden / 2, hidden]),
            ("self_attn.o_proj.weight", vec![hidden, hidden]),
            ("mlp.gate_proj.weight", vec![down_in, hidden]),
            ("mlp.up_proj.weight", vec![down_in, hidden]),
            ("mlp.down_proj.weight", vec![hidden, down_in]),
        ] {
            specs.push((format!("{p}.{name}"), shape));
        }
    }
    specs.push(("model.norm.weight".into(), vec![hidden]));
    specs.push(("lm_head.weight".into(), vec![256, hidden]));
    write_model(dir, &specs, shards, 1);
}

/// Writes `specs` as bf16 safetensors shards (random values of a weight-like spread,
/// streamed to disk) with an index, config.json and a tokenizer file.
fn write_model(dir: &Path, specs: &[(String, Vec<usize>)], shards: usize, seed: u64) {
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

#[test]
fn rerun_is_a_noop_and_force_replaces() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("model");
    small_model(&model, 64, 128, 2);
    let out = work.path().join("out");
    let args = [path(&model), "--out", path(&out), "--json", "--quiet"];
    let (code, stdout, stderr) = quantize(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["up_to_date"], false);
    let before = crate::util::sha256(&out.join("model.safetensors"));
    let mtime = std::fs::metadata(out.join("model.safetensors"))
        .expect("meta")
        .modified()
        .expect("mtime");

    let (code, stdout, stderr) = quantize(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["up_to_date"], true);
    let after = std::fs::metadata(out.join("model.safetensors"))
        .expect("meta")
        .modified()
        .expect("mtime");
    assert_eq!(mtime, after, "a rerun must not rewrite the output");

    // Other inputs (here the format) must not be mistaken for the finished output.
    let modelopt = [
        path(&model),
        "--out",
        path(&out),
        "--format",
        "modelopt",
        "--quiet",
    ];
    let (code, _, stderr) = quantize(&modelopt, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("already exists") && stderr.contains("--force"),
        "{stderr}"
    );
    let (code, _, stderr) = quantize(&[&modelopt[..], &["--force"]].concat(), &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(out.join("hf_quant_config.json").exists());
    assert_ne!(crate::util::sha256(&out.join("model.safetensors")), before);
    // Directories sous did not write are never replaced, --force or not; nor is the source.
    let foreign = work.path().join("foreign");
    std::fs::create_dir(&foreign).expect("dir");
    std::fs::write(foreign.join("notes.txt"), b"mine").expect("file");
    let (code, _, stderr) = quantize(
        &[path(&model), "--out", path(&foreign), "--force", "--quiet"],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("holds files sous did not write"), "{stderr}");
    assert!(foreign.join("notes.txt").exists());
    let (code, _, stderr) = quantize(&[path(&model), "--out", path(&model), "--force", "--quiet"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("source model"), "{stderr}");
    assert!(model.join("config.json").exists());
    std::fs::remove_dir_all(&foreign).expect("cleanup");
    // An empty directory is fine.
    let empty = work.path().join("empty");
    std::fs::create_dir(&empty).expect("dir");
    let (code, _, stderr) = quantize(&[path(&model), "--out", path(&empty), "--quiet"], &[]);
    assert_eq!(code, 0, "{stderr}");
    std::fs::remove_dir_all(&empty).expect("cleanup");
    // No temporary directories are left beside the output.
    let leftovers: Vec<String> = std::fs::read_dir(work.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn refuses_what_it_cannot_do() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("model");
    small_model(&model, 64, 128, 1);
    let out = work.path().join("out");
    let base = [path(&model), "--out", path(&out), "--quiet"];
    let check = |extra: &[&str], needles: &[&str]| {
        let (code, stdout, stderr) = quantize(&[&base[..], extra].concat(), &[]);
        assert_eq!(code, 1, "{extra:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        for needle in needles {
            assert!(stderr.contains(needle), "{extra:?}: no `{needle}` in {stderr}");
        }
        assert!(!out.exists(), "a refused run wrote {}", out.display());
    };
    check(&["--scheme", "nvfp4"], &["calibration", "hint:", "nvfp4a16"]);
    check(
        &["--ignore", "model.layers.0.self_attn.k_proj"],
        &["k_proj", "fuse"],
    );
    check(&["--ignore", "re:("], &["re:(", "regular expression"]);

    let odd = work.path().join("odd");
    small_model(&odd, 64, 120, 1);
    let (code, _, stderr) = quantize(&[path(&odd), "--out", path(&out), "--quiet"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("model.layers.0.mlp.down_proj.weight has 120 input features"),
        "{stderr}"
    );
    assert!(stderr.contains("quantize.ignore"), "{stderr}");
    // ... and with it ignored, it goes through, listed in the config's ignore.
    let (code, _, stderr) = quantize(
        &[
            path(&odd),
            "--out",
            path(&out),
            "--quiet",
            "--ignore",
            r"re:.*mlp\.down_proj",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let config: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).expect("config")).expect("JSON");
    assert_eq!(
        config["quantization_config"]["ignore"],
        json!([
            "lm_head",
            "model.layers.0.mlp.down_proj",
            "model.layers.1.mlp.down_proj"
        ])
    );

    // The quantized output is not a source, and a directory without weights is no model.
    let (code, _, stderr) = quantize(&[path(&out), "--out", path(&work.path().join("again"))], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("already quantized"), "{stderr}");
    let (code, _, stderr) = quantize(&[path(work.path()), "--out", path(&work.path().join("x"))], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no config.json"), "{stderr}");
}

#[test]
fn recipe_drives_quantize() {
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("model");
    small_model(&model, 64, 128, 1);
    let recipe = work.path().join("small.toml");
    std::fs::write(
        &recipe,
        format!(
            "[model]\npath = \"{}\"\n\n[quantize]\nscheme = \"nvfp4a16\"\nformat = \"modelopt\"\nignore = [\"model.layers.1.self_attn.o_proj\"]\n\n[engine]\nkind = \"vllm\"\n",
            model.display()
        ),
    )
    .expect("recipe");
    let cache = work.path().join("cache");
    let mut cmd = sous();
    cmd.args(["quantize", "--recipe", path(&recipe), "--json", "--quiet"])
        .env("SOUS_CACHE_DIR", &cache);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    let summary = json(&stdout);
    let out = cache.join("quantized/small");
    assert_eq!(summary["output"], path(&out));
    assert_eq!(summary["format"], "modelopt");
    let hf_quant: Value =
        serde_json::from_slice(&std::fs::read(out.join("hf_quant_config.json")).expect("hf_quant_config"))
            .expect("JSON");
    assert_eq!(
        hf_quant["quantization"]["exclude_modules"],
        json!(["lm_head", "model.embed_tokens", "model.layers.1.self_attn.o_proj"])
    );
    // --set overrides the recipe as for every command.
    let mut cmd = sous();
    cmd.args([
        "quantize",
        "--recipe",
        path(&recipe),
        "--quiet",
        "--set",
        "quantize.scheme=nvfp4",
    ])
    .env("SOUS_CACHE_DIR", &cache);
    let (code, _, stderr) = run(&mut cmd);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("calibration"), "{stderr}");
    // A recipe without [quantize] says so.
    let mut cmd = sous();
    cmd.args(["quantize", "--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml"]);
    let (code, _, stderr) = run(&mut cmd);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no `[quantize]` section"), "{stderr}");
}

/// A Llama-70B-shaped layer (hidden 8192, intermediate 28672) in bf16: 1.8 GB over
/// four shards, each MLP weight 470 MB. Generated once into target/.
fn big_model() -> PathBuf {
    static BIG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIG.get_or_init(generate_big_model).clone()
}

fn generate_big_model() -> PathBuf {
    let dir = root().join("target/test-quantize/llama70b-layer");
    let done = dir.join(".complete");
    if done.exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (h, kv, i) = (8192, 1024, 28672);
    let p = "model.layers.0";
    let specs: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![4096, h]),
        (format!("{p}.input_layernorm.weight"), vec![h]),
        (format!("{p}.self_attn.q_proj.weight"), vec![h, h]),
        (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
        (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
        (format!("{p}.self_attn.o_proj.weight"), vec![h, h]),
        (format!("{p}.post_attention_layernorm.weight"), vec![h]),
        (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
        (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
        (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
        ("model.norm.weight".into(), vec![h]),
        ("lm_head.weight".into(), vec![4096, h]),
    ];
    write_model(&dir, &specs, 4, 7);
    std::fs::write(&done, b"").expect("marker");
    dir
}

/// Reads `len` bytes at `offset` of a file.
fn read_at(file: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(file).expect("open");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).expect("read");
    buf
}

/// A tensor's bytes, from a sharded checkpoint's index, read without mapping it all.
fn tensor_bytes(dir: &Path, name: &str) -> (Vec<usize>, Vec<u8>) {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).expect("index"))
            .expect("JSON");
    let file = dir.join(index["weight_map"][name].as_str().expect("in the index"));
    let header_len = u64::from_le_bytes(read_at(&file, 0, 8).try_into().expect("8 bytes"));
    let header: Value = serde_json::from_slice(&read_at(&file, 8, header_len as usize)).expect("header");
    let info = &header[name];
    let [start, end] = [0, 1].map(|k| info["data_offsets"][k].as_u64().expect("offset"));
    let shape = info["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect();
    let data = read_at(&file, 8 + header_len + start, (end - start) as usize);
    (shape, data)
}

/// The bound is real: a 1.8 GB model whose largest tensors (470 MB) are each larger
/// than the whole address space the process may use (256 MiB: binary, libraries,
/// thread stacks and heap included) quantizes, into several shards, to the same
/// bytes as quantizing every tensor whole. Mapping a whole tensor under the same limit
/// fails, which shows the limit bites.
#[test]
fn quantizes_a_model_larger_than_its_address_space() {
    let limit_kib = 256 * 1024;
    let model = big_model();
    let work = tempfile::tempdir_in(root().join("target")).expect("tempdir");
    let out = work.path().join("out");
    let limited = |window: Option<&str>| {
        let bin = assert_cmd::cargo::cargo_bin("sous");
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "ulimit -v {limit_kib} && exec \"$0\" quantize \"$1\" --out \"$2\" --max-shard-size 300MB --json --quiet"
            ))
            .arg(&bin)
            .arg(&model)
            .arg(&out)
            .env("NO_COLOR", "1");
        if let Some(window) = window {
            cmd.env("SOUS_QUANTIZE_WINDOW", window);
        }
        let output = cmd.output().expect("sh runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // Whole tensors at once: 470 MB maps cannot fit in 256 MiB.
    let (code, _, stderr) = limited(Some("1000000000"));
    assert_ne!(code, 0, "the limit does not bite: {stderr}");
    assert!(!out.exists());

    let (code, stdout, stderr) = limited(None);
    assert_eq!(code, 0, "{stderr}");
    let summary = json(&stdout);
    let source_bytes: u64 = [
        "model-00001-of-00004",
        "model-00002-of-00004",
        "model-00003-of-00004",
        "model-00004-of-00004",
    ]
    .iter()
    .map(|s| {
        std::fs::metadata(model.join(format!("{s}.safetensors")))
            .expect("shard")
            .len()
    })
    .sum();
    assert!(source_bytes > 3 * limit_kib as u64 * 1024, "{source_bytes}");
    assert!(summary["shards"].as_u64().expect("shards") >= 3, "{summary}");
    assert_eq!(summary["quantized"], 7);

    // Same bytes as whole-tensor quantization, group by group.
    let groups: [&[&str]; 4] = [
        &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        &["self_attn.o_proj"],
        &["mlp.gate_proj", "mlp.up_proj"],
        &["mlp.down_proj"],
    ];
    for group in groups {
        let sources: Vec<(Vec<usize>, Vec<u8>)> = group
            .iter()
            .map(|m| tensor_bytes(&model, &format!("model.layers.0.{m}.weight")))
            .collect();
        let matrices: Vec<Matrix> = sources
            .iter()
            .map(|(shape, data)| Matrix::new(Dtype::Bf16, shape[0], shape[1], data).expect("matrix"))
            .collect();
        let scale = TensorScale::from_amax(
            Flavor::CompressedTensors,
            Dtype::Bf16,
            fast::group_amax(&matrices),
        );
        for (m, matrix) in group.iter().zip(&matrices) {
            let want = fast::quantize(matrix, &scale);
            let p = format!("model.layers.0.{m}");
            assert_eq!(
                tensor_bytes(&out, &format!("{p}.weight_packed")).1,
                want.packed,
                "{p}"
            );
            assert_eq!(
                tensor_bytes(&out, &format!("{p}.weight_scale")).1,
                want.scales,
                "{p}"
            );
            assert_eq!(
                tensor_bytes(&out, &format!("{p}.weight_global_scale")).1,
                scale.value().to_le_bytes(),
                "{p}"
            );
        }
    }
    let (_, embed) = tensor_bytes(&out, "model.embed_tokens.weight");
    assert_eq!(
        sha256(&embed),
        sha256(&tensor_bytes(&model, "model.embed_tokens.weight").1)
    );
}

/// Killed half way, a run leaves nothing that looks like a checkpoint; the next run
/// cleans up after it and finishes.
#[test]
fn an_interrupted_run_leaves_nothing_complete() {
    let model = big_model();
    let work = tempfile::tempdir_in(root().join("target")).expect("tempdir");
    let out = work.path().join("out");
    let bin = assert_cmd::cargo::cargo_bin("sous");
    let mut child = std::process::Command::new(&bin)
        .args(["quantize", path(&model), "--out", path(&out), "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sous starts");
    // Wait until it is writing, then kill it.
    let started = std::time::Instant::now();
    loop {
        let writing = std::fs::read_dir(work.path())
            .expect("dir")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains(".sous-tmp-"));
        if writing || started.elapsed() > std::time::Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "finished before it could be interrupted");
    assert!(!out.exists(), "an interrupted run left {}", out.display());

    let (code, stdout, stderr) = quantize(&[path(&model), "--out", path(&out), "--json", "--quiet"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["up_to_date"], false);
    assert!(out.join(".sous-quantize.json").exists());
    let leftovers: Vec<String> = std::fs::read_dir(work.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "out")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

//! `sous quantize` on a generated Llama-70B-shaped layer (1.8 GB over four shards):
//! under an address-space limit several times smaller than the model, where it must
//! give the same bytes as quantizing every tensor whole, and killed half way, where it
//! must leave nothing that looks finished.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale, fast};

use crate::quantize_util::{json, path, quantize, sha256, write_model};
use crate::util::root;

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
            .env("NO_COLOR", "1")
            // glibc reserves 64 MiB of address space for each thread's malloc arena; under
            // this limit, whether the kernel's worker threads reserve theirs before a window
            // is mapped depends on timing, and 1 to 2 runs in 20 ran out of address space
            // that way. One arena leaves the limit to sous's own maps.
            .env("MALLOC_ARENA_MAX", "1");
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

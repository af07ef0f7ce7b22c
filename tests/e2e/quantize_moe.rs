//! `sous quantize` on the MoE and hybrid models of `tests/fixtures/architectures/` (tiny
//! random models saved by transformers 5.17): fused 3-D expert tensors are quantized
//! expert by expert, into the same bytes as the one-tensor-per-expert twin of the same
//! model, in both checkpoint formats; nothing Linear is left in 16 bits unasked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::quantize_util::{path, quantize, sha256};
use crate::util::root;

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/architectures").join(name)
}

/// Every tensor of a checkpoint directory: name → (dtype, shape, SHA-256 of its bytes).
pub fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<u64>, String)> {
    let mut out = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("output directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    for file in files {
        let bytes = std::fs::read(&file).expect("shard");
        let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).expect("header");
        for (name, info) in header.as_object().expect("object") {
            if name == "__metadata__" {
                continue;
            }
            let offsets: Vec<usize> = info["data_offsets"]
                .as_array()
                .expect("offsets")
                .iter()
                .map(|v| v.as_u64().expect("offset") as usize)
                .collect();
            let data = &bytes[8 + len + offsets[0]..8 + len + offsets[1]];
            let shape = info["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|v| v.as_u64().expect("dim"))
                .collect();
            let dtype = info["dtype"].as_str().expect("dtype").to_owned();
            out.insert(name.clone(), (dtype, shape, sha256(data)));
        }
    }
    out
}

#[test]
fn fused_experts_are_quantized_expert_by_expert_in_both_formats() {
    let dir = tempfile::tempdir().expect("tempdir");
    for model in ["qwen3_moe", "qwen3_5_moe", "qwen3_next"] {
        for format in ["compressed-tensors", "modelopt"] {
            let run = |name: &str| {
                let out = dir.path().join(format!("{name}-{format}"));
                let (code, stdout, stderr) = quantize(
                    &[
                        path(&fixture(name)),
                        "--out",
                        path(&out),
                        "--format",
                        format,
                        "--json",
                        "--quiet",
                    ],
                    &[],
                );
                assert_eq!(code, 0, "{name} {format}: {stderr}");
                (out, crate::quantize_util::json(&stdout))
            };
            let (per_expert, summary) = run(model);
            let (fused, fused_summary) = run(&format!("{model}-fused"));
            assert_eq!(
                summary["quantized"], fused_summary["quantized"],
                "{model} {format}"
            );
            // The fused twins were saved without an MTP head.
            let decoder = |dir: &Path| {
                let mut all = tensors(dir);
                all.retain(|name, _| !name.starts_with("mtp."));
                all
            };
            let (a, b) = (decoder(&per_expert), decoder(&fused));
            let differ: Vec<&String> = a.keys().filter(|n| a.get(*n) != b.get(*n)).collect();
            assert!(
                differ.is_empty() && a.len() == b.len(),
                "{model} {format}: the fused layout gives other tensors: {:?} ({} against {})",
                &differ[..differ.len().min(5)],
                a.len(),
                b.len()
            );
            // Every expert of every layer is 4-bit, and no 3-D tensor is left.
            let packed = if format == "modelopt" {
                ".weight"
            } else {
                ".weight_packed"
            };
            let experts = b
                .iter()
                .filter(|(n, (dtype, _, _))| n.contains(".experts.") && n.ends_with(packed) && dtype == "U8")
                .count();
            // As many as the per-expert source has expert weights outside its MTP head.
            let source = tensors(&fixture(model))
                .into_keys()
                .filter(|n| n.contains(".experts.") && !n.starts_with("mtp."))
                .count();
            assert!(source > 0);
            assert_eq!(experts, source, "{model} {format}: NVFP4 expert weights");
            assert!(b.values().all(|(_, shape, _)| shape.len() < 3 || shape[1] == 1));
        }
    }
}

#[test]
fn expert_weights_in_a_layout_sous_does_not_read_are_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("model");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::copy(
        fixture("qwen3_moe-fused").join("config.json"),
        src.join("config.json"),
    )
    .expect("config");
    // The fused gate/up tensor saved transposed, [experts, hidden, 2 width], as GPT-OSS does.
    let specs = vec![
        (
            "model.layers.0.mlp.experts.gate_up_proj".to_owned(),
            vec![8, 64, 64],
        ),
        ("model.layers.0.mlp.experts.down_proj".to_owned(), vec![8, 32, 64]),
    ];
    crate::quantize_util::write_model(&src, &specs, 1, 7);
    std::fs::copy(
        fixture("qwen3_moe-fused").join("config.json"),
        src.join("config.json"),
    )
    .expect("config");
    let out = dir.path().join("out");
    let (code, _, stderr) = quantize(&[path(&src), "--out", path(&out)], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("model.layers.0.mlp.experts.down_proj"),
        "{stderr}"
    );
    assert!(stderr.contains("transposed"), "{stderr}");
    assert!(!out.exists(), "nothing is written");
}

/// The llm-compressor 0.14.0.1 fixture of `model` (scripts/reference/moe_nvfp4_reference.py).
fn llm_compressor(model: &str) -> serde_json::Value {
    let path = root()
        .join("tests/fixtures/nvfp4/architectures")
        .join(format!("{model}.llmcompressor.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

#[test]
fn moe_and_hybrid_models_quantize_to_llm_compressors_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let models = [
        "qwen3_moe",
        "qwen3_moe-fused",
        "qwen3_next",
        "qwen3_next-fused",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_moe-fused",
    ];
    for model in models {
        let out = dir.path().join(model);
        let (code, _, stderr) = quantize(&[path(&fixture(model)), "--out", path(&out), "--quiet"], &[]);
        assert_eq!(code, 0, "{model}: {stderr}");
        let ours = tensors(&out);
        let theirs = llm_compressor(model);
        let theirs = theirs["tensors"].as_object().expect("tensors");
        assert!(theirs.len() > 40, "{model}: {} quantized tensors", theirs.len());
        for (name, want) in theirs {
            let (dtype, shape, sha) = ours
                .get(name)
                .unwrap_or_else(|| panic!("{model}: sous wrote no `{name}`"));
            assert_eq!(dtype, want["dtype"].as_str().expect("dtype"), "{model} {name}");
            let want_shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).expect("shape");
            assert_eq!(*shape, want_shape, "{model} {name}");
            assert_eq!(
                sha,
                want["sha256"].as_str().expect("sha"),
                "{model} {name}: other bytes"
            );
        }
        // And nothing more is quantized than llm-compressor quantizes.
        let packed = ours.keys().filter(|n| n.ends_with(".weight_packed")).count();
        let want = theirs.keys().filter(|n| n.ends_with(".weight_packed")).count();
        assert_eq!(packed, want, "{model}: NVFP4 weights");
    }
}

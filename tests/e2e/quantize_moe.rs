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

/// `sous quantize MODEL --scan ARGS --json`, and its report.
fn scan(model: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec![path(model), "--scan", "--json", "--quiet"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = quantize(&all, &[]);
    assert_eq!(code, 0, "{stderr}");
    crate::quantize_util::json(&stdout)
}

/// The mean KL divergence of `candidate`'s next-token distributions from `source`'s
/// over the windows a scan reads (the built-in text, 256 tokens each), computed here
/// with the engine's own model loader on the two checkpoint directories.
fn kl_of_checkpoints(source: &Path, candidate: &Path, windows: usize) -> f64 {
    use sous_engine::native::config::ModelConfig;
    use sous_engine::native::model::{BatchSeq, KvCache, Logits, Model};
    use sous_engine::native::text::TextModel;
    use sous_engine::native::weights::{Checkpoint, Precision};
    let config = ModelConfig::read(source).expect("config");
    let text = TextModel::load(source, &config.eos_token_ids).expect("tokenizer");
    let builtin =
        std::fs::read_to_string(root().join("scripts/bench/data/alice-chapter1.txt")).expect("text");
    let ids = text.encode(&builtin, false).expect("tokens");
    let log_probs = |dir: &Path| -> Vec<Vec<f64>> {
        let config = ModelConfig::read(dir).expect("config");
        let checkpoint = Checkpoint::open(dir, &config).expect("checkpoint");
        let model = Model::load(config.clone(), &checkpoint, Precision::Stored, 256).expect("model");
        let mut cache = KvCache::new(&model, 16, 16).with_state_slots(1);
        let blocks: Vec<u32> = (0..16).collect();
        let mut rows = Vec::new();
        for window in ids.chunks_exact(256).take(windows) {
            let seq = BatchSeq {
                blocks: &blocks,
                tokens: window,
                start: 0,
                state: 0,
                logits: Logits::All,
            };
            let logits = model.forward(&[seq], &mut cache).expect("forward");
            for row in logits.chunks_exact(config.vocab_size) {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let log_sum =
                    (row.iter().map(|&v| f64::from(v - max).exp()).sum::<f64>()).ln() + f64::from(max);
                rows.push(row.iter().map(|&v| f64::from(v) - log_sum).collect());
            }
        }
        rows
    };
    let (p, q) = (log_probs(source), log_probs(candidate));
    let total: f64 = p
        .iter()
        .zip(&q)
        .map(|(p, q)| p.iter().zip(q).map(|(lp, lq)| lp.exp() * (lp - lq)).sum::<f64>())
        .sum();
    total / p.len() as f64
}

#[test]
fn a_scan_of_a_hybrid_moe_proposes_a_list_that_beats_both_defaults_and_holds_when_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = fixture("qwen3_5_moe-fused");
    let report = scan(&model, &["--max-kld", "0.02"]);
    assert_eq!(report["architecture"], "Qwen3_5MoeForCausalLM");
    // Every kind of the model was measured, per layer: experts, shared experts,
    // attention, and linear attention (kept by default, measured all the same).
    let groups = report["groups"].as_array().expect("groups");
    let kinds: std::collections::BTreeSet<&str> =
        groups.iter().map(|g| g["kind"].as_str().expect("kind")).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["experts", "linear attention", "o_proj", "q/k/v", "shared expert"]
    );
    let kl = |c: &serde_json::Value| c["divergence"]["kld"].as_f64().expect("kld");
    let configurations = report["configurations"].as_array().expect("configurations");
    let (everything, default) = (&configurations[0], &configurations[1]);
    let proposal = &report["proposal"];
    assert_eq!(proposal["met"], true);
    let chosen = &proposal["configuration"];
    assert!(kl(chosen) <= 0.02, "{}", kl(chosen));
    assert!(kl(chosen) < kl(default) && kl(default) < kl(everything));
    assert!(everything["bytes"].as_u64() < default["bytes"].as_u64());

    // Written as `--ignore`, the list gives exactly the checkpoint the scan measured.
    let ignore: Vec<String> = serde_json::from_value(proposal["ignore"].clone()).expect("ignore");
    let out = dir.path().join("proposed");
    let mut args = vec![
        path(&model).to_owned(),
        "--out".into(),
        path(&out).to_owned(),
        "--json".into(),
    ];
    for entry in &ignore {
        args.extend(["--ignore".to_owned(), entry.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = quantize(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    let summary = crate::quantize_util::json(&stdout);
    assert_eq!(
        summary["bytes_out"], chosen["bytes"],
        "the size the scan reported"
    );
    let measured = kl_of_checkpoints(&model, &out, 2);
    assert!(
        (measured - kl(chosen)).abs() < 1e-6,
        "scan {} against the written checkpoint {measured}",
        kl(chosen)
    );
}

#[test]
fn a_scan_writes_its_proposal_into_the_recipe_and_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = fixture("qwen3_next");
    let recipe = dir.path().join("next.toml");
    let text = format!(
        "# Qwen3-Next, tiny\nname = \"next\"\n[model]\npath = \"{}\"\n[engine]\nkind = \"native\"\n\
         [quantize]\nscheme = \"nvfp4a16\" # weight-only\nignore = [\"model.layers.3.self_attn.o_proj\"]\n",
        model.display()
    );
    std::fs::write(&recipe, &text).expect("recipe");
    let (code, stdout, stderr) = quantize(
        &[
            "--recipe",
            path(&recipe),
            "--scan",
            "--by",
            "kind",
            "--max-kld",
            "0.05",
            "--write",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    let report = crate::quantize_util::json(&stdout);
    // The recipe's own list is measured beside the defaults.
    let names: Vec<&str> = report["configurations"]
        .as_array()
        .expect("configurations")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert!(names.contains(&"the recipe's quantize.ignore"), "{names:?}");
    let written = std::fs::read_to_string(&recipe).expect("recipe");
    assert!(written.starts_with("# Qwen3-Next, tiny\n"), "{written}");
    assert!(written.contains("# weight-only"), "{written}");
    let parsed: toml::Table = written.parse().expect("TOML");
    let ignore: Vec<String> = parsed["quantize"]["ignore"]
        .as_array()
        .expect("ignore")
        .iter()
        .map(|v| v.as_str().expect("entry").to_owned())
        .collect();
    let proposed: Vec<String> =
        serde_json::from_value(report["proposal"]["ignore"].clone()).expect("proposal");
    assert_eq!(ignore, proposed);
    assert!(!ignore.is_empty());
    // And the recipe quantizes with it.
    let out = dir.path().join("q");
    let (code, _, stderr) = quantize(&["--recipe", path(&recipe), "--out", path(&out), "--quiet"], &[]);
    assert_eq!(code, 0, "{stderr}");

    // What it cannot do, said before any work.
    let (code, _, stderr) = quantize(&[path(&model), "--scan", "--write", "--max-kld", "0.1"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--write needs --recipe"), "{stderr}");
    let gpt_oss = dir.path().join("gpt-oss");
    std::fs::create_dir(&gpt_oss).expect("mkdir");
    std::fs::write(
        gpt_oss.join("config.json"),
        r#"{"architectures": ["GptOssForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1}"#,
    )
    .expect("config");
    let (code, _, stderr) = quantize(&[path(&gpt_oss), "--scan"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("GptOssForCausalLM"), "{stderr}");
}

/// `sous quantize MODEL --scheme nvfp4` calibrated on the builtin text's first 4
/// windows of 64 tokens, into `out`; its summary.
fn quantize_w4a4(model: &Path, out: &Path) -> serde_json::Value {
    let args = [
        path(model),
        "--out",
        path(out),
        "--scheme",
        "nvfp4",
        "--calibration-format",
        "text",
        "--samples",
        "4",
        "--seq-len",
        "64",
        "--json",
        "--quiet",
    ];
    let (code, stdout, stderr) = quantize(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    crate::quantize_util::json(&stdout)
}

fn fixture_json(name: &str) -> serde_json::Value {
    let path = root().join("tests/fixtures/nvfp4/architectures").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

/// Checks every written scale against `want` (module → input_global_scale) to `tolerance`
/// (relative; f32 sums in another order), and the all-experts rule: in each MoE layer,
/// every expert's gate/up scale is the same and every expert has a down scale.
fn assert_scales(
    model: &str,
    ours: &serde_json::Map<String, serde_json::Value>,
    want: &[(String, f64)],
    tolerance: f64,
) {
    assert_eq!(ours.len(), want.len(), "{model}: scales");
    for (module, want) in want {
        let got = ours[module]
            .as_f64()
            .unwrap_or_else(|| panic!("{model}: no scale for {module}"));
        assert!(
            ((got - want) / want).abs() <= tolerance,
            "{model} {module}: {got} against {want}"
        );
    }
    let mut by_layer: BTreeMap<&str, (Vec<f64>, usize)> = BTreeMap::new();
    for (module, scale) in ours {
        if let Some((layer, rest)) = module.split_once(".mlp.experts.") {
            let entry = by_layer.entry(layer).or_default();
            if rest.ends_with("down_proj") {
                entry.1 += 1;
            } else {
                entry.0.push(scale.as_f64().expect("scale"));
            }
        }
    }
    assert!(!by_layer.is_empty(), "{model}: no experts");
    for (layer, (gate_up, downs)) in by_layer {
        assert!(
            gate_up.windows(2).all(|w| w[0] == w[1]),
            "{model} {layer}: gate/up differ"
        );
        assert_eq!(
            downs,
            gate_up.len() / 2,
            "{model} {layer}: an expert without a down scale"
        );
    }
}

#[test]
fn w4a4_moe_and_hybrid_models_calibrate_every_expert_as_the_references_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    for model in ["qwen3_moe", "qwen3_next", "qwen3_5_moe"] {
        let out = dir.path().join(model);
        let summary = quantize_w4a4(&fixture(model), &out);
        let calibration = &summary["calibration"];
        assert_eq!(calibration["tokens"], 256);
        let ours = calibration["input_global_scale"].as_object().expect("scales");
        // The weights are llm-compressor's bytes.
        let llmc = fixture_json(&format!("{model}.w4a4.llmcompressor.json"));
        let written = tensors(&out);
        for (name, want) in llmc["tensors"].as_object().expect("tensors") {
            assert_eq!(
                written.get(name).map(|t| t.2.as_str()),
                want["sha256"].as_str(),
                "{model} {name}"
            );
        }
        // The activation scales: llm-compressor's for the hybrids; for Qwen3-MoE, which
        // llm-compressor 0.14.0.1 calibrates without the causal mask
        // (qwen3_moe.w4a4.unmasked.txt), transformers' own causal forward's.
        let want: Vec<(String, f64)> = if model == "qwen3_moe" {
            let reference = fixture_json("qwen3_moe.w4a4.transformers.json");
            reference["input_amax"]
                .as_object()
                .expect("amax")
                .iter()
                .map(|(m, amax)| {
                    (
                        m.clone(),
                        f64::from(2688.0f32 / amax.as_f64().expect("amax") as f32),
                    )
                })
                .collect()
        } else {
            llmc["global_scales"]
                .as_object()
                .expect("scales")
                .iter()
                .map(|(m, s)| (m.clone(), s["input_global_scale"].as_f64().expect("scale")))
                .collect()
        };
        assert_scales(model, ours, &want, 2e-6);
    }
}

#[test]
fn a_w4a4_hybrid_moe_is_served_with_its_activations_quantized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = fixture("qwen3_5_moe-fused");
    let w4a4 = dir.path().join("w4a4");
    quantize_w4a4(&model, &w4a4);
    let a16 = dir.path().join("a16");
    let (code, _, stderr) = quantize(&[path(&model), "--out", path(&a16), "--quiet"], &[]);
    assert_eq!(code, 0, "{stderr}");
    // Against the f32 model, over the windows a scan reads: W4A4 moves the distributions
    // further than weight-only NVFP4 (its activations are 4-bit too), and not by nats.
    let (kl_w4a4, kl_a16) = (
        kl_of_checkpoints(&model, &w4a4, 2),
        kl_of_checkpoints(&model, &a16, 2),
    );
    assert!(
        kl_a16 > 0.0 && kl_w4a4 > kl_a16 && kl_w4a4 < 1.0,
        "W4A4 {kl_w4a4}, NVFP4A16 {kl_a16}"
    );
}

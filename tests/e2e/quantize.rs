//! `sous quantize` end to end on small generated models: reruns and `--force`, what it
//! refuses to do, and recipes driving it. Bytes against the reference tools are in
//! `quantize_reference`, a model larger than the address space in `quantize_large`;
//! helpers they share are in `quantize_util`.

use std::path::Path;

use serde_json::{Value, json};

use crate::quantize_util::{json, path, quantize, write_model};
use crate::util::{run, sous};

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
        "--force",
    ])
    .env("SOUS_CACHE_DIR", &cache);
    let (code, _, stderr) = run(&mut cmd);
    assert_eq!(code, 1, "{stderr}");
    // W4A4 calibrates by running the model, which this generated one (no tokenizer)
    // cannot do; the earlier output, which --force would replace, is left as it was.
    assert!(stderr.contains("calibration"), "{stderr}");
    assert!(out.join("hf_quant_config.json").is_file());
    // A recipe without [quantize] says so.
    let mut cmd = sous();
    cmd.args(["quantize", "--recipe", "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml"]);
    let (code, _, stderr) = run(&mut cmd);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no `[quantize]` section"), "{stderr}");
}

/// `[quantize]`'s calibration keys: a text file found beside the recipe that names it,
/// samples and length taken from the recipe, the flags laid over them, and the keys
/// refused where the scheme has no calibration.
#[test]
fn calibration_comes_from_the_recipe_and_the_flags() {
    let work = tempfile::tempdir().expect("tempdir");
    let recipes = work.path().join("recipes");
    std::fs::create_dir(&recipes).expect("dir");
    // Refusals need no model: they come before anything is read.
    let refused = |body: &str, needles: &[&str]| {
        let recipe = recipes.join("refused.toml");
        std::fs::write(
            &recipe,
            format!("[model]\npath = \"/nonexistent\"\n\n[quantize]\n{body}"),
        )
        .expect("recipe");
        let mut cmd = sous();
        cmd.args(["quantize", "--recipe", path(&recipe), "--quiet"])
            .env("SOUS_CACHE_DIR", work.path().join("cache"));
        let (code, _, stderr) = run(&mut cmd);
        assert_eq!(code, 1, "{body}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{body}: no `{needle}` in {stderr}");
        }
    };
    refused(
        "scheme = \"nvfp4a16\"\nsamples = 4\n",
        &["quantize.samples", "nvfp4a16", "refused.toml"],
    );
    refused(
        "scheme = \"nvfp4\"\nseq_len = 0\n",
        &["quantize.seq_len", "at least 1"],
    );
    let model_dir = work.path().join("model");
    small_model(&model_dir, 64, 128, 1);
    let (code, _, stderr) = quantize(
        &[
            path(&model_dir),
            "--out",
            path(&work.path().join("x")),
            "--samples",
            "3",
            "--quiet",
        ],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--samples") && stderr.contains("nvfp4"),
        "{stderr}"
    );

    let Some(model) = crate::util::smollm2() else {
        return;
    };
    std::fs::write(
        recipes.join("calibration.txt"),
        [
            "The Rhine rises in the Swiss Alps and flows north through Germany and the Netherlands \
             to the North Sea; for centuries it carried coal, grain and timber between the cities \
             along its banks, and it still carries more freight than any other river in Europe.",
            "Short line.",
            "A lighthouse keeper on a northern island kept a log of every ship that passed, the \
             weather at dawn and at dusk, and the oil burned each night; two hundred years of those \
             logs are now read by people who study storms and the history of trade.",
        ]
        .join("\n\n"),
    )
    .expect("text");
    let recipe = recipes.join("w4a4.toml");
    std::fs::write(
        &recipe,
        format!(
            "[model]\npath = \"{}\"\n\n[quantize]\nscheme = \"nvfp4\"\ncalibration = \"calibration.txt\"\nsamples = 2\nseq_len = 24\n\n[engine]\nkind = \"native\"\n",
            model.display()
        ),
    )
    .expect("recipe");
    let out = work.path().join("w4a4");
    let calibrate = |extra: &[&str]| {
        let mut cmd = sous();
        cmd.args([
            "quantize",
            "--recipe",
            path(&recipe),
            "--out",
            path(&out),
            "--force",
            "--json",
            "--quiet",
        ])
        .args(extra);
        let (code, stdout, stderr) = run(&mut cmd);
        assert_eq!(code, 0, "{extra:?}: {stderr}");
        json(&stdout)["calibration"].clone()
    };
    // From the recipe: the file beside it (the short paragraph skipped), 2 samples cut
    // to 24 tokens.
    let calibration = calibrate(&[]);
    assert_eq!(
        calibration["source"],
        json!(recipes.join("calibration.txt").display().to_string())
    );
    assert_eq!(calibration["samples"], json!(2));
    assert_eq!(calibration["tokens"], json!(48));
    let peak = calibration["peak_rss_bytes"].as_u64().expect("peak memory");
    assert!(peak > 100 << 20, "SmolLM2 is loaded: {peak}");
    let from_recipe = calibration["input_global_scale"].clone();
    // The flags win over the recipe: another text, fewer samples, shorter.
    let calibration = calibrate(&["--calibration", "builtin", "--samples", "1", "--seq-len", "16"]);
    assert_eq!(calibration["source"], json!("builtin"));
    assert_eq!(calibration["samples"], json!(1));
    assert_eq!(calibration["tokens"], json!(16));
    assert_ne!(calibration["input_global_scale"], from_recipe);
    // Windows of the plain text instead of paragraphs through the chat template, from
    // the recipe: two whole windows of 24 tokens.
    let text_recipe = recipes.join("w4a4-text.toml");
    std::fs::write(
        &text_recipe,
        std::fs::read_to_string(&recipe)
            .expect("recipe")
            .replace("samples = 2", "calibration_format = \"text\"\nsamples = 2"),
    )
    .expect("recipe");
    let mut cmd = sous();
    cmd.args(["quantize", "--recipe", path(&text_recipe), "--out", path(&out)])
        .args(["--force", "--json", "--quiet"]);
    let (code, stdout, stderr) = run(&mut cmd);
    assert_eq!(code, 0, "{stderr}");
    let calibration = json(&stdout)["calibration"].clone();
    assert_eq!(calibration["format"], json!("text"));
    assert_eq!(calibration["tokens"], json!(48));
    // The key belongs to W4A4.
    let a16 = recipes.join("a16-text.toml");
    std::fs::write(
        &a16,
        format!(
            "[model]\npath = \"{}\"\n\n[quantize]\nscheme = \"nvfp4a16\"\ncalibration_format = \"text\"\n\n[engine]\nkind = \"native\"\n",
            model.display()
        ),
    )
    .expect("recipe");
    let (code, _, stderr) = run(sous().args(["recipe", "check", path(&a16)]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("quantize.calibration_format"), "{stderr}");
    // A missing file is named, and nothing is written.
    let (code, _, stderr) = run(sous()
        .args([
            "quantize",
            "--recipe",
            path(&recipe),
            "--out",
            path(&work.path().join("none")),
        ])
        .args(["--calibration", "missing.txt", "--quiet"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("missing.txt"), "{stderr}");
    assert!(!work.path().join("none").exists());
}

#[test]
fn concurrent_runs_into_one_output_take_turns() {
    // Two pods whose init containers share a volume: one quantizes, the other waits
    // for it and finds the result, and the output is whole.
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("model");
    small_model(&model, 256, 512, 2);
    let out = work.path().join("out");
    let args = [path(&model), "--out", path(&out), "--json"];
    let runs: Vec<(i32, String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2).map(|_| s.spawn(|| quantize(&args, &[]))).collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for (code, _, stderr) in &runs {
        assert_eq!(*code, 0, "{stderr}");
    }
    let fresh: Vec<bool> = runs
        .iter()
        .map(|(_, stdout, _)| json(stdout)["up_to_date"] == false)
        .collect();
    assert_eq!(
        fresh.iter().filter(|f| **f).count(),
        1,
        "exactly one run quantizes: {fresh:?}"
    );
    let (code, stdout, stderr) = quantize(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["up_to_date"], true);
    let staging: Vec<_> = std::fs::read_dir(work.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("sous-tmp"))
        .collect();
    assert!(staging.is_empty(), "a staging directory was left behind");
}

/// W4A4 calibration reads the chat template where transformers 5 saves it
/// (chat_template.jinja), with the same samples as the template in
/// tokenizer_config.json gives; the checkpoint keeps the named templates; a model whose
/// named templates have no `default` calibrates on plain text windows instead.
#[test]
fn w4a4_calibrates_folders_saved_by_transformers_5() {
    let Some(model) = crate::util::smollm2() else {
        return;
    };
    let work = tempfile::tempdir().expect("tempdir");
    let calibrate = |source: &Path, out: &str, extra: &[&str]| {
        let out = work.path().join(out);
        let mut args = vec![
            path(source),
            "--out",
            path(&out),
            "--scheme",
            "nvfp4",
            "--json",
            "--quiet",
        ];
        args.extend(extra);
        if !extra.contains(&"--samples") {
            args.extend(["--samples", "2", "--seq-len", "64"]);
        }
        let (code, stdout, stderr) = quantize(&args, &[]);
        (code, (code == 0).then(|| json(&stdout)), stderr, out)
    };
    // The imported model keeps its template in tokenizer_config.json; the same template
    // saved by transformers 5 is in chat_template.jinja: the same ids, so the same scales.
    let (code, legacy, stderr, _) = calibrate(&model, "legacy", &[]);
    assert_eq!(code, 0, "{stderr}");
    let legacy = legacy.expect("summary");
    let named = crate::util::saved_by_transformers(&model, "named");
    let (code, saved, stderr, out) = calibrate(named.path(), "named", &[]);
    assert_eq!(code, 0, "{stderr}");
    let saved = saved.expect("summary");
    assert_eq!(saved["calibration"]["format"], "chat");
    assert_eq!(saved["calibration"]["tokens"], legacy["calibration"]["tokens"]);
    assert_eq!(
        saved["calibration"]["input_global_scale"],
        legacy["calibration"]["input_global_scale"]
    );
    for file in ["chat_template.jinja", "additional_chat_templates/tool_use.jinja"] {
        assert_eq!(
            std::fs::read(out.join(file)).expect(file),
            std::fs::read(named.path().join(file)).expect(file),
            "{file} is copied into the checkpoint"
        );
    }

    // Named templates without `default`: transformers picks none for a conversation.
    let extras = crate::util::saved_by_transformers(&model, "extras-only");
    let (code, _, stderr, out) = calibrate(extras.path(), "extras", &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("none is named `default`") && stderr.contains("--calibration-format text"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written");
    let (code, text, stderr, _) = calibrate(extras.path(), "extras", &["--calibration-format", "text"]);
    assert_eq!(code, 0, "{stderr}");
    let text = text.expect("summary");
    assert_eq!(text["calibration"]["format"], "text");
    assert_eq!(text["calibration"]["samples"], json!(2));
    assert_eq!(
        text["calibration"]["tokens"],
        json!(128),
        "two whole windows of 64"
    );

    // More windows than the text holds: the counts, and what would fit.
    let (code, _, stderr, _) = calibrate(
        extras.path(),
        "too-many",
        &[
            "--calibration-format",
            "text",
            "--samples",
            "16",
            "--seq-len",
            "512",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("2938 tokens long: 5 windows of 512 tokens") && stderr.contains("--seq-len 183"),
        "{stderr}"
    );
}

/// W4A4 calibration of the test model once per instruction set this CPU has
/// (`SOUS_KERNELS_ISA`): the native engine measures the activation scales with f32
/// products, whose bits every set shares, so every checkpoint is the same bytes.
#[test]
fn w4a4_calibration_writes_the_same_bytes_on_every_instruction_set() {
    use sous_kernels::gemm::KernelPath;
    let Some(model) = crate::util::smollm2() else {
        return;
    };
    let _cpu = crate::util::cpu_exclusive();
    let work = tempfile::tempdir().expect("tempdir");
    let mut paths = KernelPath::available();
    // Calibration multiplies in f32: the dot product is no path of its own here.
    paths.dedup_by_key(|p| p.isa);
    let calibrate = |path: KernelPath| {
        let out = work.path().join(path.isa.name());
        // One sample of 32 tokens: the portable kernels take seconds per layer pass.
        let args = [
            crate::quantize_util::path(&model),
            "--out",
            crate::quantize_util::path(&out),
            "--scheme",
            "nvfp4",
            "--samples",
            "1",
            "--seq-len",
            "32",
            "--json",
            "--quiet",
        ];
        let (code, stdout, stderr) = quantize(&args, &crate::util::kernel_path_env(path));
        assert_eq!(code, 0, "{}: {stderr}", path.isa.name());
        assert_eq!(json(&stdout)["calibration"]["tokens"], json!(32), "{stdout}");
        crate::util::files(&out)
    };
    let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    let want = calibrate(paths[0]);
    for &path in &paths[1..] {
        let (isa, first) = (path.isa.name(), paths[0].isa.name());
        let got = calibrate(path);
        assert_eq!(names(&got), names(&want), "{isa} against {first}");
        for ((file, got), (_, want)) in got.iter().zip(&want) {
            if file == ".sous-quantize.json" {
                // The record of the run: its times and paths are its own; what was made
                // from what, and the scales, are the checkpoint's.
                let (got, want) = (
                    json(&String::from_utf8_lossy(got)),
                    json(&String::from_utf8_lossy(want)),
                );
                assert_eq!(got["fingerprint"], want["fingerprint"], "{isa} against {first}");
                let scales = |v: &Value| v["summary"]["calibration"]["input_global_scale"].clone();
                assert_eq!(scales(&got), scales(&want), "{isa} against {first}");
                continue;
            }
            assert!(got == want, "{file}: {isa} against {first}");
        }
    }
}

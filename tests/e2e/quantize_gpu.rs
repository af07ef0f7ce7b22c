//! `sous quantize --device cuda` and `sous kernels`: what a machine without a CUDA
//! driver says (CI's case: exit 1, the missing library named, nothing written), the
//! recipe's `quantize.device`, and, opt-in on a machine with a GPU
//! (`SOUS_TEST_CUDA=1`), the CPU's bytes from the GPU on the SmolLM2 test model.
//! `scripts/gpu-check.sh` runs the full check and the benchmark on a GPU machine. And
//! `sous kernels bandwidth`, the CPU's read-bandwidth probe, on every machine.

use std::path::Path;

use crate::quantize_util::{json, path, quantize, write_model};
use crate::util::{run, smollm2, sous};

fn small_model(dir: &Path) {
    let mut specs: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![64, 64])];
    for (name, shape) in [
        ("input_layernorm.weight", vec![64]),
        ("self_attn.q_proj.weight", vec![64, 64]),
        ("self_attn.k_proj.weight", vec![32, 64]),
        ("self_attn.v_proj.weight", vec![32, 64]),
        ("self_attn.o_proj.weight", vec![64, 64]),
        ("mlp.gate_proj.weight", vec![128, 64]),
        ("mlp.up_proj.weight", vec![128, 64]),
        ("mlp.down_proj.weight", vec![64, 128]),
    ] {
        specs.push((format!("model.layers.0.{name}"), shape));
    }
    specs.push(("lm_head.weight".into(), vec![64, 64]));
    write_model(dir, &specs, 1, 3);
}

#[test]
fn without_a_driver_the_gpu_is_refused_by_name() {
    if sous_kernels::cuda::driver_present() {
        eprintln!("SKIPPED: this machine has a CUDA driver; the refusal is for machines without one");
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("model");
    small_model(&model);
    let out = work.path().join("out");
    let (code, stdout, stderr) = quantize(&[path(&model), "--out", path(&out), "--device", "cuda"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("no CUDA driver found (libcuda.so"), "{stderr}");
    assert!(
        stderr.contains("hint:") && stderr.contains("--device cpu"),
        "{stderr}"
    );
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    // A device sous does not know is bad input that says what it takes.
    let (code, _, stderr) = quantize(&[path(&model), "--out", path(&out), "--device", "gpu"], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("write `cpu`, `cuda` or `cuda:N`"), "{stderr}");
    // The recipe's `quantize.device` is used, and checked.
    let recipe = work.path().join("gpu.toml");
    let write_recipe = |device: &str| {
        std::fs::write(
            &recipe,
            format!(
                "[model]\npath = \"{}\"\n\n[quantize]\nscheme = \"nvfp4a16\"\ndevice = \"{device}\"\n\n[engine]\nkind = \"vllm\"\n",
                model.display()
            ),
        )
        .expect("recipe");
    };
    write_recipe("cuda:1");
    let (code, _, stderr) = run(sous().args(["quantize", "--recipe", path(&recipe), "--out", path(&out)]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no CUDA driver found"), "{stderr}");
    // ... and the flag wins over it.
    let (code, stdout, stderr) = run(sous().args([
        "quantize",
        "--recipe",
        path(&recipe),
        "--out",
        path(&out),
        "--device",
        "cpu",
        "--json",
        "--quiet",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["device"], "cpu");
    write_recipe("tpu");
    let (code, _, stderr) = run(sous().args(["recipe", "check", path(&recipe)]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("quantize.device") && stderr.contains("`tpu` is not a device"),
        "{stderr}"
    );
    // A deployment quantizes in an init container with no GPU: rendered as the CPU, and
    // said so.
    let deployed = work.path().join("deployed.toml");
    std::fs::write(
        &deployed,
        "[model]\nrepo = \"Qwen/Qwen3-0.6B\"\n[quantize]\nscheme = \"nvfp4a16\"\ndevice = \"cuda\"\n[engine]\nkind = \"vllm\"\n[deploy.storage]\nsize = \"10Gi\"\n",
    )
    .expect("recipe");
    let hub = work.path().join("hub");
    let (code, stdout, stderr) = run(sous()
        .args(["deploy", "render", "--recipe", path(&deployed), "--target", "k8s"])
        .env("HF_HUB_CACHE", &hub)
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT"));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("`quantize.device` is cuda:0") && stderr.contains("on the CPU"),
        "{stderr}"
    );
    assert!(
        stdout.contains("sous quantize") || stdout.contains("- quantize"),
        "{stdout}"
    );
    assert!(!stdout.contains("device = \"cuda"), "{stdout}");
    // `sous kernels` says the same.
    for cmd in ["check", "bench"] {
        let (code, _, stderr) = run(sous().args(["kernels", cmd]));
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains("no CUDA driver found"), "{stderr}");
    }
}

/// On a GPU machine (`SOUS_TEST_CUDA=1`): every output file of SmolLM2 quantized on the
/// GPU equals the CPU's, in both formats, and the kernel check passes.
#[test]
fn on_a_gpu_the_bytes_are_the_cpus() {
    if std::env::var_os("SOUS_TEST_CUDA").is_none() {
        return;
    }
    let Some(model) = smollm2() else { return };
    let (code, _, stderr) = run(sous().args(["kernels", "check", "--mib", "64"]));
    assert_eq!(code, 0, "{stderr}");
    let work = tempfile::tempdir().expect("tempdir");
    for format in ["compressed-tensors", "modelopt"] {
        let mut outputs = Vec::new();
        for device in ["cpu", "cuda"] {
            let out = work.path().join(format!("{format}-{device}"));
            let (code, stdout, stderr) = quantize(
                &[
                    path(&model),
                    "--out",
                    path(&out),
                    "--format",
                    format,
                    "--device",
                    device,
                    "--json",
                    "--quiet",
                ],
                &[],
            );
            assert_eq!(code, 0, "{device}: {stderr}");
            assert!(
                json(&stdout)["device"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(device)
            );
            outputs.push(out);
        }
        let mut names: Vec<String> = std::fs::read_dir(&outputs[0])
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".sous-quantize.json")
            .collect();
        names.sort();
        assert!(names.iter().any(|n| n.ends_with(".safetensors")), "{names:?}");
        for name in names {
            let cpu = std::fs::read(outputs[0].join(&name)).expect("cpu file");
            let gpu = std::fs::read(outputs[1].join(&name)).expect("gpu file");
            assert!(cpu == gpu, "{format}: {name} differs between the CPU and the GPU");
        }
    }
}

#[test]
fn the_cpu_read_bandwidth_is_measured_over_the_buffer_asked_for() {
    let (code, stdout, stderr) = run(sous().args([
        "kernels",
        "bandwidth",
        "--mib",
        "64",
        "--threads",
        "2",
        "--seconds",
        "0",
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(report["bytes"], 64 << 20);
    assert_eq!(report["threads"], 2);
    assert!(report["passes"].as_u64().expect("passes") >= 5);
    let (best, median) = (
        report["best_gb_per_s"].as_f64().expect("best"),
        report["median_gb_per_s"].as_f64().expect("median"),
    );
    assert!(best >= median && median > 0.0, "{report}");
    let (code, _, stderr) = run(sous().args(["kernels", "bandwidth", "--threads", "0"]));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--threads"), "{stderr}");
}

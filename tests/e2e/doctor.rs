//! `sous doctor` with a `PATH` that holds only what a test puts there: nothing (this
//! CPU machine as CI sees it), or scripts that print what `nvidia-smi` (an H200, a
//! GB10), `vllm --version` and `docker` print. The Hub is a closed loopback port, the
//! caches are temporary directories, and the token is never printed.
//!
//! On a machine with a CUDA driver the driver API finds its GPUs even with nothing on
//! `PATH`, so the checks that need "no GPU" say so on stderr and skip.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::util::{run, sous};

/// A closed port: nothing answers there.
const CLOSED_HUB: &str = "http://127.0.0.1:9";
const SPARK: &str = "recipes/dgx-spark/qwen3.8-27b-nvfp4.toml";
const SPARK_BASELINE: &str = "recipes/dgx-spark/qwen3.8-27b-nvfp4-baseline.toml";

/// What `nvidia-smi` 580.159.04 prints on an H200 for the two questions doctor asks
/// (captured on one): the GPU query, and `--version` for the CUDA version.
const H200_SMI: &str = r#"case "$*" in
  "--query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv,noheader,nounits")
    echo '0, NVIDIA H200, 143771, 9.0, 580.159.04' ;;
  "--version")
    printf 'NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\nDRIVER version      : 580.159.04\nCUDA Version        : 13.0\n' ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac"#;

/// The same on a DGX Spark: NVML cannot report the GB10's memory, which the CPU shares.
const GB10_SMI: &str = r#"case "$*" in
  "--query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv,noheader,nounits")
    echo '0, NVIDIA GB10, [N/A], 12.1, 580.95.05' ;;
  "--version")
    printf 'NVIDIA-SMI version  : 580.95.05\nNVML version        : 580.95\nDRIVER version      : 580.95.05\nCUDA Version        : 13.0\n' ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac"#;

/// Docker 28 with the NVIDIA Container Toolkit's runtime configured.
const DOCKER: &str = r#"case "$*" in
  "--version") echo 'Docker version 28.5.1, build e180ab8' ;;
  "info --format {{json .}}")
    echo '{"ID":"b2c1f0e4","Containers":0,"ServerVersion":"28.5.1","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}},"DefaultRuntime":"runc","CDISpecDirs":["/etc/cdi","/var/run/cdi"]}' ;;
  *) echo "fake docker: unexpected arguments: $*" >&2; exit 2 ;;
esac"#;

/// `vllm --version` prints the release alone.
fn vllm(version: &str) -> String {
    format!(
        r#"if [ "$*" = "--version" ]; then echo '{version}'; else echo "fake vllm: unexpected arguments: $*" >&2; exit 2; fi"#
    )
}

/// A temporary home: `bin/` (the whole `PATH`), the caches, a recipe directory.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("bin")).expect("bin");
        Machine { dir }
    }

    fn path(&self, rest: &str) -> std::path::PathBuf {
        self.dir.path().join(rest)
    }

    /// A program on `PATH`: a `/bin/sh` script using only the shell's builtins.
    fn fake(&self, name: &str, body: &str) {
        let path = self.path("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write fake");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn recipe(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).expect("write recipe");
        path.display().to_string()
    }

    /// `sous doctor ARGS` in an environment of only these variables.
    fn doctor(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut cmd = sous();
        cmd.env_clear()
            .env("NO_COLOR", "1")
            .env("PATH", self.path("bin"))
            .env("HOME", self.path("home"))
            .env("HF_ENDPOINT", CLOSED_HUB)
            .env("HF_HUB_CACHE", self.path("hub"))
            .env("SOUS_CACHE_DIR", self.path("cache"))
            .env("SOUS_STATE_DIR", self.path("state"))
            .envs(env.iter().copied())
            .arg("doctor")
            .args(args);
        run(&mut cmd)
    }

    fn doctor_json(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
        let (code, stdout, stderr) = self.doctor(&[args, &["--json"]].concat(), env);
        let json =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
        (code, json, stderr)
    }
}

fn recipe<'a>(json: &'a Value, path: &str) -> &'a Value {
    json["recipes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["path"] == path))
        .unwrap_or_else(|| panic!("{path} in {json:#}"))
}

fn no_driver() -> bool {
    if sous_kernels::cuda::driver_present() {
        eprintln!("SKIPPED: this machine has a CUDA driver, which finds its GPUs with nothing on PATH");
        return false;
    }
    true
}

#[test]
fn on_a_cpu_machine_only_the_native_recipes_can_run() {
    if !no_driver() {
        return;
    }
    let machine = Machine::new();
    let (code, stdout, stderr) = machine.doctor(&[], &[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("✗ no NVIDIA GPU found (nvidia-smi not on PATH, libcuda.so not loadable)"),
        "{stdout}"
    );
    assert!(stdout.contains("✓ native"), "{stdout}");
    assert!(
        stdout.contains("✗ vllm    missing  `vllm` not on PATH"),
        "{stdout}"
    );
    assert!(
        stdout.contains("✗ docker  missing  `docker` not on PATH"),
        "{stdout}"
    );
    assert!(stdout.contains("token: absent"), "{stdout}");

    let (code, json, stderr) = machine.doctor_json(&[], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["blocking"], Value::Null);
    let recipes = json["recipes"].as_array().expect("recipes");
    assert!(recipes.len() >= 7, "{recipes:?}");
    for r in recipes {
        let path = r["path"].as_str().expect("path");
        if path.starts_with("recipes/local/") {
            assert_eq!(r["can_run"], true, "{r}");
            assert_eq!(r["reasons"], serde_json::json!([]), "{r}");
        } else {
            assert_eq!(r["can_run"], false, "{r}");
            assert!(
                r["reasons"][0]
                    .as_str()
                    .is_some_and(|why| why.contains("needs an NVIDIA GPU")),
                "{r}"
            );
        }
        assert!(!path.contains("hardware"), "hardware.toml is not a recipe");
    }
    let spark = recipe(&json, SPARK);
    assert_eq!(spark["reasons"][1], "vLLM is not installed: `vllm` not on PATH");

    // Whether the native engine gets huge pages here, and the kernel's mode as its file
    // says it (the test machine's own, read the way `sous doctor` should read it).
    let pages = &json["engines"]["native"]["cpu"]["huge_pages"];
    assert!(pages["used"].is_boolean(), "{pages}");
    let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
    let mode = enabled.as_deref().and_then(|e| {
        e.split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
    });
    assert_eq!(pages["mode"].as_str(), mode, "{pages}");

    // The machine-dependent values, and sous's own version, replaced.
    let mut json = json;
    json["engines"]["native"]["cpu"] = "[this CPU]".into();
    json["engines"]["native"]["version"] = "[sous version]".into();
    for disk in json["disk"].as_array_mut().expect("disk") {
        for key in ["path", "measured_at", "available_bytes"] {
            disk[key] = format!("[{key}]").into();
        }
    }
    let pretty = serde_json::to_string_pretty(&json).expect("JSON");
    insta::assert_snapshot!("cpu-machine-json", pretty);
}

#[test]
fn with_an_h200_and_vllm_the_spark_recipes_run_without_fp4() {
    let machine = Machine::new();
    machine.fake("nvidia-smi", H200_SMI);
    machine.fake("vllm", &vllm("0.27.1"));
    machine.fake("docker", DOCKER);
    let w4a4 = machine.recipe(
        "w4a4.toml",
        "name = \"w4a4-vllm\"\n[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n[engine]\nkind = \"vllm\"\n[quantize]\nscheme = \"nvfp4\"\n",
    );
    let docker = machine.recipe(
        "docker.toml",
        "name = \"in-docker\"\n[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n[engine]\nkind = \"vllm\"\nimage = \"vllm/vllm-openai:v0.27.1\"\nruntime = \"docker\"\n[server]\nhost = \"0.0.0.0\"\n",
    );
    let args = ["--recipes", "recipes", "--recipe", &w4a4, "--recipe", &docker];
    let (code, json, stderr) = machine.doctor_json(&args, &[]);
    assert_eq!(code, 0, "{json:#}\n{stderr}");
    let gpu = &json["gpus"][0];
    assert_eq!(gpu["name"], "NVIDIA H200");
    assert_eq!(gpu["memory_bytes"], 143_771u64 << 20);
    assert_eq!(gpu["compute_capability"], "9.0");
    assert_eq!(gpu["native_fp4"], false);
    assert_eq!(gpu["unified_memory"], false);
    assert_eq!(json["gpus"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        json["driver"],
        serde_json::json!({"source": "nvidia-smi", "version": "580.159.04", "cuda": "13.0", "problem": null})
    );
    assert_eq!(json["engines"]["vllm"]["version"], "0.27.1");
    assert_eq!(json["engines"]["vllm"]["available"], true);
    assert_eq!(json["containers"]["docker"]["gpu_via"], "nvidia runtime");
    assert_eq!(json["containers"]["docker"]["version"], "28.5.1");
    for path in [SPARK, SPARK_BASELINE] {
        let r = recipe(&json, path);
        assert_eq!(r["can_run"], true, "{r}");
        // Written for the vLLM installed: no release warning.
        assert!(!r["warnings"].to_string().contains("written for"), "{r}");
    }
    // The Titan recipe's model directory is not here, and nothing says where to get it.
    let titan = recipe(&json, "recipes/titan/qwen3.8-flash-next.toml");
    assert_eq!(titan["can_run"], false);
    assert!(
        titan["reasons"][0]
            .as_str()
            .is_some_and(|r| r.contains("`model.path` /model does not exist"))
    );
    // W4A4 on Hopper: it runs, without FP4 tensor cores.
    let r = recipe(&json, &w4a4);
    assert_eq!(r["can_run"], true, "{r}");
    let warnings = r["warnings"].to_string();
    assert!(
        warnings.contains("NVIDIA H200 (compute capability 9.0) has no native FP4")
            && warnings.contains("W4A16"),
        "{r}"
    );
    assert_eq!(recipe(&json, &docker)["can_run"], true);

    let (code, stdout, stderr) = machine.doctor(&["--recipe", SPARK], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("✓ cuda:0  NVIDIA H200  140.40 GiB  compute capability 9.0  no native FP4"),
        "{stdout}"
    );
    assert!(
        stdout.contains("driver 580.159.04, CUDA 13.0 (from nvidia-smi)"),
        "{stdout}"
    );
    assert!(stdout.contains("1 of 1 recipes can run here."), "{stdout}");
}

#[test]
fn a_gb10_has_fp4_and_unified_memory() {
    let machine = Machine::new();
    machine.fake("nvidia-smi", GB10_SMI);
    machine.fake("vllm", &vllm("0.33.0"));
    let w4a4 = machine.recipe(
        "w4a4.toml",
        "name = \"w4a4-vllm\"\n[model]\nrepo = \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n[engine]\nkind = \"vllm\"\n[quantize]\nscheme = \"nvfp4\"\n",
    );
    let (code, json, stderr) = machine.doctor_json(&["--recipe", SPARK, "--recipe", &w4a4], &[]);
    assert_eq!(code, 0, "{stderr}");
    let gpu = &json["gpus"][0];
    assert_eq!(gpu["name"], "NVIDIA GB10");
    assert_eq!(gpu["memory_bytes"], Value::Null);
    assert_eq!(gpu["compute_capability"], "12.1");
    assert_eq!(gpu["native_fp4"], true);
    assert_eq!(gpu["unified_memory"], true);
    let spark = recipe(&json, SPARK);
    assert_eq!(spark["can_run"], true, "{spark}");
    assert!(
        spark["warnings"].to_string().contains("written for vLLM 0.27.1")
            && spark["warnings"].to_string().contains("this machine has 0.33.0"),
        "{spark}"
    );
    assert!(!recipe(&json, &w4a4)["warnings"].to_string().contains("FP4"));

    // No memory of its own: the machine's RAM, which it shares.
    let (_, stdout, _) = machine.doctor(&["--recipe", SPARK], &[]);
    let ram = json["engines"]["native"]["cpu"]["memory_bytes"]
        .as_u64()
        .expect("this machine's RAM");
    let line = format!(
        "✓ cuda:0  NVIDIA GB10  unified memory: shares the {:.2} GiB of RAM  compute capability 12.1  native FP4",
        ram as f64 / (1u64 << 30) as f64
    );
    assert!(stdout.contains(&line), "no {line:?} in\n{stdout}");
}

#[test]
fn a_named_recipe_that_cannot_run_fails_naming_what_is_missing() {
    let machine = Machine::new();
    let (code, stdout, stderr) = machine.doctor(&["--recipe", SPARK], &[]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("an error line: {stderr}"));
    assert!(
        error.starts_with(&format!("error: {SPARK} cannot run here: ")),
        "{error}"
    );
    assert!(
        error.contains("vLLM is not installed: `vllm` not on PATH"),
        "{error}"
    );
    if no_driver() {
        assert!(
            error.contains("no NVIDIA GPU found (nvidia-smi not on PATH, libcuda.so not loadable)"),
            "{error}"
        );
    }
    assert!(stderr.contains("hint: "), "{stderr}");
    // The report is still printed, recipe last.
    assert!(stdout.contains(&format!("✗ {SPARK}  vllm")), "{stdout}");
    // The JSON says the same, and the exit code too.
    let (code, json, _) = machine.doctor_json(&["--recipe", SPARK], &[]);
    assert_eq!(code, 1);
    assert!(
        json["blocking"]
            .as_str()
            .is_some_and(|b| b.starts_with(&format!("{SPARK} cannot run here"))),
        "{json:#}"
    );
    // A recipe that is not there is named too.
    let (code, _, stderr) = machine.doctor(&["--recipe", "recipes/no-such.toml"], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("recipes/no-such.toml cannot run here: the recipe does not load"),
        "{stderr}"
    );
}

#[test]
fn the_token_is_reported_present_and_never_printed() {
    const SECRET: &str = "hf_secret_value_123";
    let machine = Machine::new();
    for json in [false, true] {
        let args: &[&str] = if json { &["--json"] } else { &[] };
        let (code, stdout, stderr) = machine.doctor(args, &[("HF_TOKEN", SECRET)]);
        assert_eq!(code, 0, "{stderr}");
        assert!(
            !stdout.contains(SECRET) && !stderr.contains(SECRET),
            "the token leaked"
        );
        if json {
            let json: Value = serde_json::from_str(&stdout).expect("JSON");
            assert_eq!(
                json["hub"]["token"],
                serde_json::json!({"present": true, "source": "HF_TOKEN"})
            );
        } else {
            assert!(stdout.contains("token: present (from HF_TOKEN)"), "{stdout}");
        }
    }
    // From the login file: its path, not its content.
    let file = machine.path("home/.cache/huggingface/token");
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&file, format!("{SECRET}\n")).expect("write token");
    let (code, stdout, stderr) = machine.doctor(&[], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains(SECRET) && !stderr.contains(SECRET),
        "the token leaked"
    );
    assert!(
        stdout.contains(&format!("token: present (from {})", file.display())),
        "{stdout}"
    );
    // The Hub does not answer on a closed port.
    assert!(
        stdout.contains(&format!("✗ {CLOSED_HUB}  cannot connect")),
        "{stdout}"
    );
}

#[test]
fn a_missing_recipes_directory_is_a_user_error() {
    let machine = Machine::new();
    let (code, _, stderr) = machine.doctor(&["--recipes", "no-such-dir"], &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("error: --recipes no-such-dir: not a directory"),
        "{stderr}"
    );
}

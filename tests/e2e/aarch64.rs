//! The aarch64 `sous` against this machine's x86-64 one, on the SmolLM2 test model:
//! NVFP4 checkpoints (FP4 weights in both formats, and W4A4 with activation scales the
//! native engine calibrates) equal byte for byte, and the native engine's greedy
//! continuations in f32 equal token for token, with their logprobs.
//!
//! `scripts/aarch64.sh` cross-builds sous for aarch64 and runs these (ignored in the
//! main run: they need that binary) with `SOUS_TEST_AARCH64_BIN` naming it; it runs
//! under `qemu-aarch64-static` (`SOUS_TEST_AARCH64_RUNNER`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{Running, clean, files, free_port, health, root, run, smollm2, sous};

/// The aarch64 binary and the emulator that runs it.
fn aarch64() -> (String, PathBuf) {
    let bin = std::env::var_os("SOUS_TEST_AARCH64_BIN")
        .map(PathBuf::from)
        .expect("SOUS_TEST_AARCH64_BIN names the aarch64 sous (scripts/aarch64.sh builds it)");
    assert!(bin.is_file(), "no aarch64 sous at {}", bin.display());
    let runner = std::env::var("SOUS_TEST_AARCH64_RUNNER").unwrap_or_else(|_| "qemu-aarch64-static".into());
    (runner, bin)
}

/// The aarch64 `sous` as a program: the emulator, then the binary.
fn sous_aarch64_program() -> Command {
    let (runner, bin) = aarch64();
    let mut cmd = Command::new(runner);
    cmd.arg(bin);
    cmd
}

/// The aarch64 `sous` with the clean environment of [`sous`].
fn sous_aarch64() -> assert_cmd::Command {
    clean(assert_cmd::Command::from_std(sous_aarch64_program()))
}

#[test]
#[ignore = "needs an aarch64 sous: scripts/aarch64.sh runs it"]
fn aarch64_quantizes_smollm2_to_the_bytes_of_x86_64() {
    let Some(model) = smollm2() else { return };
    let model = model.to_str().expect("utf-8 path");
    let work = tempfile::tempdir().expect("tempdir");
    // FP4 weights in each format, and W4A4: the activation scales of a calibration
    // sample, measured by running the model in the native engine.
    let cases: [(&str, &[&str]); 3] = [
        ("compressed-tensors", &[]),
        ("modelopt", &["--format", "modelopt"]),
        (
            "w4a4",
            &["--scheme", "nvfp4", "--samples", "1", "--seq-len", "32"],
        ),
    ];
    for (name, args) in cases {
        let mut outs = Vec::new();
        for (arch, mut cmd) in [("x86-64", sous()), ("aarch64", sous_aarch64())] {
            let out = work.path().join(format!("{name}-{arch}"));
            let started = Instant::now();
            cmd.args(["quantize", model, "--quiet", "--out"])
                .arg(&out)
                .args(args);
            let (code, _, stderr) = run(&mut cmd);
            assert_eq!(code, 0, "{arch} {name}: {stderr}");
            eprintln!(
                "{name}: {arch} quantized in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            outs.push(files(&out));
        }
        let (x86, arm) = (&outs[0], &outs[1]);
        let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(x86), names(arm), "{name}: the same files");
        assert!(
            x86.iter()
                .any(|(n, b)| n.ends_with(".safetensors") && b.len() > 50 << 20),
            "{name}: a checkpoint was written"
        );
        for ((file, a), (_, b)) in x86.iter().zip(arm) {
            if file == ".sous-quantize.json" {
                // The record of the run: what was made from what (its fingerprint) must
                // agree; the output path, the time, the kernel's name and the error
                // statistics (sums in each kernel's order) are the run's own.
                let record =
                    |bytes: &[u8]| -> Value { serde_json::from_slice(bytes).expect("a JSON record") };
                let (a, b) = (record(a), record(b));
                assert_eq!(a["fingerprint"], b["fingerprint"], "{name}: {file}");
                for field in ["scheme", "format", "bytes_out", "shards", "quantized", "kept"] {
                    assert_eq!(a["summary"][field], b["summary"][field], "{name}: {file} {field}");
                }
                continue;
            }
            assert!(a == b, "{name}: {file} differs between x86-64 and aarch64");
        }
    }
}

/// A native engine serving the test model in f32, ready.
struct Engine {
    _running: Running,
    url: String,
}

fn serve(program: Command, recipe: &Path, port: u16, within: Duration) -> Engine {
    let recipe = recipe.to_str().expect("utf-8 path");
    // The engine process itself, as `sous serve` starts it: under qemu, the supervisor
    // could not start an aarch64 child without binfmt_misc.
    let running = Running::start_program(program, &["serve", "--engine-process", "--recipe", recipe], &[]);
    let deadline = Instant::now() + within;
    while !health(port).is_ok_and(|(status, _)| status == 200) {
        assert!(
            Instant::now() < deadline,
            "the engine did not become ready:\n{}",
            running.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Engine {
        _running: running,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// The fixture's single prompts as token ids (a long chat prompt and two short ones).
fn prompts() -> Vec<(String, Vec<u64>)> {
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/smollm2/generation.json")).expect("fixture");
    let fixture: Value = serde_json::from_str(&text).expect("fixture JSON");
    fixture["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            let ids = p["input_ids"].as_array().expect("ids");
            (
                p["name"].as_str().unwrap_or("?").to_owned(),
                ids.iter().map(|v| v.as_u64().expect("an id")).collect(),
            )
        })
        .collect()
}

/// Each prompt's greedy continuation, all requests in flight at once: text, tokens and
/// logprobs.
fn continuations(url: &str, prompts: &[(String, Vec<u64>)], tokens: usize) -> Vec<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let requests = prompts.iter().map(|(name, ids)| {
            let body = json!({
                "model": "smollm2", "prompt": ids, "max_tokens": tokens,
                "temperature": 0, "ignore_eos": true, "logprobs": 2,
            });
            let client = client.clone();
            async move {
                let resp = client
                    .post(format!("{url}/v1/completions"))
                    .json(&body)
                    .timeout(Duration::from_secs(600))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("prompt {name}: {e}"));
                assert_eq!(resp.status().as_u16(), 200, "prompt {name}");
                let body: Value = resp.json().await.expect("a JSON body");
                let choice = &body["choices"][0];
                assert_eq!(
                    choice["logprobs"]["tokens"].as_array().map(Vec::len),
                    Some(tokens),
                    "prompt {name}: {body}"
                );
                json!({"name": name, "text": choice["text"], "logprobs": choice["logprobs"]})
            }
        });
        futures_util::future::join_all(requests).await
    })
}

#[test]
#[ignore = "needs an aarch64 sous: scripts/aarch64.sh runs it"]
fn aarch64_continues_greedily_with_the_tokens_and_logprobs_of_x86_64() {
    let Some(model) = smollm2() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    let prompts = prompts();
    let tokens = 16;
    let mut results = Vec::new();
    for (arch, program, within) in [
        ("x86-64", Command::new(assert_cmd::cargo::cargo_bin("sous")), 60),
        ("aarch64", sous_aarch64_program(), 600),
    ] {
        let port = free_port();
        let recipe = work.path().join(format!("{arch}.toml"));
        std::fs::write(
            &recipe,
            format!(
                "name = \"f32\"\n[model]\npath = \"{}\"\nserved_name = \"smollm2\"\n[engine]\nkind = \"native\"\n\
                 [memory]\nkv_cache_bytes = \"64MiB\"\n[serving]\ndtype = \"float32\"\nmax_model_len = 1024\n\
                 [server]\nhost = \"127.0.0.1\"\nport = {port}\n",
                model.display()
            ),
        )
        .expect("recipe");
        let started = Instant::now();
        let engine = serve(program, &recipe, port, Duration::from_secs(within));
        let got = continuations(&engine.url, &prompts, tokens);
        eprintln!(
            "{arch}: {} prompts × {tokens} tokens in {:.1} s, start-up included",
            prompts.len(),
            started.elapsed().as_secs_f64()
        );
        results.push(got);
    }
    for (x86, arm) in results[0].iter().zip(&results[1]) {
        assert_eq!(x86, arm, "aarch64 continued differently from x86-64");
    }
}

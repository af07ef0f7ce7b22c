//! `sous eval` against the native engine serving the test model: perplexity equal to
//! the single-request figure, llama.cpp's windows, a quantized and a speculative recipe
//! against the bf16 one, lm-evaluation-harness on the shipped task, resuming after a
//! failure, and the refusals (a text shorter than a window, a window longer than the
//! server's context, a server without prompt log-probabilities).

use std::path::Path;

use serde_json::{Value, json};

use crate::snapshot::sous_snapshot;
use crate::util::{Mirror, cpu_exclusive, free_port, python, root, run, smollm2, sous};

/// The whole built-in text's perplexity under the test model in f32 arithmetic: the same
/// bits on every kernel path of every CPU (benchmarks/native.md, "Numbers across kernel paths").
const F32_PERPLEXITY: f64 = 17.9858;

/// How far (relative) the bf16 figure may be from [`F32_PERPLEXITY`]: bf16 arithmetic
/// gives one figure with AVX512-BF16's dot product and another on every other path
/// (AVX-512 without it, AVX2, portable), and which one a CPU takes is measured at load.
/// This is 2.5 times the distance measured between the two, each of which is nearer
/// the f32 figure than that distance (benchmarks/native.md, "Numbers across kernel paths").
const BF16_SPREAD: f64 = 0.001;

/// `sous serve` of the test model in bf16 (the shipped recipe's arithmetic), ready.
fn serve(model: &Path) -> crate::native::Server {
    crate::native::serve(
        model,
        "[serving]\ndtype = \"bfloat16\"\nmax_model_len = 8192\n",
        "",
        &[],
    )
}

/// `sous eval ARGS --json` with its state in `state`.
fn eval_cmd(state: &Path, args: &[&str]) -> assert_cmd::Command {
    let mut cmd = sous();
    cmd.arg("eval")
        .args(args)
        .arg("--json")
        .env("SOUS_STATE_DIR", state);
    cmd
}

/// `sous eval ARGS --json` with its state in `state`: exit code, report, stderr.
fn eval(state: &Path, args: &[&str]) -> (i32, Value, String) {
    let (code, stdout, stderr) = run(&mut eval_cmd(state, args));
    (code, serde_json::from_str(&stdout).unwrap_or(Value::Null), stderr)
}

/// The perplexity of the whole text from one `prompt_logprobs` request, computed here.
fn single_request_perplexity(url: &str, text: &str) -> f64 {
    let body = json!({"model": "smollm2", "prompt": text, "max_tokens": 1, "prompt_logprobs": 0});
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let answer: Value = runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&body)
            .send()
            .await
            .expect("an answer");
        response.json().await.expect("JSON")
    });
    let entries = answer["choices"][0]["prompt_logprobs"]
        .as_array()
        .expect("prompt_logprobs");
    let lps: Vec<f64> = entries
        .iter()
        .skip(1)
        .map(|e| {
            // With k = 0 each entry holds the prompt's token only.
            let map = e.as_object().expect("entry");
            assert_eq!(map.len(), 1);
            map.values()
                .next()
                .and_then(|v| v["logprob"].as_f64())
                .expect("logprob")
        })
        .collect();
    (-lps.iter().sum::<f64>() / lps.len() as f64).exp()
}

#[test]
fn perplexity_by_windows_and_against_a_baseline() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let server = serve(&model);
    let url = server.url.as_str();
    let state = tempfile::tempdir().expect("state");
    let alice = std::fs::read_to_string(root().join("scripts/bench/data/alice-chapter1.txt")).expect("text");

    // One window holding the whole text: the single-request figure, and the shipped
    // recipe's (bf16 arithmetic, bf16 KV cache) within its kernels' spread of the f32
    // figure, whatever path this CPU takes.
    let (code, whole, stderr) = eval(state.path(), &["--url", url, "--whole"]);
    assert_eq!(code, 0, "{stderr}");
    let ppl = whole["runs"][0]["perplexity"]["perplexity"]["value"]
        .as_f64()
        .expect("perplexity");
    let direct = single_request_perplexity(url, &alice);
    assert!((ppl - direct).abs() < 1e-9 * direct, "{ppl} vs {direct}");
    assert!(
        (ppl / F32_PERPLEXITY - 1.0).abs() < BF16_SPREAD,
        "bf16 perplexity {ppl}: more than {BF16_SPREAD} from the f32 figure {F32_PERPLEXITY}"
    );
    assert_eq!(whole["runs"][0]["perplexity"]["tokens"], 2937);

    // llama.cpp's cut: 512-token windows, the last 255 of each scored, the rest dropped.
    let (code, windows, stderr) = eval(state.path(), &["--url", url]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(windows["windows"], 5);
    assert_eq!(windows["cut"]["score_from"], 256);
    assert_eq!(windows["runs"][0]["perplexity"]["tokens"], 5 * 255);
    let windowed = windows["runs"][0]["perplexity"]["perplexity"]["value"]
        .as_f64()
        .expect("ppl");
    assert!(
        (windowed - ppl).abs() > 1e-3,
        "a shorter context gives another figure"
    );

    // The candidate's server is down: the baseline's windows are kept, and the same
    // command, once the candidate answers, resumes from them.
    let dead = format!("http://127.0.0.1:{}", free_port());
    sous_snapshot!(
        "eval-candidate-unreachable",
        eval_cmd(
            state.path(),
            &["--url", &dead, "--baseline-url", url, "--chunks", "2"],
        ),
        // bf16 arithmetic's figure depends on the CPU's kernel path (see BF16_SPREAD).
        &[(r"perplexity [0-9.]+ ± [0-9.]+", "perplexity [PPL]")]
    );
    let (code, same, stderr) = eval(
        state.path(),
        &["--url", url, "--baseline-url", url, "--chunks", "2"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("2 of 2 windows already scored"), "{stderr}");
    // A server against itself: no divergence, the same top token everywhere.
    let c = &same["comparison"];
    assert_eq!(c["tokens"], 2 * 255);
    assert_eq!(c["kld_mean"]["value"].as_f64(), Some(0.0), "{c}");
    assert_eq!(c["top1_agreement"]["value"].as_f64(), Some(1.0), "{c}");
    assert_eq!(c["delta_perplexity"]["value"].as_f64(), Some(0.0), "{c}");
    // Reported: nothing left to resume.
    let left = std::fs::read_dir(state.path().join("evals")).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
            .count()
    });
    assert_eq!(left, 0);

    // Refusals: a text shorter than one window, a window longer than the context.
    let short = state.path().join("short.txt");
    std::fs::write(&short, "Alice was beginning to get very tired.").expect("short text");
    sous_snapshot!(
        "eval-text-shorter-than-a-window",
        eval_cmd(
            state.path(),
            &["--url", url, "--text", short.to_str().expect("utf-8")],
        )
    );
    let long = alice.repeat(4);
    let long_path = state.path().join("long.txt");
    std::fs::write(&long_path, long).expect("long text");
    sous_snapshot!(
        "eval-window-longer-than-the-context",
        eval_cmd(
            state.path(),
            &[
                "--url",
                url,
                "--text",
                long_path.to_str().expect("utf-8"),
                "--ctx",
                "8192",
            ],
        )
    );
}

#[test]
fn shipped_recipes_against_the_bf16_one() {
    let _cpu = cpu_exclusive();
    let Some(_) = smollm2() else { return };
    let mirror = Mirror::start(&root().join("target/models"), &[], &[]);
    let work = tempfile::tempdir().expect("tempdir");
    let (cache, sous_cache) = (work.path().join("hub"), work.path().join("sous-cache"));
    let envs = [
        ("HF_ENDPOINT", mirror.url.as_str()),
        ("HF_HUB_CACHE", cache.to_str().expect("utf-8")),
        ("SOUS_CACHE_DIR", sous_cache.to_str().expect("utf-8")),
    ];
    let (p1, p2) = (
        format!("server.port={}", free_port()),
        format!("server.port={}", free_port()),
    );
    // Both servers on one kernel path: each would otherwise measure at load whether bf16
    // products take AVX512-BF16's dot product, and on a CPU where both kernels run at
    // about the same speed two loads can choose differently, which moves the numbers
    // by the spread between them (benchmarks/native.md, "Numbers across kernel paths").
    let path = sous_kernels::gemm::KernelPath::available()[0];
    let eval = |candidate: &str, extra: &[&str]| {
        let (code, stdout, stderr) = run(sous()
            .args(["eval", "--recipe", candidate, "--set", &p1])
            .args([
                "--baseline",
                "recipes/local/smollm2-135m.toml",
                "--baseline-set",
                &p2,
            ])
            .args(["--chunks", "2", "--json"])
            .args(extra)
            .envs(envs)
            .envs(crate::util::kernel_path_env(path))
            .env("SOUS_STATE_DIR", work.path()));
        (
            code,
            serde_json::from_str::<Value>(&stdout).unwrap_or(Value::Null),
            stderr,
        )
    };

    // Speculative decoding changes nothing a prompt's scores show.
    let (a, b) = (work.path().join("ngram"), work.path().join("nvfp4"));
    let (a, b) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let (code, ngram, stderr) = eval("recipes/local/smollm2-135m-ngram.toml", &["--out", a]);
    assert_eq!(code, 0, "{stderr}");
    let c = &ngram["comparison"];
    assert_eq!(c["kld_max"].as_f64(), Some(0.0), "{c}");
    assert_eq!(c["top1_agreement"]["value"].as_f64(), Some(1.0), "{c}");
    assert_eq!(ngram["runs"][0]["label"], "smollm2-135m");
    assert_eq!(ngram["runs"][1]["label"], "smollm2-135m-ngram");

    // NVFP4 weights cost a 135M model a good deal; the quality gate says so and fails.
    let (code, nvfp4, stderr) = eval(
        "recipes/local/smollm2-135m-nvfp4.toml",
        &["--max-kld", "0.01", "--out", b],
    );
    assert_eq!(code, 1, "the gate fails the run: {stderr}");
    assert!(stderr.contains("exceeds --max-kld 0.01"), "{stderr}");
    let c = &nvfp4["comparison"];
    assert!(c["kld_mean"]["value"].as_f64().is_some_and(|k| k > 0.01), "{c}");
    assert!(c["kld_p99"].as_f64() >= c["kld_mean"]["value"].as_f64(), "{c}");
    assert!(
        c["top1_agreement"]["value"]
            .as_f64()
            .is_some_and(|a| a < 0.95 && a > 0.5),
        "{c}"
    );
    assert!(
        c["delta_perplexity"]["value"].as_f64().is_some_and(|d| d > 0.0),
        "{c}"
    );

    // The two reports side by side.
    let (code, table, stderr) = run(sous().args([
        "bench",
        "compare",
        &format!("{a}/eval.json"),
        &format!("{b}/eval.json"),
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        table.contains("a: smollm2-135m-ngram (against smollm2-135m)"),
        "{table}"
    );
    let kld = table
        .lines()
        .find(|l| l.starts_with("| KL divergence, mean |"))
        .expect("KL row");
    assert!(
        kld.starts_with("| KL divergence, mean | 0.000000 | 0."),
        "{table}"
    );
}

#[test]
fn lm_evaluation_harness_runs_the_shipped_task() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let Some(python) = python("lm-evaluation-harness through the native engine") else {
        return;
    };
    let lm_eval = python.with_file_name("lm_eval");
    let server = serve(&model);
    let state = tempfile::tempdir().expect("state");
    let out = state.path().join("out");
    let (code, report, stderr) = eval(
        state.path(),
        &[
            "--url",
            &server.url,
            "--chunks",
            "1",
            "--tasks",
            "sous_capitals",
            "--lm-eval",
            lm_eval.to_str().expect("utf-8"),
            "--out",
            out.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let task = &report["runs"][0]["tasks"][0];
    assert_eq!(task["task"], "sous_capitals", "{report}");
    assert_eq!(task["samples"], 32);
    let acc = task["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["name"] == "acc")
        .expect("acc");
    // A 135M model knows some capitals: better than the 25 % of guessing.
    assert!(
        acc["value"].as_f64().is_some_and(|a| a > 0.25 && a <= 1.0),
        "{acc}"
    );
    assert!(acc["stderr"].as_f64().is_some_and(|s| s > 0.0), "{acc}");
    // The harness tokenized through the server, and its own files are kept.
    let side = std::fs::read_dir(out.join("lm_eval"))
        .expect("lm_eval dir")
        .flatten()
        .next()
        .expect("one side");
    let log = std::fs::read_to_string(side.path().join("lm_eval.log")).expect("log");
    assert!(log.contains("Using remote tokenizer"), "{log}");
    assert!(out.join("eval.json").is_file());

    // Without the harness: what to install.
    sous_snapshot!(
        "eval-without-the-harness",
        eval_cmd(
            state.path(),
            &[
                "--url",
                &server.url,
                "--tasks",
                "sous_capitals",
                "--lm-eval",
                "/nonexistent/lm_eval",
            ],
        )
    );
}

#[test]
fn a_server_without_prompt_logprobs_is_refused_by_name() {
    let Some(model) = smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = crate::bench::fake(&[]);
    let port = fake.port;
    let url = format!("http://127.0.0.1:{port}");
    sous_snapshot!(
        "eval-without-prompt-logprobs",
        eval_cmd(
            dir.path(),
            &[
                "--url",
                &url,
                "--tokenizer",
                model.to_str().expect("utf-8"),
                "--chunks",
                "1",
            ],
        )
    );
    drop(fake);
}

#[test]
fn quantize_prints_the_eval_of_its_output_against_its_source() {
    let _cpu = cpu_exclusive();
    let Some(model) = smollm2() else { return };
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("nvfp4");
    let (code, stdout, stderr) = run(sous()
        .arg("quantize")
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .args(["--eval", "--json", "--quiet"])
        .env("SOUS_STATE_DIR", work.path()));
    assert_eq!(code, 0, "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("JSON summary");
    assert!(summary["quantized"].as_u64().is_some_and(|n| n > 0), "{summary}");
    let eval = &summary["eval"];
    assert_eq!(eval["runs"][0]["label"], "source");
    assert_eq!(eval["runs"][1]["label"], "quantized");
    let c = &eval["comparison"];
    assert!(c["kld_mean"]["value"].as_f64().is_some_and(|k| k > 0.0), "{c}");
    assert!(
        c["delta_perplexity"]["value"].as_f64().is_some_and(|d| d > 0.0),
        "{c}"
    );
    // The servers' recipes were temporary.
    let left: Vec<_> = std::fs::read_dir(work.path().join("evals"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().starts_with("quantize-")),
        "{left:?}"
    );
}

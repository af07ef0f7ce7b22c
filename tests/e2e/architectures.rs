//! `sous serve` with the native engine on the MoE and hybrid models of
//! `tests/fixtures/architectures/` (tiny random models saved by transformers 5.17, with
//! a byte-level tokenizer saved by transformers too): the served log-probabilities of
//! the prompt and of a greedy continuation are transformers' (with the MTP head drafting
//! too), `sous plan`'s KV prediction is the engine's, and what the engine does not run on
//! a hybrid model is refused at start-up naming the setting.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::native::serve;
use crate::util::root;

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/architectures").join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference JSON")
}

/// One completion of `case` of model `name`'s reference, greedy, with the prompt's and
/// the output's log-probabilities, checked against transformers'.
fn served_logprobs_are_transformers(name: &str) {
    served_with(name, "");
}

/// [`served_logprobs_are_transformers`] with `serving` TOML lines added.
fn served_with(name: &str, serving: &str) {
    let want = reference(name);
    let case = &want["cases"][1];
    let prompt: Vec<u64> = case["prompt"]
        .as_array()
        .expect("prompt")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect();
    let greedy = case["greedy_logprobs"].as_array().expect("greedy_logprobs");
    let server = serve(
        &fixture(name),
        &format!("[serving]\nmax_num_seqs = 4\n{serving}"),
        "",
        &[],
    );
    // `sous plan`'s prediction (linear-attention states set aside) is what the engine sized.
    let log = server.running.stderr();
    let ready = log
        .lines()
        .find(|l| l.contains("ready http://"))
        .expect("a ready line");
    let number_after = |key: &str| -> u64 {
        let rest = &ready[ready.find(key).unwrap_or_else(|| panic!("no `{key}` in {ready}")) + key.len()..];
        rest.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("a number")
    };
    assert_eq!(
        number_after("KV cache "),
        number_after("(plan: "),
        "{name}: {ready}"
    );
    let body = json!({
        "prompt": prompt,
        "max_tokens": greedy.len(),
        "temperature": 0,
        "logprobs": 0,
        "prompt_logprobs": 0,
        "ignore_eos": true,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reply: Value = runtime.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/v1/completions", server.url))
            .json(&body)
            .send()
            .await
            .expect("the server answers")
            .json()
            .await
            .expect("JSON")
    });
    let choice = &reply["choices"][0];
    let close = |got: f64, want: f64, what: String| {
        assert!(
            (got - want).abs() < 2e-4,
            "{name}: {what}: served {got}, transformers {want}\n{reply}"
        );
    };
    for (i, want) in case["prompt_logprobs"]
        .as_array()
        .expect("prompt_logprobs")
        .iter()
        .enumerate()
    {
        let Some(want) = want.as_f64() else { continue };
        let entry = &choice["prompt_logprobs"][i][prompt[i].to_string()];
        close(
            entry["logprob"].as_f64().expect("a logprob"),
            want,
            format!("prompt token {i}"),
        );
    }
    let served = choice["logprobs"]["token_logprobs"]
        .as_array()
        .expect("token_logprobs");
    assert_eq!(served.len(), greedy.len(), "{name}: {reply}");
    for (step, (got, want)) in served.iter().zip(greedy).enumerate() {
        close(
            got.as_f64().expect("a logprob"),
            want.as_f64().expect("a logprob"),
            format!("greedy step {step}"),
        );
    }
}

#[test]
fn a_qwen3_moe_model_is_served_as_transformers_runs_it() {
    served_logprobs_are_transformers("qwen3_moe");
}

#[test]
fn a_qwen3_next_model_is_served_as_transformers_runs_it() {
    served_logprobs_are_transformers("qwen3_next");
}

#[test]
fn a_hybrid_drafting_with_its_mtp_head_is_served_as_transformers_runs_it() {
    served_with(
        "qwen3_next",
        "speculative = { method = \"qwen3_next_mtp\", tokens = 2 }",
    );
}

#[test]
fn a_qwen3_5_moe_model_is_served_as_transformers_runs_it() {
    served_logprobs_are_transformers("qwen3_5_moe");
}

#[test]
fn prefix_caching_on_a_hybrid_model_is_refused_naming_the_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recipe = dir.path().join("hybrid.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"hybrid\"\n[model]\npath = \"{}\"\n\n[engine]\nkind = \"native\"\n\n\
             [serving]\nprefix_caching = true\n\n[memory]\nkv_cache_bytes = \"64MiB\"\n",
            fixture("qwen3_5").display()
        ),
    )
    .expect("recipe");
    let out = crate::util::sous()
        .args(["serve", "--recipe", recipe.to_str().expect("utf-8"), "--dry-run"])
        .output()
        .expect("sous runs");
    let out = if out.status.success() {
        crate::util::sous()
            .args(["serve", "--recipe", recipe.to_str().expect("utf-8")])
            .env("SOUS_STATE_DIR", dir.path().join("state"))
            .output()
            .expect("sous runs")
    } else {
        out
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "served a hybrid model with prefix caching:\n{stderr}"
    );
    assert!(
        stderr.contains("`serving.prefix_caching`") && stderr.contains("Qwen3_5ForCausalLM"),
        "{stderr}"
    );
}

#[test]
fn an_nvfp4a16_moe_is_quantized_and_served_from_its_packed_experts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("qwen3_moe-nvfp4");
    let quantized = crate::util::sous()
        .args(["quantize", fixture("qwen3_moe").to_str().expect("utf-8"), "--out"])
        .arg(&out)
        .arg("--quiet")
        .output()
        .expect("sous runs");
    assert!(
        quantized.status.success(),
        "{}",
        String::from_utf8_lossy(&quantized.stderr)
    );
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture("qwen3_moe").join(file), out.join(file)).expect("tokenizer");
    }
    let recipe = |name: &str, model: &std::path::Path, port: u16| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"{name}\"\n[model]\npath = \"{}\"\n[engine]\nkind = \"native\"\n\
                 [memory]\nkv_cache_bytes = \"64MiB\"\n[server]\nhost = \"127.0.0.1\"\nport = {port}\n",
                model.display()
            ),
        )
        .expect("recipe");
        path
    };
    let nvfp4 = recipe("nvfp4", &out, crate::util::free_port());
    let f32 = recipe("f32", &fixture("qwen3_moe"), crate::util::free_port());
    let eval = crate::util::sous()
        .args(["eval", "--chunks", "2", "--ctx", "128", "--json", "--recipe"])
        .arg(&nvfp4)
        .arg("--baseline")
        .arg(&f32)
        .env("SOUS_STATE_DIR", dir.path().join("state"))
        .output()
        .expect("sous eval runs");
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let report: Value = serde_json::from_slice(&eval.stdout).expect("eval JSON");
    // NVFP4 moves the numbers, a little: a wrong expert (unpacked wrongly, or another
    // expert's) moves them by nats on this model.
    let kl = report["comparison"]["kld_mean"]["value"].as_f64().expect("KL");
    assert!(kl > 0.0 && kl < 0.2, "KL divergence from the f32 model {kl}");
}

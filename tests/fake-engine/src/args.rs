//! The command lines the fake engine accepts, as each engine's parser would: which
//! engine it plays (from the program name or `-m sglang.launch_server`), the flags
//! each parser declares that sous renders (and common others), and the parsers' own
//! error messages and exit code 2 for anything else (vLLM 0.33 and SGLang 0.5.23:
//! argparse, "unrecognized arguments"; TensorRT-LLM: click, "No such option").

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Vllm,
    Sglang,
    Trtllm,
}

/// Flags taking a value, per engine (a subset of each parser that covers every flag
/// sous renders and the common others).
const VLLM_VALUES: &[&str] = &[
    "--served-model-name",
    "--host",
    "--port",
    "--uds",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--device-memory-utilization",
    "--kv-cache-memory-bytes",
    "--kv-cache-dtype",
    "--block-size",
    "--prefix-match-unit",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
    "--quantization",
    "-q",
    "--cpu-offload-gb",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--kv-transfer-config",
    "--tool-call-parser",
    "--tool-parser-plugin",
    "--reasoning-parser",
    "--reasoning-parser-plugin",
    "--dtype",
    "--api-key",
    "--compilation-config",
    "-cc",
    "--download-dir",
    "--load-format",
    "--mamba-cache-dtype",
    "--mamba-ssm-cache-dtype",
    "--mamba-block-size",
    "--mamba-cache-mode",
    "--config",
    "--optimization-level",
    "--seed",
    "--revision",
    "--tokenizer",
    "--attention-backend",
];
const VLLM_SWITCHES: &[&str] = &[
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--disable-prefix-caching",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--disable-chunked-prefill",
    "--enable-expert-parallel",
    "--no-enable-expert-parallel",
    "--enable-auto-tool-choice",
    "--no-enable-auto-tool-choice",
    "--trust-remote-code",
    "--no-trust-remote-code",
    "--enforce-eager",
    "--no-enforce-eager",
    "--disable-log-stats",
    "--enable-log-requests",
    "--async-scheduling",
    "--language-model-only",
];
const SGLANG_VALUES: &[&str] = &[
    "--model-path",
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--context-length",
    "--mem-fraction-static",
    "--max-total-tokens",
    "--kv-cache-dtype",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--max-running-requests",
    "--tp-size",
    "--tensor-parallel-size",
    "--pp-size",
    "--dp-size",
    "--ep-size",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--reasoning-parser",
    "--tool-call-parser",
    "--dtype",
    "--api-key",
    "--hicache-size",
    "--hicache-ratio",
    "--quantization",
    "--load-format",
    "--download-dir",
    "--config",
];
const SGLANG_SWITCHES: &[&str] = &[
    "--disable-radix-cache",
    "--trust-remote-code",
    "--enable-metrics",
    "--enable-hierarchical-cache",
    "--enable-metrics-for-all-schedulers",
];
const TRTLLM_VALUES: &[&str] = &[
    "--host",
    "--port",
    "--backend",
    "--max_batch_size",
    "--max_num_tokens",
    "--max_seq_len",
    "--tp_size",
    "--tensor_parallel_size",
    "--pp_size",
    "--pipeline_parallel_size",
    "--ep_size",
    "--moe_expert_parallel_size",
    "--free_gpu_memory_fraction",
    "--kv_cache_free_gpu_memory_fraction",
    "--config",
    "--extra_llm_api_options",
    "--reasoning_parser",
    "--tool_parser",
    "--served_model_name",
    "--log_level",
    "--tokenizer",
    "--revision",
];
const TRTLLM_SWITCHES: &[&str] = &["--trust_remote_code", "--enable_chunked_prefill"];

pub struct Parsed {
    pub kind: Kind,
    pub model: String,
    pub values: BTreeMap<String, String>,
}

pub fn fail(kind: Kind, message: &str) -> ! {
    match kind {
        Kind::Vllm => {
            eprintln!("usage: vllm serve [model_tag] [options]\nvllm serve: error: {message}");
        }
        Kind::Sglang => eprintln!(
            "usage: launch_server.py [-h] --model-path MODEL_PATH [options]\nlaunch_server.py: error: {message}"
        ),
        Kind::Trtllm => eprintln!(
            "Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\nError: {message}"
        ),
    }
    std::process::exit(2);
}

pub fn parse(args: &[String]) -> Parsed {
    let (kind, rest): (Kind, &[String]) = match args {
        [first, rest @ ..] if first == "serve" => (Kind::Vllm, rest),
        [m, module, rest @ ..] if m == "-m" && module == "sglang.launch_server" => (Kind::Sglang, rest),
        rest => (Kind::Trtllm, rest),
    };
    let (values_known, switches) = match kind {
        Kind::Vllm => (VLLM_VALUES, VLLM_SWITCHES),
        Kind::Sglang => (SGLANG_VALUES, SGLANG_SWITCHES),
        Kind::Trtllm => (TRTLLM_VALUES, TRTLLM_SWITCHES),
    };
    let mut values = BTreeMap::new();
    let mut positional = Vec::new();
    let mut unknown = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if arg.starts_with('-') => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if switches.contains(&flag.as_str()) {
            values.insert(flag, "true".into());
        } else if values_known.contains(&flag.as_str()) {
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    match rest.get(i) {
                        Some(v) => v.clone(),
                        None => fail(kind, &format!("argument {flag}: expected one argument")),
                    }
                }
            };
            values.insert(flag, value);
        } else if arg.starts_with('-') {
            unknown.push(arg.clone());
        } else {
            positional.push(arg.clone());
        }
        i += 1;
    }
    if let Some(first) = unknown.first() {
        match kind {
            Kind::Trtllm => fail(kind, &format!("No such option: {first}")),
            _ => fail(kind, &format!("unrecognized arguments: {}", unknown.join(" "))),
        }
    }
    let model = match kind {
        Kind::Sglang => values
            .get("--model-path")
            .or_else(|| values.get("--model"))
            .cloned()
            .unwrap_or_else(|| fail(kind, "the following arguments are required: --model-path")),
        _ => positional
            .first()
            .cloned()
            .unwrap_or_else(|| fail(kind, "the following arguments are required: model")),
    };
    if kind == Kind::Vllm
        && let Some(spec) = values.get("--speculative-config")
        && serde_json::from_str::<serde_json::Value>(spec).is_err()
    {
        fail(
            kind,
            &format!("argument --speculative-config: invalid loads value: '{spec}'"),
        );
    }
    Parsed { kind, model, values }
}

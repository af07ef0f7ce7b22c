//! TensorRT-LLM: `trtllm-serve MODEL --flag value ... --config OPTIONS.yaml`.
//!
//! `trtllm-serve` is a click program with underscore option names
//! (`tensorrt_llm/commands/serve.py`); most settings live in a YAML file of `LlmArgs`
//! fields (`tensorrt_llm/llmapi/llm_args.py`) merged over the flags, so sous writes
//! that file into the instance directory. Read in TensorRT-LLM 1.3; `docs/engines.md`
//! has the details and how they differ from vLLM.

use serde_json::{Map, Value, json};

use super::image::ImageDefaults;
use super::{Arg, Launch, LaunchFile, RenderContext, RenderError, Target, float, push};
use crate::recipe::{EngineKind, KvCacheDtype, Recipe, Warning, is_mtp};
use crate::version::Version;

/// The newest release whose options sous renders for.
pub const NEWEST: Version = Version::new(1, 3, 0);

/// The official image, `nvcr.io/nvidia/tensorrt-llm/release` (NVIDIA/TensorRT-LLM
/// `docker/Dockerfile.multi`, stage `release`): no `ENTRYPOINT` or `CMD` of its own, so
/// those of its base, NVIDIA's PyTorch container (`nvcr.io/nvidia/pytorch`):
/// `/opt/nvidia/nvidia_entrypoint.sh`, which runs its arguments.
pub const IMAGE: ImageDefaults = ImageDefaults {
    repository: "nvcr.io/nvidia/tensorrt-llm/release",
    entrypoint: &["/opt/nvidia/nvidia_entrypoint.sh"],
    cmd: &[],
};

/// Name of the options file in the instance directory.
pub const OPTIONS_FILE: &str = "trtllm-options.yaml";

pub(super) fn render(recipe: &Recipe, ctx: &RenderContext) -> Result<Launch, RenderError> {
    let target = Target::new(recipe, NEWEST);
    let mut launch = target.launch(EngineKind::Trtllm);
    let mut warnings = Vec::new();
    let mut options = Map::new();
    let mut kv = Map::new();
    let argv = &mut launch.argv;
    let program = recipe.engine.executable.as_deref().unwrap_or("trtllm-serve");
    argv.extend([Arg::from(program), Arg::from(recipe.model.engine_arg())]);

    if recipe.model.served_name != recipe.model.engine_arg() {
        // Declared by newer builds (1.3.0rc15 and later, per third-party launchers);
        // older ones report the model path in `/v1/models`.
        if target.at_least(1, 3, 0) {
            push(argv, "--served_model_name", &recipe.model.served_name);
        } else {
            warnings.push(Warning::new(format!(
                "{} has no served-name option: clients must ask for the model as `{}`",
                target.label,
                recipe.model.engine_arg()
            )));
        }
    }
    // trtllm-serve listens on `localhost` by default.
    push(argv, "--host", &recipe.server.host);
    if recipe.server.port != 8000 {
        push(argv, "--port", recipe.server.port);
    }

    let serving = &recipe.serving;
    let memory = &recipe.memory;
    if let Some(len) = serving.max_model_len {
        push(argv, "--max_seq_len", len);
    }
    if let Some(n) = serving.max_num_seqs {
        push(argv, "--max_batch_size", n);
    }
    if let Some(n) = serving.max_batched_tokens {
        push(argv, "--max_num_tokens", n);
    }
    if let Some(n) = serving.tensor_parallel {
        push(argv, "--tp_size", n);
    }
    if let Some(n) = serving.pipeline_parallel {
        push(argv, "--pp_size", n);
    }
    if serving.data_parallel.is_some_and(|n| n > 1) {
        return Err(target.unsupported(
            "serving.data_parallel",
            "trtllm-serve serves one model replica per process",
            Some("run one instance per replica behind a load balancer, or use vLLM or SGLang"),
        ));
    }
    if serving.expert_parallel == Some(true) {
        push(argv, "--ep_size", serving.tensor_parallel.unwrap_or(1));
    }
    if serving.chunked_prefill == Some(true) {
        argv.push(Arg::from("--enable_chunked_prefill"));
    }
    if serving.trust_remote_code == Some(true) {
        argv.push(Arg::from("--trust_remote_code"));
    }
    if let Some(parser) = &serving.reasoning_parser {
        // TensorRT-LLM spells DeepSeek-R1's parser with a dash.
        let name = if parser == "deepseek_r1" {
            "deepseek-r1"
        } else {
            parser.as_str()
        };
        push(argv, "--reasoning_parser", name);
    }
    if let Some(parser) = &serving.tool_call_parser {
        push(argv, "--tool_parser", parser);
    }
    // `auto_tool_choice`: no switch; tool calls are parsed whenever a parser is set.

    let resolved = super::memory::of(recipe, &target)?;
    if let Some(u) = resolved.gpu_utilization {
        kv.insert("free_gpu_memory_fraction".into(), json!(u));
        warnings.push(Warning::new(format!(
            "TensorRT-LLM's `free_gpu_memory_fraction` ({}) is a fraction of the memory left free after loading the weights, not of the whole GPU as in vLLM",
            float(u)
        )));
    }
    if let Some(bytes) = resolved.kv_cache_bytes {
        kv.insert("max_gpu_total_bytes".into(), json!(bytes));
        if memory.gpu_utilization.is_some() {
            warnings.push(Warning::new(
                "TensorRT-LLM uses the smaller of `memory.kv_cache_bytes` and the `memory.gpu_utilization` share",
            ));
        }
    }
    warnings.extend(super::native_only_embeddings(recipe, &target.label));
    if let Some(dtype) = memory.kv_cache_dtype {
        let name = match dtype {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 => "fp8",
            other => {
                return Err(target.unknown(
                    "memory.kv_cache_dtype",
                    "KV-cache dtype",
                    other.as_str(),
                    &["auto", "fp8", "fp8_e4m3"],
                ));
            }
        };
        kv.insert("dtype".into(), json!(name));
    }
    if let Some(on) = serving.prefix_caching {
        kv.insert("enable_block_reuse".into(), json!(on));
    }
    if let Some(bytes) = memory.kv_offload_bytes {
        kv.insert("host_cache_size".into(), json!(bytes));
    }
    if !kv.is_empty() {
        options.insert("kv_cache_config".into(), Value::Object(kv));
    }
    if let Some(dtype) = serving.dtype {
        options.insert("dtype".into(), json!(dtype.as_str()));
    }
    if let Some(spec) = &serving.speculative {
        let method = spec.method.as_deref().unwrap_or_default();
        let k = spec.tokens.unwrap_or(1);
        let config = match method {
            m if is_mtp(m) => json!({ "decoding_type": "MTP", "num_nextn_predict_layers": k }),
            "eagle" => {
                json!({ "decoding_type": "Eagle", "max_draft_len": k, "speculative_model": spec.model })
            }
            "eagle3" => {
                json!({ "decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": spec.model })
            }
            "draft_model" => {
                json!({ "decoding_type": "Draft_Target", "max_draft_len": k, "speculative_model": spec.model })
            }
            "ngram" => json!({
                "decoding_type": "NGram",
                "max_draft_len": k,
                "max_matching_ngram_size": spec.prompt_lookup_max.or(spec.prompt_lookup_min).unwrap_or(k),
            }),
            other => {
                return Err(target.unknown(
                    "serving.speculative.method",
                    "speculative method",
                    other,
                    &["mtp", "eagle", "eagle3", "draft_model", "ngram"],
                ));
            }
        };
        options.insert("speculative_config".into(), config);
    }
    if recipe.server.api_key_env.is_some() {
        return Err(target.unsupported(
            "server.api_key_env",
            "trtllm-serve has no API-key option",
            Some("remove `server.api_key_env` and put an authenticating proxy in front of the server"),
        ));
    }
    // `/prometheus/metrics` (read by `sous bench`) is mounted only with per-request
    // metrics on (`tensorrt_llm/serve/openai_server.py`).
    options.insert("enable_iter_perf_stats".into(), json!(true));
    options.insert("return_perf_metrics".into(), json!(true));
    if let Some(extra) = &recipe.engine.extra_options {
        merge(&mut options, extra);
    }

    let path = ctx.instance_dir.join(OPTIONS_FILE);
    // Builds up to 1.2 only know `--extra_llm_api_options`; 1.3 documents `--config`.
    let flag = if target.at_least(1, 3, 0) {
        "--config"
    } else {
        "--extra_llm_api_options"
    };
    push(&mut launch.argv, flag, path.display());
    let contents = serde_yaml_ng::to_string(&Value::Object(options)).map_err(|e| {
        target.unsupported(
            "engine.extra_options",
            format!("cannot be written as YAML: {e}"),
            None,
        )
    })?;
    launch.files.push(LaunchFile { path, contents });
    launch.warnings = warnings;
    Ok(launch)
}

/// Deep merge, `extra` winning.
fn merge(base: &mut Map<String, Value>, extra: &Map<String, Value>) {
    for (key, value) in extra {
        match (base.get_mut(key), value) {
            (Some(Value::Object(b)), Value::Object(e)) => merge(b, e),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

//! vLLM: `vllm serve MODEL --flag value ...`.
//!
//! Flags and value sets mirror vLLM's argument parser: `vllm/engine/arg_utils.py`,
//! `vllm/config/cache.py`, `vllm/config/speculative.py`, `vllm/tool_parsers/__init__.py`
//! and `vllm/reasoning/__init__.py` of vLLM 0.10.2, 0.11.0, 0.13.0, 0.17.0, 0.22.0 and
//! 0.33.0 (what changed between them: `docs/engines.md`).
//! Booleans use the `--x` / `--no-x` spellings every one of those releases accepts
//! (`--disable-x` only exists from 0.33). A setting the recipe leaves unset is not
//! rendered, so vLLM's default applies.

use serde_json::json;

use super::image::ImageDefaults;
use super::{Arg, Launch, RenderError, Target, float, push};
use crate::recipe::{EngineKind, KvCacheDtype, Recipe, Warning, is_mtp};
use crate::version::Version;

/// The newest release whose parser sous has checked.
pub const NEWEST: Version = Version::new(0, 33, 0);

/// The official images (vllm-project/vllm `docker/Dockerfile`, target `vllm-openai`,
/// published as `vllm/vllm-openai`; `docker/Dockerfile.cpu`, the same target, as
/// `vllm/vllm-openai-cpu`): `ENTRYPOINT ["python3", "-m",
/// "vllm.entrypoints.openai.api_server"]` up to v0.11.0, `["vllm", "serve"]` from
/// v0.11.1 (read in v0.10.2, v0.11.0, v0.11.1, v0.13.0, v0.20.0 and v0.32.0); no `CMD`.
/// An unknown release counts as the newest.
pub(super) fn images(version: Option<&Version>) -> [ImageDefaults; 2] {
    let entrypoint: &'static [&'static str] = if version.is_none_or(|v| v.at_least(0, 11, 1)) {
        &["vllm", "serve"]
    } else {
        &["python3", "-m", "vllm.entrypoints.openai.api_server"]
    };
    ["vllm/vllm-openai", "vllm/vllm-openai-cpu"].map(|repository| ImageDefaults {
        repository,
        entrypoint,
        cmd: &[],
    })
}

/// MTP heads vLLM 0.11.0 accepts as `method` (docs.vllm.ai v0.11.0 `vllm.config.speculative`).
const MTP_0_11: &[&str] = &[
    "deepseek_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
    "mimo_mtp",
    "longcat_flash_mtp",
];

/// MTP heads of vLLM 0.33.0 (`vllm/config/speculative.py` `MTPModelTypes`); all of them
/// are rewritten to `mtp` with a deprecation warning there.
const MTP_0_33: &[&str] = &[
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
];

/// Methods every release from 0.10.2 accepts.
const METHODS_ALWAYS: &[&str] = &["ngram", "eagle", "eagle3", "draft_model"];

/// Methods sous only knows from 0.33.0.
const METHODS_0_33: &[&str] = &[
    "suffix",
    "custom_class",
    "extract_hidden_states",
    "dflash",
    "ngram_gpu",
    "dspark",
];

/// `--tool-call-parser` names of 0.33.0 (`vllm/tool_parsers/__init__.py`).
const TOOL_PARSERS_0_33: &[&str] = &[
    "dots",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v32",
    "deepseek_v4",
    "deepseek_v41",
    "cohere_command3",
    "cohere_command4",
    "ernie45",
    "glm45",
    "glm47",
    "ling3",
    "granite",
    "granite4",
    "hermes",
    "hf",
    "beam",
    "poolside_v1",
    "hunyuan_a13b",
    "hy_v3",
    "hy_v4",
    "internlm",
    "jamba",
    "lfm2",
    "kimi_k2",
    "kimi_k3",
    "k2_horizon",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "longcat",
    "mimo",
    "minimax_m2",
    "minimax_m3",
    "minicpm5",
    "mistral",
    "olmo3",
    "plamo3",
    "muse",
    "muse_glimmer",
    "musespark1x",
    "openai",
    "phi4_mini_json",
    "pythonic",
    "qwen3_coder",
    "qwen3_json",
    "qwen3_xml",
    "seed_oss",
    "step3",
    "step3p5",
    "step5",
    "inkling",
    "xlam",
    "gigachat3",
    "functiongemma",
    "gemma4",
    "apertus",
];

/// `--reasoning-parser` names of 0.33.0 (`vllm/reasoning/__init__.py`), plus `none`.
const REASONING_PARSERS_0_33: &[&str] = &[
    "none",
    "deepseek_r1",
    "deepseek_v3",
    "deepseek_v4",
    "deepseek_v41",
    "poolside_v1",
    "cohere_command3",
    "cohere_command4",
    "ernie45",
    "gemma4",
    "glm45",
    "glm47",
    "ling3",
    "openai_gptoss",
    "granite",
    "granite_thinking_parser",
    "hf",
    "beam",
    "holo2",
    "hunyuan_a13b",
    "hy_v3",
    "hy_v4",
    "kimi_k2",
    "kimi_k3",
    "k2_horizon",
    "mimo",
    "minicpmv",
    "minimax_m2",
    "minimax_m2_append_think",
    "minimax_m3",
    "mistral",
    "nemotron_v3",
    "olmo3",
    "plamo3",
    "muse",
    "muse_glimmer",
    "musespark1x",
    "qwen3",
    "seed_oss",
    "step3",
    "step3p5",
    "step5",
    "inkling",
];

pub(super) fn render(recipe: &Recipe) -> Result<Launch, RenderError> {
    let target = Target::new(recipe, NEWEST);
    if !target.at_least(0, 10, 2) {
        return Err(RenderError::TooOld {
            engine: target.label,
            oldest: "vLLM 0.10.2".into(),
        });
    }
    let mut launch = target.launch(EngineKind::Vllm);
    let argv = &mut launch.argv;
    let program = recipe.engine.executable.as_deref().unwrap_or("vllm");
    argv.extend([
        Arg::from(program),
        Arg::from("serve"),
        Arg::from(recipe.model.engine_arg()),
    ]);

    if recipe.model.served_name != recipe.model.engine_arg() {
        push(argv, "--served-model-name", &recipe.model.served_name);
    }
    // vLLM listens on every interface unless told otherwise (`--host` default None).
    if recipe.server.host != "0.0.0.0" {
        push(argv, "--host", &recipe.server.host);
    }
    if recipe.server.port != 8000 {
        push(argv, "--port", recipe.server.port);
    }

    let serving = &recipe.serving;
    let memory = &recipe.memory;
    let resolved = super::memory::of(recipe, &target)?;
    if let Some(len) = serving.max_model_len {
        push(argv, "--max-model-len", len);
    }
    if let Some(u) = resolved.gpu_utilization {
        push(argv, "--gpu-memory-utilization", float(u));
    }
    if let Some(bytes) = resolved.kv_cache_bytes {
        // The full name: `--kv-cache-memory` only works as an argparse abbreviation.
        push(argv, "--kv-cache-memory-bytes", bytes);
        if let Some(u) = memory.gpu_utilization {
            launch.warnings.push(Warning::new(format!(
                "vLLM ignores `memory.gpu_utilization` ({}) when `memory.kv_cache_bytes` is set: the KV cache gets exactly {} per GPU and the start-up memory check is skipped (vllm/v1/worker/gpu_worker.py)",
                float(u),
                crate::recipe::ByteSize(bytes),
            )));
        }
    }
    launch
        .warnings
        .extend(super::native_only_embeddings(recipe, &target.label));
    if let Some(dtype) = memory.kv_cache_dtype {
        push(argv, "--kv-cache-dtype", kv_cache_dtype(&target, dtype)?);
    }
    if let Some(bytes) = memory.kv_offload_bytes {
        if !target.at_least(0, 13, 0) {
            return Err(target.unsupported(
                "memory.kv_offload_bytes",
                "`--kv-offloading-size` arrived in vLLM 0.13",
                Some("use vLLM 0.13 or later, or pass a `--kv-transfer-config` for the OffloadingConnector in `engine.extra_args`"),
            ));
        }
        push(
            argv,
            "--kv-offloading-size",
            float(crate::recipe::ByteSize(bytes).gib()),
        );
        push(argv, "--kv-offloading-backend", "native");
    }
    if let Some(on) = serving.prefix_caching {
        argv.push(Arg::from(if on {
            "--enable-prefix-caching"
        } else {
            "--no-enable-prefix-caching"
        }));
    }
    if let Some(on) = serving.chunked_prefill {
        argv.push(Arg::from(if on {
            "--enable-chunked-prefill"
        } else {
            "--no-enable-chunked-prefill"
        }));
    }
    if let Some(n) = serving.max_num_seqs {
        push(argv, "--max-num-seqs", n);
    }
    if let Some(n) = serving.max_batched_tokens {
        push(argv, "--max-num-batched-tokens", n);
    }
    if let Some(n) = serving.tensor_parallel {
        push(argv, "--tensor-parallel-size", n);
    }
    if let Some(n) = serving.pipeline_parallel {
        push(argv, "--pipeline-parallel-size", n);
    }
    if let Some(n) = serving.data_parallel {
        push(argv, "--data-parallel-size", n);
    }
    if serving.expert_parallel == Some(true) {
        argv.push(Arg::from("--enable-expert-parallel"));
    }
    if let Some(spec) = &serving.speculative {
        let method = spec.method.as_deref().unwrap_or_default();
        let method = speculative_method(&target, method, &mut launch.warnings)?;
        let mut config = serde_json::Map::new();
        config.insert("method".into(), json!(method));
        config.insert("num_speculative_tokens".into(), json!(spec.tokens));
        if let Some(model) = &spec.model {
            config.insert("model".into(), json!(model));
        }
        if method == "ngram" {
            // vLLM copies one bound to the other and defaults both to 5; rendering both
            // keeps the command line independent of that rule.
            let (min, max) = match (spec.prompt_lookup_min, spec.prompt_lookup_max) {
                (None, None) => (5, 5),
                (Some(min), None) => (min, min),
                (None, Some(max)) => (max, max),
                (Some(min), Some(max)) => (min, max),
            };
            config.insert("prompt_lookup_max".into(), json!(max));
            config.insert("prompt_lookup_min".into(), json!(min));
        }
        let argv = &mut launch.argv;
        push(argv, "--speculative-config", serde_json::Value::Object(config));
    }
    if let Some(parser) = &serving.reasoning_parser {
        check_name(
            &target,
            "serving.reasoning_parser",
            "reasoning parser",
            parser,
            REASONING_PARSERS_0_33,
            &mut launch.warnings,
        )?;
        push(&mut launch.argv, "--reasoning-parser", parser);
    }
    if let Some(parser) = &serving.tool_call_parser {
        check_name(
            &target,
            "serving.tool_call_parser",
            "tool-call parser",
            parser,
            TOOL_PARSERS_0_33,
            &mut launch.warnings,
        )?;
        push(&mut launch.argv, "--tool-call-parser", parser);
    }
    let argv = &mut launch.argv;
    if serving.auto_tool_choice == Some(true) {
        argv.push(Arg::from("--enable-auto-tool-choice"));
    }
    if serving.trust_remote_code == Some(true) {
        argv.push(Arg::from("--trust-remote-code"));
    }
    if let Some(dtype) = serving.dtype {
        push(argv, "--dtype", dtype.as_str());
    }
    if let Some(var) = &recipe.server.api_key_env {
        // The environment, not `--api-key`, so the key is not visible in `ps`.
        launch
            .env
            .insert("VLLM_API_KEY".into(), Arg::FromEnv(var.clone()));
    }
    if recipe.engine.extra_options.is_some() {
        return Err(target.unsupported(
            "engine.extra_options",
            "vLLM takes its settings as flags",
            Some("put extra flags in `engine.extra_args`"),
        ));
    }
    Ok(launch)
}

fn kv_cache_dtype(target: &Target, dtype: KvCacheDtype) -> Result<&'static str, RenderError> {
    // `vllm/config/cache.py` `CacheDType` by release.
    let since = match dtype {
        KvCacheDtype::Auto | KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => (0, 10, 2),
        KvCacheDtype::Bfloat16 => (0, 11, 0),
        KvCacheDtype::Float16 | KvCacheDtype::Nvfp4 => (0, 22, 0),
    };
    if target.at_least(since.0, since.1, since.2) {
        Ok(dtype.as_str())
    } else {
        let known: &[&str] = if target.at_least(0, 11, 0) {
            &["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]
        } else {
            &["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
        };
        Err(target.unknown("memory.kv_cache_dtype", "KV-cache dtype", dtype.as_str(), known))
    }
}

/// The `method` to render, checked against what the release accepts.
fn speculative_method(
    target: &Target,
    method: &str,
    warnings: &mut Vec<Warning>,
) -> Result<String, RenderError> {
    let key = "serving.speculative.method";
    // Generic methods first: the hint shows the head of this list.
    let known_now: Vec<&str> = ["mtp"]
        .iter()
        .chain(METHODS_ALWAYS)
        .chain(METHODS_0_33)
        .chain(MTP_0_33)
        .copied()
        .collect();
    if !known_now.contains(&method) {
        return Err(target.unknown(key, "speculative method", method, &known_now));
    }
    if METHODS_ALWAYS.contains(&method) {
        return Ok(method.to_owned());
    }
    if !target.at_least(0, 11, 0) {
        return Err(target.unsupported(
            key,
            format!("sous knows speculative method `{method}` from vLLM 0.11.0 on"),
            Some("set `engine.version` to 0.11.0 or later"),
        ));
    }
    if is_mtp(method) && method != "mtp" && target.at_least(0, 33, 0) {
        // 0.33 rewrites every model-specific MTP method to `mtp`, with a deprecation
        // warning (`vllm/config/speculative.py`); render what it would use.
        return Ok("mtp".to_owned());
    }
    if !(target.at_least(0, 33, 0) || method == "mtp" || MTP_0_11.contains(&method)) {
        warnings.push(Warning::new(format!(
            "speculative method `{method}` is known from vLLM 0.33.0; sous has not checked that {} accepts it",
            target.label
        )));
    }
    Ok(method.to_owned())
}

/// Parser names: refused when unknown to the newest release sous checked (where the
/// recipe targets it), a warning for other releases, whose lists differ.
fn check_name(
    target: &Target,
    key: &str,
    what: &str,
    name: &str,
    known: &[&str],
    warnings: &mut Vec<Warning>,
) -> Result<(), RenderError> {
    if known.contains(&name) {
        return Ok(());
    }
    if target.at_least(0, 33, 0) {
        return Err(target.unknown(key, what, name, known));
    }
    warnings.push(Warning::new(format!(
        "`{name}` is not a {what} of vLLM 0.33.0; check that {} has it",
        target.label
    )));
    Ok(())
}

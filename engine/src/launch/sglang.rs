//! SGLang: `python3 -m sglang.launch_server --model-path MODEL --flag value ...`.
//!
//! Flags mirror SGLang 0.5.23 (`python/sglang/srt/arg_groups/`, `fields/*.py`,
//! `server_args.py`; `docs/engines.md`). Its booleans are `store_true`
//! only, so a setting that is on by default (radix cache, chunked prefill) is turned
//! off with its own flag. SGLang's defaults differ from vLLM's (host `127.0.0.1`, port
//! 30000), so host and port are always rendered to keep the recipe's endpoint.

use super::image::ImageDefaults;
use super::{Arg, Launch, RenderError, Target, float, push};
use crate::recipe::{EngineKind, KvCacheDtype, Recipe, Warning, is_mtp};
use crate::version::Version;

/// The release whose flags sous renders.
pub const NEWEST: Version = Version::new(0, 5, 23);

/// The official image, `lmsysorg/sglang` (sgl-project/sglang `docker/Dockerfile`, read at
/// its 0.5.5 version): no `ENTRYPOINT` or `CMD` of its own, so those of its base,
/// `nvidia/cuda:*-cudnn-devel-ubuntu22.04`: NVIDIA's `/opt/nvidia/nvidia_entrypoint.sh`,
/// which prints the CUDA banner and runs its arguments.
pub const IMAGE: ImageDefaults = ImageDefaults {
    repository: "lmsysorg/sglang",
    entrypoint: &["/opt/nvidia/nvidia_entrypoint.sh"],
    cmd: &[],
};

/// `--reasoning-parser` names of 0.5.23 (`parser/reasoning_parser_names.py`).
const REASONING_PARSERS: &[&str] = &[
    "auto",
    "apertus2509",
    "beam",
    "deepseek-r1",
    "deepseek-v3",
    "deepseek-v4",
    "deepseek-v41",
    "dots",
    "glm45",
    "ling3",
    "hunyuan",
    "gpt-oss",
    "k2_horizon",
    "kimi",
    "kimi_k2",
    "kimi_k3",
    "mimo",
    "muse",
    "poolside_v1",
    "qwen3",
    "qwen3-thinking",
    "minimax",
    "minimax-append-think",
    "minimax-m3",
    "nanbeige",
    "step3",
    "step3p5",
    "mistral",
    "nemotron_3",
    "granite_thinking_parser",
    "interns1",
    "gemma4",
    "inkling",
    "iquest_q1",
    "cohere_command4",
    "gigachat35",
    "response_template",
];

/// `--tool-call-parser` names of 0.5.23 (`function_call/parser_names.py`).
const TOOL_PARSERS: &[&str] = &[
    "auto",
    "apertus2509",
    "beam",
    "cohere_command4",
    "deepseekv3",
    "deepseekv31",
    "deepseekv32",
    "deepseekv4",
    "deepseekv41",
    "dots",
    "glm",
    "glm47",
    "gpt-oss",
    "k2_horizon",
    "kimi_k2",
    "kimi_k3",
    "lfm2",
    "ling3",
    "llama3",
    "mimo",
    "minicpm5",
    "mistral",
    "muse",
    "poolside_v1",
    "pythonic",
    "qwen",
    "qwen3_coder",
    "spark25",
    "step3",
    "step3p5",
    "minimax-m2",
    "minimax-m3",
    "nanbeige",
    "trinity",
    "interns1",
    "hermes",
    "hunyuan",
    "gigachat3",
    "gigachat35",
    "gemma4",
    "inkling",
    "iquest_q1",
    "response_template",
];

/// Recipe parser names (vLLM's spelling) that SGLang spells differently.
const RENAMES: &[(&str, &str)] = &[
    ("deepseek_r1", "deepseek-r1"),
    ("deepseek_v3", "deepseek-v3"),
    ("deepseek_v4", "deepseek-v4"),
    ("deepseek_v41", "deepseek-v41"),
    ("openai_gptoss", "gpt-oss"),
    ("minimax_m2_append_think", "minimax-append-think"),
    ("minimax_m3", "minimax-m3"),
    ("nemotron_v3", "nemotron_3"),
    ("qwen3_json", "qwen"),
    ("llama3_json", "llama3"),
    ("glm45", "glm"),
    ("minimax_m2", "minimax-m2"),
    ("openai", "gpt-oss"),
];

pub(super) fn render(recipe: &Recipe) -> Result<Launch, RenderError> {
    let target = Target::new(recipe, NEWEST);
    let mut launch = target.launch(EngineKind::Sglang);
    let python = recipe.engine.executable.as_deref().unwrap_or("python3");
    launch.argv.extend([
        Arg::from(python),
        Arg::from("-m"),
        Arg::from("sglang.launch_server"),
    ]);
    let mut warnings = Vec::new();
    let argv = &mut launch.argv;
    push(argv, "--model-path", recipe.model.engine_arg());
    if recipe.model.served_name != recipe.model.engine_arg() {
        push(argv, "--served-model-name", &recipe.model.served_name);
    }
    push(argv, "--host", &recipe.server.host);
    push(argv, "--port", recipe.server.port);

    let serving = &recipe.serving;
    let memory = &recipe.memory;
    let resolved = super::memory::of(recipe, &target)?;
    if let Some(len) = serving.max_model_len {
        push(argv, "--context-length", len);
    }
    if let Some(u) = resolved.gpu_utilization {
        push(argv, "--mem-fraction-static", float(u));
        warnings.push(Warning::new(
            "SGLang's `--mem-fraction-static` counts weights and the KV pool only, not activations or CUDA graphs (vLLM's utilization counts everything): the same number leaves SGLang less headroom",
        ));
    }
    if let Some(dtype) = memory.kv_cache_dtype {
        // `fields/model.py`: no plain `fp8`, no `float16`.
        let name = match dtype {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            KvCacheDtype::Fp8E5m2 => "fp8_e5m2",
            KvCacheDtype::Bfloat16 => "bfloat16",
            KvCacheDtype::Nvfp4 => "nvfp4",
            KvCacheDtype::Float16 => {
                return Err(target.unknown(
                    "memory.kv_cache_dtype",
                    "KV-cache dtype",
                    "float16",
                    &["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "nvfp4"],
                ));
            }
        };
        push(argv, "--kv-cache-dtype", name);
    }
    warnings.extend(super::native_only_embeddings(recipe, &target.label));
    if let Some(bytes) = memory.kv_offload_bytes {
        // `--hicache-size` is in GB (10^9 bytes) and an int (`fields/memory.py`).
        let gb = bytes / 1_000_000_000;
        if gb == 0 {
            return Err(target.unsupported(
                "memory.kv_offload_bytes",
                "SGLang's `--hicache-size` counts whole GB (10^9 bytes)",
                Some("use at least `1GB`"),
            ));
        }
        if bytes % 1_000_000_000 != 0 {
            warnings.push(Warning::new(format!(
                "SGLang's `--hicache-size` counts whole GB: {bytes} bytes is rendered as {gb} GB"
            )));
        }
        argv.push(Arg::from("--enable-hierarchical-cache"));
        push(argv, "--hicache-size", gb);
    }
    if serving.prefix_caching == Some(false) {
        argv.push(Arg::from("--disable-radix-cache"));
    }
    match (serving.chunked_prefill, serving.max_batched_tokens) {
        (Some(false), Some(n)) => {
            push(argv, "--chunked-prefill-size", -1);
            push(argv, "--max-prefill-tokens", n);
        }
        (Some(false), None) => push(argv, "--chunked-prefill-size", -1),
        (_, Some(n)) => push(argv, "--chunked-prefill-size", n),
        (_, None) => {}
    }
    if let Some(n) = serving.max_num_seqs {
        push(argv, "--max-running-requests", n);
    }
    if let Some(n) = serving.tensor_parallel {
        push(argv, "--tp-size", n);
    }
    if let Some(n) = serving.pipeline_parallel {
        push(argv, "--pp-size", n);
    }
    if let Some(n) = serving.data_parallel {
        push(argv, "--dp-size", n);
    }
    if serving.expert_parallel == Some(true) {
        // Experts spread over the tensor-parallel group, as vLLM's flag does.
        push(argv, "--ep-size", serving.tensor_parallel.unwrap_or(1));
    }
    if let Some(spec) = &serving.speculative {
        let method = spec.method.as_deref().unwrap_or_default();
        let k = spec.tokens.unwrap_or(1);
        let key = "serving.speculative.method";
        let algorithm = match method {
            m if is_mtp(m) => "NEXTN",
            "eagle" => "EAGLE",
            "eagle3" => "EAGLE3",
            "draft_model" => "STANDALONE",
            "ngram" => "NGRAM",
            other => {
                return Err(target.unknown(
                    key,
                    "speculative method",
                    other,
                    &["mtp", "eagle", "eagle3", "draft_model", "ngram"],
                ));
            }
        };
        push(argv, "--speculative-algorithm", algorithm);
        if let Some(model) = &spec.model {
            push(argv, "--speculative-draft-model-path", model);
        }
        if algorithm == "NGRAM" {
            if spec.prompt_lookup_min.is_some() || spec.prompt_lookup_max.is_some() {
                return Err(target.unsupported(
                    "serving.speculative.prompt_lookup_min",
                    "sous does not map prompt-lookup sizes to SGLang's `--speculative-ngram-*` flags",
                    Some("remove them, or pass SGLang's flags in `engine.extra_args`"),
                ));
            }
            push(argv, "--speculative-num-draft-tokens", k);
        } else {
            // All three or none: passing only some trips an assert in
            // `arg_groups/speculative_hook.py`. A chain (top-k 1) of k steps verifies
            // k + 1 tokens.
            push(argv, "--speculative-num-steps", k);
            push(argv, "--speculative-eagle-topk", 1);
            push(argv, "--speculative-num-draft-tokens", k + 1);
        }
    }
    if let Some(parser) = &serving.reasoning_parser {
        let name = translate(
            &target,
            "serving.reasoning_parser",
            "reasoning parser",
            parser,
            REASONING_PARSERS,
            &mut warnings,
        )?;
        push(argv, "--reasoning-parser", name);
    }
    if let Some(parser) = &serving.tool_call_parser {
        let name = translate(
            &target,
            "serving.tool_call_parser",
            "tool-call parser",
            parser,
            TOOL_PARSERS,
            &mut warnings,
        )?;
        push(argv, "--tool-call-parser", name);
    }
    // `auto_tool_choice`: SGLang has no switch; `tool_choice: "auto"` works whenever a
    // tool-call parser is set.
    if serving.trust_remote_code == Some(true) {
        argv.push(Arg::from("--trust-remote-code"));
    }
    if let Some(dtype) = serving.dtype {
        push(argv, "--dtype", dtype.as_str());
    }
    if let Some(var) = &recipe.server.api_key_env {
        argv.push(Arg::from("--api-key"));
        argv.push(Arg::FromEnv(var.clone()));
    }
    // `sous bench` and dashboards read `/metrics`, which SGLang serves only on request.
    argv.push(Arg::from("--enable-metrics"));
    if recipe.engine.extra_options.is_some() {
        return Err(target.unsupported(
            "engine.extra_options",
            "SGLang takes its settings as flags",
            Some("put extra flags in `engine.extra_args`"),
        ));
    }
    launch.warnings = warnings;
    Ok(launch)
}

/// A recipe parser name in SGLang's spelling, checked against 0.5.23's list.
fn translate<'a>(
    target: &Target,
    key: &str,
    what: &str,
    name: &'a str,
    known: &[&str],
    warnings: &mut Vec<Warning>,
) -> Result<&'a str, RenderError> {
    let translated = RENAMES
        .iter()
        .find(|(ours, _)| *ours == name)
        .map_or(name, |(_, theirs)| theirs);
    if known.contains(&translated) {
        return Ok(translated);
    }
    if target.at_least(0, 5, 23) {
        return Err(target.unknown(key, what, name, known));
    }
    warnings.push(Warning::new(format!(
        "`{name}` is not a {what} of SGLang 0.5.23; check that {} has it",
        target.label
    )));
    Ok(translated)
}

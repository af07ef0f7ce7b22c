//! What an engine sizes its memory from, resolved once: the recipe's `[memory]` fields,
//! the variables of `[env]` the engine reads for its KV cache, and the engine's own
//! flags where they can reach past the recipe (`engine.extra_args`,
//! `engine.extra_options`). The adapters render these settings and `sous plan` counts
//! them, so the two cannot disagree.
//!
//! A flag or option in `engine.extra_args` / `engine.extra_options` that sets what a
//! recipe field sets is refused, naming the field: the engine would take the later value
//! and the plan the field's. What the engines read from the environment, by release:
//!
//! - vLLM: `VLLM_CPU_KVCACHE_SPACE`, whole GiB (`vllm/envs.py` parses it with `int()`),
//!   read by the CPU backend only (`vllm/platforms/cpu.py`). Up to 0.19 it is the CPU
//!   backend's only KV budget (4 GiB when unset up to 0.12, half of the NUMA node's RAM
//!   from 0.13); from 0.20 it overrides `--kv-cache-memory-bytes`, and unset, the cache
//!   gets `--gpu-memory-utilization` of the node's RAM less what the process holds
//!   (`vllm/v1/worker/cpu_worker.py`). Read in v0.10.2, v0.13.0, v0.20.0 and v0.32.0.
//!   vLLM reads no variable that sizes its GPU cache.
//! - SGLang 0.5.23 (`sglang/srt/environ.py`): no variable replaces
//!   `--mem-fraction-static` or `--max-total-tokens`; those that change its pool
//!   (`SGLANG_VLM_CACHE_SIZE_MB`, `SGLANG_MM_FEATURE_CACHE_MB`) reserve memory for
//!   multimodal models, which `sous plan` does not size for SGLang.
//! - TensorRT-LLM 1.3 (`tensorrt_llm/envs.py`): none replaces `kv_cache_config`; its
//!   `TRTLLM_WINDOW_SIZE_SHARES` splits the pool between sliding windows, which the plan
//!   does not model for TensorRT-LLM.

use super::{RenderError, Target};
use crate::recipe::{ByteSize, EngineKind, Recipe};
use crate::version::Version;

/// The `[env]` variable vLLM's CPU backend reads its KV budget from, in GiB.
pub const VLLM_CPU_KV_SPACE: &str = "VLLM_CPU_KVCACHE_SPACE";

const GIB: u64 = 1 << 30;

/// An engine's memory settings, as it will read them.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMemory {
    /// The release the settings are read for (the recipe's, or the newest sous knows).
    pub version: Version,
    /// `memory.gpu_utilization`: vLLM's `--gpu-memory-utilization` (a fraction of RAM
    /// on its CPU backend), SGLang's `--mem-fraction-static`, TensorRT-LLM's
    /// `free_gpu_memory_fraction`.
    pub gpu_utilization: Option<f64>,
    /// `memory.kv_cache_bytes`: vLLM's `--kv-cache-memory-bytes`, TensorRT-LLM's
    /// `max_gpu_total_bytes`.
    pub kv_cache_bytes: Option<u64>,
    /// vLLM's `VLLM_CPU_KVCACHE_SPACE` from `[env]`, in bytes.
    pub cpu_kv_space: Option<u64>,
    /// A cap on the pool in tokens the engine takes besides the recipe: SGLang's
    /// `--max-total-tokens` or TensorRT-LLM's `kv_cache_config.max_tokens`, from
    /// `engine.extra_args` / `engine.extra_options` (no recipe field says it).
    pub max_tokens: Option<u64>,
}

impl EngineMemory {
    /// vLLM's `--gpu-memory-utilization` when the recipe sets none: 0.9 up to 0.19,
    /// 0.92 from 0.20 (`vllm/config/cache.py`, read in v0.13.0 and v0.20.0).
    pub fn vllm_default_utilization(&self) -> f64 {
        if self.version.at_least(0, 20, 0) {
            0.92
        } else {
            0.9
        }
    }
}

/// Flags of vLLM's command line that recipe fields render (`vllm/engine/arg_utils.py`).
/// argparse also takes an unambiguous prefix of a flag (the Titan report's
/// `--kv-cache-memory`), so a prefix of one of these counts as the flag.
const VLLM_FIELDS: &[(&str, &str)] = &[
    ("--gpu-memory-utilization", "memory.gpu_utilization"),
    ("--kv-cache-memory-bytes", "memory.kv_cache_bytes"),
    ("--kv-cache-dtype", "memory.kv_cache_dtype"),
    ("--kv-offloading-size", "memory.kv_offload_bytes"),
    ("--max-model-len", "serving.max_model_len"),
    ("--max-num-seqs", "serving.max_num_seqs"),
    ("--max-num-batched-tokens", "serving.max_batched_tokens"),
    ("--tensor-parallel-size", "serving.tensor_parallel"),
    ("-tp", "serving.tensor_parallel"),
    ("--pipeline-parallel-size", "serving.pipeline_parallel"),
    ("-pp", "serving.pipeline_parallel"),
    ("--dtype", "serving.dtype"),
];

/// SGLang's (`python/sglang/srt/server_args.py`, argparse with prefixes too).
const SGLANG_FIELDS: &[(&str, &str)] = &[
    ("--mem-fraction-static", "memory.gpu_utilization"),
    ("--kv-cache-dtype", "memory.kv_cache_dtype"),
    ("--hicache-size", "memory.kv_offload_bytes"),
    ("--context-length", "serving.max_model_len"),
    ("--max-running-requests", "serving.max_num_seqs"),
    ("--tp-size", "serving.tensor_parallel"),
    ("--tp", "serving.tensor_parallel"),
    ("--pp-size", "serving.pipeline_parallel"),
    ("--dtype", "serving.dtype"),
];

/// trtllm-serve's (click: whole names only; `tensorrt_llm/commands/serve.py`).
const TRTLLM_FIELDS: &[(&str, &str)] = &[
    ("--max_seq_len", "serving.max_model_len"),
    ("--max_batch_size", "serving.max_num_seqs"),
    ("--max_num_tokens", "serving.max_batched_tokens"),
    ("--tp_size", "serving.tensor_parallel"),
    ("--pp_size", "serving.pipeline_parallel"),
    ("--kv_cache_free_gpu_memory_fraction", "memory.gpu_utilization"),
];

/// TensorRT-LLM `LlmArgs` options of the YAML file that recipe fields render
/// (`tensorrt_llm/llmapi/llm_args.py`), as paths into `engine.extra_options`.
const TRTLLM_OPTIONS: &[(&[&str], &str)] = &[
    (
        &["kv_cache_config", "free_gpu_memory_fraction"],
        "memory.gpu_utilization",
    ),
    (
        &["kv_cache_config", "max_gpu_total_bytes"],
        "memory.kv_cache_bytes",
    ),
    (&["kv_cache_config", "dtype"], "memory.kv_cache_dtype"),
    (&["kv_cache_config", "host_cache_size"], "memory.kv_offload_bytes"),
    (&["max_seq_len"], "serving.max_model_len"),
    (&["max_batch_size"], "serving.max_num_seqs"),
    (&["max_num_tokens"], "serving.max_batched_tokens"),
    (&["tensor_parallel_size"], "serving.tensor_parallel"),
    (&["pipeline_parallel_size"], "serving.pipeline_parallel"),
    (&["dtype"], "serving.dtype"),
];

/// The memory settings of `recipe` for its engine (`None` for the native engine, which
/// reads the recipe itself), or why the engine would not read them as the recipe means.
pub fn resolve(recipe: &Recipe) -> Result<Option<EngineMemory>, RenderError> {
    let Some(newest) = super::newest(recipe.engine.kind) else {
        return Ok(None);
    };
    of(recipe, &Target::new(recipe, newest)).map(Some)
}

/// [`resolve`] for an adapter that knows its release.
pub(super) fn of(recipe: &Recipe, target: &Target) -> Result<EngineMemory, RenderError> {
    let (fields, prefixes): (&[(&str, &str)], bool) = match recipe.engine.kind {
        EngineKind::Native => (&[], false),
        EngineKind::Vllm => (VLLM_FIELDS, true),
        EngineKind::Sglang => (SGLANG_FIELDS, true),
        EngineKind::Trtllm => (TRTLLM_FIELDS, false),
    };
    check_extra_args(target, &recipe.engine.extra_args, fields, prefixes)?;
    let mut memory = EngineMemory {
        version: target.version.clone(),
        gpu_utilization: recipe.memory.gpu_utilization,
        kv_cache_bytes: recipe.memory.kv_cache_bytes,
        cpu_kv_space: None,
        max_tokens: None,
    };
    match recipe.engine.kind {
        EngineKind::Vllm => memory.cpu_kv_space = vllm_cpu_kv_space(target, recipe)?,
        EngineKind::Sglang => {
            if recipe.memory.kv_cache_bytes.is_some() {
                return Err(target.unsupported(
                    "memory.kv_cache_bytes",
                    "SGLang sizes its KV pool in tokens (`--max-total-tokens`), not bytes",
                    Some("size the cache with `memory.gpu_utilization`, or pass `--max-total-tokens N` in `engine.extra_args`"),
                ));
            }
            memory.max_tokens = flag_value(&recipe.engine.extra_args, "--max-total-tokens")
                .map(|v| tokens(target, "--max-total-tokens", v))
                .transpose()?;
        }
        EngineKind::Trtllm => {
            if let Some(options) = &recipe.engine.extra_options {
                for (path, field) in TRTLLM_OPTIONS {
                    if lookup(options, path).is_some() {
                        return Err(target.unsupported(
                            "engine.extra_options",
                            format!("`{}` is what `{field}` sets", path.join(".")),
                            Some(&format!(
                                "set `{field}` in the recipe and remove it from `engine.extra_options`"
                            )),
                        ));
                    }
                }
                memory.max_tokens = match lookup(options, &["kv_cache_config", "max_tokens"]) {
                    None | Some(serde_json::Value::Null) => None,
                    Some(v) => Some(v.as_u64().ok_or_else(|| {
                        target.unsupported(
                            "engine.extra_options",
                            format!("`kv_cache_config.max_tokens` is {v}, not a number of tokens"),
                            None,
                        )
                    })?),
                };
            }
        }
        EngineKind::Native => {}
    }
    Ok(memory)
}

/// `VLLM_CPU_KVCACHE_SPACE` of `[env]`, as vLLM parses it, checked against
/// `memory.kv_cache_bytes`.
fn vllm_cpu_kv_space(target: &Target, recipe: &Recipe) -> Result<Option<u64>, RenderError> {
    let Some(raw) = recipe.env.get(VLLM_CPU_KV_SPACE) else {
        return Ok(None);
    };
    let key = format!("env.{VLLM_CPU_KV_SPACE}");
    let hint = "give the KV budget as `memory.kv_cache_bytes` (e.g. \"2GiB\"), which sous renders and `sous plan` counts";
    let text = raw.trim();
    // Python's int(): an optional sign, digits, underscores between digits.
    let digits = text.strip_prefix('+').unwrap_or(text);
    let gib: Option<u64> = (!digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_'))
    .then(|| digits.replace('_', "").parse().ok())
    .flatten();
    let bytes = match gib {
        Some(0) => {
            return Err(target.unsupported(
                &key,
                "0 GiB holds no token: vLLM's CPU backend then has no KV cache".to_owned(),
                Some(hint),
            ));
        }
        Some(n) => n.checked_mul(GIB).ok_or_else(|| {
            target.unsupported(&key, format!("`{raw}` GiB is beyond any machine"), Some(hint))
        })?,
        None => {
            return Err(target.unsupported(
                &key,
                format!(
                    "`{raw}` is not a whole number of GiB: vLLM reads it with Python's int() and fails to start (vllm/envs.py)"
                ),
                Some(hint),
            ));
        }
    };
    if let Some(fixed) = recipe.memory.kv_cache_bytes
        && fixed != bytes
    {
        return Err(target.unsupported(
            &key,
            format!(
                "it gives the CPU backend {} of KV cache, `memory.kv_cache_bytes` {}; vLLM's CPU backend takes the variable (vllm/platforms/cpu.py)",
                ByteSize(bytes),
                ByteSize(fixed)
            ),
            Some("keep one of the two: `memory.kv_cache_bytes` is rendered for every backend"),
        ));
    }
    Ok(Some(bytes))
}

/// Refuses an extra argument that sets what a recipe field sets.
fn check_extra_args(
    target: &Target,
    extra: &[String],
    fields: &[(&str, &str)],
    prefixes: bool,
) -> Result<(), RenderError> {
    for arg in extra {
        let name = arg.split_once('=').map_or(arg.as_str(), |(name, _)| name);
        if !name.starts_with('-') || name.len() < 3 {
            continue;
        }
        let hit = fields.iter().find(|(flag, _)| {
            *flag == name || (prefixes && name.starts_with("--") && name.len() > 4 && flag.starts_with(name))
        });
        if let Some((flag, field)) = hit {
            return Err(target.unsupported(
                "engine.extra_args",
                format!("`{name}` sets what `{field}` sets (`{flag}`): the engine would take the later value and `sous plan` the field's"),
                Some(&format!("set `{field}` in the recipe and remove `{name}` from `engine.extra_args`")),
            ));
        }
    }
    Ok(())
}

/// The value of `flag` in an argument list (`--flag value` or `--flag=value`).
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == flag {
            return iter.next().map(String::as_str);
        }
        if let Some(value) = arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')) {
            return Some(value);
        }
    }
    None
}

fn tokens(target: &Target, flag: &str, value: &str) -> Result<u64, RenderError> {
    value.parse().map_err(|_| {
        target.unsupported(
            "engine.extra_args",
            format!("`{flag} {value}`: not a number of tokens"),
            None,
        )
    })
}

fn lookup<'a>(
    options: &'a serde_json::Map<String, serde_json::Value>,
    path: &[&str],
) -> Option<&'a serde_json::Value> {
    let (first, rest) = path.split_first()?;
    let value = options.get(*first)?;
    if rest.is_empty() {
        return Some(value);
    }
    lookup(value.as_object()?, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            version: Version::new(0, 32, 0),
            assumed: false,
            label: "vLLM 0.32.0".into(),
        }
    }

    #[test]
    fn extra_flags_that_shadow_a_field_are_found_by_prefix_too() {
        let check = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            check_extra_args(&target(), &args, VLLM_FIELDS, true).map_err(|e| e.to_string())
        };
        assert!(check(&["--enable-prefix-caching", "--block-size", "32"]).is_ok());
        for args in [
            &["--gpu-memory-utilization", "0.5"][..],
            &["--kv-cache-memory=15569256448"][..],
            &["--kv-cache-memory", "1"][..],
            &["-tp", "2"][..],
            &["--max-model", "4096"][..],
        ] {
            let err = check(args).expect_err("refused");
            assert!(err.contains("engine.extra_args"), "{err}");
        }
        assert_eq!(
            flag_value(
                &["--a".into(), "--max-total-tokens".into(), "9".into()],
                "--max-total-tokens"
            ),
            Some("9")
        );
        assert_eq!(
            flag_value(&["--max-total-tokens=7".into()], "--max-total-tokens"),
            Some("7")
        );
    }
}

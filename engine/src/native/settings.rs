//! The native engine's settings, resolved once from a recipe: [`Settings`] (what
//! [`Engine::load`](super::Engine::load) takes), its KV part [`KvSettings`] (which
//! `sous plan` sizes the cache from, by the engine's own rule), and the recipe keys the
//! engine refuses rather than ignores ([`unhonoured`]), with the defaults of what a
//! recipe leaves out. Loading the model and sizing the cache are in the parent module.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::NativeError;
use super::model::{Embeddings, KvDtype};
use super::speculative;
use super::weights::Precision;
use crate::recipe::{EmbeddingDtype, KvCacheDtype, ModelDtype, Recipe};

/// Default `serving.max_num_seqs` of the native engine.
pub const DEFAULT_MAX_NUM_SEQS: usize = 64;
/// Default `serving.max_batched_tokens`: one step of this many tokens takes well under a
/// second on two cores for small models, so decoding streams keep flowing while a long
/// prompt is prefilled in chunks.
pub const DEFAULT_MAX_BATCHED_TOKENS: usize = 512;
/// Default KV budget when the recipe sets neither `memory.kv_cache_bytes` nor
/// `memory.gpu_utilization`: vLLM's CPU backend reserves 4 GiB
/// (`VLLM_CPU_KVCACHE_SPACE`); sous takes the smaller of that and a quarter of RAM.
pub const DEFAULT_KV_BYTES: u64 = 4 << 30;

/// How the native engine holds `recipe`'s KV cache: bf16 for `memory.kv_cache_dtype =
/// "bfloat16"`; for `auto` (or none) the dtype the model is served in, as vLLM's `auto`
/// is the model's dtype: bf16 with `serving.dtype = "bfloat16"`, else f32 ([`unhonoured`]
/// refuses the dtypes it has no kernels for).
pub fn kv_dtype(recipe: &Recipe) -> KvDtype {
    match (recipe.memory.kv_cache_dtype, recipe.serving.dtype) {
        (Some(KvCacheDtype::Bfloat16), _) => KvDtype::Bf16,
        (None | Some(KvCacheDtype::Auto), Some(ModelDtype::Bfloat16)) => KvDtype::Bf16,
        _ => KvDtype::F32,
    }
}

/// The engine's settings, resolved from a recipe.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The model directory.
    pub model_dir: PathBuf,
    /// Name clients use.
    pub served_name: String,
    /// The precision float weights are held in (products accumulate in f32).
    pub precision: Precision,
    /// How the token embedding and a float lm_head are held.
    pub embeddings: Embeddings,
    /// How the KV cache holds keys and values.
    pub kv_dtype: KvDtype,
    /// Longest prompt + output; `None`: the model's.
    pub max_model_len: Option<usize>,
    /// Most sequences at once.
    pub max_num_seqs: usize,
    /// Most tokens per step.
    pub max_batched_tokens: usize,
    /// Prefix caching.
    pub prefix_caching: bool,
    /// Chunked prefill.
    pub chunked_prefill: bool,
    /// Speculative decoding by prompt lookup, if the recipe asks for it.
    pub speculative: Option<speculative::Ngram>,
    /// Speculative decoding with the checkpoint's MTP head: tokens drafted per step.
    pub mtp: Option<usize>,
    /// Fixed KV budget in bytes.
    pub kv_cache_bytes: Option<u64>,
    /// Fraction of host RAM for weights and KV cache together.
    pub memory_fraction: Option<f64>,
    /// Listen address.
    pub host: String,
    /// Listen port (0: any).
    pub port: u16,
    /// API key clients must send, if any.
    pub api_key: Option<String>,
    /// How long in-flight requests may run after a stop signal.
    pub stop_grace: Duration,
    /// How often the stats line is logged (`VLLM_LOG_STATS_INTERVAL`, as vLLM).
    pub log_interval: Duration,
    /// The user's choices for the products' kernels (`SOUS_KERNELS_ISA`, `SOUS_BF16_DOT`,
    /// ...: [`super::kernel_choices`]); the load measures what they leave open.
    pub kernels: sous_kernels::gemm::Choices,
}

impl Settings {
    /// The settings of `recipe`, serving the model in `model_dir`: refused with the
    /// first key the engine cannot honour ([`unhonoured`]), a dtype it has no kernels
    /// for, an API key variable that is not set, or a stats interval that is not a
    /// number.
    pub fn from_recipe(recipe: &Recipe, model_dir: &Path) -> Result<Settings, NativeError> {
        if let Some(u) = unhonoured(recipe) {
            return Err(NativeError::Settings {
                message: format!("the native engine cannot honour `{}`: {}", u.key, u.message),
                hint: u.hint,
            });
        }
        let s = &recipe.serving;
        // `auto`/`float32`: f32 arithmetic on the checkpoint's own weights (a bf16
        // checkpoint stays bf16: widening is exact, so the numbers are the same and half
        // the bytes are read). `bfloat16`: bf16 weights and bf16 inputs to the products,
        // accumulated in f32.
        let precision = match s.dtype {
            None | Some(ModelDtype::Auto) | Some(ModelDtype::Float32) => Precision::Stored,
            Some(ModelDtype::Bfloat16) => Precision::Bf16,
            Some(ModelDtype::Float16) => {
                return Err(NativeError::Settings {
                    message: "`serving.dtype = \"float16\"`: the native engine computes in f32 or bf16"
                        .into(),
                    hint: "use \"bfloat16\" (bf16 weights) or \"float32\" / \"auto\" (the checkpoint's own)"
                        .into(),
                });
            }
        };
        let api_key = match &recipe.server.api_key_env {
            Some(var) => Some(crate::env::named(var).ok_or_else(|| NativeError::Settings {
                message: format!("`server.api_key_env` names `{var}`, which is not set"),
                hint: format!("export {var}=... before `sous serve`, or remove `server.api_key_env`"),
            })?),
            None => None,
        };
        let kv = KvSettings::from_recipe(recipe);
        let method = s
            .speculative
            .as_ref()
            .map(speculative::Method::from_section)
            .transpose()?;
        Ok(Settings {
            model_dir: model_dir.to_owned(),
            served_name: recipe.model.served_name.clone(),
            precision,
            embeddings: match recipe.memory.embedding_dtype {
                None | Some(EmbeddingDtype::Auto) => Embeddings::Stored,
                Some(EmbeddingDtype::Q8_0) => Embeddings::Q8_0,
            },
            kv_dtype: kv.dtype,
            max_model_len: s.max_model_len.map(|v| v as usize),
            max_num_seqs: s.max_num_seqs.map_or(DEFAULT_MAX_NUM_SEQS, |v| v as usize),
            max_batched_tokens: s
                .max_batched_tokens
                .map_or(DEFAULT_MAX_BATCHED_TOKENS, |v| v as usize),
            prefix_caching: s.prefix_caching.unwrap_or(false),
            chunked_prefill: s.chunked_prefill.unwrap_or(true),
            speculative: match method {
                Some(speculative::Method::Ngram(ngram)) => Some(ngram),
                _ => None,
            },
            mtp: match method {
                Some(speculative::Method::Mtp { tokens }) => Some(tokens),
                _ => None,
            },
            kv_cache_bytes: kv.bytes,
            memory_fraction: kv.memory_fraction,
            host: recipe.server.host.clone(),
            port: recipe.server.port,
            api_key,
            stop_grace: recipe.server.stop_grace,
            log_interval: log_interval(crate::env::VLLM_LOG_STATS_INTERVAL.get().as_deref())?,
            kernels: super::kernel_choices(),
        })
    }

    /// The KV cache's part of these settings, for sizing it.
    pub fn kv(&self) -> KvSettings {
        KvSettings {
            dtype: self.kv_dtype,
            bytes: self.kv_cache_bytes,
            memory_fraction: self.memory_fraction,
            max_num_seqs: self.max_num_seqs.max(1),
        }
    }
}

/// How the native engine holds its KV cache and how much memory the cache gets, as a
/// recipe sets them: the part of [`Settings`] that both the engine's start-up and
/// `sous plan` size the cache from, so that the two read one value by one rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvSettings {
    /// How keys and values are held ([`kv_dtype`]).
    pub dtype: KvDtype,
    /// Fixed budget in bytes (`memory.kv_cache_bytes`).
    pub bytes: Option<u64>,
    /// Fraction of host RAM for weights and KV cache together (`memory.gpu_utilization`).
    pub memory_fraction: Option<f64>,
    /// Sequences running at once (`serving.max_num_seqs`): a hybrid model's cache holds
    /// a linear-attention state for each.
    pub max_num_seqs: usize,
}

impl KvSettings {
    /// The KV settings of `recipe`. Unlike [`Settings::from_recipe`] this refuses
    /// nothing: `sous plan` sizes the cache of a recipe the engine would refuse too.
    pub fn from_recipe(recipe: &Recipe) -> KvSettings {
        KvSettings {
            dtype: kv_dtype(recipe),
            bytes: recipe.memory.kv_cache_bytes,
            memory_fraction: recipe.memory.gpu_utilization,
            max_num_seqs: recipe
                .serving
                .max_num_seqs
                .map_or(DEFAULT_MAX_NUM_SEQS, |v| v as usize)
                .max(1),
        }
    }

    /// The part of the KV budget `budget` left for keys and values once every running
    /// sequence's linear-attention state (`state_per_sequence` bytes; 0 for a model
    /// without linear attention) is set aside, or an error naming both.
    pub fn after_states(&self, budget: u64, state_per_sequence: u64) -> Result<u64, NativeError> {
        let states = state_per_sequence * self.max_num_seqs as u64;
        budget.checked_sub(states).ok_or_else(|| NativeError::Settings {
            message: format!(
                "the linear-attention states of {} sequences take {:.3} GiB, more than the {:.3} GiB KV budget",
                self.max_num_seqs,
                states as f64 / (1u64 << 30) as f64,
                budget as f64 / (1u64 << 30) as f64
            ),
            hint: "lower `serving.max_num_seqs` or raise `memory.kv_cache_bytes`".into(),
        })
    }

    /// The KV budget in bytes: `memory.kv_cache_bytes`; else `memory.gpu_utilization` of
    /// host RAM less the `weights`; else the smaller of [`DEFAULT_KV_BYTES`] and a
    /// quarter of RAM. `host` is the RAM (`/proc/meminfo`).
    pub fn budget(&self, weights: u64, host: Option<u64>) -> Result<u64, NativeError> {
        Ok(match (self.bytes, self.memory_fraction) {
            (Some(bytes), _) => bytes,
            (None, Some(fraction)) => {
                let total = host.ok_or_else(|| NativeError::Settings {
                    message: "`memory.gpu_utilization` is a fraction of host RAM for the native engine, \
                              and /proc/meminfo cannot be read"
                        .into(),
                    hint: "set `memory.kv_cache_bytes` instead".into(),
                })?;
                ((total as f64 * fraction) as u64).saturating_sub(weights)
            }
            (None, None) => DEFAULT_KV_BYTES.min(host.map_or(DEFAULT_KV_BYTES, |m| m / 4)),
        })
    }
}

/// The stats line's interval from vLLM's own variable, read as vLLM 0.33's `envs.py`
/// reads `VLLM_LOG_STATS_INTERVAL`: seconds as a float, 10 when unset or not above 0.
fn log_interval(value: Option<&str>) -> Result<Duration, NativeError> {
    let Some(text) = value else {
        return Ok(Duration::from_secs(10));
    };
    let secs: f64 = text.trim().parse().map_err(|_| NativeError::Settings {
        message: format!("VLLM_LOG_STATS_INTERVAL is `{text}`, not a number of seconds"),
        hint: "set it to the seconds between the engine's stats lines (10 by default), or unset it".into(),
    })?;
    Ok(if secs > 0.0 && secs.is_finite() {
        Duration::from_secs_f64(secs)
    } else {
        Duration::from_secs(10)
    })
}

/// A recipe setting the native engine does not honour: the key, why, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    /// The recipe key, e.g. `memory.kv_cache_dtype`.
    pub key: &'static str,
    /// Why the engine cannot honour it.
    pub message: String,
    /// What to do instead.
    pub hint: String,
}

/// The first setting of `recipe` the native engine would otherwise ignore. Each is
/// refused rather than dropped: a recipe that asks for an fp8 KV cache or a tool-call
/// parser and silently gets neither would be measured, tuned and deployed as if it had.
pub fn unhonoured(recipe: &Recipe) -> Option<Unhonoured> {
    let refuse = |key: &'static str, message: &str, hint: &str| {
        Some(Unhonoured {
            key,
            message: message.into(),
            hint: hint.into(),
        })
    };
    let (m, s) = (&recipe.memory, &recipe.serving);
    if let Some(dtype) = m
        .kv_cache_dtype
        .filter(|d| !matches!(d, KvCacheDtype::Auto | KvCacheDtype::Bfloat16))
    {
        return refuse(
            "memory.kv_cache_dtype",
            &format!(
                "the native engine holds its KV cache in f32 (`auto`) or bf16 (`bfloat16`), not {}",
                dtype.as_str()
            ),
            "set `memory.kv_cache_dtype` to \"bfloat16\" for half the bytes per token, or remove it for f32",
        );
    }
    if m.kv_offload_bytes.is_some() {
        return refuse(
            "memory.kv_offload_bytes",
            "the native engine's KV cache is in host memory already; there is no tier to offload it to",
            "remove `memory.kv_offload_bytes`, and give `memory.kv_cache_bytes` the memory instead",
        );
    }
    let parallel = [
        ("serving.tensor_parallel", s.tensor_parallel),
        ("serving.pipeline_parallel", s.pipeline_parallel),
        ("serving.data_parallel", s.data_parallel),
    ];
    if let Some((key, _)) = parallel.into_iter().find(|(_, n)| n.is_some_and(|n| n > 1)) {
        return refuse(
            key,
            "the native engine is one process on the CPU; it spreads each product over the cores itself",
            &format!("remove `{key}`; `RAYON_NUM_THREADS` in `[env]` sets how many cores it uses"),
        );
    }
    if s.expert_parallel == Some(true) {
        return refuse(
            "serving.expert_parallel",
            "the native engine is one process on the CPU: it holds all the experts itself, with no devices to spread them over",
            "remove `serving.expert_parallel`",
        );
    }
    let parsers = [
        ("serving.reasoning_parser", s.reasoning_parser.is_some()),
        // `serving.auto_tool_choice` needs a tool-call parser (the recipe checks), so
        // refusing the parser refuses it too.
        ("serving.tool_call_parser", s.tool_call_parser.is_some()),
    ];
    if let Some((key, _)) = parsers.into_iter().find(|(_, set)| *set) {
        return refuse(
            key,
            "the native engine returns the model's text as it is: it parses no tool calls or reasoning",
            &format!("remove `{key}`, or serve the model with vLLM or SGLang, which parse them"),
        );
    }
    if s.trust_remote_code == Some(true) {
        return refuse(
            "serving.trust_remote_code",
            "the native engine runs no code from the model's repository; it implements the architectures it serves",
            "remove `serving.trust_remote_code`",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_interval_is_read_as_vllm_reads_it() {
        let secs = |v: Option<&str>| log_interval(v).map(|d| d.as_secs_f64()).ok();
        assert_eq!(secs(None), Some(10.0));
        assert_eq!(secs(Some("1")), Some(1.0));
        assert_eq!(secs(Some(" 0.5 ")), Some(0.5));
        // vLLM falls back to 10 for 0 and below.
        assert_eq!(secs(Some("0")), Some(10.0));
        assert_eq!(secs(Some("-3")), Some(10.0));
        let err = log_interval(Some("fast")).expect_err("not a number");
        assert!(err.to_string().contains("`fast`"), "{err}");
    }
}

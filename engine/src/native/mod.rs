//! The built-in `native` engine: a Llama-family decoder on the CPU, served
//! in-process with an OpenAI-compatible API and vLLM's metrics.
//!
//! - [`config`], [`weights`], [`model`]: reading a Hugging Face model directory
//!   (unquantized or NVFP4 as `sous quantize` writes it) and the forward pass;
//! - [`blocks`], [`core`], [`sampling`]: the paged KV cache, the scheduler with
//!   iteration-level batching, chunked prefill and prefix caching, and sampling;
//! - [`text`]: tokenizer, chat template, detokenization, stop strings;
//! - [`http`], [`metrics`]: the HTTP API and the Prometheus metrics.
//!
//! [`Engine::load`] builds everything from a resolved recipe; [`http::serve`] runs it.

pub mod blocks;
pub mod config;
pub mod core;
pub mod http;
pub mod metrics;
pub mod model;
pub mod sampling;
pub mod speculative;
pub mod text;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::diagnose::{Class, Diagnose, user_unless};
use crate::dialect::log::vllm;
use crate::recipe::{EmbeddingDtype, KvCacheDtype, ModelDtype, Recipe};
use crate::reporter::Reporter;
use config::ModelConfig;
use metrics::Metrics;
pub use model::KvDtype;
use model::{Embeddings, Model};
use text::TextModel;
use weights::{Checkpoint, Precision};

/// Tokens per KV block (vLLM's default `--block-size`).
pub const BLOCK_SIZE: usize = 16;
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

/// What can go wrong loading or running the native engine.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A model file is malformed.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The model is of a kind the engine does not run.
    #[error("the native engine cannot run {what}")]
    Unsupported {
        /// What.
        what: String,
        /// What to do instead.
        hint: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    MissingTensor {
        /// Its name.
        name: String,
        /// The model directory.
        dir: PathBuf,
    },
    /// The settings do not fit together.
    #[error("{message}")]
    Settings {
        /// What is wrong.
        message: String,
        /// What to change.
        hint: String,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Diagnose for NativeError {
    fn class(&self) -> Class {
        user_unless(matches!(self, NativeError::Internal(_)))
    }

    fn hint(&self) -> Option<String> {
        match self {
            NativeError::Unsupported { hint, .. } | NativeError::Settings { hint, .. } => Some(hint.clone()),
            NativeError::MissingTensor { .. } => Some(
                "the checkpoint is incomplete or not a Llama-family model: pull or quantize it again".into(),
            ),
            NativeError::Bind { .. } => Some("pick another `server.port`, or stop what is using it".into()),
            _ => None,
        }
    }
}

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
}

impl Settings {
    /// The settings of `recipe`, serving the model in `model_dir`.
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
        Ok(Settings {
            model_dir: model_dir.to_owned(),
            served_name: recipe.model.served_name.clone(),
            precision,
            embeddings: match recipe.memory.embedding_dtype {
                None | Some(EmbeddingDtype::Auto) => Embeddings::Stored,
                Some(EmbeddingDtype::Q8_0) => Embeddings::Q8_0,
            },
            kv_dtype: kv_dtype(recipe),
            max_model_len: s.max_model_len.map(|v| v as usize),
            max_num_seqs: s.max_num_seqs.map_or(DEFAULT_MAX_NUM_SEQS, |v| v as usize),
            max_batched_tokens: s
                .max_batched_tokens
                .map_or(DEFAULT_MAX_BATCHED_TOKENS, |v| v as usize),
            prefix_caching: s.prefix_caching.unwrap_or(false),
            chunked_prefill: s.chunked_prefill.unwrap_or(true),
            speculative: s
                .speculative
                .as_ref()
                .map(speculative::Ngram::from_section)
                .transpose()?,
            kv_cache_bytes: recipe.memory.kv_cache_bytes,
            memory_fraction: recipe.memory.gpu_utilization,
            host: recipe.server.host.clone(),
            port: recipe.server.port,
            api_key,
            stop_grace: recipe.server.stop_grace,
            log_interval: log_interval(crate::env::VLLM_LOG_STATS_INTERVAL.get().as_deref())?,
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
            "the native engine serves dense Llama-family models, which have no experts",
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

/// A loaded engine, ready to serve.
pub struct Engine {
    /// The settings.
    pub settings: Settings,
    /// Text handling.
    pub text: Arc<TextModel>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The scheduler loop, not started yet.
    pub core: core::Core,
    /// The effective context limit.
    pub max_model_len: usize,
    /// KV cache capacity in tokens.
    pub kv_tokens: usize,
    /// How many full-length requests fit at once.
    pub max_concurrency: f64,
    /// When loading began, for the readiness line.
    pub started: Instant,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings)
            .finish()
    }
}

/// The KV cache the native engine sizes at start-up (its "GPU KV cache size" line),
/// which `sous plan` predicts with the same code.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// Blocks of [`BLOCK_SIZE`] tokens.
    pub blocks: usize,
    /// Tokens they hold.
    pub tokens: usize,
    /// Requests of `max_model_len` tokens that fit at once.
    pub max_concurrency: f64,
}

/// The KV budget in bytes: `memory.kv_cache_bytes`; else `memory.gpu_utilization` of
/// host RAM less the weights; else the smaller of [`DEFAULT_KV_BYTES`] and a quarter of
/// RAM. `host` is the RAM (`/proc/meminfo`).
pub fn kv_budget(
    kv_cache_bytes: Option<u64>,
    memory_fraction: Option<f64>,
    weights: u64,
    host: Option<u64>,
) -> Result<u64, NativeError> {
    Ok(match (kv_cache_bytes, memory_fraction) {
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

/// Blocks, tokens and concurrency of a `budget` at `per_token` bytes per token.
pub fn capacity(per_token: u64, budget: u64, max_model_len: usize) -> Capacity {
    let blocks = if per_token == 0 {
        0
    } else {
        (budget / (per_token * BLOCK_SIZE as u64)) as usize
    };
    let tokens = blocks * BLOCK_SIZE;
    let max_concurrency = tokens as f64 / (max_model_len.div_ceil(BLOCK_SIZE).max(1) * BLOCK_SIZE) as f64;
    Capacity {
        blocks,
        tokens,
        max_concurrency,
    }
}

/// Writes a line to the engine log with vLLM's prefix (`vllm::prefixed`), so that the
/// readers of vLLM's logs (`sous bench logs`, `sous serve`'s own scan) read the native
/// engine's log as they read vLLM's. `source` is `file!():line!()` of the caller (see
/// [`here`]); its file name is kept.
pub(crate) fn log(reporter: &dyn Reporter, level: &str, source: &str, message: &str) {
    let source = source.rsplit('/').next().unwrap_or(source);
    let at = chrono::Local::now().naive_local();
    reporter.output(
        None,
        &vllm::prefixed(std::process::id(), level, at, source, message),
    );
}

/// `file:line` of the place it is written, for [`log`].
macro_rules! here {
    () => {
        concat!(file!(), ":", line!())
    };
}
pub(crate) use here;

/// Total host RAM in bytes (`MemTotal` of `/proc/meminfo`), if known.
pub fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Engine {
    /// Loads the model and sizes the KV cache. `reporter` receives vLLM-style log
    /// lines as engine output, at start-up and from the running loop.
    pub fn load(settings: Settings, reporter: Arc<dyn Reporter>) -> Result<Engine, NativeError> {
        let started = Instant::now();
        let log = |line: String| self::log(reporter.as_ref(), "INFO", here!(), &line);
        let dir = &settings.model_dir;
        let config = ModelConfig::read(dir)?;
        let mut model_limit = config.max_position_embeddings;
        if let Some(window) = config.sliding_window {
            model_limit = model_limit.min(window);
        }
        let max_model_len = match settings.max_model_len {
            Some(len) if len > model_limit => {
                return Err(NativeError::Settings {
                    message: format!(
                        "`serving.max_model_len` is {len}, longer than the model's {model_limit} tokens \
                         ({})",
                        if config.sliding_window.is_some() {
                            "its sliding attention window"
                        } else {
                            "max_position_embeddings"
                        }
                    ),
                    hint: format!("set `serving.max_model_len` to {model_limit} or less"),
                });
            }
            Some(0) => {
                return Err(NativeError::Settings {
                    message: "`serving.max_model_len` is 0".into(),
                    hint: "leave it out to use the model's limit".into(),
                });
            }
            Some(len) => len,
            None => model_limit,
        };
        let text = TextModel::load(dir, &config.eos_token_ids)?;
        let checkpoint = Checkpoint::open(dir, &config)?;
        let quantization = checkpoint.quantization();
        let mut model = Model::load_with(
            config,
            &checkpoint,
            settings.precision,
            settings.embeddings,
            max_model_len,
        )?;
        drop(checkpoint);
        match model.place_in_huge_pages() {
            Ok(Some(placement)) => log(format!("Weights: {placement}")),
            Ok(None) => {}
            // Only slower: the weights stay on the heap, in pages of the system's default size.
            Err(e) => log(format!(
                "Weights stay in small pages: mapping them for huge pages failed ({e})"
            )),
        }
        let weights = model.weight_bytes();
        log(format!(
            "Model loading took {:.4} GiB memory and {:.6} seconds ({}, weights {:?}, {:?}, embeddings {}, f32 compute, {} kernels)",
            weights as f64 / (1u64 << 30) as f64,
            started.elapsed().as_secs_f64(),
            model.config().architecture,
            quantization,
            settings.precision,
            model.embedding_format(),
            sous_kernels::gemm::Isa::current().name(),
        ));
        if let Some(calibration) = sous_kernels::gemm::calibrate_decode_panels(model.tuning_matrix()) {
            log(format!("Decode products: {calibration}"));
        }
        if let Some(calibration) = sous_kernels::gemm::calibrate_batch_tile(model.tuning_matrix()) {
            log(format!("Batch products: {calibration}"));
        }
        if settings.precision == Precision::Bf16
            && let Some(calibration) = model
                .layer_matrix()
                .and_then(sous_kernels::gemm::calibrate_bf16_dot)
        {
            log(format!("bf16 products: {calibration}"));
        }
        let per_token = model::kv_bytes_per_token(model.config(), settings.kv_dtype);
        let budget = kv_budget(
            settings.kv_cache_bytes,
            settings.memory_fraction,
            weights,
            host_memory(),
        )?;
        let Capacity {
            blocks,
            tokens: kv_tokens,
            max_concurrency,
        } = capacity(per_token, budget, max_model_len);
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        log(format!("Available KV cache memory: {:.2} GiB", gib(budget)));
        if kv_tokens < max_model_len {
            let needed = per_token * max_model_len as u64;
            let hint = if blocks == 0 {
                "No available memory for the cache blocks. Try increasing `memory.kv_cache_bytes` or \
                 `memory.gpu_utilization`"
                    .to_owned()
            } else {
                format!(
                    "set `serving.max_model_len` to {} or less, or give the cache more memory",
                    kv_tokens
                )
            };
            return Err(NativeError::Settings {
                message: format!(
                    "To serve at least one request with the model's max seq len ({max_model_len}), ({:.2} GiB KV \
                     cache is needed, which is larger than the available KV cache memory ({:.2} GiB). Based on \
                     the available memory, the estimated maximum model length is {kv_tokens}.",
                    gib(needed),
                    gib(budget)
                ),
                hint,
            });
        }
        log(crate::dialect::log::vllm::capacity_line(
            "CPU",
            kv_tokens,
            max_model_len,
            max_concurrency,
        ));
        let cache_info = vec![
            ("block_size".to_owned(), BLOCK_SIZE.to_string()),
            ("cache_dtype".to_owned(), settings.kv_dtype.name().to_owned()),
            (
                "enable_prefix_caching".to_owned(),
                if settings.prefix_caching { "True" } else { "False" }.to_owned(),
            ),
            (
                "kv_cache_max_concurrency".to_owned(),
                format!("{max_concurrency:.2}"),
            ),
            ("kv_cache_size_tokens".to_owned(), kv_tokens.to_string()),
            ("num_cpu_blocks".to_owned(), blocks.to_string()),
        ];
        let metrics = Arc::new(Metrics::new(
            &settings.served_name,
            cache_info,
            settings.speculative.map(|s| s.tokens),
        ));
        let limits = core::Limits {
            max_num_seqs: settings.max_num_seqs.max(1),
            max_batched_tokens: settings.max_batched_tokens.max(1),
            max_model_len,
            chunked_prefill: settings.chunked_prefill,
            speculative: settings.speculative,
            eos: text.eos.clone(),
            log_interval: settings.log_interval,
        };
        let cache = model::KvCache::with_dtype(&model, blocks, BLOCK_SIZE, settings.kv_dtype);
        let core = core::Core::new(
            model,
            cache,
            settings.prefix_caching,
            limits,
            metrics.clone(),
            reporter.clone(),
        );
        Ok(Engine {
            settings,
            text: Arc::new(text),
            metrics,
            core,
            max_model_len,
            kv_tokens,
            max_concurrency,
            started,
        })
    }
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

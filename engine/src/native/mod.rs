//! The built-in `native` engine: a Llama-family decoder on the CPU, served
//! in-process with an OpenAI-compatible API and vLLM's metrics.
//!
//! - [`config`], [`weights`], [`model`]: reading a Hugging Face model directory
//!   (unquantized or NVFP4 as `sous quantize` writes it) and the forward pass;
//! - [`blocks`], [`core`], [`sampling`]: the paged KV cache, the scheduler with
//!   iteration-level batching, chunked prefill and prefix caching, and sampling;
//! - [`text`]: tokenizer, chat template, detokenization, stop strings;
//! - `settings`: [`Settings`], resolved once from a recipe, and the keys the engine
//!   refuses ([`unhonoured`]);
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
mod settings;
pub mod speculative;
pub mod text;
pub mod weights;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::diagnose::{Class, Diagnose, user_unless};
use crate::dialect::log::vllm;
use crate::reporter::Reporter;
use config::ModelConfig;
use metrics::Metrics;
pub use model::KvDtype;
use model::Model;
pub use settings::{
    DEFAULT_KV_BYTES, DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, KvSettings, Settings, Unhonoured,
    kv_dtype, unhonoured,
};
use text::TextModel;
use weights::{Checkpoint, Precision};

/// Tokens per KV block (vLLM's default `--block-size`).
pub const BLOCK_SIZE: usize = 16;

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
                "the checkpoint is incomplete, or its layout is not the one its `architectures` names: pull or quantize it again".into(),
            ),
            NativeError::Bind { .. } => Some("pick another `server.port`, or stop what is using it".into()),
            _ => None,
        }
    }
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

/// Whether the weights and the KV cache go in mappings advised for huge pages: unless
/// `SOUS_HUGE_PAGES` is `off` (`0`, `false`).
pub fn huge_pages() -> bool {
    !crate::env::HUGE_PAGES
        .get()
        .is_some_and(|v| matches!(v.as_str(), "off" | "0" | "false"))
}

/// The CPU's read bandwidth at the engine's thread count, which the decode roofline
/// compares decode steps with: `SOUS_READ_BANDWIDTH` in GB/s where set to a number,
/// none where `off`, else measured (`sous_kernels::bandwidth`: a STREAM-style read of
/// eight times the last-level cache, at least 256 MiB and at most 1 GiB, for at least
/// a tenth of a second and five passes; the same probe as `sous kernels bandwidth`).
pub fn read_bandwidth() -> Option<metrics::ReadBandwidth> {
    let threads = rayon::current_num_threads();
    let chosen = crate::env::READ_BANDWIDTH.non_empty();
    match chosen.as_deref().map(|v| (v, v.trim().parse::<f64>())) {
        Some(("off", _)) => None,
        Some((_, Ok(gb))) if gb > 0.0 => Some(metrics::ReadBandwidth {
            median_gb_per_s: gb,
            best_gb_per_s: gb,
            threads,
        }),
        _ => {
            let llc = sous_kernels::bandwidth::last_level_cache_bytes().unwrap_or(32 << 20);
            let bytes = (8 * llc).clamp(256 << 20, 1 << 30) as usize;
            let b = sous_kernels::bandwidth::measure(bytes, threads, 5, 0.1);
            Some(metrics::ReadBandwidth {
                median_gb_per_s: b.median_gb_per_s,
                best_gb_per_s: b.best_gb_per_s,
                threads,
            })
        }
    }
}

/// The instruction set the kernels run on: the widest this CPU has, or the narrower
/// one `SOUS_KERNELS_ISA` names.
pub fn kernel_isa() -> sous_kernels::gemm::Isa {
    kernel_choices().tuning().isa()
}

/// The user's choices for the kernels (`SOUS_KERNELS_ISA`, `SOUS_BF16_DOT`,
/// `SOUS_DECODE_PANELS`, `SOUS_BATCH_TILE`), each `None` where unset.
pub fn kernel_choices() -> sous_kernels::gemm::Choices {
    sous_kernels::gemm::Choices::parse(
        crate::env::KERNELS_ISA.get().as_deref(),
        crate::env::BF16_DOT.get().as_deref(),
        crate::env::DECODE_PANELS.get().as_deref(),
        crate::env::BATCH_TILE.get().as_deref(),
    )
}

/// Makes the choices `model`'s kernels run with and hands them to it: the user's
/// `choices` (from the settings: [`kernel_choices`]), and what they leave open measured
/// on the model's matrices. Each choice made is reported (`Decode products: ...`).
pub fn tune(model: &mut Model, choices: sous_kernels::gemm::Choices, mut report: impl FnMut(String)) {
    let mut tuning = choices.tuning();
    if let Some(calibration) = tuning.calibrate_decode_panels(model.tuning_matrix(), choices.decode_panels) {
        report(format!("Decode products: {calibration}"));
    }
    if let Some(calibration) = tuning.calibrate_batch_tile(model.tuning_matrix(), choices.batch_tile) {
        report(format!("Batch products: {calibration}"));
    }
    if model.precision() == Precision::Bf16
        && let Some(calibration) = model
            .layer_matrix()
            .and_then(|w| tuning.calibrate_bf16_dot(w, choices.bf16_dot))
    {
        report(format!("bf16 products: {calibration}"));
    }
    model.set_tuning(tuning);
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
        if config.linear.is_some() {
            // A linear-attention state sums the whole prefix: a cached block of keys and
            // values alone cannot resume it.
            if settings.prefix_caching {
                return Err(NativeError::Settings {
                    message: format!(
                        "`serving.prefix_caching` is not available for {}: its linear-attention layers keep \
                         one state per request, which the native engine does not save at block boundaries",
                        config.architecture
                    ),
                    hint: "remove `serving.prefix_caching` from the recipe, or serve this model with vLLM"
                        .into(),
                });
            }
        }
        let text = TextModel::load(dir, &config.eos_token_ids)?;
        let checkpoint = Checkpoint::open(dir, &config)?;
        let quantization = checkpoint.quantization();
        let model = Model::load_with(
            config,
            &checkpoint,
            settings.precision,
            settings.embeddings,
            max_model_len,
        )?;
        drop(checkpoint);
        let model = match (settings.mtp, model.has_mtp()) {
            (Some(_), false) => {
                return Err(NativeError::Settings {
                    message: format!(
                        "`serving.speculative` drafts with the checkpoint's MTP head, and {} has none (no `mtp.fc.weight`)",
                        dir.display()
                    ),
                    hint: "use `speculative = { method = \"ngram\", tokens = 3 }`, or a checkpoint that ships its MTP head"
                        .into(),
                });
            }
            (None, _) => model.without_mtp(),
            (Some(_), true) => model,
        };
        let mut model = model;
        match model.place_in_huge_pages() {
            Ok(Some(placement)) => log(format!("Weights: {placement}")),
            Ok(None) => {}
            // Only slower: the weights stay on the heap, in pages of the system's default size.
            Err(e) => log(format!(
                "Weights stay in small pages: mapping them for huge pages failed ({e})"
            )),
        }
        let weights = model.weight_bytes();
        let loaded = Instant::now();
        log(format!(
            "Model loading took {:.4} GiB memory and {:.6} seconds ({}, weights {:?}, {:?}, embeddings {}, f32 compute, {} kernels)",
            weights as f64 / (1u64 << 30) as f64,
            loaded.duration_since(started).as_secs_f64(),
            model.config().architecture,
            quantization,
            settings.precision,
            model.embedding_format(),
            settings.kernels.tuning().isa().name(),
        ));
        tune(&mut model, settings.kernels, log);
        let bandwidth = read_bandwidth();
        let step = model.step_bytes(&[1], settings.kv_dtype).total();
        match bandwidth {
            Some(b) => log(format!(
                "Read bandwidth: {:.1} GB/s (median; best {:.1}) with {} threads; a decode step reads {:.3} GB, \
                 so one sequence decodes at most {:.1} tok/s at the start of a context",
                b.median_gb_per_s,
                b.best_gb_per_s,
                b.threads,
                step as f64 / 1e9,
                b.median_gb_per_s * 1e9 / step.max(1) as f64
            )),
            None => log(format!(
                "Read bandwidth: not measured (SOUS_READ_BANDWIDTH=off); a decode step reads {:.3} GB",
                step as f64 / 1e9
            )),
        }
        let per_token = model.kv_bytes_per_token(settings.kv_dtype);
        let states = model
            .config()
            .linear
            .as_ref()
            .map_or(0, model::LinearStates::bytes_per_sequence);
        let budget = settings.kv().budget(weights, crate::host::total())?;
        if states > 0 {
            log(format!(
                "Linear-attention state: {:.2} MiB per sequence, {:.2} MiB for {} sequences",
                states as f64 / (1u64 << 20) as f64,
                (states * settings.max_num_seqs.max(1) as u64) as f64 / (1u64 << 20) as f64,
                settings.max_num_seqs.max(1)
            ));
        }
        let budget = settings.kv().after_states(budget, states)?;
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
            settings.speculative.map(|s| s.tokens).or(settings.mtp),
        ));
        if let Some(b) = bandwidth {
            metrics.set_bandwidth(b);
        }
        let limits = core::Limits {
            max_num_seqs: settings.max_num_seqs.max(1),
            max_batched_tokens: settings.max_batched_tokens.max(1),
            max_model_len,
            chunked_prefill: settings.chunked_prefill,
            speculative: settings.speculative,
            mtp: settings.mtp,
            eos: text.eos.clone(),
            log_interval: settings.log_interval,
        };
        let cache = model::KvCache::with_dtype(&model, blocks, BLOCK_SIZE, settings.kv_dtype);
        // As vLLM's engine core logs it (`crate::dialect::log::vllm::phase::INIT_ENGINE`):
        // here the kernels' calibration, the bandwidth probe and the KV cache.
        log(format!(
            "init engine (profile, create kv cache, warmup model) took {:.2} seconds",
            loaded.elapsed().as_secs_f64()
        ));
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

//! `sous` as a library: everything the `sous` binary does, reachable without the
//! terminal.
//!
//! - [`pipeline`]: a recipe to weights on disk (pull, quantize, up-to-date checks) and
//!   to a running, ready instance; `serve`, `bench --recipe` and every later command
//!   go through it.
//! - [`hub`]: the Hugging Face Hub: a resumable, verified downloader into the shared
//!   cache, and a local read-only mirror.
//! - [`plan`]: a recipe's model read for `sous plan` (config and safetensors headers,
//!   locally or by range requests) and the weights a planned quantization writes.
//! - [`quantize`]: safetensors in, an NVFP4 checkpoint out (compressed-tensors or
//!   ModelOpt layout).
//! - [`import`]: a GGUF file to a Hugging Face model directory.
//! - [`bench`]: workloads against an OpenAI-compatible server, `/metrics` scrapes and
//!   vLLM log analysis, with reports as tables, JSON, CSV and SVG.
//! - [`deploy`]: a recipe rendered for Kubernetes, compose or systemd, and a rendered
//!   directory written or compared.
//! - [`devices`]: the GPUs' memory as the CUDA driver reports it now, which `serve`
//!   checks a memory fraction against before the launch and `plan` plans against.
//! - [`doctor`]: what this machine can run: GPUs, engines, container runtimes, the
//!   Hub, free space, and which recipes can be served here.
//! - [`instances`]: the instances `sous serve` runs here (records, health, logs), for
//!   `ps`, `logs`, `stop` and `run`.
//! - [`inventory`]: what the Hub cache and sous's cache hold (models, revisions, quantized
//!   variants, sizes, provenance), for `list` and `rm`.
//! - [`eval`]: what a recipe costs in quality: perplexity, KL divergence against a
//!   baseline, and task accuracy through lm-evaluation-harness.
//! - [`served`], [`stats`], [`compare`]: what `bench` and `eval` share without importing
//!   each other: the model and tokenizer a server under test serves, statistics of one
//!   quantity, and any two reports side by side.
//! - [`tune`]: `sous tune`'s levers, trials, intervals, verdicts, journal and the
//!   tuned recipe's text, and the whole tune: each trial served and measured, the
//!   report and the tuned recipe written.
//! - [`error`]: what class of failure each error is (the user's or sous's) and what
//!   to do about it.
//!
//! The recipe model, the engine adapters, the supervisor and the native engine live in
//! `sous-engine`; the NVFP4 numerics in `sous-kernels`. Nothing here prints: operations
//! report through [`sous_engine::reporter::Reporter`], which the binary draws.

pub mod bench;
pub mod chain;
pub mod compare;
pub mod deploy;
pub mod devices;
pub mod doctor;
pub mod error;
pub mod eval;
pub mod hub;
pub mod import;
pub mod instances;
pub mod inventory;
pub mod pipeline;
pub mod plan;
pub mod quantize;
pub mod served;
pub mod stats;
pub mod tune;

pub use sous_engine as engine;

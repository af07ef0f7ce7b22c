//! `sous-engine`: everything about a deployment that is not the terminal.
//!
//! - [`atomic`]: files and directories that appear whole or not at all.
//! - [`checkpoint`]: what a safetensors checkpoint calls its files and NVFP4 tensors,
//!   shared by the code that writes checkpoints and the native engine that reads them.
//! - [`recipe`]: the recipe format, loading (`extends`, environment, `--set`),
//!   validation, and the generated schema and reference.
//! - [`diagnose`]: the exit class and hint of every error type.
//! - [`host`]: the host's memory and memory pressure, as Linux reports them.
//! - [`device`]: the GPU memory an engine starts against, and whether a memory
//!   fraction fits it before the launch.
//! - [`dialect`]: what vLLM, SGLang and TensorRT-LLM call their metrics, and the log
//!   lines sous writes as vLLM does or reads from an engine.
//! - [`chat`]: chat templates rendered as transformers renders them (minijinja).
//! - [`launch`]: engine adapters that turn a [`recipe::Recipe`] into the exact command
//!   line, environment and option files of vLLM, SGLang or TensorRT-LLM.
//! - [`native`]: the built-in CPU engine (our own kernels + axum) with an OpenAI-compatible API.
//! - [`serve`]: running an engine: launch, readiness, OOM fallback, restarts, stop.
//! - [`size`]: byte sizes as users write them (`5GB`, `14.5GiB`) and as sous shows them.
//! - [`version`]: engine release numbers.
//! - [`paths`]: where sous keeps per-deployment state.
//! - [`env`]: every environment variable sous reads, declared once.
//! - [`repo`]: Hub repository ids, checked as the Hub checks them.
//! - [`reporter`]: how long operations report status, warnings, output and progress.
//!
//! This crate never prints: it returns values and typed errors, and logs through
//! `tracing`. The `sous` binary decides what reaches the terminal.

pub mod atomic;
pub mod chat;
pub mod checkpoint;
pub mod device;
pub mod diagnose;
pub mod dialect;
pub mod env;
pub mod host;
pub mod launch;
pub mod native;
pub mod paths;
pub mod plan;
pub mod recipe;
pub mod repo;
pub mod reporter;
pub mod serve;
pub mod size;
pub mod version;

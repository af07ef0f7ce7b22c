//! The command line: one file per command, each with its arguments and an `exec`
//! that calls the `sous` library (or `sous-engine`) and says what happened.

mod bench;
mod completions;
mod deploy;
mod doctor;
mod eval;
mod hub;
mod import;
mod kernels;
mod list;
mod logs;
mod man;
mod plan;
mod ps;
mod pull;
mod quantize;
mod recipe;
mod rm;
mod run;
mod serve;
mod stop;
mod tune;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sous_engine::recipe::Loaded;

use crate::shell::Shell;

/// One recipe file to a running, measured LLM server.
#[derive(Debug, Parser)]
#[command(name = "sous", version, about, long_about = None, propagate_version = true)]
#[command(
    after_help = "Exit codes: 0 success, 1 bad input (recipe, flags, files), 2 internal error.\nDocs: docs/recipe.md for the recipe format."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check recipes and print them resolved, or print the recipe schema.
    #[command(subcommand)]
    Recipe(recipe::RecipeCommand),
    /// Download a model from the Hugging Face Hub into the shared cache (resumable, verified).
    Pull(pull::PullArgs),
    /// Convert a model from another format into a Hugging Face model directory.
    #[command(subcommand)]
    Import(import::ImportCommand),
    /// Tools for the Hub itself: `sous hub serve` runs a local read-only mirror.
    #[command(subcommand)]
    Hub(hub::HubCommand),
    /// Quantize a model's weights to NVFP4 (compressed-tensors or ModelOpt checkpoint).
    Quantize(quantize::QuantizeArgs),
    /// Check and time the NVFP4 kernels on a GPU against the CPU's bytes.
    #[command(subcommand)]
    Kernels(kernels::KernelsCommand),
    /// Whether a recipe fits a machine, the KV cache its engine will size, and a decode
    /// ceiling, from the model's config and headers (no GPU, no weights).
    Plan(plan::PlanArgs),
    /// Serve a recipe's model: pull and quantize it if needed, then run its engine until
    /// Ctrl-C (--dry-run prints the exact command line instead).
    Serve(serve::ServeArgs),
    /// The instances `sous serve` runs on this machine: health, load, URL, uptime.
    Ps(ps::PsArgs),
    /// An instance's engine log; `-f` follows it.
    Logs(logs::LogsArgs),
    /// Stop a running instance from any shell (grace period, then kill).
    Stop(stop::StopArgs),
    /// The models in the Hub cache and the quantized variants in sous's cache.
    List(list::ListArgs),
    /// Remove a model, one of its revisions, or a quantized variant from the caches.
    Rm(rm::RmArgs),
    /// Chat with a recipe's model (or any OpenAI-compatible server) in the terminal,
    /// streamed; one-shot with a prompt.
    Run(run::RunArgs),
    /// Measure a server: probe, sweep, prefix, agent workloads; compare reports.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// What a recipe costs in quality: perplexity over a text, KL divergence and
    /// top-token agreement against a baseline, task accuracy by lm-evaluation-harness.
    Eval(eval::EvalArgs),
    /// From a baseline recipe to a measured, tuned one: each lever tried alone against
    /// the same seeded workload, the ones that helped combined, a recipe that extends
    /// the baseline written with each gain.
    Tune(tune::TuneArgs),
    /// Render the recipe for Kubernetes, compose or systemd, or diff a rendered directory.
    #[command(subcommand)]
    Deploy(deploy::DeployCommand),
    /// What this machine can run: GPUs, drivers, engines, container runtimes, the Hub,
    /// disk, and which shipped recipes can be served here.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script.
    Completions(completions::CompletionsArgs),
    /// Write the man pages (one per command) into a directory.
    Man(man::ManArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Recipe(cmd) => recipe::exec(cmd, shell),
        Command::Serve(args) => serve::exec(args, shell),
        Command::Pull(args) => pull::exec(args, shell),
        Command::Quantize(args) => quantize::exec(args, shell),
        Command::Hub(cmd) => hub::exec(cmd, shell),
        Command::Import(cmd) => import::exec(cmd, shell),
        Command::Bench(cmd) => bench::exec(cmd, shell),
        Command::Plan(args) => plan::exec(args, shell),
        Command::Kernels(cmd) => kernels::exec(cmd, shell),
        Command::Eval(args) => eval::exec(args, shell),
        Command::Tune(args) => tune::exec(args, shell),
        Command::Deploy(cmd) => deploy::exec(cmd, shell),
        Command::Ps(args) => ps::exec(args, shell),
        Command::Logs(args) => logs::exec(args, shell),
        Command::Stop(args) => stop::exec(args, shell),
        Command::List(args) => list::exec(args, shell),
        Command::Rm(args) => rm::exec(args, shell),
        Command::Run(args) => run::exec(args, shell),
        Command::Doctor(args) => doctor::exec(args, shell),
        Command::Completions(args) => completions::exec(args, shell),
        Command::Man(args) => man::exec(args, shell),
    }
}

/// `--set key.path=value`, repeatable; shared by every command that reads a recipe.
#[derive(Debug, Clone, Args)]
pub struct OverrideArgs {
    /// Override a recipe value, e.g. `--set memory.gpu_utilization=0.85` (repeatable;
    /// applied after the file and SOUS_<TABLE>__<KEY> environment variables).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Loads a recipe with the process's `SOUS_*` overrides and the `--set` arguments.
pub fn load_recipe(path: &Path, overrides: &OverrideArgs) -> anyhow::Result<Loaded> {
    sous::pipeline::session::load_recipe(path, &overrides.set)
}

/// The API key in the environment variable `--api-key-env` names, if it names one; an
/// unset variable is the user's error.
pub fn api_key(var: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(var) = var else { return Ok(None) };
    match sous_engine::env::named(var) {
        Some(key) => Ok(Some(key)),
        None => Err(crate::failure::UserError::new(
            format!("--api-key-env: `{var}` is not set"),
            Some(&format!("export {var}=...")),
        )
        .into()),
    }
}

/// The API key a recipe's server expects: the value of the variable its
/// `server.api_key_env` names, when both are set.
pub fn recipe_api_key(recipe: &sous_engine::recipe::Recipe) -> Option<String> {
    sous::pipeline::session::api_key(recipe)
}

/// The async runtime of the commands that talk over the network or run engines.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// A path as the user wrote it.
pub fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Shared `--recipe FILE` argument.
#[derive(Debug, Clone, Args)]
pub struct RecipeArg {
    /// The recipe file.
    #[arg(long, short = 'r', value_name = "FILE")]
    pub recipe: PathBuf,
}

//! `sous`: one recipe file to a running, measured LLM server.
//!
//! The binary is glue: parse the command line, call the `sous` library, render the
//! outcome once. Each command lives in `commands/<name>.rs`; terminal output,
//! progress included, goes through [`shell::Shell`]; errors are rendered and exit
//! codes decided in [`failure`].

mod commands;
mod failure;
mod shell;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match commands::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return failure::usage(err),
    };
    init_tracing();
    let shell = shell::Shell::from_env();
    match std::panic::catch_unwind(|| commands::run(cli, &shell)) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => failure::report(&shell, &err),
        Err(_) => ExitCode::from(sous::error::Class::Internal.exit_code()),
    }
}

/// Logs go to stderr, filtered by `SOUS_LOG` (e.g. `SOUS_LOG=debug`); warnings by default.
fn init_tracing() {
    let filter = sous_engine::env::LOG
        .get()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .init();
}

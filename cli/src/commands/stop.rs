//! `sous stop NAME [--timeout D]`: stops an instance from any shell the way SIGTERM to
//! its `sous serve` does: the engine gets its grace period, then the engine's process
//! group and `sous serve` are killed.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use sous::instances::{self, Record};
use sous_engine::paths;

use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  sous stop smollm2-135m\n  sous stop smollm2-135m --timeout 5s")]
pub struct StopArgs {
    /// The instance: its recipe's name (`sous ps` lists them).
    name: String,
    /// How long the engine gets to stop before it is killed (default: its recipe's
    /// `server.stop_grace`), e.g. `10s`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

pub fn exec(args: StopArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let entry = instances::find(&paths::state_dir(), &args.name)?;
    let (was, seconds) = match &entry.record {
        Record::Live(state) => {
            let grace = args.timeout.unwrap_or_else(|| state.grace());
            shell.status(
                "stopping",
                &format!(
                    "`{}` (sous pid {}), grace {}",
                    args.name,
                    state.sous_pid,
                    humantime::format_duration(grace)
                ),
            );
            let took = super::runtime()?.block_on(state.stop(grace));
            ("running", Some(took.as_secs_f64()))
        }
        Record::Stale(_) => {
            instances::prune(std::slice::from_ref(&entry));
            ("stale", None)
        }
        Record::None | Record::Unreadable(_) => ("stopped", None),
    };
    if args.json {
        shell.data(&serde_json::to_string_pretty(&json!({
            "name": args.name,
            "was": was,
            "stopped": true,
            "seconds": seconds,
        }))?)?;
    }
    match (was, seconds) {
        (_, Some(s)) => shell.status("stopped", &format!("`{}` in {s:.1} s", args.name)),
        ("stale", _) => shell.status(
            "stopped",
            &format!(
                "`{}` was not running (its `sous serve` was gone); removed its stale record",
                args.name
            ),
        ),
        _ => shell.status("stopped", &format!("`{}` was not running", args.name)),
    }
    Ok(ExitCode::SUCCESS)
}

//! `sous bench logs` and `sous bench scrape`: the passive measurements, read from what
//! a production server leaves behind (its log files, its `/metrics` now and on a
//! schedule, or a Prometheus server's record of a past window), then printed as a
//! table or JSON and, with `--svg`, charted.
//!
//! Not here: the flags ([`super`]) or the figures (`sous::bench::logs`,
//! `sous::bench::scrape`).

use std::process::ExitCode;

use sous::bench::scrape;
use sous::bench::window::Window;

use super::{LogsArgs, ScrapeArgs};
use crate::failure::UserError;
use crate::shell::Shell;

/// `sous bench logs`: the files read and analysed, then charted with --svg and printed.
pub(super) fn logs(args: &LogsArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    use sous::bench::logs::{LogInput, LogsOptions, analyze};
    if !args.names.is_empty() && args.names.len() != args.files.len() {
        return Err(UserError::new(
            format!(
                "{} --name values for {} files",
                args.names.len(),
                args.files.len()
            ),
            Some("give one --name per file, in order, or none"),
        )
        .into());
    }
    let inputs = args
        .files
        .iter()
        .enumerate()
        .map(|(i, path)| LogInput::read(path, args.names.get(i).map(String::as_str)))
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = LogsOptions::default();
    let options = LogsOptions {
        year: args.year.unwrap_or(defaults.year),
        idle_gap_s: args.idle_gap,
        threshold_tok_s: args.threshold,
        top_k: args.top,
        window: Window {
            since: args.since,
            until: args.until,
        },
        after_restart: args.after_restart,
        ..defaults
    };
    let report = analyze(&inputs, &options)?;
    if let Some(path) = &args.svg {
        sous::bench::logs::chart::draw(path, &report)
            .map_err(|e| UserError::new(format!("cannot draw {}: {e}", path.display()), None))?;
        shell.status("wrote", &path.display().to_string());
    }
    print_report(shell, args.json, &report, || report.to_table())
}

/// `sous bench scrape`: every URL now, then on the schedule; the first round must
/// reach them all, later failures are skipped. With --prometheus, the Prometheus
/// server's figures of a past window instead.
pub(super) fn watch(args: &ScrapeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    if let Some(url) = &args.prometheus {
        return history(url, args, shell);
    }
    let Some(window) = args.window else {
        return Err(UserError::new("pass --for DURATION", Some("e.g. --for 10m")).into());
    };
    let runtime = crate::commands::runtime()?;
    let (instances, scheduled) = runtime.block_on(scrape::watch(&args.urls, window, args.interval, shell))?;
    let report = scrape::analyze(&instances, scheduled)?;
    for r in &report.counter_resets {
        shell.warn(&format!(
            "{} restarted before scrape {} (a counter went down); its figures span the restart",
            r.url, r.scrape
        ));
    }
    if let Some(path) = &args.svg {
        scrape::draw_live_chart(path, &instances, &report, scheduled)?;
        shell.status("wrote", &path.display().to_string());
    }
    print_report(shell, args.json, &report, || report.to_table())
}

/// `sous bench scrape --prometheus URL --since ...`: the window placed on the clock
/// (relative times back from --until or now), then the Prometheus server's figures.
fn history(url: &str, args: &ScrapeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let window = sous::bench::window::Window {
        since: args.since,
        until: args.until,
    };
    let bounds = window
        .place(now)
        .map_err(|e| UserError::new(e, Some("--since must come before --until")))?;
    let (Some(since), until) = (bounds.since, bounds.until.unwrap_or(now)) else {
        return Err(UserError::new("--prometheus needs --since", Some("e.g. --since 1d")).into());
    };
    if since >= until {
        return Err(UserError::new(
            format!(
                "the window is empty: --since is {} and it ends at {}",
                sous::bench::window::format_utc(since),
                sous::bench::window::format_utc(until)
            ),
            Some("--since must come before --until (and now)"),
        )
        .into());
    }
    let selector = match &args.selector {
        Some(text) => scrape::promql::Selector::parse(text)?,
        None => scrape::promql::Selector::NONE,
    };
    let ask = scrape::Ask {
        url,
        selector: &selector,
        selector_text: args.selector.as_deref(),
        since,
        until,
        now,
    };
    let runtime = crate::commands::runtime()?;
    let report = runtime.block_on(scrape::ask(&ask, shell))?;
    if let Some(path) = &args.svg {
        scrape::draw_prometheus_chart(path, &report)?;
        shell.status("wrote", &path.display().to_string());
    }
    print_report(shell, args.json, &report, || report.to_table())
}

/// A passive report on stdout: its JSON with `--json`, else its table.
fn print_report(
    shell: &Shell,
    json: bool,
    report: &impl serde::Serialize,
    table: impl FnOnce() -> String,
) -> anyhow::Result<ExitCode> {
    if json {
        shell.data(&serde_json::to_string_pretty(report)?)?;
    } else {
        shell.data(&table())?;
    }
    Ok(ExitCode::SUCCESS)
}

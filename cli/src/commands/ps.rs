//! `sous ps [--json] [--prune] [--router URL]`: the instances `sous serve` runs on this
//! machine, with their health and load (running and waiting requests, KV cache usage)
//! as their engines report them, like `ollama ps` and `docker ps`; with `--router`, a
//! router and the instances behind it, wherever they run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};
use sous::bench::table;
use sous::instances::{self, Entry, Probe, Record};
use sous_engine::dialect::Family;
use sous_engine::paths;

use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous ps\n  sous ps --json | jq '.[] | select(.health != \"ok\")'\n  sous ps --prune\n  sous ps --router http://10.0.0.5:8000"
)]
pub struct PsArgs {
    /// Print the instances as a JSON array.
    #[arg(long)]
    json: bool,
    /// Remove the records of instances whose `sous serve` is gone (stale).
    #[arg(long)]
    prune: bool,
    /// Also show this router (vllm-router or sglang-router, its base URL) and the
    /// instances it routes to, wherever they run. Repeat for several.
    #[arg(long, value_name = "URL")]
    router: Vec<String>,
}

pub fn exec(args: PsArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let state_dir = paths::state_dir();
    let entries = instances::scan(&state_dir)?;
    let pruned = if args.prune {
        instances::prune(&entries)
    } else {
        Vec::new()
    };
    let shown: Vec<&Entry> = entries
        .iter()
        .filter(|e| !matches!(e.record, Record::None) && !pruned.contains(&e.name))
        .collect();
    let runtime = super::runtime()?;
    let probes: Vec<Option<Probe>> =
        runtime.block_on(futures_util::future::join_all(shown.iter().map(|e| async {
            match e.live() {
                Some(state) => Some(instances::probe(state, Duration::from_secs(3)).await),
                None => None,
            }
        })));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut rows: Vec<Value> = shown
        .iter()
        .zip(&probes)
        .map(|(entry, probe)| row(entry, probe.as_ref(), now))
        .collect();
    for (i, router) in args.router.iter().enumerate() {
        let name = if args.router.len() == 1 {
            "router".to_owned()
        } else {
            format!("router-{}", i + 1)
        };
        rows.extend(runtime.block_on(fleet(&name, router.trim_end_matches('/'), shell)));
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&rows)?)?;
    } else if rows.is_empty() && args.router.is_empty() {
        shell.status(
            "none",
            &format!("no instance runs (state: {})", state_dir.display()),
        );
    } else {
        shell.data(&render(&rows))?;
    }
    for name in &pruned {
        shell.status("pruned", &format!("the stale record of `{name}`"));
    }
    let stale = rows.iter().filter(|r| r["status"] == "stale").count();
    if stale > 0 && !args.json {
        shell.warn(&format!(
            "{stale} stale record{} (its `sous serve` is gone): `sous ps --prune` removes {}",
            if stale == 1 { "" } else { "s" },
            if stale == 1 { "it" } else { "them" }
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// A router and the instances it routes to, as rows: the router's own health, then
/// each worker's health and load (vLLM's metric names, else SGLang's).
async fn fleet(name: &str, router: &str, shell: &Shell) -> Vec<Value> {
    let timeout = Duration::from_secs(3);
    let families = [Family::Vllm, Family::Sglang];
    let own = instances::probe_url(router, &[], timeout).await;
    let mut rows = vec![json!({
        "name": name,
        "status": "router",
        "engine": "router",
        "url": router,
        "health": own.health,
    })];
    let workers = match instances::router_workers(router, timeout).await {
        Ok(w) => w,
        Err(why) => {
            shell.warn(&format!("{name} ({router}): its workers are unknown: {why}"));
            return rows;
        }
    };
    let probes = futures_util::future::join_all(
        workers
            .iter()
            .map(|w| instances::probe_url(w, &families, timeout)),
    )
    .await;
    for (i, (url, probe)) in workers.iter().zip(probes).enumerate() {
        rows.push(json!({
            "name": format!("{name}/{i}"),
            "status": "worker",
            "router": router,
            "url": url,
            "health": probe.health,
            "running_requests": probe.running,
            "waiting_requests": probe.waiting,
            "kv_cache_usage": probe.kv_cache_usage,
        }));
    }
    rows
}

/// One instance as `--json` shows it (the table is drawn from the same values).
fn row(entry: &Entry, probe: Option<&Probe>, now: u64) -> Value {
    let (status, state) = match &entry.record {
        Record::Live(s) => ("running", Some(s)),
        Record::Stale(s) => ("stale", Some(s)),
        Record::Unreadable(why) => {
            return json!({"name": entry.name, "status": "unreadable", "error": why, "dir": entry.dir});
        }
        Record::None => ("stopped", None),
    };
    let Some(s) = state else {
        return json!({"name": entry.name, "status": status, "dir": entry.dir});
    };
    let started = (status == "running")
        .then(|| instances::started_unix(s))
        .flatten();
    json!({
        "name": entry.name,
        "status": status,
        "engine": s.engine.map(|e| e.as_str()),
        "model": s.model,
        "weights": s.weights,
        "url": s.url,
        "port": s.port,
        "sous_pid": s.sous_pid,
        "engine_pid": s.engine_pid,
        "started_unix": started,
        "uptime_seconds": started.map(|t| now.saturating_sub(t)),
        "start_phases": s.phases,
        "health": probe.map_or(if status == "stale" { "stale" } else { "unknown" }, |p| p.health.as_str()),
        "running_requests": probe.and_then(|p| p.running),
        "waiting_requests": probe.and_then(|p| p.waiting),
        "kv_cache_usage": probe.and_then(|p| p.kv_cache_usage),
        "log": entry.log(),
    })
}

fn render(rows: &[Value]) -> String {
    let mut cells = vec![
        [
            "NAME", "ENGINE", "MODEL", "URL", "PIDS", "UPTIME", "HEALTH", "RUNNING", "WAITING", "KV",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    let text = |v: &Value| v.as_str().map_or("-".to_owned(), str::to_owned);
    let count = |v: &Value| v.as_f64().map_or("-".to_owned(), |n| format!("{n}"));
    for r in rows {
        let pids = match (r["sous_pid"].as_u64(), r["engine_pid"].as_u64()) {
            (Some(s), Some(e)) => format!("{s}/{e}"),
            (Some(s), None) => s.to_string(),
            _ => "-".to_owned(),
        };
        let health = if r["status"] == "unreadable" {
            "unreadable".to_owned()
        } else {
            text(&r["health"])
        };
        cells.push(vec![
            text(&r["name"]),
            text(&r["engine"]),
            text(&r["model"]),
            text(&r["url"]),
            pids,
            r["uptime_seconds"].as_u64().map_or("-".to_owned(), uptime),
            health,
            count(&r["running_requests"]),
            count(&r["waiting_requests"]),
            r["kv_cache_usage"]
                .as_f64()
                .map_or("-".to_owned(), |u| format!("{:.1}%", u * 100.0)),
        ]);
    }
    table::layout_left(&cells, "", 7)
}

/// `3d4h`, `2h05m`, `4m09s`, `12s`: the two largest units, as `docker ps` abbreviates.
fn uptime(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_keeps_the_two_largest_units() {
        assert_eq!(uptime(12), "12s");
        assert_eq!(uptime(249), "4m09s");
        assert_eq!(uptime(7500), "2h05m");
        assert_eq!(uptime(3 * 86_400 + 4 * 3600 + 59), "3d4h");
    }
}

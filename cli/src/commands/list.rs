//! `sous list [--json]`: the models in the Hugging Face cache and the quantized variants
//! in sous's cache: repository, revision, size on disk, complete or partial, what each
//! variant was quantized from and how, and which running instance serves it.

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};
use sous::bench::table;
use sous::hub::config::HubConfig;
use sous::instances;
use sous::inventory::{self, Listing};
use sous_engine::paths;
use sous_engine::serve::instance::InstanceState;
use sous_engine::size::human;

use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  sous list\n  sous list --json | jq '.models[].repo'")]
pub struct ListArgs {
    /// Print the listing as JSON.
    #[arg(long)]
    json: bool,
}

pub fn exec(args: ListArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let hub = HubConfig::from_env();
    let listing = inventory::list(&hub.cache_dir, &paths::cache_dir().join("quantized"))?;
    let live: Vec<InstanceState> = instances::scan(&paths::state_dir())?
        .iter()
        .filter_map(|e| e.live().cloned())
        .collect();
    let value = to_json(&listing, &live);
    if args.json {
        shell.data(&serde_json::to_string_pretty(&value)?)?;
    } else {
        shell.data(&render(&value))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The listing with each model, revision and variant's users.
fn to_json(listing: &Listing, live: &[InstanceState]) -> Value {
    let models: Vec<Value> = listing
        .models
        .iter()
        .map(|m| {
            let revisions: Vec<Value> = m
                .revisions
                .iter()
                .map(|r| {
                    let mut v = json!(r);
                    v["served_by"] = json!(inventory::served_by(&r.path, None, live));
                    v
                })
                .collect();
            let mut v = json!(m);
            v["revisions"] = json!(revisions);
            v["served_by"] = json!(inventory::served_by(&m.path, Some(&m.repo), live));
            v
        })
        .collect();
    let variants: Vec<Value> = listing
        .variants
        .iter()
        .map(|q| {
            let mut v = json!(q);
            v["served_by"] = json!(inventory::served_by(&q.path, None, live));
            v
        })
        .collect();
    json!({
        "hub_cache": listing.hub_cache,
        "quantized_dir": listing.quantized_dir,
        "models": models,
        "variants": variants,
    })
}

fn render(v: &Value) -> String {
    let text = |x: &Value| x.as_str().unwrap_or("-").to_owned();
    let users = |x: &Value| {
        let names: Vec<&str> = x
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if names.is_empty() {
            "-".to_owned()
        } else {
            names.join(", ")
        }
    };
    let mut out = format!("Models in {}\n", text(&v["hub_cache"]));
    let mut rows = vec![
        ["REPO", "REVISION", "STATUS", "FILES", "SIZE", "SERVED BY"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for m in v["models"].as_array().into_iter().flatten() {
        let revisions = m["revisions"].as_array().cloned().unwrap_or_default();
        if revisions.is_empty() {
            rows.push(vec![
                text(&m["repo"]),
                "-".into(),
                "empty".into(),
                "0".into(),
                human(m["size_on_disk"].as_u64().unwrap_or(0)),
                users(&m["served_by"]),
            ]);
        }
        for r in revisions {
            let commit = text(&r["commit"]);
            let short = commit.get(..7).unwrap_or(&commit).to_owned();
            let refs: Vec<&str> = r["refs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let revision = if refs.is_empty() {
                short
            } else {
                format!("{} ({short})", refs.join(", "))
            };
            let mut served = users(&r["served_by"]);
            if served == "-" {
                served = users(&m["served_by"]);
            }
            rows.push(vec![
                text(&m["repo"]),
                revision,
                text(&r["status"]),
                r["files"].as_u64().unwrap_or(0).to_string(),
                human(r["size"].as_u64().unwrap_or(0)),
                served,
            ]);
        }
    }
    if rows.len() == 1 {
        out.push_str("  none (`sous pull ORG/NAME` fetches one)\n");
    } else {
        out.push_str(&table::layout_left(&rows, "  ", 3));
    }
    out.push_str(&format!(
        "\nQuantized variants in {}\n",
        text(&v["quantized_dir"])
    ));
    let mut rows = vec![
        [
            "NAME",
            "FROM",
            "SCHEME",
            "FORMAT",
            "DEVICE",
            "SOUS",
            "SIZE",
            "SERVED BY",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for q in v["variants"].as_array().into_iter().flatten() {
        let from = match (q["repo"].as_str(), q["commit"].as_str()) {
            (Some(repo), Some(commit)) => format!("{repo}@{}", commit.get(..7).unwrap_or(commit)),
            (Some(repo), None) => repo.to_owned(),
            _ => text(&q["source"]),
        };
        let complete = q["complete"].as_bool().unwrap_or(false);
        rows.push(vec![
            text(&q["name"]),
            if complete {
                from
            } else {
                "(incomplete: no completion marker)".into()
            },
            text(&q["scheme"]),
            text(&q["format"]),
            text(&q["device"]),
            text(&q["sous_version"]),
            human(q["size_on_disk"].as_u64().unwrap_or(0)),
            users(&q["served_by"]),
        ]);
    }
    if rows.len() == 1 {
        out.push_str("  none\n");
    } else {
        out.push_str(&table::layout_left(&rows, "  ", 6));
    }
    out
}

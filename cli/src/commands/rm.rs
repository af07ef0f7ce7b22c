//! `sous rm MODEL|MODEL@REVISION|VARIANT [--yes]`: removes a model from the Hub cache
//! (all of it, or one revision and the blobs no other revision links to) or a quantized
//! variant from sous's cache. It refuses while a running instance serves what it would
//! remove, and touches nothing sous or huggingface_hub did not write. Without `--yes` it
//! lists what it would remove first: on a terminal it asks, elsewhere it stops there
//! (a dry run).

use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use sous::hub::config::HubConfig;
use sous::instances;
use sous::inventory::{self, InventoryError, Target};
use sous_engine::paths;
use sous_engine::serve::instance::InstanceState;
use sous_engine::size::human;

use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous rm HuggingFaceTB/SmolLM2-135M-Instruct            every revision\n  sous rm HuggingFaceTB/SmolLM2-135M-Instruct@main --yes one revision\n  sous rm smollm2-135m-nvfp4                             a quantized variant (its recipe's name)"
)]
pub struct RmArgs {
    /// `org/name` (a model), `org/name@revision` (one revision: a ref or a commit), or a
    /// quantized variant's name (`sous list` shows them).
    name: String,
    /// Remove without asking.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Print what is (or would be) removed as JSON.
    #[arg(long)]
    json: bool,
}

/// Paths listed before the rest are counted.
const SHOWN: usize = 12;

pub fn exec(args: RmArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let hub = HubConfig::from_env();
    let listing = inventory::list(&hub.cache_dir, &paths::cache_dir().join("quantized"))?;
    let target = Target::parse(&args.name);
    let removal = inventory::plan_removal(&listing, &target)?;
    let live: Vec<InstanceState> = instances::scan(&paths::state_dir())?
        .iter()
        .filter_map(|e| e.live().cloned())
        .collect();
    let users = match &target {
        Target::Model(repo) => listing
            .models
            .iter()
            .filter(|m| &m.repo == repo)
            .flat_map(|m| inventory::served_by(&m.path, Some(repo), &live))
            .collect(),
        Target::Revision(repo, rev) => listing
            .models
            .iter()
            .filter(|m| &m.repo == repo)
            .flat_map(|m| m.revisions.iter())
            .filter(|r| &r.commit == rev || r.refs.contains(rev))
            .flat_map(|r| inventory::served_by(&r.path, None, &live))
            // An engine given the repository id reads whichever revision it resolves.
            .chain(
                live.iter()
                    .filter(|s| {
                        s.weights.is_none()
                            && s.model
                                .as_deref()
                                .is_some_and(|m| m.split('@').next() == Some(repo))
                    })
                    .map(|s| s.name.clone()),
            )
            .collect(),
        Target::Variant(_) => listing
            .variants
            .iter()
            .filter(|v| v.name == args.name)
            .flat_map(|v| inventory::served_by(&v.path, None, &live))
            .collect::<Vec<_>>(),
    };
    if let Some(user) = users.first()
        && let Some(state) = live.iter().find(|s| &s.name == user)
    {
        return Err(InventoryError::InUse {
            name: args.name.clone(),
            instance: user.clone(),
            url: state.url.clone(),
        }
        .into());
    }
    for kept in &removal.kept {
        shell.warn(&format!(
            "{} was not written by sous or huggingface_hub: left in place",
            kept.display()
        ));
    }
    if removal.paths.is_empty() {
        shell.status("nothing", &format!("to remove for `{}`", args.name));
        return Ok(ExitCode::SUCCESS);
    }
    let listing_text = describe(&removal);
    let go = if args.yes {
        true
    } else if !args.json && shell.interactive() {
        shell.data(&listing_text)?;
        shell.confirm(&format!("remove `{}` ({})?", args.name, human(removal.bytes)))?
    } else {
        false
    };
    if go {
        inventory::remove(&removal)?;
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&json!({
            "target": removal.target,
            "kind": removal.kind,
            "removed": go,
            "bytes": removal.bytes,
            "paths": removal.paths,
            "kept": removal.kept,
        }))?)?;
    } else if !go && !shell.interactive() {
        shell.data(&listing_text)?;
    }
    if go {
        shell.status(
            "removed",
            &format!("`{}`: {} freed", args.name, human(removal.bytes)),
        );
    } else if args.yes || shell.interactive() && !args.json {
        shell.status("kept", &format!("`{}`: nothing removed", args.name));
    } else {
        shell.status(
            "dry run",
            &format!("nothing removed; `sous rm {} --yes` removes it", args.name),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What a removal deletes, for people: the first paths and a count of the rest.
fn describe(removal: &inventory::Removal) -> String {
    let mut out = format!(
        "would remove {} `{}`: {} entries, {}\n",
        removal.kind,
        removal.target,
        removal.paths.len(),
        human(removal.bytes)
    );
    for path in removal.paths.iter().take(SHOWN) {
        out.push_str(&format!("  {}\n", path.display()));
    }
    if removal.paths.len() > SHOWN {
        out.push_str(&format!("  ... and {} more\n", removal.paths.len() - SHOWN));
    }
    out
}

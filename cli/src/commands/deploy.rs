//! `sous deploy render` and `sous deploy diff`: a recipe as Kubernetes manifests, a
//! compose file or systemd units, printed, written into a directory, or compared with
//! one. The rendering is the library's (`sous::deploy`); this file parses the flags,
//! sizes the model volume when the recipe does not, and says what happened.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use sous::deploy::{self, Options, Rendering, Target};
use sous::hub::config::HubConfig;
use sous_engine::recipe::Recipe;

use super::{OverrideArgs, RecipeArg, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Subcommand)]
pub enum DeployCommand {
    /// Render the recipe for Kubernetes, compose or systemd: one stream on stdout, or
    /// one file per object with --out (plus a kustomization.yaml for Kubernetes).
    Render(RenderArgs),
    /// Show what rendering the recipe would change in a directory (exit 1 when it
    /// would change anything, as `git diff --exit-code`).
    Diff(DiffArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TargetArg {
    /// Kubernetes manifests (Deployment or LeaderWorkerSet, claim, ConfigMap, Service).
    K8s,
    /// A docker-compose.yml for one machine.
    Compose,
    /// systemd units running `sous serve`.
    Systemd,
}

impl From<TargetArg> for Target {
    fn from(t: TargetArg) -> Target {
        match t {
            TargetArg::K8s => Target::K8s,
            TargetArg::Compose => Target::Compose,
            TargetArg::Systemd => Target::Systemd,
        }
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous deploy render --recipe recipes/dgx-spark/qwen3.8-27b-nvfp4.toml | kubectl apply -f -\n  sous deploy render --recipe my.toml --out deploy/ --target compose"
)]
pub struct RenderArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// What to render for.
    #[arg(long, value_enum, default_value = "k8s")]
    target: TargetArg,
    /// Write one file per object into this directory instead of printing.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// With --out: replace files sous did not write.
    #[arg(long, requires = "out")]
    force: bool,
    /// systemd: where the `sous` binary is on the machine that runs the units.
    #[arg(long, value_name = "PATH", default_value = deploy::pod::SOUS_IN_IMAGE)]
    sous_bin: String,
    /// systemd: where the router's program is on that machine (default: its name,
    /// found on systemd's search path).
    #[arg(long, value_name = "PATH")]
    router_bin: Option<String>,
    /// Print JSON: the files and warnings, or with --out what was written.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  sous deploy diff --recipe my.toml deploy/   # exit 1 when the rendering changed"
)]
pub struct DiffArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// The directory a `sous deploy render --out` wrote.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// What the directory was rendered for. Default: what its last rendering says.
    #[arg(long, value_enum)]
    target: Option<TargetArg>,
    /// systemd: where the `sous` binary is on the machine that runs the units.
    #[arg(long, value_name = "PATH", default_value = deploy::pod::SOUS_IN_IMAGE)]
    sous_bin: String,
    /// systemd: where the router's program is on that machine (default: its name,
    /// found on systemd's search path).
    #[arg(long, value_name = "PATH")]
    router_bin: Option<String>,
    #[command(flatten)]
    overrides: OverrideArgs,
}

pub fn exec(command: DeployCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match command {
        DeployCommand::Render(args) => render(args, shell),
        DeployCommand::Diff(args) => diff(args, shell),
    }
}

fn render(args: RenderArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let recipe = load(&args.recipe.recipe, &args.overrides, shell)?;
    let rendering = rendered(
        &recipe,
        args.target.into(),
        (&args.sous_bin, args.router_bin.as_deref()),
        &args.recipe.recipe,
    )?;
    for w in &rendering.warnings {
        shell.warn(w);
    }
    match &args.out {
        None if args.json => {
            let files: Vec<_> = rendering
                .files
                .iter()
                .map(|f| json!({"name": f.name, "contents": f.contents}))
                .collect();
            shell.data(&serde_json::to_string_pretty(&json!({
                "target": rendering.target.as_str(),
                "files": files,
                "warnings": rendering.warnings,
            }))?)?;
        }
        None => shell.data(rendering.stream().trim_end())?,
        Some(dir) => {
            let written = deploy::out::write(&rendering, dir, args.force)?;
            if args.json {
                shell.data(&serde_json::to_string_pretty(&json!({
                    "target": rendering.target.as_str(),
                    "dir": dir,
                    "changed": written.changed,
                    "unchanged": written.unchanged,
                    "removed": written.removed,
                    "warnings": rendering.warnings,
                }))?)?;
            }
            let mut summary = format!(
                "{} files in {} ({} changed",
                rendering.files.len(),
                display(dir),
                written.changed.len()
            );
            if !written.removed.is_empty() {
                summary.push_str(&format!(
                    ", {} removed: {}",
                    written.removed.len(),
                    written.removed.join(", ")
                ));
            }
            summary.push(')');
            shell.status("rendered", &summary);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn diff(args: DiffArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let recipe = load(&args.recipe.recipe, &args.overrides, shell)?;
    let target = match args.target {
        Some(t) => t.into(),
        None => match deploy::out::rendered_target(&args.dir)?.as_deref() {
            Some("compose") => Target::Compose,
            Some("systemd") => Target::Systemd,
            Some("k8s") => Target::K8s,
            _ => {
                return Err(UserError::new(
                    format!(
                        "{} was not rendered by `sous deploy render --out`",
                        display(&args.dir)
                    ),
                    Some("pass --target to compare it anyway"),
                )
                .into());
            }
        },
    };
    let rendering = rendered(
        &recipe,
        target,
        (&args.sous_bin, args.router_bin.as_deref()),
        &args.recipe.recipe,
    )?;
    let text = deploy::out::diff(&rendering, &args.dir)?;
    if text.is_empty() {
        shell.status(
            "unchanged",
            &format!("{} is as the recipe renders it", display(&args.dir)),
        );
        return Ok(ExitCode::SUCCESS);
    }
    shell.data(text.trim_end())?;
    Ok(ExitCode::from(1))
}

fn load(path: &Path, overrides: &OverrideArgs, shell: &Shell) -> anyhow::Result<Recipe> {
    let loaded = load_recipe(path, overrides)?;
    for w in &loaded.warnings {
        shell.warn(&w.message);
    }
    Ok(loaded.recipe)
}

/// Renders, asking the disk or the Hub for the model's size only when the volume sous
/// creates has no `deploy.storage.size`.
/// `bins`: where the `sous` binary and the router are on a systemd machine.
fn rendered(
    recipe: &Recipe,
    target: Target,
    (sous_bin, router_bin): (&str, Option<&str>),
    file: &Path,
) -> anyhow::Result<Rendering> {
    let storage = &recipe.deploy.storage;
    let model_bytes = if target == Target::K8s && storage.size.is_none() && storage.existing_claim.is_none() {
        let runtime = super::runtime()?;
        runtime.block_on(deploy::model_bytes(recipe, &HubConfig::from_env()))
    } else {
        None
    };
    let starts = sous_engine::serve::starts::read(&sous_engine::paths::state_dir().join(&recipe.name));
    let options = Options {
        model_bytes,
        sous_bin: sous_bin.to_owned(),
        router_bin: router_bin.map(str::to_owned),
        starts,
    };
    deploy::render(recipe, target, &options).with_context(|| format!("recipe {}", display(file)))
}

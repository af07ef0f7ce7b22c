//! `sous recipe check FILE...` and `sous recipe schema`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use sous_engine::launch;
use sous_engine::recipe::{EngineKind, Loaded, schema};

use super::{OverrideArgs, display, load_recipe};
use crate::failure::{self, Reported};
use crate::shell::Shell;

#[derive(Debug, Subcommand)]
pub enum RecipeCommand {
    /// Validate recipes (with their `extends` chain, SOUS_* variables and --set) and print
    /// each resolved, as TOML or JSON.
    Check(CheckArgs),
    /// Print the recipe JSON Schema (or the Markdown reference) generated from sous's types.
    Schema(SchemaArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous recipe check recipes/local/*.toml\n  sous recipe check my.toml --set serving.max_model_len=16384 --json"
)]
pub struct CheckArgs {
    /// Recipe files.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print a JSON array, one object per file: {"file", "ok", "recipe" | "error", "warnings"}.
    #[arg(long)]
    json: bool,
    /// Treat warnings as errors.
    #[arg(long)]
    deny_warnings: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Print the Markdown reference (docs/recipe.md) instead of the JSON Schema.
    #[arg(long)]
    markdown: bool,
}

pub fn exec(cmd: RecipeCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cmd {
        RecipeCommand::Check(args) => check(args, shell),
        RecipeCommand::Schema(args) => {
            shell.data(&if args.markdown {
                schema::markdown()
            } else {
                schema::json_schema()
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(args: CheckArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let mut failed = 0;
    let mut reports = Vec::new();
    let mut texts = Vec::new();
    for file in &args.files {
        match check_one(file, &args.overrides) {
            Ok((loaded, warnings)) => {
                for w in &warnings {
                    shell.warn(&format!("{}: {w}", display(file)));
                }
                if args.deny_warnings && !warnings.is_empty() {
                    failed += 1;
                    shell.error(
                        &format!("{}: warnings are denied (--deny-warnings)", display(file)),
                        None,
                    );
                }
                let resolved = loaded.recipe.to_file();
                if args.json {
                    reports.push(json!({
                        "file": file,
                        "ok": !args.deny_warnings || warnings.is_empty(),
                        "recipe": resolved,
                        "warnings": warnings,
                    }));
                } else {
                    let toml = toml::to_string(&resolved).context("writing the resolved recipe as TOML")?;
                    let header = if args.files.len() > 1 {
                        format!("# {}\n", display(file))
                    } else {
                        String::new()
                    };
                    texts.push(format!("{header}{toml}"));
                    shell.status(
                        "ok",
                        &format!(
                            "{} ({} on {})",
                            display(file),
                            loaded.recipe.name,
                            loaded.recipe.engine.kind
                        ),
                    );
                }
            }
            Err(err) => {
                failed += 1;
                if args.json {
                    let (_, hint) = failure::classify(&err);
                    reports.push(json!({
                        "file": file,
                        "ok": false,
                        "error": { "message": failure::message(&err), "hint": hint },
                        "warnings": [],
                    }));
                }
                failure::print(shell, &err);
            }
        }
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&reports)?)?;
    } else if !texts.is_empty() {
        shell.data(&texts.join("\n"))?;
    }
    if failed > 0 {
        let summary = if args.files.len() > 1 {
            format!("{failed} of {} recipes failed the check", args.files.len())
        } else {
            String::new()
        };
        return Err(Reported(summary).into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and resolves a recipe, then renders it for its engine so that what the engine
/// cannot honour is caught too. Returns every warning.
fn check_one(file: &std::path::Path, overrides: &OverrideArgs) -> anyhow::Result<(Loaded, Vec<String>)> {
    let loaded = load_recipe(file, overrides)?;
    let mut warnings: Vec<String> = loaded.warnings.iter().map(|w| w.message.clone()).collect();
    // The one setting checked against this machine: a floor it cannot keep.
    sous_engine::serve::check_host_floor(loaded.recipe.memory.host_floor)
        .with_context(|| format!("recipe {}", display(file)))?;
    if loaded.recipe.engine.kind != EngineKind::Native {
        let ctx = sous::pipeline::session::setup().render_context(&loaded.recipe, None);
        let rendered =
            launch::render(&loaded.recipe, &ctx).with_context(|| format!("recipe {}", display(file)))?;
        warnings.extend(rendered.warnings.into_iter().map(|w| w.message));
    }
    Ok((loaded, warnings))
}

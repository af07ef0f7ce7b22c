//! `sous serve --recipe FILE`: for now, `--dry-run` only: the engine's exact command
//! line, environment and option files for the recipe.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use sous_engine::launch::{self, RenderContext};

use super::{OverrideArgs, RecipeArg, display, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// Print the engine's command line, environment and option files instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: print {"argv": [...], "env": {...}, "files": [...], ...} as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

pub fn exec(args: ServeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let loaded = load_recipe(&args.recipe.recipe, &args.overrides)?;
    for w in &loaded.warnings {
        shell.warn(&w.message);
    }
    if !args.dry_run {
        return Err(UserError::new(
            "`sous serve` cannot start engines yet: only `--dry-run` is implemented",
            Some("run `sous serve --recipe FILE --dry-run` and start the printed command yourself"),
        )
        .into());
    }
    let recipe = &loaded.recipe;
    let ctx = RenderContext {
        instance_dir: sous_engine::paths::instance_dir(&recipe.name),
    };
    let rendered =
        launch::render(recipe, &ctx).with_context(|| format!("recipe {}", display(&args.recipe.recipe)))?;
    for w in &rendered.warnings {
        shell.warn(&w.message);
    }
    if rendered.version_assumed {
        shell.warn(&format!(
            "`engine.version` is not set: rendered for {} {}, the newest release sous knows",
            recipe.engine.kind.display_name(),
            rendered.version
        ));
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&rendered)?)?;
    } else {
        shell.data(&rendered.to_shell())?;
    }
    Ok(ExitCode::SUCCESS)
}

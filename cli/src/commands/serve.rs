//! `sous serve --recipe FILE`: build what the recipe serves (pull, quantize) and run
//! its engine under supervision until Ctrl-C; `--dry-run` prints the exact command
//! line, environment and option files instead; `--replace` swaps a running instance
//! of the recipe for this one. The work is the library's pipeline; this file parses
//! the flags and says what happened.
//!
//! The native engine runs under the same supervisor as a `sous serve
//! --engine-process` child, which this file also defines.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use sous::pipeline::session::{ENGINE_PROCESS, setup};
use sous::pipeline::{self, Started};
use sous_engine::launch;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::reporter::Reporter;

use super::{OverrideArgs, RecipeArg, display, load_recipe, shutdown_signal};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous serve --recipe recipes/local/smollm2-135m.toml\n  sous serve --recipe recipes/dgx-spark/qwen3.8-27b-nvfp4.toml --dry-run\n  sous serve --recipe my.toml --replace --set memory.gpu_utilization=0.85"
)]
pub struct ServeArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// Print the engine's command line, environment and option files instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: print {"argv": [...], "env": {...}, "files": [...], ...} as JSON.
    #[arg(long, requires = "dry_run")]
    json: bool,
    /// Refuse to start when the model is not already on disk, instead of pulling it.
    #[arg(long)]
    no_build: bool,
    /// Replace the instance a previous `sous serve` runs for this recipe's name: nothing
    /// happens if its recipe is unchanged and it is healthy; otherwise this one starts
    /// and the old one stops once this one is ready (or first, when both cannot run at
    /// once, which is said).
    #[arg(long, conflicts_with = "dry_run")]
    replace: bool,
    /// Serve the native engine in this process (what `sous serve` runs for a native recipe).
    #[arg(long = ENGINE_PROCESS, hide = true, conflicts_with_all = ["dry_run", "replace"])]
    engine_process: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

pub fn exec(args: ServeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let loaded = load_recipe(&args.recipe.recipe, &args.overrides)?;
    for w in &loaded.warnings {
        shell.warn(&w.message);
    }
    let recipe = loaded.recipe;
    if args.engine_process {
        return engine_process(&recipe, shell);
    }
    let setup = setup();
    let mut ctx = setup.render_context(&recipe, None);
    if args.dry_run {
        // The caches' directory as a start would key it now (it is created then).
        let gpus: Vec<String> = sous::devices::for_recipe(&recipe)
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.name)
            .collect();
        ctx.compile_cache = setup.compile_cache(&recipe, &gpus).map(|(_, dir)| dir);
    }
    let rendered =
        launch::render(&recipe, &ctx).with_context(|| format!("recipe {}", display(&args.recipe.recipe)))?;
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
    if args.dry_run {
        if args.json {
            shell.data(&serde_json::to_string_pretty(&rendered)?)?;
        } else {
            shell.data(&rendered.to_shell())?;
        }
        return Ok(ExitCode::SUCCESS);
    }

    let reporter: Arc<dyn Reporter> = Arc::new(shell.clone());
    let runtime = super::runtime()?;
    let running = pipeline::running(&recipe, &setup, args.replace, shell)?;
    let built = runtime.block_on(pipeline::build(&recipe, &setup, args.no_build, &reporter))?;
    runtime.block_on(async {
        match pipeline::start(&built, &setup, running, reporter).await? {
            Started::Unchanged(_) => {}
            Started::Running(instance) => {
                instance.run_until(shutdown_signal()).await?;
                shell.status("stopped", &recipe.name);
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The native engine's process (`sous serve --engine-process`): serves the model the
/// resolved recipe names, in this process, until SIGINT/SIGTERM.
fn engine_process(recipe: &Recipe, shell: &Shell) -> anyhow::Result<ExitCode> {
    let dir = match (&recipe.model.path, recipe.engine.kind) {
        (Some(path), EngineKind::Native) => PathBuf::from(path),
        _ => {
            return Err(UserError::new(
                format!("--{ENGINE_PROCESS} serves a native recipe with `model.path` set"),
                Some("run `sous serve --recipe FILE`: it builds the model and starts this process itself"),
            )
            .into());
        }
    };
    let runtime = super::runtime()?;
    serve_native(&runtime, recipe, &dir, shell)
}

/// Runs the native engine in this process until SIGINT/SIGTERM.
fn serve_native(
    runtime: &tokio::runtime::Runtime,
    recipe: &Recipe,
    dir: &std::path::Path,
    shell: &Shell,
) -> anyhow::Result<ExitCode> {
    use sous_engine::native::{Engine, Settings, http};
    let settings = Settings::from_recipe(recipe, dir)?;
    shell.status("loading", &format!("{} with the native engine", dir.display()));
    let reporter: Arc<dyn Reporter> = Arc::new(shell.clone());
    let engine = Engine::load(settings, reporter.clone())?;
    runtime.block_on(http::serve(engine, reporter, shutdown_signal()))?;
    shell.status("stopped", &recipe.name);
    Ok(ExitCode::SUCCESS)
}

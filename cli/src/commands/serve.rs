//! `sous serve --recipe FILE`: make sure the model is there (pull), then run the
//! recipe's engine under supervision; `--dry-run` prints the exact command line,
//! environment and option files instead.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use sha2::{Digest, Sha256};
use sous_engine::launch;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::serve::{self, Event, Outcome};

use super::{OverrideArgs, RecipeArg, display, load_recipe, shutdown_signal};
use crate::failure::UserError;
use crate::hub::api::HubClient;
use crate::hub::config::HubConfig;
use crate::hub::progress::Style;
use crate::hub::pull::{PullRequest, pull};
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
    /// Refuse to start when the model is not already on disk, instead of pulling it.
    #[arg(long)]
    no_build: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

pub fn exec(args: ServeArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let loaded = load_recipe(&args.recipe.recipe, &args.overrides)?;
    for w in &loaded.warnings {
        shell.warn(&w.message);
    }
    let recipe = loaded.recipe;
    let ctx = super::render_context(&recipe);
    if recipe.engine.kind == EngineKind::Native && !args.dry_run {
        return Err(UserError::new(
            "the native engine is not built yet: `sous serve` can run vLLM, SGLang and TensorRT-LLM",
            Some("set `engine.kind` to `vllm`, `sglang` or `trtllm`"),
        )
        .into());
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

    let runtime = super::runtime()?;
    runtime.block_on(build(&recipe, args.no_build, shell))?;
    let hash = recipe_hash(&recipe)?;
    let echo = shell.clone();
    let prefix = recipe.engine.kind.as_str().to_owned();
    let on_event: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(move |event| report(&echo, &prefix, event));
    let result = runtime.block_on(serve::run(&recipe, &ctx, &hash, on_event, shutdown_signal()));
    match result {
        Ok(Outcome::Stopped) => {
            shell.status("stopped", &recipe.name);
            Ok(ExitCode::SUCCESS)
        }
        Ok(Outcome::GaveUp(code)) => {
            shell.error(
                &format!(
                    "the engine crashed more than {} times in 10 minutes; giving up with its exit code {code}",
                    recipe.engine.restarts
                ),
                Some(&format!("read {}", ctx.instance_dir.join("engine.log").display())),
            );
            Ok(ExitCode::from(clamp(code)))
        }
        Err(e) => {
            let (hint, code) = (e.hint(), e.exit_code());
            shell.error(&format!("{:#}", anyhow::Error::new(e)), hint.as_deref());
            // The engine's own exit code when it has one.
            Ok(ExitCode::from(code.map_or(crate::failure::USER, clamp)))
        }
    }
}

fn clamp(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(1).max(1)
}

/// Makes sure what the recipe serves is on disk: pulls the model when the recipe names
/// a Hub repository and it is not complete yet (a no-op when it is).
async fn build(recipe: &Recipe, no_build: bool, shell: &Shell) -> anyhow::Result<()> {
    if let Some(quantize) = &recipe.quantize {
        return Err(UserError::new(
            format!(
                "the recipe asks for a {:?} checkpoint, and `sous quantize` is not built yet",
                quantize.scheme
            ),
            Some("remove `[quantize]` to serve the model as it is, or point `model.path` at a quantized checkpoint"),
        )
        .into());
    }
    let Some(repo) = &recipe.model.repo else {
        let path = recipe.model.path.as_deref().unwrap_or_default();
        if recipe.engine.runtime == sous_engine::recipe::Runtime::Host && !std::path::Path::new(path).exists()
        {
            return Err(UserError::new(
                format!("`model.path` `{path}` does not exist"),
                Some("set `model.repo` so that `sous serve` can pull it, or fix the path"),
            )
            .into());
        }
        return Ok(());
    };
    let config = HubConfig::from_env();
    let request = PullRequest {
        repo: repo.clone(),
        revision: recipe.model.revision.clone().unwrap_or_else(|| "main".into()),
        include: Vec::new(),
        exclude: Vec::new(),
        local_dir: recipe.model.path.as_ref().map(std::path::PathBuf::from),
        offline: no_build || config.offline,
        connections: 16,
        progress: Style::detect(),
    };
    let client = HubClient::new(config)?;
    match pull(&client, &request).await {
        Ok(report) if report.up_to_date => {
            shell.status("model", &format!("{repo} is on disk ({})", report.path.display()));
            Ok(())
        }
        Ok(report) => {
            shell.status("pulled", &format!("{repo} into {}", report.path.display()));
            Ok(())
        }
        Err(crate::hub::pull::PullError::NotCached { .. }) if no_build => Err(UserError::new(
            format!("`{repo}` is not on disk and --no-build forbids pulling it"),
            Some("run `sous pull` first, or drop --no-build"),
        )
        .into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("pulling {repo}"))),
    }
}

fn recipe_hash(recipe: &Recipe) -> anyhow::Result<String> {
    let toml = toml::to_string(&recipe.to_file()).context("hashing the recipe")?;
    Ok(hex::encode(Sha256::digest(toml.as_bytes())))
}

fn report(shell: &Shell, prefix: &str, event: Event) {
    match event {
        Event::Launching {
            attempt,
            utilization,
            log,
        } => {
            let fraction = utilization.map_or(String::new(), |u| format!(" at memory fraction {u}"));
            let again = if attempt > 1 {
                format!(" (attempt {attempt})")
            } else {
                String::new()
            };
            shell.status(
                "starting",
                &format!("{prefix}{fraction}{again}; log: {}", log.display()),
            );
        }
        Event::Output(line) => shell.engine_line(prefix, &line),
        Event::OomFallback { failed, next } => shell.warn(&format!(
            "the engine ran out of memory at start-up{}; retrying with `memory.gpu_utilization = {next}`",
            failed.map_or(String::new(), |f| format!(" with memory fraction {f}"))
        )),
        Event::Ready {
            url,
            seconds,
            utilization,
            capacity,
        } => {
            let fraction = utilization.map_or(String::new(), |u| format!(", memory fraction {u}"));
            let kv = capacity.map_or(String::new(), |c| {
                let concurrency = c
                    .max_concurrency
                    .map_or(String::new(), |x| format!(", max concurrency {x}x"));
                format!(", KV cache {} tokens{concurrency}", c.tokens)
            });
            shell.status("ready", &format!("{url} after {seconds:.1} s{fraction}{kv}"));
        }
        Event::Restarting { code, after, left } => shell.warn(&format!(
            "the engine exited with code {code}; restarting in {} s ({left} restarts left)",
            after.as_secs()
        )),
        Event::Stopping => shell.status("stopping", "sending SIGTERM to the engine"),
    }
}

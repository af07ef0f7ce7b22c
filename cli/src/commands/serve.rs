//! `sous serve --recipe FILE`: make sure the model is there (pull, quantize), then run
//! the recipe's engine under supervision; `--dry-run` prints the exact command line,
//! environment and option files instead; `--replace` swaps a running instance of the
//! recipe for this one. The native engine runs under the same supervisor, as a
//! `sous serve --engine-process` child.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use sha2::{Digest, Sha256};
use sous_engine::launch;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::serve::{self, Event, Outcome, instance};

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
    /// Replace the instance a previous `sous serve` runs for this recipe's name: nothing
    /// happens if its recipe is unchanged and it is healthy; otherwise this one starts
    /// and the old one stops once this one is ready (or first, when both cannot run at
    /// once, which is said).
    #[arg(long, conflicts_with = "dry_run")]
    replace: bool,
    /// Serve the native engine in this process (what `sous serve` runs for a native recipe).
    #[arg(long, hide = true, conflicts_with_all = ["dry_run", "replace"])]
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
    let ctx = super::render_context(&recipe);
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
    let running = instance::read_live(&ctx.instance_dir)?;
    if let Some(old) = &running
        && !args.replace
    {
        return Err(UserError::new(
            format!(
                "recipe `{}` is already being served by sous (pid {}) at {}",
                recipe.name, old.sous_pid, old.url
            ),
            Some(&format!(
                "pass --replace to swap it for this recipe, or stop it first (`kill {}`)",
                old.sous_pid
            )),
        )
        .into());
    }
    let mut recipe = recipe;
    let dir = runtime.block_on(build(&recipe, args.no_build, shell))?;
    if recipe.quantize.is_some() || recipe.engine.kind == EngineKind::Native {
        // Serve the checkpoint the build step made, as the dry run cannot know it.
        recipe.model.path = Some(dir.display().to_string());
        recipe.model.repo = None;
        recipe.model.revision = None;
    }
    if recipe.engine.kind == EngineKind::Native {
        // What the engine process would refuse, refused here before it starts.
        sous_engine::native::Settings::from_recipe(&recipe, &dir).map_err(native_error)?;
        sous_engine::native::config::ModelConfig::read(&dir).map_err(native_error)?;
    }
    let hash = recipe_hash(&recipe)?;
    let replacing = match running {
        None if args.replace => {
            shell.status(
                "replace",
                &format!("no instance of `{}` is running; starting one", recipe.name),
            );
            None
        }
        None => None,
        Some(old) => {
            if old.recipe_hash == hash && runtime.block_on(old.healthy()) {
                shell.status(
                    "unchanged",
                    &format!(
                        "`{}` already serves this recipe at {} (sous pid {}); nothing to do",
                        recipe.name, old.url, old.sous_pid
                    ),
                );
                return Ok(ExitCode::SUCCESS);
            }
            match instance::can_overlap(&old, &recipe) {
                Ok(()) => {
                    shell.status(
                        "replacing",
                        &format!(
                            "`{}` (sous pid {} at {}): the new instance starts beside it, the old one stops once the new one is ready",
                            recipe.name, old.sous_pid, old.url
                        ),
                    );
                    Some(old)
                }
                Err(why) => {
                    shell.warn(&format!(
                        "stopping the running instance (sous pid {}) before starting the new one: {why}; {} does not answer until the new one is ready",
                        old.sous_pid, old.url
                    ));
                    let took = runtime.block_on(old.stop(old.grace()));
                    shell.status(
                        "stopped",
                        &format!("the old instance in {:.1} s", took.as_secs_f64()),
                    );
                    None
                }
            }
        }
    };
    let echo = shell.clone();
    let prefix = recipe.engine.kind.as_str().to_owned();
    let on_event: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(move |event| report(&echo, &prefix, event));
    let result = runtime.block_on(serve::run(
        &recipe,
        &ctx,
        &hash,
        replacing,
        on_event,
        shutdown_signal(),
    ));
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

/// The native engine's process (`sous serve --engine-process`): serves the model the
/// resolved recipe names, in this process, until SIGINT/SIGTERM.
fn engine_process(recipe: &Recipe, shell: &Shell) -> anyhow::Result<ExitCode> {
    let dir = match (&recipe.model.path, recipe.engine.kind) {
        (Some(path), EngineKind::Native) => std::path::PathBuf::from(path),
        _ => {
            return Err(UserError::new(
                "--engine-process serves a native recipe with `model.path` set",
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
    let started = std::time::Instant::now();
    let settings = Settings::from_recipe(recipe, dir).map_err(native_error)?;
    shell.status("loading", &format!("{} with the native engine", dir.display()));
    let echo = shell.clone();
    let log: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |line| echo.log_line(&line));
    let engine = Engine::load(settings, log.clone()).map_err(native_error)?;
    let (kv_tokens, concurrency) = (engine.kv_tokens, engine.max_concurrency);
    let echo = shell.clone();
    let on_event: Arc<dyn Fn(http::ServerEvent) + Send + Sync> = Arc::new(move |event| match event {
        http::ServerEvent::Log(line) => log(line),
        http::ServerEvent::Ready { url, .. } => echo.status(
            "listening",
            &format!(
                "on {url} after {:.1} s, KV cache {kv_tokens} tokens, max concurrency {concurrency:.2}x",
                started.elapsed().as_secs_f64()
            ),
        ),
    });
    runtime
        .block_on(http::serve(engine, on_event, shutdown_signal()))
        .map_err(native_error)?;
    shell.status("stopped", &recipe.name);
    Ok(ExitCode::SUCCESS)
}

fn native_error(e: sous_engine::native::NativeError) -> anyhow::Error {
    if e.is_internal() {
        anyhow::Error::new(e)
    } else {
        let hint = e.hint();
        UserError::new(e.to_string(), hint.as_deref()).into()
    }
}

/// Makes sure what the recipe serves is on disk and returns its directory: pulls the
/// model when the recipe names a Hub repository and it is not complete yet, then, when
/// the recipe has `[quantize]`, quantizes it unless an up-to-date checkpoint of the
/// same source commit, settings and sous version exists (both are no-ops when done).
async fn build(recipe: &Recipe, no_build: bool, shell: &Shell) -> anyhow::Result<std::path::PathBuf> {
    let (source, provenance) = fetch(recipe, no_build, shell).await?;
    let Some(quantize) = &recipe.quantize else {
        return Ok(source);
    };
    let out = sous_engine::paths::quantized_dir(&recipe.name);
    let request = crate::quantize::Request {
        source,
        out: out.clone(),
        scheme: quantize.scheme,
        format: quantize.format,
        modelopt_export: crate::quantize::ModelOptExport::Gpu,
        ignore: quantize.ignore.clone(),
        max_shard_bytes: 5_000_000_000,
        force: true,
        digests: false,
        provenance,
        progress: Style::detect(),
        window_bytes: crate::quantize::DEFAULT_WINDOW,
    };
    if no_build {
        // Serve the checkpoint there is, without checking it against the recipe.
        if !out.join(crate::quantize::MARKER).is_file() {
            return Err(UserError::new(
                format!(
                    "the recipe's quantized checkpoint {} does not exist and --no-build forbids making it",
                    out.display()
                ),
                Some("run `sous quantize --recipe` first, or drop --no-build"),
            )
            .into());
        }
        shell.status(
            "quantized",
            &format!("{} (not rebuilt: --no-build)", out.display()),
        );
        return Ok(out);
    }
    let summary = tokio::task::spawn_blocking(move || crate::quantize::run(&request))
        .await
        .context("the quantization thread failed")??;
    if summary.up_to_date {
        shell.status(
            "quantized",
            &format!("{} is up to date", summary.output.display()),
        );
    } else {
        shell.status(
            "quantized",
            &format!(
                "{} weights to {} in {:.1} s",
                summary.quantized,
                summary.output.display(),
                summary.seconds
            ),
        );
    }
    Ok(summary.output)
}

/// Pulls the recipe's model if needed; returns its directory and, for a Hub model, where
/// it came from.
async fn fetch(
    recipe: &Recipe,
    no_build: bool,
    shell: &Shell,
) -> anyhow::Result<(std::path::PathBuf, Option<crate::quantize::Provenance>)> {
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
        return Ok((std::path::PathBuf::from(path), None));
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
    let provenance = |report: &crate::hub::pull::PullReport| {
        Some(crate::quantize::Provenance {
            repo: Some(repo.clone()),
            commit: Some(report.commit.clone()),
        })
    };
    match pull(&client, &request).await {
        Ok(report) if report.up_to_date => {
            shell.status("model", &format!("{repo} is on disk ({})", report.path.display()));
            Ok((report.path.clone(), provenance(&report)))
        }
        Ok(report) => {
            shell.status("pulled", &format!("{repo} into {}", report.path.display()));
            Ok((report.path.clone(), provenance(&report)))
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
        Event::Replaced { sous_pid, seconds } => shell.status(
            "replaced",
            &format!(
                "the previous instance (sous pid {sous_pid}) stopped {seconds:.1} s after this one was ready"
            ),
        ),
        Event::Stopping => shell.status("stopping", "sending SIGTERM to the engine"),
    }
}

//! The start step: an instance of a built recipe, supervised, with `--replace`'s
//! rules for an instance of the same recipe that already runs (unchanged and
//! healthy: nothing to do; otherwise the new one starts beside the old one, or after
//! it when both cannot run at once, which is said).

use std::sync::Arc;

use sous_engine::launch::caches::Contents;
use sous_engine::recipe::Recipe;
use sous_engine::reporter::Reporter;
use sous_engine::serve::{Instance, InstanceState, Prepared, instance};

use super::{Built, PipelineError, Setup};

/// What [`start`] did.
pub enum Started {
    /// The running instance already serves this recipe and is healthy: nothing was
    /// started.
    Unchanged(InstanceState),
    /// A new instance is starting; [`Instance::ready`] waits for it.
    Running(Instance),
}

/// The instance of `recipe` that runs now, if any. Without `replace` a running one is
/// an error, found before the build so that nothing is pulled for a recipe that
/// cannot be served.
pub fn running(
    recipe: &Recipe,
    setup: &Setup,
    replace: bool,
    reporter: &dyn Reporter,
) -> Result<Option<InstanceState>, PipelineError> {
    match instance::read_live(&setup.instance_dir(recipe))? {
        Some(old) if !replace => Err(PipelineError::AlreadyServed {
            name: recipe.name.clone(),
            pid: old.sous_pid,
            url: old.url,
        }),
        None if replace => {
            reporter.status(
                "replace",
                &format!("no instance of `{}` is running; starting one", recipe.name),
            );
            Ok(None)
        }
        found => Ok(found),
    }
}

/// Starts `built` under a supervisor on the current tokio runtime. `running` is what
/// [`running`] found: it is left alone when it serves this very recipe and is
/// healthy, replaced otherwise.
pub async fn start(
    built: &Built,
    setup: &Setup,
    running: Option<InstanceState>,
    reporter: Arc<dyn Reporter>,
) -> Result<Started, PipelineError> {
    let recipe = &built.recipe;
    let hash = built.hash(setup)?;
    let replacing = match running {
        None => None,
        Some(old) => {
            if old.recipe_hash == hash && old.healthy().await {
                reporter.status(
                    "unchanged",
                    &format!(
                        "`{}` already serves this recipe at {} (sous pid {}); nothing to do",
                        recipe.name, old.url, old.sous_pid
                    ),
                );
                return Ok(Started::Unchanged(old));
            }
            match instance::can_overlap(&old, recipe) {
                Ok(()) => {
                    reporter.status(
                        "replacing",
                        &format!(
                            "`{}` (sous pid {} at {}): the new instance starts beside it, the old one stops once the new one is ready",
                            recipe.name, old.sous_pid, old.url
                        ),
                    );
                    Some(old)
                }
                Err(why) => {
                    reporter.warn(&format!(
                        "stopping the running instance (sous pid {}) before starting the new one: {why}; {} does not answer until the new one is ready",
                        old.sous_pid, old.url
                    ));
                    let took = old.stop(old.grace()).await;
                    reporter.status(
                        "stopped",
                        &format!("the old instance in {:.1} s", took.as_secs_f64()),
                    );
                    None
                }
            }
        }
    };
    Ok(Started::Running(launch(built, setup, replacing, reporter)?))
}

/// Starts `built` under a supervisor on the current tokio runtime, beside `replacing`
/// when there is one (stopped once the new instance is ready), without looking for a
/// running instance: for callers that checked with [`running`] that none runs.
pub fn launch(
    built: &Built,
    setup: &Setup,
    replacing: Option<InstanceState>,
    reporter: Arc<dyn Reporter>,
) -> Result<Instance, PipelineError> {
    let mut ctx = built.render_context(setup);
    let hash = built.hash(setup)?;
    // The GPUs' memory now, after any instance that had to stop first has stopped.
    let devices = match crate::devices::for_recipe(&built.recipe) {
        Ok(devices) => devices,
        Err(why) => {
            // No driver at all is a CPU machine (vLLM's CPU backend, a test double):
            // nothing to check. A driver that does not answer is worth a word.
            if sous_kernels::cuda::driver_present() {
                reporter.warn(&format!(
                    "the GPUs' memory was not checked before the start: {why}"
                ));
            }
            Vec::new()
        }
    };
    let gpus: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    if let Some((key, dir)) = setup.compile_cache(&built.recipe, &gpus) {
        match sous_engine::launch::caches::prepare(&dir, &key) {
            Ok(()) => {
                let held = Contents::of(&dir);
                let state = if held.is_warm() {
                    format!(
                        "warm: {} files, {} kept from an earlier start",
                        held.files,
                        sous_engine::size::human(held.bytes)
                    )
                } else {
                    "cold: this start fills it".to_owned()
                };
                reporter.status("cache", &format!("{} ({state})", dir.display()));
                ctx.compile_cache = Some(dir);
            }
            Err(e) => reporter.warn(&format!(
                "the engine's compile caches stay where it puts them by default: cannot create {}: {e}",
                dir.display()
            )),
        }
    }
    let prepared = Prepared {
        planned_kv_tokens: built.planned_kv_tokens,
        devices,
        build_phases: built.phases.clone(),
    };
    Ok(Instance::start(
        &built.recipe,
        &ctx,
        &hash,
        replacing,
        reporter,
        prepared,
    ))
}

//! A recipe served for the length of one command: `sous bench --recipe`, `sous run`,
//! `sous eval`, `sous tune` and `sous quantize --eval` build it, start it, wait until it
//! is ready, use it and stop it. Also the pipeline's [`Setup`] as the `sous` binary
//! sees it ([`setup()`]), whose native engine is that binary's own
//! `serve --engine-process`.
//!
//! The engine's output stays in its log: a session's reporter drops it
//! ([`WithoutOutput`]). Recipes are read as every command reads them
//! ([`load_recipe()`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use sous_engine::recipe::{Loaded, Overrides, Recipe};
use sous_engine::reporter::{Progress, Reporter, Task};
use sous_engine::serve::Instance;

use super::Setup;

/// The hidden flag of `sous serve` that makes it the native engine's process; the one
/// place it is spelled.
pub const ENGINE_PROCESS: &str = "engine-process";

/// The pipeline's surroundings, with the command that runs a native recipe's engine:
/// the running executable, `serve --engine-process --recipe`.
pub fn setup() -> Setup {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sous"));
    Setup::from_env(vec![
        exe.display().to_string(),
        "serve".into(),
        format!("--{ENGINE_PROCESS}"),
        "--recipe".into(),
    ])
}

/// Loads a recipe with the process's `SOUS_*` overrides, then the `--set KEY=VALUE`
/// overrides in `set`.
pub fn load_recipe(path: &Path, set: &[String]) -> anyhow::Result<Loaded> {
    let mut layered = Overrides::new().with_env(sous_engine::env::overrides());
    for arg in set {
        layered.set(arg)?;
    }
    sous_engine::recipe::load(path, &layered).with_context(|| format!("recipe {}", path.display()))
}

/// The API key a recipe's server expects: the value of the variable its
/// `server.api_key_env` names, when both are set.
pub fn api_key(recipe: &Recipe) -> Option<String> {
    recipe
        .server
        .api_key_env
        .as_deref()
        .and_then(sous_engine::env::named)
}

/// Serves `recipe` through the pipeline (build, start, readiness) for the length of one
/// command, saying so: the engine's output goes to its log only. Returns the instance
/// (stop it when done) and its base URL.
pub async fn for_session(recipe: &Recipe, reporter: Arc<dyn Reporter>) -> anyhow::Result<(Instance, String)> {
    session(recipe, reporter, true).await
}

/// [`for_session`], saying nothing but warnings when `statuses` is false (`sous tune`
/// serves one trial after another and says what each is itself).
pub async fn session(
    recipe: &Recipe,
    reporter: Arc<dyn Reporter>,
    statuses: bool,
) -> anyhow::Result<(Instance, String)> {
    let setup = setup();
    let running = super::running(recipe, &setup, false, reporter.as_ref())?;
    if statuses {
        reporter.status(
            "serving",
            &format!(
                "{} (log: {})",
                recipe.name,
                setup.instance_dir(recipe).join("engine.log").display()
            ),
        );
    }
    let reporter: Arc<dyn Reporter> = Arc::new(WithoutOutput(reporter, statuses));
    let built = super::build(recipe, &setup, false, &reporter).await?;
    let mut instance = super::launch(&built, &setup, running, reporter)?;
    let url = instance.ready().await?.url.clone();
    Ok((instance, url))
}

/// A reporter without the engine's output lines (they stay in the engine log), and
/// without statuses when the flag is false.
pub struct WithoutOutput(pub Arc<dyn Reporter>, pub bool);

impl Reporter for WithoutOutput {
    fn status(&self, word: &str, message: &str) {
        if self.1 {
            self.0.status(word, message);
        }
    }

    fn warn(&self, message: &str) {
        self.0.warn(message);
    }

    fn output(&self, _: Option<&str>, _: &str) {}

    fn progress(&self, task: Task) -> Box<dyn Progress> {
        self.0.progress(task)
    }
}

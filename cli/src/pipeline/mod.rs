//! The build pipeline: a recipe to weights on disk, and weights to a running, ready
//! instance. `sous serve`, `sous bench --recipe` and every later command that needs
//! a served model go through these steps, and nothing else does them.
//!
//! ```text
//! Recipe ──build──▶ Built { recipe, weights, native } ──start──▶ Instance (supervised, ready)
//!          pull, quantize,                              launch, readiness, KV capacity,
//!          up-to-date checks, the native                --replace
//!          engine's settings and planned KV
//! ```
//!
//! - `build`: [`build()`], [`Built`], [`Weights`].
//! - `start`: [`running()`] (checked before a build, so nothing is pulled for a
//!   recipe that cannot be served), [`start()`] (with `--replace`'s rules) and
//!   [`launch()`].
//! - `error`: [`PipelineError`].
//! - [`session`]: a recipe served for the length of one command, and the [`Setup`]
//!   of the `sous` binary.
//!
//! Not here: the engines themselves (`sous-engine`'s `launch` and `serve`), or how
//! anything looks (operations report to a [`Reporter`]).
//!
//! [`Reporter`]: sous_engine::reporter::Reporter

mod build;
pub mod caches;
mod error;
pub mod session;
mod start;

pub use build::{Built, Weights, build};
pub use error::PipelineError;
pub use start::{Started, launch, running, start};

use std::path::PathBuf;

use sous_engine::launch::RenderContext;
use sous_engine::launch::caches::CacheKey;
use sous_engine::paths;
use sous_engine::recipe::Recipe;

use crate::doctor::exec::SearchPath;
use crate::hub::config::HubConfig;

/// What the pipeline takes from its surroundings: the Hub's settings, where sous keeps
/// state and rebuildable artifacts, and the command that runs the native engine's
/// process.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Endpoint, token and cache of the Hub.
    pub hub: HubConfig,
    /// sous's state: one directory per served recipe (`instance.json`, logs).
    pub state_dir: PathBuf,
    /// sous's cache: quantized checkpoints, one directory per recipe.
    pub cache_dir: PathBuf,
    /// The command that serves a native recipe in a process of its own, to which the
    /// recipe file's path is appended (the `sous` binary gives
    /// `sous serve --engine-process --recipe`).
    pub native_command: Vec<String>,
}

impl Setup {
    /// The settings from the environment (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE`,
    /// `SOUS_STATE_DIR`, `SOUS_CACHE_DIR`, the XDG variables) and the given native
    /// engine command.
    pub fn from_env(native_command: Vec<String>) -> Setup {
        Setup {
            hub: HubConfig::from_env(),
            state_dir: paths::state_dir(),
            cache_dir: paths::cache_dir(),
            native_command,
        }
    }

    /// The state directory of `recipe`'s instance.
    pub fn instance_dir(&self, recipe: &Recipe) -> PathBuf {
        self.state_dir.join(&recipe.name)
    }

    /// Where `recipe`'s quantized checkpoint is built.
    pub fn quantized_dir(&self, recipe: &Recipe) -> PathBuf {
        paths::quantized_dir_in(&self.cache_dir, &recipe.name)
    }

    /// Where `recipe`'s engine keeps its compile caches on the GPUs named `gpus` (none:
    /// the CPU): the key and the directory, not created yet. `None` for the native
    /// engine.
    pub fn compile_cache(&self, recipe: &Recipe, gpus: &[String]) -> Option<(CacheKey, PathBuf)> {
        let key = caches::key(recipe, gpus, &SearchPath::from_env())?;
        let dir = key.dir_in(&self.cache_dir.join(sous_engine::launch::caches::DIR));
        Some((key, dir))
    }

    /// Where the engine of `recipe` keeps its files and what it serves: `weights`
    /// when the build step made them, else the recipe's model as written (a dry run).
    pub fn render_context(&self, recipe: &Recipe, weights: Option<PathBuf>) -> RenderContext {
        RenderContext {
            instance_dir: self.instance_dir(recipe),
            hub_cache: self.hub.cache_dir.clone(),
            native_command: self.native_command.clone(),
            weights,
            compile_cache: None,
        }
    }
}

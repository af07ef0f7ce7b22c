//! Engine adapters: a [`Recipe`] becomes the exact command line, environment and
//! option files of the engine it names. One file per engine; each refuses, with the
//! recipe key and the reason, what its engine (or the recipe's release of it) cannot
//! do, rather than rendering a flag the engine would reject or silently ignore.
//!
//! Nothing here starts a process: `sous serve --dry-run` prints a [`Launch`] and
//! `sous serve` runs exactly that.

pub mod caches;
mod container;
pub mod image;
pub mod memory;
pub mod native;
mod sglang;
mod shell;
mod trtllm;
mod vllm;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Serialize, Serializer};

use crate::diagnose::{Class, Diagnose};
use crate::recipe::{EngineKind, Recipe, Runtime, Warning, closest};
use crate::version::Version;

/// One argument of an engine's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// Passed as written.
    Lit(String),
    /// The value of an environment variable of sous's own environment, read at launch
    /// (API keys), so that secrets never appear in a recipe or a rendering. Serialized
    /// as `${NAME}`.
    FromEnv(String),
}

impl Serialize for Arg {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Arg::Lit(s) => serializer.serialize_str(s),
            Arg::FromEnv(var) => serializer.serialize_str(&format!("${{{var}}}")),
        }
    }
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Lit(s.to_owned())
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Lit(s)
    }
}

/// A file the engine reads, written before it starts (TensorRT-LLM's YAML options).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaunchFile {
    /// Where it is written; the command line refers to this path.
    pub path: PathBuf,
    /// Its contents.
    pub contents: String,
}

/// Everything needed to start an engine for a recipe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch {
    /// The engine.
    pub engine: EngineKind,
    /// The release whose flags were rendered, and whether the recipe named it or sous
    /// assumed its newest known release.
    pub version: String,
    /// Whether `version` was assumed (the recipe did not set `engine.version`).
    pub version_assumed: bool,
    /// The command line, program first.
    pub argv: Vec<Arg>,
    /// Environment variables set for the engine, on top of the inherited environment.
    pub env: BTreeMap<String, Arg>,
    /// Files written before the engine starts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<LaunchFile>,
    /// Container image the command runs in, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Legal but suspicious settings.
    pub warnings: Vec<Warning>,
}

impl Launch {
    /// A shell script that starts the engine: option files written with here-documents,
    /// then `NAME=value ... program args`, one flag per line. Secrets are referenced as
    /// `"$NAME"`, never expanded.
    pub fn to_shell(&self) -> String {
        shell::render(self)
    }
}

/// What a rendering needs beside the recipe: where the engine's files go, and what
/// the build step made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderContext {
    /// The instance's state directory (`<state>/<recipe name>`).
    pub instance_dir: PathBuf,
    /// The Hugging Face cache, mounted into containers.
    pub hub_cache: PathBuf,
    /// The command that runs the native engine in a process of its own; the path of
    /// the resolved recipe it serves is appended. Whoever defines that command (the
    /// `sous` binary) provides it, so the engine crate spells none of its flags.
    pub native_command: Vec<String>,
    /// The directory the build step left the served weights in (a quantized
    /// checkpoint, or the pulled model the native engine loads). `None` renders the
    /// recipe's model as written, which is what a dry run shows.
    pub weights: Option<PathBuf>,
    /// The directory the engine's compile caches are kept in between starts
    /// ([`caches`]: one per engine release and GPU). `None` leaves them where the
    /// engine puts them by default.
    pub compile_cache: Option<PathBuf>,
}

/// The recipe as the engine serves it: with [`RenderContext::weights`], its model is
/// that directory rather than the recipe's repository or path. The caller's recipe is
/// left as it is.
pub fn served_recipe<'a>(recipe: &'a Recipe, ctx: &RenderContext) -> Cow<'a, Recipe> {
    match &ctx.weights {
        None => Cow::Borrowed(recipe),
        Some(dir) => {
            let mut served = recipe.clone();
            served.model.path = Some(dir.display().to_string());
            served.model.repo = None;
            served.model.revision = None;
            Cow::Owned(served)
        }
    }
}

/// A recipe the chosen engine cannot serve as written. Every variant is the user's to
/// fix (exit code 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The engine has no equivalent of a recipe setting.
    #[error("{engine} cannot honour `{key}`: {message}")]
    Unsupported {
        /// Engine and release, e.g. `vLLM 0.27.1`.
        engine: String,
        /// The recipe key.
        key: String,
        /// Why.
        message: String,
        /// What to do instead.
        hint: Option<String>,
    },
    /// A name (speculative method, parser, KV type) the engine release does not know.
    #[error("{engine} has no {what} `{value}`")]
    UnknownValue {
        /// Engine and release.
        engine: String,
        /// The recipe key.
        key: String,
        /// What kind of name, e.g. `speculative method`.
        what: String,
        /// The value.
        value: String,
        /// The values the release accepts.
        known: Vec<String>,
    },
    /// A release older than any sous can render for.
    #[error("{engine} is older than the oldest release sous renders for ({oldest})")]
    TooOld {
        /// Engine and release.
        engine: String,
        /// The oldest supported release.
        oldest: String,
    },
}

impl Diagnose for RenderError {
    /// A recipe the engine cannot serve is the author's to fix.
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            RenderError::Unsupported { hint, .. } => hint.clone(),
            RenderError::UnknownValue { value, known, .. } => {
                if let Some(near) = closest(value, known.iter().map(String::as_str)) {
                    return Some(format!("did you mean `{near}`?"));
                }
                const SHOWN: usize = 10;
                let names: Vec<String> = known.iter().take(SHOWN).map(|k| format!("`{k}`")).collect();
                let more = known.len().saturating_sub(SHOWN);
                let tail = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                Some(format!("known: {}{tail}", names.join(", ")))
            }
            RenderError::TooOld { .. } => Some("set `engine.version` to a newer release".into()),
        }
    }
}

impl RenderError {
    /// The recipe key at fault, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            RenderError::Unsupported { key, .. } | RenderError::UnknownValue { key, .. } => Some(key),
            RenderError::TooOld { .. } => Some("engine.version"),
        }
    }
}

/// The newest release of `engine` whose parser sous has checked (none for the native
/// engine, which is sous's own).
fn newest(engine: EngineKind) -> Option<Version> {
    match engine {
        EngineKind::Vllm => Some(vllm::NEWEST),
        EngineKind::Sglang => Some(sglang::NEWEST),
        EngineKind::Trtllm => Some(trtllm::NEWEST),
        EngineKind::Native => None,
    }
}

/// The release `recipe`'s compile caches are kept for when the installed one cannot
/// be read: its `engine.version`, else its `engine.image`, else the release sous
/// renders for (sous's own version for the native engine).
pub fn cache_release(recipe: &Recipe) -> String {
    match (&recipe.engine.version, &recipe.engine.image) {
        (Some(version), _) => version.to_string(),
        (None, Some(image)) => image.clone(),
        (None, None) => newest(recipe.engine.kind)
            .map(|v| v.to_string())
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
    }
}

/// The official images of `engine` (at `version`, where the entrypoint changed between
/// releases), each with what it runs by itself.
fn official_images(engine: EngineKind, version: Option<&Version>) -> Vec<image::ImageDefaults> {
    match engine {
        EngineKind::Vllm => vllm::images(version).to_vec(),
        EngineKind::Sglang => vec![sglang::IMAGE],
        EngineKind::Trtllm => vec![trtllm::IMAGE],
        EngineKind::Native => vec![image::SOUS_IMAGE],
    }
}

/// Renders the recipe for its engine.
pub fn render(recipe: &Recipe, ctx: &RenderContext) -> Result<Launch, RenderError> {
    let recipe = &*served_recipe(recipe, ctx);
    let mut launch = match recipe.engine.kind {
        EngineKind::Vllm => vllm::render(recipe)?,
        EngineKind::Sglang => sglang::render(recipe)?,
        EngineKind::Trtllm => trtllm::render(recipe, ctx)?,
        EngineKind::Native => {
            let mut launch = native::render(recipe, ctx)?;
            for (name, value) in &recipe.env {
                launch.env.insert(name.clone(), Arg::Lit(value.clone()));
            }
            return Ok(launch);
        }
    };
    launch
        .argv
        .extend(recipe.engine.extra_args.iter().map(|a| Arg::Lit(a.clone())));
    // The kept caches first, so that the recipe's `[env]` can point one elsewhere.
    if let Some(dir) = &ctx.compile_cache {
        for (name, path) in caches::variables(recipe.engine.kind, dir) {
            launch
                .env
                .insert(name.to_owned(), Arg::Lit(path.display().to_string()));
        }
    }
    for (name, value) in &recipe.env {
        launch.env.insert(name.clone(), Arg::Lit(value.clone()));
    }
    launch.image = recipe.engine.image.clone();
    if recipe.engine.runtime != Runtime::Host {
        container::wrap(&mut launch, recipe, ctx);
    }
    Ok(launch)
}

/// The release an adapter renders for: the recipe's, or the newest sous knows.
pub(crate) struct Target {
    pub version: Version,
    pub assumed: bool,
    pub label: String,
}

impl Target {
    pub(crate) fn new(recipe: &Recipe, newest: Version) -> Target {
        let name = recipe.engine.kind.display_name();
        match &recipe.engine.version {
            Some(v) => Target {
                label: format!("{name} {v}"),
                version: v.clone(),
                assumed: false,
            },
            None => Target {
                label: format!("{name} {newest}"),
                version: newest,
                assumed: true,
            },
        }
    }

    /// Same-or-newer, with an unset version counting as newest.
    pub(crate) fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        self.version.at_least(major, minor, patch)
    }

    pub(crate) fn unsupported(
        &self,
        key: &str,
        message: impl Into<String>,
        hint: Option<&str>,
    ) -> RenderError {
        RenderError::Unsupported {
            engine: self.label.clone(),
            key: key.to_owned(),
            message: message.into(),
            hint: hint.map(str::to_owned),
        }
    }

    pub(crate) fn unknown(&self, key: &str, what: &str, value: &str, known: &[&str]) -> RenderError {
        RenderError::UnknownValue {
            engine: self.label.clone(),
            key: key.to_owned(),
            what: what.to_owned(),
            value: value.to_owned(),
            known: known.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    pub(crate) fn launch(&self, engine: EngineKind) -> Launch {
        Launch {
            engine,
            version: self.version.to_string(),
            version_assumed: self.assumed,
            argv: Vec::new(),
            env: BTreeMap::new(),
            files: Vec::new(),
            image: None,
            warnings: Vec::new(),
        }
    }
}

/// A float as engines' argparse reads it: `0.9`, not `0.90000000000000002`.
pub(crate) fn float(value: f64) -> String {
    let text = format!("{value}");
    if text.contains('e') {
        format!("{value:.6}")
    } else {
        text
    }
}

/// Pushes `flag value`.
pub(crate) fn push(argv: &mut Vec<Arg>, flag: &str, value: impl ToString) {
    argv.push(Arg::Lit(flag.to_owned()));
    argv.push(Arg::Lit(value.to_string()));
}

/// `memory.embedding_dtype` other than `auto` is the native engine's alone: other engines
/// hold embeddings as the checkpoint stores them. A warning rather than a refusal, so that
/// a native recipe still renders for another engine (`--set engine.kind=vllm`), whose
/// numbers are then the checkpoint's own.
fn native_only_embeddings(recipe: &Recipe, engine: &str) -> Option<Warning> {
    let dtype = recipe.memory.embedding_dtype?;
    (dtype != crate::recipe::EmbeddingDtype::Auto).then(|| {
        Warning::new(format!(
            "`memory.embedding_dtype = \"{}\"` applies to the native engine only: {engine} holds the embeddings as the checkpoint stores them",
            dtype.as_str()
        ))
    })
}

//! Why a recipe could not be built or started, each failure with its class and the
//! user's next step.

use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose};
use sous_engine::native::NativeError;
use sous_engine::repo::RepoId;
use sous_engine::serve::ServeError;
use sous_engine::serve::instance::InstanceError;

use crate::hub::api::HubError;
use crate::hub::pull::PullError;
use crate::quantize::QuantizeError;

/// Why a recipe could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Another `sous serve` runs the recipe and `--replace` was not asked for.
    #[error("recipe `{name}` is already being served by sous (pid {pid}) at {url}")]
    AlreadyServed {
        /// The recipe's name.
        name: String,
        /// The pid of the `sous serve` serving it.
        pid: u32,
        /// Its URL.
        url: String,
    },
    /// The recipe's local model directory does not exist.
    #[error("`model.path` `{0}` does not exist")]
    MissingPath(String),
    /// The Hub client could not be set up.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The pull failed.
    #[error("pulling {repo}")]
    Pull {
        /// The repository.
        repo: RepoId,
        /// Why.
        source: Box<PullError>,
    },
    /// The model is not on disk and building is forbidden.
    #[error("`{0}` is not on disk and --no-build forbids pulling it")]
    NotPulled(RepoId),
    /// The quantized checkpoint is not there and building is forbidden.
    #[error(
        "the recipe's quantized checkpoint {} does not exist and --no-build forbids making it",
        .0.display()
    )]
    NotQuantized(PathBuf),
    /// The quantization failed.
    #[error(transparent)]
    Quantize(#[from] QuantizeError),
    /// The native engine would refuse the model or the settings.
    #[error(transparent)]
    Native(#[from] NativeError),
    /// The engine could not be started or stopped serving.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The record of the running instance could not be read.
    #[error(transparent)]
    Instance(#[from] InstanceError),
    /// The resolved recipe could not be written as TOML to hash it (a bug).
    #[error("hashing the recipe: {0}")]
    Hash(#[from] toml::ser::Error),
    /// A worker thread failed (a bug).
    #[error("the {0} thread failed")]
    Thread(&'static str),
}

impl Diagnose for PipelineError {
    fn class(&self) -> Class {
        match self {
            PipelineError::Hub(e) => e.class(),
            PipelineError::Pull { source, .. } => source.class(),
            PipelineError::Quantize(e) => e.class(),
            PipelineError::Native(e) => e.class(),
            PipelineError::Serve(e) => e.class(),
            PipelineError::Instance(e) => e.class(),
            PipelineError::Hash(_) | PipelineError::Thread(_) => Class::Internal,
            PipelineError::AlreadyServed { .. }
            | PipelineError::MissingPath(_)
            | PipelineError::NotPulled(_)
            | PipelineError::NotQuantized(_) => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            PipelineError::AlreadyServed { pid, url, .. } => Some(format!(
                "pass --replace to swap it for this recipe (`sous serve --replace`), or stop it first \
                 (`kill {pid}`); `sous bench --url {url}` measures the running one"
            )),
            PipelineError::MissingPath(_) => {
                Some("set `model.repo` so that `sous serve` can pull it, or fix the path".into())
            }
            PipelineError::NotPulled(_) => Some("run `sous pull` first, or drop --no-build".into()),
            PipelineError::NotQuantized(_) => {
                Some("run `sous quantize --recipe` first, or drop --no-build".into())
            }
            PipelineError::Hub(e) => e.hint(),
            PipelineError::Pull { source, .. } => source.hint(),
            PipelineError::Quantize(e) => e.hint(),
            PipelineError::Native(e) => e.hint(),
            PipelineError::Serve(e) => e.hint(),
            PipelineError::Instance(e) => e.hint(),
            PipelineError::Hash(_) | PipelineError::Thread(_) => None,
        }
    }
}

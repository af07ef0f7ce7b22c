//! What can stop a rendering or the writing of one, each with the recipe key or the
//! file at fault and what to do.

use std::path::PathBuf;

use sous_engine::diagnose::{Class, Diagnose};
use sous_engine::launch::RenderError;

/// Why a recipe could not be rendered for a target, or the rendering not written.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Neither `model.repo` nor `model.path`.
    #[error("the recipe names no model to deploy")]
    NoModelSource,
    /// A path-only model with no volume that holds it.
    #[error(
        "`model.path` ({path}) is set without `model.repo`: sous cannot fill a volume it has no source for"
    )]
    PathWithoutClaim {
        /// The recipe's path.
        path: String,
    },
    /// `deploy.model_claim` beside a repository sous would pull.
    #[error(
        "`deploy.model_claim` is set, but `model.repo` is too: sous pulls the repository into its own volume"
    )]
    ClaimWithRepo,
    /// A relative `model.path`.
    #[error("`model.path` ({path}) is relative; in a container it must be absolute")]
    RelativePath {
        /// The recipe's path.
        path: String,
    },
    /// A W4A4 calibration text that is a file of this machine.
    #[error(
        "`quantize.calibration` is a file of this machine ({path}), which the container that quantizes does not have"
    )]
    CalibrationFile {
        /// The resolved path.
        path: String,
    },
    /// A memory limit that the KV cache's host tier alone exceeds.
    #[error(
        "`deploy.memory_limit` ({limit}) is below `memory.kv_offload_bytes` ({offload}): the engine would be killed for memory once the host tier fills"
    )]
    OffloadAboveLimit {
        /// The limit, as written.
        limit: String,
        /// The offload, in GiB.
        offload: String,
    },
    /// No image for an engine that has no official one sous can name.
    #[error("`engine.image` is not set, and sous names no default image for {engine}")]
    NoImage {
        /// The engine.
        engine: &'static str,
    },
    /// The volume's size is unknown.
    #[error(
        "cannot size the model volume: the model is not on this machine and the Hub did not say how large it is"
    )]
    NoStorageSize,
    /// GPUs of one instance that no whole number of nodes holds.
    #[error(
        "one instance needs {gpus} GPUs, which is not a whole number of nodes of {per_node} (`deploy.gpus_per_node`)"
    )]
    GpusAcrossNodes {
        /// GPUs of one instance.
        gpus: u32,
        /// GPUs per node.
        per_node: u32,
    },
    /// A multi-node recipe for an engine that has no multi-node launch.
    #[error("one instance needs {nodes} nodes, and {engine} has no multi-node launch sous can render")]
    MultiNode {
        /// The engine.
        engine: &'static str,
        /// Nodes one instance needs.
        nodes: u32,
    },
    /// An instance across nodes on a volume only one node can mount.
    #[error(
        "one instance spans {nodes} nodes, and every one of them loads the model from the volume, which `ReadWriteOnce` lets one node mount"
    )]
    MultiNodeClaim {
        /// Nodes.
        nodes: u32,
    },
    /// Host ports past 65535.
    #[error("{replicas} replicas from port {port} need host ports past 65535")]
    Ports {
        /// The first port.
        port: u16,
        /// Replicas.
        replicas: u32,
    },
    /// Files sous wrote that were edited since.
    #[error("{} edited since sous rendered {}: {}", if .files.len() == 1 { "a file was" } else { "files were" }, .dir.display(), .files.join(", "))]
    Edited {
        /// The directory.
        dir: PathBuf,
        /// The files.
        files: Vec<String>,
    },
    /// A target that cannot express a GPU count.
    #[error(
        "{target} runs one machine: an instance of {gpus} GPUs across {nodes} nodes cannot be rendered for it"
    )]
    TargetCannotSpan {
        /// The target.
        target: &'static str,
        /// GPUs of one instance.
        gpus: u32,
        /// Nodes.
        nodes: u32,
    },
    /// The recipe's engine cannot serve it.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// `--out` holds files sous did not write.
    #[error("{dir} holds files sous did not write: {}", .files.join(", "))]
    ForeignFiles {
        /// The directory.
        dir: PathBuf,
        /// The files.
        files: Vec<String>,
    },
    /// `--out` is not a directory.
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// Reading or writing the output.
    #[error("{what} {path}: {source}")]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Serializing an object (a bug).
    #[error("rendering {what}: {message}")]
    Serialize {
        /// The object.
        what: String,
        /// The serializer's message.
        message: String,
    },
    /// The resolved recipe could not be written as TOML (a bug).
    #[error("writing the resolved recipe as TOML: {0}")]
    Toml(String),
}

impl Diagnose for DeployError {
    fn class(&self) -> Class {
        match self {
            DeployError::Serialize { .. } | DeployError::Toml(_) => Class::Internal,
            DeployError::Render(e) => e.class(),
            _ => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        Some(match self {
            DeployError::NoModelSource => {
                "set `model.repo` (an init container pulls it) or `model.path` with `deploy.model_claim`".into()
            }
            DeployError::PathWithoutClaim { .. } => {
                "set `model.repo` so an init container pulls it, or `deploy.model_claim` to a claim that holds the model".into()
            }
            DeployError::ClaimWithRepo => "remove `deploy.model_claim`, or `model.repo`".into(),
            DeployError::RelativePath { .. } => "write `model.path` as an absolute path, e.g. `/models/NAME`".into(),
            DeployError::CalibrationFile { .. } => {
                "use `calibration = \"builtin\"`, or quantize on this machine (`sous quantize --recipe`) and deploy the checkpoint with `model.path`".into()
            }
            DeployError::OffloadAboveLimit { .. } => {
                "raise `deploy.memory_limit` above the host tier plus the engine's own memory, or lower `memory.kv_offload_bytes`".into()
            }
            DeployError::NoImage { .. } => {
                "set `engine.image` to the engine's image and release, e.g. `lmsysorg/sglang:v0.5.23`".into()
            }
            DeployError::NoStorageSize => {
                "set `deploy.storage.size` (e.g. `100Gi`), run `sous pull --recipe` first, or make the Hub reachable".into()
            }
            DeployError::GpusAcrossNodes { .. } => {
                "make tensor × pipeline × data parallel a multiple of `deploy.gpus_per_node`".into()
            }
            DeployError::MultiNode { .. } => {
                "use vLLM or SGLang, or lower the parallelism to fit `deploy.gpus_per_node`".into()
            }
            DeployError::MultiNodeClaim { .. } => {
                "set `deploy.storage.access_mode = \"ReadWriteMany\"` (a storage class that offers it), or `deploy.storage.existing_claim`".into()
            }
            DeployError::Ports { .. } => "lower `server.port` or `deploy.replicas`".into(),
            DeployError::Edited { .. } => {
                "put the change into the recipe and render again, or pass --force to overwrite the edits".into()
            }
            DeployError::TargetCannotSpan { .. } => "use `--target k8s`, or raise `deploy.gpus_per_node`".into(),
            DeployError::Render(e) => return e.hint(),
            DeployError::ForeignFiles { .. } => {
                "render into an empty directory, or pass --force to replace them".into()
            }
            DeployError::NotADirectory(_) => "give --out a directory".into(),
            DeployError::Io { .. } | DeployError::Serialize { .. } | DeployError::Toml(_) => return None,
        })
    }
}

//! The resolved recipe: defaults filled, every value checked, ready for the engine
//! adapters. Adapters and commands only ever see a [`Recipe`].
//!
//! Checks here are the ones that hold whatever the engine: ranges, settings that
//! contradict each other, what must be present. What a particular engine or release
//! cannot do is refused by its adapter (`launch/`).
//!
//! This file holds [`Recipe`] itself, [`resolve`], which builds it section by section,
//! the checks that span sections, and the way back to a file ([`Recipe::to_file`]).
//! Each section's resolved type and checks have their own file: `model` (with the
//! `[quantize]` build step), `engine`, `memory`, `serving` and `server`.

mod deploy;
mod engine;
mod memory;
mod model;
mod router;
mod server;
mod serving;

use deploy::resolve_deploy;
pub use deploy::{
    DEFAULT_CONTAINER_NAME, DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_SHM_SIZE, DEFAULT_STARTUP_PERIOD, Deploy,
    Quantity, Storage, default_sous_image, is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name,
};
use engine::resolve_engine;
pub use engine::{Engine, RESTART_WINDOW};
use memory::resolve_memory;
pub use memory::{Memory, host_weight_glob, is_host_weight};
pub use model::{
    Calibration, CalibrationText, DEFAULT_CALIBRATION_SAMPLES, DEFAULT_CALIBRATION_SEQ_LEN, DEFAULT_REVISION,
    Model, QuantDevice, Quantize,
};
use model::{resolve_model, resolve_quantize};
pub use router::{Router, SGLANG_ROUTER_VERSION, VLLM_ROUTER_VERSION, default_router};
use server::resolve_server;
pub use server::{DEFAULT_HOST, DEFAULT_PORT, Server};
use serving::check_serving;
pub use serving::is_mtp;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::error::{At, Location, RecipeError};
use super::file::{
    EngineKind, EngineSection, MemorySection, ModelDtype, ModelSection, QuantizeSection, RecipeFile, Runtime,
    ServerSection, ServingSection,
};
use super::load::Provenance;

/// A recipe with every layer merged, defaults filled and values checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// Deployment name.
    pub name: String,
    /// What the recipe is for.
    pub description: Option<String>,
    /// The model.
    pub model: Model,
    /// The build step, if any.
    pub quantize: Option<Quantize>,
    /// The engine.
    pub engine: Engine,
    /// Memory settings.
    pub memory: Memory,
    /// Serving settings; `None` leaves the engine's default.
    pub serving: ServingSection,
    /// The endpoint.
    pub server: Server,
    /// Environment for the engine.
    pub env: BTreeMap<String, String>,
    /// How `sous deploy` runs it elsewhere.
    pub deploy: Deploy,
}

/// Something legal but probably not what the author meant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// What, and why it matters.
    pub message: String,
}

impl Warning {
    /// A warning with this message.
    pub fn new(message: impl Into<String>) -> Warning {
        Warning {
            message: message.into(),
        }
    }
}

/// Resolves merged settings into a [`Recipe`].
pub fn resolve(raw: RecipeFile, provenance: &Provenance) -> Result<(Recipe, Vec<Warning>), RecipeError> {
    let at = |path: &[&str]| At::from(provenance.locate(path, false));
    let invalid = |path: &[&str], message: String, hint: Option<&str>| RecipeError::InvalidValue {
        key: path.join("."),
        message,
        at: at(path),
        hint: hint.map(str::to_owned),
    };
    let mut warnings = Vec::new();

    let name = match raw.name {
        Some(name) => name,
        None => default_name(provenance.leaf()),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
    {
        return Err(invalid(
            &["name"],
            format!("`{name}` is not a deployment name: use lower-case letters, digits, `.`, `_` and `-`"),
            None,
        ));
    }

    let model = resolve_model(raw.model, &invalid)?;
    let calibration_base = match provenance.locate(&["quantize", "calibration"], false) {
        Some(Location::File { path, .. } | Location::FileOnly(path)) => path.parent().map(Path::to_path_buf),
        _ => None,
    };
    let quantize = raw
        .quantize
        .map(|q| resolve_quantize(q, calibration_base.as_deref()))
        .transpose()
        .map_err(|(key, m)| invalid(&["quantize", key], m, None))?;
    let engine = resolve_engine(raw.engine, &invalid)?;
    let memory = resolve_memory(raw.memory, provenance, &invalid)?;
    let serving = check_serving(raw.serving, provenance, &invalid)?;
    let server = resolve_server(raw.server, &invalid)?;
    let deploy = resolve_deploy(raw.deploy, &name, engine.kind, &invalid)?;

    for key in raw.env.keys() {
        if !is_env_name(key) {
            return Err(invalid(
                &["env", key],
                format!("`{key}` is not an environment variable name"),
                Some("use letters, digits and `_`, not starting with a digit"),
            ));
        }
    }

    if engine.kind == EngineKind::Native && engine.image.is_some() {
        return Err(RecipeError::Conflict {
            message: "`engine.image` is set, but the native engine runs inside sous, not in a container"
                .into(),
            at: at(&["engine", "image"]),
            hint: Some("remove `engine.image`, or pick `vllm`, `sglang` or `trtllm` as `engine.kind`".into()),
        });
    }
    if quantize.is_some() && model.repo.is_none() && model.path.is_none() {
        warnings.push(Warning::new(
            "`[quantize]` is set but there is no model to quantize",
        ));
    }

    Ok((
        Recipe {
            name,
            description: raw.description,
            model,
            quantize,
            engine,
            memory,
            serving,
            server,
            env: raw.env,
            deploy,
        },
        warnings,
    ))
}

type Invalid<'a> = dyn Fn(&[&str], String, Option<&str>) -> RecipeError + 'a;

fn default_name(leaf: &Path) -> String {
    leaf.file_stem()
        .map(|s| s.to_string_lossy().to_ascii_lowercase().replace(' ', "-"))
        .unwrap_or_else(|| "recipe".to_owned())
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Recipe {
    /// The recipe as a self-contained recipe file: every layer merged, defaults written
    /// out, no `extends`. Loading it gives this recipe back.
    pub fn to_file(&self) -> RecipeFile {
        RecipeFile {
            name: Some(self.name.clone()),
            description: self.description.clone(),
            extends: None,
            model: ModelSection {
                repo: self.model.repo.as_ref().map(ToString::to_string),
                revision: self.model.revision.clone(),
                path: self.model.path.clone(),
                served_name: Some(self.model.served_name.clone()),
            },
            quantize: self.quantize.as_ref().map(|q| QuantizeSection {
                scheme: Some(q.scheme),
                format: Some(q.format),
                ignore: q.ignore.clone(),
                calibration: q.calibration.as_ref().map(|c| c.text.as_arg()),
                calibration_format: q.calibration.as_ref().map(|c| c.format),
                samples: q.calibration.as_ref().map(|c| c.samples as u32),
                seq_len: q.calibration.as_ref().map(|c| c.seq_len as u32),
                device: (q.device != QuantDevice::Cpu).then(|| q.device.to_string()),
            }),
            engine: EngineSection {
                kind: Some(self.engine.kind),
                version: self.engine.version.as_ref().map(ToString::to_string),
                image: self.engine.image.clone(),
                executable: self.engine.executable.clone(),
                extra_args: self.engine.extra_args.clone(),
                extra_options: self.engine.extra_options.clone(),
                runtime: (self.engine.runtime != Runtime::Host).then_some(self.engine.runtime),
                restarts: (self.engine.restarts != 3).then_some(self.engine.restarts),
            },
            memory: MemorySection {
                gpu_utilization: self.memory.gpu_utilization,
                oom_fallback: self.memory.oom_fallback.clone(),
                kv_cache_dtype: self.memory.kv_cache_dtype,
                kv_cache_bytes: self.memory.kv_cache_bytes.map(crate::size::ByteSize),
                kv_offload_bytes: self.memory.kv_offload_bytes.map(crate::size::ByteSize),
                host_weights: self.memory.host_weights.clone(),
                embedding_dtype: self.memory.embedding_dtype,
                host_floor: self.memory.host_floor.map(crate::size::ByteSize),
            },
            serving: self.serving.clone(),
            server: ServerSection {
                host: Some(self.server.host.clone()),
                port: Some(self.server.port),
                api_key_env: self.server.api_key_env.clone(),
                startup_timeout: Some(humantime::format_duration(self.server.startup_timeout).to_string()),
                stop_grace: Some(humantime::format_duration(self.server.stop_grace).to_string()),
            },
            env: self.env.clone(),
            deploy: self.deploy.to_section(),
        }
    }

    /// GPUs one instance of the recipe takes: tensor × pipeline × data parallel (vLLM's
    /// in-process data parallelism takes DP × TP GPUs); none for the native engine.
    pub fn gpus(&self) -> u32 {
        match self.engine.kind {
            EngineKind::Native => 0,
            _ => {
                let s = &self.serving;
                s.tensor_parallel.unwrap_or(1)
                    * s.pipeline_parallel.unwrap_or(1)
                    * s.data_parallel.unwrap_or(1)
            }
        }
    }

    /// The data type the model computes in, when the recipe fixes it.
    pub fn dtype(&self) -> Option<ModelDtype> {
        self.serving.dtype
    }
}

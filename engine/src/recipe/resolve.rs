//! The resolved recipe: defaults filled, every value checked, ready for the engine
//! adapters. Adapters and commands only ever see a [`Recipe`].
//!
//! Checks here are the ones that hold whatever the engine: ranges, settings that
//! contradict each other, what must be present. What a particular engine or release
//! cannot do is refused by its adapter (`launch/`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::error::{At, RecipeError};
use super::file::{
    EngineKind, EngineSection, KvCacheDtype, MemorySection, ModelDtype, ModelSection, QuantFormat,
    QuantScheme, QuantizeSection, RecipeFile, Runtime, ServerSection, ServingSection, SpeculativeSection,
};
use super::load::Provenance;
use crate::version::Version;

/// Default `server.host`: every interface, as vLLM's own default.
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// Default `server.port`: vLLM's and TensorRT-LLM's.
pub const DEFAULT_PORT: u16 = 8000;
/// Default `model.revision`.
pub const DEFAULT_REVISION: &str = "main";

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
}

/// Where the weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Hub repository id.
    pub repo: Option<String>,
    /// Revision of `repo` (default `main`).
    pub revision: Option<String>,
    /// Local directory.
    pub path: Option<String>,
    /// Name clients use.
    pub served_name: String,
}

impl Model {
    /// What the engine is given: the local path if there is one, else the repository id.
    pub fn engine_arg(&self) -> &str {
        self.path.as_deref().or(self.repo.as_deref()).unwrap_or_default()
    }
}

/// The build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantize {
    /// Scheme.
    pub scheme: QuantScheme,
    /// Format.
    pub format: QuantFormat,
    /// Extra modules kept unquantized.
    pub ignore: Vec<String>,
}

/// The engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    /// Which engine.
    pub kind: EngineKind,
    /// Which release; `None` means the newest sous knows.
    pub version: Option<Version>,
    /// Container image.
    pub image: Option<String>,
    /// Executable override.
    pub executable: Option<String>,
    /// Verbatim extra arguments.
    pub extra_args: Vec<String>,
    /// Extra TensorRT-LLM options.
    pub extra_options: Option<serde_json::Map<String, serde_json::Value>>,
    /// Host process or container.
    pub runtime: Runtime,
    /// Restarts after a crash, within [`RESTART_WINDOW`].
    pub restarts: u32,
}

/// The window `engine.restarts` counts within.
pub const RESTART_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// Memory settings, in bytes where sizes are involved.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// Fraction of accelerator memory.
    pub gpu_utilization: Option<f64>,
    /// Fallback fractions after an OOM at start-up.
    pub oom_fallback: Vec<f64>,
    /// KV-cache type.
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Fixed KV budget per GPU.
    pub kv_cache_bytes: Option<u64>,
    /// Host RAM for KV offload.
    pub kv_offload_bytes: Option<u64>,
}

/// The endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Listen address.
    pub host: String,
    /// Listen port.
    pub port: u16,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Longest start-up.
    pub startup_timeout: std::time::Duration,
    /// Longest stop after SIGTERM.
    pub stop_grace: std::time::Duration,
}

impl Server {
    /// Where a client on this machine reaches the server: the listen host, or loopback
    /// for a wildcard address.
    pub fn connect_host(&self) -> &str {
        match self.host.as_str() {
            "0.0.0.0" | "::" => "127.0.0.1",
            other => other,
        }
    }

    /// `http://HOST:PORT` with [`Server::connect_host`].
    pub fn local_url(&self) -> String {
        format!("http://{}:{}", self.connect_host(), self.port)
    }
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
    let quantize = raw
        .quantize
        .map(resolve_quantize)
        .transpose()
        .map_err(|m| invalid(&["quantize", "scheme"], m, None))?;
    let engine = resolve_engine(raw.engine, &invalid)?;
    let memory = resolve_memory(raw.memory, provenance, &invalid)?;
    let serving = check_serving(raw.serving, provenance, &invalid)?;
    let server = resolve_server(raw.server, &invalid)?;

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

fn resolve_model(raw: ModelSection, invalid: &Invalid<'_>) -> Result<Model, RecipeError> {
    if raw.repo.is_none() && raw.path.is_none() {
        return Err(RecipeError::Missing {
            key: "model.repo".into(),
            message: "the recipe names no model".into(),
            hint: Some("set `model.repo = \"org/name\"` (a Hub repository) or `model.path = \"/models/x\"` (a local directory)".into()),
        });
    }
    if let Some(repo) = &raw.repo {
        let valid_part = |p: &str| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() > 2 || !parts.iter().all(|p| valid_part(p)) {
            return Err(invalid(
                &["model", "repo"],
                format!("`{repo}` is not a Hub repository id"),
                Some("write `org/name`, e.g. `Qwen/Qwen3.8-27B`; for a local directory use `model.path`"),
            ));
        }
    }
    if raw.revision.is_some() && raw.repo.is_none() {
        return Err(invalid(
            &["model", "revision"],
            "a revision needs `model.repo`: a local `model.path` has no revisions".into(),
            None,
        ));
    }
    if let Some(path) = &raw.path
        && path.trim().is_empty()
    {
        return Err(invalid(&["model", "path"], "the path is empty".into(), None));
    }
    let served_name = match raw.served_name {
        Some(name) if name.trim().is_empty() => {
            return Err(invalid(
                &["model", "served_name"],
                "the name is empty".into(),
                None,
            ));
        }
        Some(name) => name,
        None => match (&raw.repo, &raw.path) {
            (Some(repo), _) => repo.clone(),
            (None, Some(path)) => Path::new(path)
                .file_name()
                .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned()),
            (None, None) => String::new(),
        },
    };
    let revision = raw
        .repo
        .as_ref()
        .map(|_| raw.revision.unwrap_or_else(|| DEFAULT_REVISION.to_owned()));
    Ok(Model {
        repo: raw.repo,
        revision,
        path: raw.path,
        served_name,
    })
}

fn resolve_quantize(raw: QuantizeSection) -> Result<Quantize, String> {
    let scheme = raw
        .scheme
        .ok_or_else(|| "`[quantize]` needs a `scheme`: `nvfp4a16` or `nvfp4`".to_owned())?;
    Ok(Quantize {
        scheme,
        format: raw.format.unwrap_or(QuantFormat::CompressedTensors),
        ignore: raw.ignore,
    })
}

fn resolve_engine(raw: EngineSection, invalid: &Invalid<'_>) -> Result<Engine, RecipeError> {
    let kind = raw.kind.ok_or_else(|| RecipeError::Missing {
        key: "engine.kind".into(),
        message: "the recipe does not say which engine serves the model".into(),
        hint: Some("set `engine.kind` to `vllm`, `sglang`, `trtllm` or `native`".into()),
    })?;
    let version = raw
        .version
        .as_deref()
        .map(str::parse::<Version>)
        .transpose()
        .map_err(|e| invalid(&["engine", "version"], e.to_string(), None))?;
    if kind == EngineKind::Native && version.is_some() {
        return Err(invalid(
            &["engine", "version"],
            "the native engine is part of sous: its version is sous's own".into(),
            Some("remove `engine.version`"),
        ));
    }
    let runtime = raw.runtime.unwrap_or(Runtime::Host);
    if runtime != Runtime::Host && raw.image.is_none() {
        return Err(invalid(
            &["engine", "runtime"],
            format!("a `{}` runtime needs `engine.image`", runtime.as_str()),
            Some("set `engine.image` (e.g. `vllm/vllm-openai:v0.27.1`), or use `runtime = \"host\"`"),
        ));
    }
    if runtime != Runtime::Host && kind == EngineKind::Native {
        return Err(invalid(
            &["engine", "runtime"],
            "the native engine runs inside sous".into(),
            None,
        ));
    }
    if kind == EngineKind::Native && !raw.extra_args.is_empty() {
        return Err(invalid(
            &["engine", "extra_args"],
            "the native engine takes no command-line arguments; every setting is a recipe key".into(),
            Some("remove `engine.extra_args`"),
        ));
    }
    Ok(Engine {
        kind,
        version,
        image: raw.image,
        executable: raw.executable,
        extra_args: raw.extra_args,
        extra_options: raw.extra_options,
        runtime,
        restarts: raw.restarts.unwrap_or(3),
    })
}

fn resolve_memory(
    raw: MemorySection,
    provenance: &Provenance,
    invalid: &Invalid<'_>,
) -> Result<Memory, RecipeError> {
    let fraction_ok = |f: f64| f > 0.0 && f <= 1.0;
    if let Some(u) = raw.gpu_utilization
        && !fraction_ok(u)
    {
        return Err(invalid(
            &["memory", "gpu_utilization"],
            format!("{u} is outside (0, 1]"),
            Some("it is a fraction of the GPU's memory: 0.9 means 90 %"),
        ));
    }
    let mut previous = raw.gpu_utilization;
    for (i, &f) in raw.oom_fallback.iter().enumerate() {
        if !fraction_ok(f) {
            return Err(invalid(
                &["memory", "oom_fallback"],
                format!("{f} is outside (0, 1]"),
                None,
            ));
        }
        match previous {
            None => {
                return Err(RecipeError::Conflict {
                    message: "`memory.oom_fallback` lowers `memory.gpu_utilization`, which is not set".into(),
                    at: At::from(provenance.locate(&["memory", "oom_fallback"], false)),
                    hint: Some("set `memory.gpu_utilization` to the value to try first".into()),
                });
            }
            Some(p) if f >= p => {
                let what = if i == 0 {
                    "`memory.gpu_utilization`".to_owned()
                } else {
                    "the value before it".to_owned()
                };
                return Err(invalid(
                    &["memory", "oom_fallback"],
                    format!("{f} is not below {what} ({p}): a fallback must ask for less memory"),
                    None,
                ));
            }
            Some(_) => previous = Some(f),
        }
    }
    if raw.kv_cache_bytes.is_some() && !raw.oom_fallback.is_empty() {
        return Err(RecipeError::Conflict {
            message: "`memory.kv_cache_bytes` fixes the KV budget, so the utilization values in `memory.oom_fallback` would change nothing".into(),
            at: At::from(provenance.locate(&["memory", "oom_fallback"], false)),
            hint: Some("drop `memory.oom_fallback`, or drop `memory.kv_cache_bytes` and size the cache with `memory.gpu_utilization`".into()),
        });
    }
    if raw.kv_cache_bytes.is_some_and(|b| b.bytes() == 0) {
        return Err(invalid(
            &["memory", "kv_cache_bytes"],
            "a KV budget of 0 bytes holds no token".into(),
            None,
        ));
    }
    Ok(Memory {
        gpu_utilization: raw.gpu_utilization,
        oom_fallback: raw.oom_fallback,
        kv_cache_dtype: raw.kv_cache_dtype,
        kv_cache_bytes: raw.kv_cache_bytes.map(|b| b.bytes()),
        kv_offload_bytes: raw.kv_offload_bytes.map(|b| b.bytes()),
    })
}

fn check_serving(
    raw: ServingSection,
    provenance: &Provenance,
    invalid: &Invalid<'_>,
) -> Result<ServingSection, RecipeError> {
    let positive: [(&str, Option<u64>); 6] = [
        ("max_model_len", raw.max_model_len),
        ("max_num_seqs", raw.max_num_seqs.map(u64::from)),
        ("max_batched_tokens", raw.max_batched_tokens),
        ("tensor_parallel", raw.tensor_parallel.map(u64::from)),
        ("pipeline_parallel", raw.pipeline_parallel.map(u64::from)),
        ("data_parallel", raw.data_parallel.map(u64::from)),
    ];
    for (key, value) in positive {
        if value == Some(0) {
            return Err(invalid(&["serving", key], "must be at least 1".into(), None));
        }
    }
    if let (Some(false), Some(batched), Some(len)) =
        (raw.chunked_prefill, raw.max_batched_tokens, raw.max_model_len)
        && batched < len
    {
        return Err(RecipeError::Conflict {
            message: format!(
                "without chunked prefill a whole prompt is scheduled in one step, so `serving.max_batched_tokens` ({batched}) must be at least `serving.max_model_len` ({len})"
            ),
            at: At::from(provenance.locate(&["serving", "max_batched_tokens"], false)),
            hint: Some("enable `serving.chunked_prefill`, raise `serving.max_batched_tokens`, or lower `serving.max_model_len`".into()),
        });
    }
    if raw.auto_tool_choice == Some(true) && raw.tool_call_parser.is_none() {
        return Err(RecipeError::Conflict {
            message:
                "`serving.auto_tool_choice` needs a `serving.tool_call_parser` to read the model's tool calls"
                    .into(),
            at: At::from(provenance.locate(&["serving", "auto_tool_choice"], false)),
            hint: Some("set `serving.tool_call_parser` (e.g. `qwen3_coder`, `hermes`, `llama3_json`)".into()),
        });
    }
    for (key, value) in [
        ("reasoning_parser", &raw.reasoning_parser),
        ("tool_call_parser", &raw.tool_call_parser),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(invalid(&["serving", key], "the name is empty".into(), None));
        }
    }
    if let Some(spec) = &raw.speculative {
        check_speculative(spec, invalid)?;
    }
    Ok(raw)
}

fn check_speculative(spec: &SpeculativeSection, invalid: &Invalid<'_>) -> Result<(), RecipeError> {
    let key = |k: &'static str| ["serving", "speculative", k];
    let method = spec.method.as_deref().ok_or_else(|| RecipeError::Missing {
        key: "serving.speculative.method".into(),
        message: "speculative decoding needs a method".into(),
        hint: Some("e.g. `speculative = { method = \"mtp\", tokens = 2 }`".into()),
    })?;
    if spec.tokens.is_none() {
        return Err(RecipeError::Missing {
            key: "serving.speculative.tokens".into(),
            message: "speculative decoding needs the number of tokens drafted per step".into(),
            hint: Some(format!(
                "e.g. `speculative = {{ method = \"{method}\", tokens = 2 }}`"
            )),
        });
    }
    if spec.tokens == Some(0) {
        return Err(invalid(&key("tokens"), "must be at least 1".into(), None));
    }
    let needs_model = matches!(method, "eagle" | "eagle3" | "draft_model");
    if needs_model && spec.model.is_none() {
        return Err(RecipeError::Missing {
            key: "serving.speculative.model".into(),
            message: format!("method `{method}` drafts with a separate model"),
            hint: Some("set `serving.speculative.model` to the draft model's Hub id or path".into()),
        });
    }
    if spec.model.is_some() && (method == "ngram" || is_mtp(method)) {
        return Err(invalid(
            &key("model"),
            format!("method `{method}` drafts without a separate model"),
            Some("remove `serving.speculative.model`"),
        ));
    }
    if method != "ngram" && (spec.prompt_lookup_min.is_some() || spec.prompt_lookup_max.is_some()) {
        return Err(invalid(
            &key("prompt_lookup_min"),
            format!("prompt lookup settings apply to `ngram`, not `{method}`"),
            None,
        ));
    }
    if let (Some(min), Some(max)) = (spec.prompt_lookup_min, spec.prompt_lookup_max)
        && min > max
    {
        return Err(invalid(
            &key("prompt_lookup_min"),
            format!("{min} is above `prompt_lookup_max` ({max})"),
            None,
        ));
    }
    Ok(())
}

/// Whether a speculative method is multi-token prediction: `mtp` or a model-specific
/// MTP head (`qwen3_next_mtp`, `deepseek_mtp`, ...).
pub fn is_mtp(method: &str) -> bool {
    method == "mtp" || method.ends_with("_mtp")
}

fn resolve_server(raw: ServerSection, invalid: &Invalid<'_>) -> Result<Server, RecipeError> {
    if raw.port == Some(0) {
        return Err(invalid(
            &["server", "port"],
            "0 is not a port".into(),
            Some("use 1-65535, e.g. 8000"),
        ));
    }
    if let Some(var) = &raw.api_key_env
        && !is_env_name(var)
    {
        return Err(invalid(
            &["server", "api_key_env"],
            format!("`{var}` is not an environment variable name"),
            Some("name the variable that holds the key (e.g. `SOUS_API_KEY`), not the key itself"),
        ));
    }
    let duration = |key: &'static str, value: &Option<String>, default: u64| match value {
        None => Ok(std::time::Duration::from_secs(default)),
        Some(text) => humantime::parse_duration(text).map_err(|e| {
            invalid(
                &["server", key],
                format!("`{text}` is not a duration ({e})"),
                Some("write e.g. `90s`, `30m` or `1h`"),
            )
        }),
    };
    Ok(Server {
        host: raw.host.unwrap_or_else(|| DEFAULT_HOST.to_owned()),
        port: raw.port.unwrap_or(DEFAULT_PORT),
        api_key_env: raw.api_key_env,
        startup_timeout: duration("startup_timeout", &raw.startup_timeout, 1800)?,
        stop_grace: duration("stop_grace", &raw.stop_grace, 30)?,
    })
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
                repo: self.model.repo.clone(),
                revision: self.model.revision.clone(),
                path: self.model.path.clone(),
                served_name: Some(self.model.served_name.clone()),
            },
            quantize: self.quantize.as_ref().map(|q| QuantizeSection {
                scheme: Some(q.scheme),
                format: Some(q.format),
                ignore: q.ignore.clone(),
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
                kv_cache_bytes: self.memory.kv_cache_bytes.map(super::bytes::ByteSize),
                kv_offload_bytes: self.memory.kv_offload_bytes.map(super::bytes::ByteSize),
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
        }
    }

    /// The data type the model computes in, when the recipe fixes it.
    pub fn dtype(&self) -> Option<ModelDtype> {
        self.serving.dtype
    }
}

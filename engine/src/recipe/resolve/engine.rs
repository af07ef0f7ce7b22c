//! The recipe's engine: which one, which release, how it runs (host process or
//! container) and how often it is restarted, with the combinations no engine accepts
//! refused. What a particular engine or release cannot do is its adapter's to refuse
//! (`launch/`).

use crate::recipe::{EngineKind, EngineSection, RecipeError, Runtime};
use crate::version::Version;

use super::Invalid;

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

pub(super) fn resolve_engine(raw: EngineSection, invalid: &Invalid<'_>) -> Result<Engine, RecipeError> {
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

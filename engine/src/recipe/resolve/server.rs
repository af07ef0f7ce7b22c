//! The recipe's endpoint: listen address and port, the variable holding the API key,
//! and how long start-up and stop may take. Binding and serving are the engines' (or
//! the native engine's) concern, not this file's.

use crate::recipe::{RecipeError, ServerSection};

use super::{Invalid, is_env_name};

/// Default `server.host`: every interface, as vLLM's own default.
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// Default `server.port`: vLLM's and TensorRT-LLM's.
pub const DEFAULT_PORT: u16 = 8000;

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

pub(super) fn resolve_server(raw: ServerSection, invalid: &Invalid<'_>) -> Result<Server, RecipeError> {
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

//! What a server under test serves, before a benchmark or an eval: the first model of its
//! `/v1/models` (name, root, `max_model_len`, as vLLM's `ModelCard` in vLLM 0.33
//! `vllm/entrypoints/serve/engine/protocol.py` carries them), and the tokenizer that
//! prompts are measured with. Not here: sending the workload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use sous_engine::repo::RepoId;

use sous_engine::diagnose::{Class, Diagnose, user_unless};

use crate::hub::cache::RepoCache;

/// Why the server's model or its tokenizer could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ServedError {
    /// The server did not answer `/v1/models`.
    #[error("cannot reach {url}/v1/models: {error}")]
    Unreachable {
        /// The server's base URL.
        url: String,
        /// What the client said.
        error: reqwest::Error,
    },
    /// `/v1/models` answered with an error status.
    #[error("{url}/v1/models answered {status}")]
    ModelsStatus {
        /// The server's base URL.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
    },
    /// `/v1/models` answered something that is not its JSON.
    #[error("reading /v1/models")]
    ModelsBody(#[source] reqwest::Error),
    /// A tokenizer file does not load.
    #[error("cannot read the tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// No tokenizer was given and none was found for the served model.
    #[error(
        "no tokenizer found for model `{id}`{}",
        root.as_ref().map_or(String::new(), |r| format!(" (root `{r}`)"))
    )]
    NoTokenizer {
        /// The served model's name.
        id: String,
        /// Its root, as `/v1/models` gave it.
        root: Option<String>,
    },
}

impl Diagnose for ServedError {
    /// A body that is not `/v1/models`' JSON is the server's or sous's business; the
    /// address, the key and the tokenizer are the user's.
    fn class(&self) -> Class {
        user_unless(matches!(self, ServedError::ModelsBody(_)))
    }

    fn hint(&self) -> Option<String> {
        match self {
            ServedError::Unreachable { .. } => Some("check --url, and that the server is up"),
            ServedError::ModelsStatus { .. } => Some("pass --api-key-env if the server needs a key"),
            ServedError::NoTokenizer { .. } => Some(
                "pass --tokenizer DIR_OR_FILE (a model directory with tokenizer.json), or `sous pull` the model",
            ),
            _ => None,
        }
        .map(str::to_owned)
    }
}

/// The first model a server lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Its name, as requests give it (empty when the list is).
    pub id: String,
    /// Where it was loaded from, when the server says.
    pub root: Option<String>,
    /// The longest prompt + output it takes, when the server says.
    pub max_model_len: Option<usize>,
}

/// The first model of `{url}/v1/models`.
pub async fn models(client: &reqwest::Client, url: &str, key: Option<&str>) -> Result<Served, ServedError> {
    let mut request = client
        .get(format!("{url}/v1/models"))
        .timeout(Duration::from_secs(10));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|error| ServedError::Unreachable {
        url: url.to_owned(),
        error,
    })?;
    if !response.status().is_success() {
        return Err(ServedError::ModelsStatus {
            url: url.to_owned(),
            status: response.status(),
        });
    }
    let body: Value = response.json().await.map_err(ServedError::ModelsBody)?;
    let first = &body["data"][0];
    Ok(Served {
        id: first["id"].as_str().unwrap_or_default().to_owned(),
        root: first["root"].as_str().map(str::to_owned),
        max_model_len: first["max_model_len"].as_u64().map(|n| n as usize),
    })
}

/// The tokenizer: `given` (a file, or a directory holding `tokenizer.json`), else the
/// model's root directory, else the Hugging Face cache entry of the root or the served
/// name. Returns it with the file it came from.
pub fn tokenizer(
    given: Option<&Path>,
    root: Option<&str>,
    id: &str,
) -> Result<(tokenizers::Tokenizer, PathBuf), ServedError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = given {
        candidates.push(if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        });
    } else {
        let cache = crate::hub::config::HubConfig::from_env().cache_dir;
        for name in root.into_iter().chain([id]) {
            let path = Path::new(name);
            if path.is_dir() {
                candidates.push(path.join("tokenizer.json"));
            }
            if let Ok(repo) = name.parse::<RepoId>() {
                let snapshots = RepoCache::new(&cache, &repo).dir().join("snapshots");
                if let Ok(entries) = std::fs::read_dir(&snapshots) {
                    candidates.extend(entries.flatten().map(|e| e.path().join("tokenizer.json")));
                }
            }
        }
    }
    for path in &candidates {
        if path.is_file() {
            let t = tokenizers::Tokenizer::from_file(path).map_err(|e| ServedError::Tokenizer {
                path: path.clone(),
                message: e.to_string(),
            })?;
            return Ok((t, path.clone()));
        }
    }
    Err(ServedError::NoTokenizer {
        id: id.to_owned(),
        root: root.map(str::to_owned),
    })
}

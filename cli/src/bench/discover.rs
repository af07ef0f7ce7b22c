//! What a server under test serves, before a benchmark: the first model of its
//! `/v1/models` (name, root, `max_model_len`, as vLLM's `ModelCard` in vLLM 0.33
//! `vllm/entrypoints/serve/engine/protocol.py` carries them), and the tokenizer that
//! prompts are measured with. Not here: sending the workload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use sous_engine::repo::RepoId;

use super::BenchError;
use crate::hub::cache::RepoCache;

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
pub async fn models(client: &reqwest::Client, url: &str, key: Option<&str>) -> Result<Served, BenchError> {
    let mut request = client
        .get(format!("{url}/v1/models"))
        .timeout(Duration::from_secs(10));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|error| BenchError::Unreachable {
        url: url.to_owned(),
        error,
    })?;
    if !response.status().is_success() {
        return Err(BenchError::ModelsStatus {
            url: url.to_owned(),
            status: response.status(),
        });
    }
    let body: Value = response.json().await.map_err(BenchError::ModelsBody)?;
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
) -> Result<(tokenizers::Tokenizer, PathBuf), BenchError> {
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
            let t = tokenizers::Tokenizer::from_file(path).map_err(|e| BenchError::Tokenizer {
                path: path.clone(),
                message: e.to_string(),
            })?;
            return Ok((t, path.clone()));
        }
    }
    Err(BenchError::NoTokenizer {
        id: id.to_owned(),
        root: root.map(str::to_owned),
    })
}

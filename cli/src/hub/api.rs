//! The Hub's HTTP API, the part a pull needs: revision info, the file tree, and the
//! `resolve` URLs files are downloaded from; with the Hub's errors mapped by their
//! `X-Error-Code` (huggingface_hub 2.4.0 `utils/_http.py::hf_raise_for_status`), which
//! hf-hub 1.0.0 ignores (it classifies by status and call site, `client.rs`
//! `check_response`). `docs/hub.md` lists the requests and errors.
//!
//! Written on reqwest rather than the hf-hub crate: hf-hub 1.0.0 cannot resume, has no
//! parallel ranged downloads, verifies neither sizes nor hashes, writes error bodies
//! into the cache when a GET fails after a good HEAD, and pulls in hf-xet
//! unconditionally (327 crates); see "Why sous does not use the hf-hub crate" in
//! `docs/hub.md`.

use std::time::Duration;

use reqwest::{Client, Response, StatusCode, header};
use serde::Deserialize;
use sous_engine::diagnose::{Class, Diagnose};

use super::config::HubConfig;

/// What can go wrong talking to the Hub. Every variant but `Http` and `Protocol` is the
/// user's to fix (exit code 1); those two usually mean the network or the server.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The repository does not exist, or is private and the token cannot see it.
    #[error("repository `{repo}` not found on {endpoint}")]
    RepoNotFound {
        /// The repository.
        repo: String,
        /// The Hub.
        endpoint: String,
    },
    /// The revision (branch, tag, commit) does not exist.
    #[error("revision `{revision}` not found in `{repo}`")]
    RevisionNotFound {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
    },
    /// A file of the listing is missing from the repository.
    #[error("file `{path}` not found in `{repo}` at {revision}")]
    EntryNotFound {
        /// The repository.
        repo: String,
        /// The revision.
        revision: String,
        /// The file.
        path: String,
    },
    /// The repository is gated, and no token was sent.
    #[error("`{repo}` is gated: it needs a token from an account that accepted its terms")]
    GatedAnonymous {
        /// The repository.
        repo: String,
    },
    /// The token was refused.
    #[error("the Hub refused the token for `{repo}` ({status})")]
    Forbidden {
        /// The repository.
        repo: String,
        /// 401 or 403.
        status: u16,
    },
    /// No connection, a timeout or a dropped stream, after retries.
    #[error("cannot reach {url}")]
    Http {
        /// The URL.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The Hub answered with a server error or asked to come back later (408, 429,
    /// 5xx), after retries: it is down or overloaded, not refusing.
    #[error("the Hub is unavailable: {url} answered HTTP {status}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Unavailable {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// `X-Error-Message`, if the Hub gave one.
        message: String,
    },
    /// An answer sous cannot use (bad JSON, missing headers, unexpected status).
    #[error("unexpected answer from {url}: {message}")]
    Protocol {
        /// The URL.
        url: String,
        /// What was wrong.
        message: String,
    },
}

impl Diagnose for HubError {
    /// The repository, the token, the network or the server: never sous's fault.
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            HubError::RepoNotFound { .. } => Some(
                "check the repository id; a private repository needs a token (HF_TOKEN or `hf auth login`)".into(),
            ),
            HubError::RevisionNotFound { .. } => Some("check the branch, tag or commit after `@`".into()),
            HubError::GatedAnonymous { repo } => Some(format!(
                "accept the terms on the repository's page, then set HF_TOKEN (a read token of that account) and pull `{repo}` again"
            )),
            HubError::Forbidden { .. } => Some(
                "the token is invalid, or its account has not been granted access: check HF_TOKEN or the token file".into(),
            ),
            HubError::Http { .. } => Some(
                "check the network and HF_ENDPOINT; run the same command again to resume where it stopped".into(),
            ),
            HubError::Unavailable { .. } => Some(
                "the Hub is down or overloaded: run the same command again later; a revision pulled before is used from disk when the Hub cannot answer".into(),
            ),
            HubError::EntryNotFound { .. } | HubError::Protocol { .. } => None,
        }
    }
}

impl HubError {
    /// Whether the Hub could not answer at all: no connection, a timeout, or a server
    /// error after retries. What a reachable Hub says (401, 403, 404, a revision that
    /// does not exist) is an answer, not an outage. huggingface_hub 2.4.0's
    /// `HfApi.resolve_revision` (`hf_api.py`) draws the line at the same place: transport
    /// errors and statuses from 500 fall back to the cached commit, with a warning; the
    /// rest is raised.
    pub fn is_outage(&self) -> bool {
        matches!(self, HubError::Http { .. } | HubError::Unavailable { .. })
    }
}

/// `GET /api/models/{repo}/revision/{rev}`.
#[derive(Debug, Clone, Deserialize)]
pub struct RevisionInfo {
    /// The commit the revision points to.
    pub sha: String,
}

/// One entry of `GET /api/models/{repo}/tree/{rev}?recursive=true`.
#[derive(Debug, Clone, Deserialize)]
pub struct TreeEntry {
    /// `file` or `directory`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Path in the repository.
    pub path: String,
    /// Size in bytes.
    #[serde(default)]
    pub size: u64,
    /// git object id (for LFS files, of the pointer).
    #[serde(default)]
    pub oid: String,
    /// LFS metadata, for large files.
    #[serde(default)]
    pub lfs: Option<LfsInfo>,
    /// The file's Xet hash, for files in Xet storage (`xetHash`; huggingface_hub reads
    /// it into `RepoFile.xet_hash`, `src/huggingface_hub/hf_api.py`).
    #[serde(default, rename = "xetHash")]
    pub xet_hash: Option<String>,
}

/// LFS metadata of a tree entry.
#[derive(Debug, Clone, Deserialize)]
pub struct LfsInfo {
    /// sha256 of the content.
    pub oid: String,
    /// Size of the content.
    pub size: u64,
}

/// A connection to one Hub.
#[derive(Debug, Clone)]
pub struct HubClient {
    http: Client,
    config: HubConfig,
}

/// Attempts for a metadata request before giving up.
const ATTEMPTS: u32 = 5;

impl HubClient {
    /// A client for the configured Hub.
    pub fn new(config: HubConfig) -> Result<HubClient, HubError> {
        let http = Client::builder()
            .user_agent(concat!("sous/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(30))
            // Python and the Hub expect identity encoding on file bodies; compressed
            // bodies would also break byte ranges.
            .no_gzip()
            .build()
            .map_err(|source| HubError::Http {
                url: config.endpoint.clone(),
                source,
            })?;
        Ok(HubClient { http, config })
    }

    /// The settings in use.
    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The underlying HTTP client (shared connection pool).
    pub fn http(&self) -> &Client {
        &self.http
    }

    /// Adds the token, when there is one.
    pub fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.config.token {
            Some(token) => request.bearer_auth(token.expose()),
            None => request,
        }
    }

    /// The URL a file is downloaded from.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> String {
        format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.config.endpoint,
            encode_path(path)
        )
    }

    /// Resolves a revision to its commit.
    pub async fn revision(&self, repo: &str, revision: &str) -> Result<RevisionInfo, HubError> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}",
            self.config.endpoint,
            encode_segment(revision)
        );
        let response = self.get_with_retries(&url, repo, revision, None).await?;
        let info: RevisionInfo = response.json().await.map_err(|e| HubError::Protocol {
            url: url.clone(),
            message: format!("revision info is not the expected JSON: {e}"),
        })?;
        if !super::cache::is_commit(&info.sha) {
            return Err(HubError::Protocol {
                url,
                message: format!("`{}` is not a commit id", info.sha),
            });
        }
        Ok(info)
    }

    /// Every file of a commit, following `Link: <...>; rel="next"` pages.
    pub async fn tree(&self, repo: &str, commit: &str) -> Result<Vec<TreeEntry>, HubError> {
        let mut url = format!(
            "{}/api/models/{repo}/tree/{commit}?recursive=true&expand=false",
            self.config.endpoint
        );
        let mut files = Vec::new();
        loop {
            let response = self.get_with_retries(&url, repo, commit, None).await?;
            let next = next_link(&response);
            let page: Vec<TreeEntry> = response.json().await.map_err(|e| HubError::Protocol {
                url: url.clone(),
                message: format!("file tree is not the expected JSON: {e}"),
            })?;
            files.extend(page.into_iter().filter(|e| e.kind == "file"));
            match next {
                Some(n) => url = n,
                None => break,
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// GET with retries on transient failures (connection errors, 429, 5xx), with
    /// exponential backoff; Hub errors are mapped.
    async fn get_with_retries(
        &self,
        url: &str,
        repo: &str,
        revision: &str,
        path: Option<&str>,
    ) -> Result<Response, HubError> {
        let mut delay = Duration::from_millis(200);
        let mut attempt = 1;
        loop {
            let result = self.authorize(self.http.get(url)).send().await;
            let retry = match result {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) if is_retryable(response.status()) && attempt < ATTEMPTS => true,
                Ok(response) => return Err(classify(response, url, repo, revision, path)),
                Err(source) if attempt < ATTEMPTS => {
                    tracing::debug!(%url, error = %source, attempt, "retrying");
                    true
                }
                Err(source) => {
                    return Err(HubError::Http {
                        url: url.to_owned(),
                        source,
                    });
                }
            };
            debug_assert!(retry);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(8));
            attempt += 1;
        }
    }
}

/// Statuses worth retrying (huggingface_hub and hf-hub retry the same set).
pub fn is_retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

/// Maps an error response to what it means, by `X-Error-Code` first, then status.
pub fn classify(response: Response, url: &str, repo: &str, revision: &str, path: Option<&str>) -> HubError {
    let status = response.status();
    let code = response
        .headers()
        .get("x-error-code")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let message = response
        .headers()
        .get("x-error-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match (code.as_str(), status.as_u16()) {
        ("RepoNotFound", _) => HubError::RepoNotFound {
            repo: repo.to_owned(),
            endpoint: origin(url),
        },
        ("RevisionNotFound", _) => HubError::RevisionNotFound {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
        },
        ("EntryNotFound", _) => HubError::EntryNotFound {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            path: path.unwrap_or_default().to_owned(),
        },
        ("GatedRepo", 401) => HubError::GatedAnonymous {
            repo: repo.to_owned(),
        },
        (_, 401 | 403) => HubError::Forbidden {
            repo: repo.to_owned(),
            status: status.as_u16(),
        },
        (_, 404) => HubError::RepoNotFound {
            repo: repo.to_owned(),
            endpoint: origin(url),
        },
        _ if is_retryable(status) => HubError::Unavailable {
            url: url.to_owned(),
            status: status.as_u16(),
            message,
        },
        _ => HubError::Protocol {
            url: url.to_owned(),
            message: if message.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {message}")
            },
        },
    }
}

fn origin(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let end = url[after_scheme..]
        .find('/')
        .map_or(url.len(), |i| after_scheme + i);
    url[..end].to_owned()
}

fn next_link(response: &Response) -> Option<String> {
    let link = response.headers().get(header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            url.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned()
        })
    })
}

/// Percent-encodes one URL segment (a revision: `refs/pr/1` → `refs%2Fpr%2F1`).
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a file path, keeping its `/`.
pub fn encode_path(path: &str) -> String {
    path.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_the_hub() {
        assert_eq!(encode_segment("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_path("sub dir/a+b.json"), "sub%20dir/a%2Bb.json");
        assert_eq!(origin("http://127.0.0.1:9/api/models/x"), "http://127.0.0.1:9");
    }
}

//! The Hugging Face Hub as sous sees it ([`HubConfig`]): whether its endpoint answers,
//! and whether a token was found and where. The token itself is never read into
//! anything printed: only the name of the variable or file it came from.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hub::config::HubConfig;

/// How long the Hub may take to answer.
pub const LIMIT: Duration = Duration::from_secs(5);

/// The Hub.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hub {
    /// The endpoint (`HF_ENDPOINT`, else `https://huggingface.co`).
    pub endpoint: String,
    /// `HF_HUB_OFFLINE`: sous will not reach for the Hub, so it was not asked.
    pub offline: bool,
    /// Whether it answered `GET /api/models?limit=1` (any HTTP status); `None` when
    /// offline.
    pub reachable: Option<bool>,
    /// The HTTP status it answered with.
    pub status: Option<u16>,
    /// How long the answer took.
    pub latency_ms: Option<u64>,
    /// Why it did not answer.
    pub error: Option<String>,
    /// The token.
    pub token: TokenSource,
}

/// Where the token sous would send comes from; never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenSource {
    /// Whether there is one.
    pub present: bool,
    /// `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN` or the token file's path; or why there is
    /// none although one may be set (`HF_HUB_DISABLE_IMPLICIT_TOKEN`).
    pub source: Option<String>,
}

impl std::fmt::Display for TokenSource {
    /// `present (from HF_TOKEN)`, `absent`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.present, &self.source) {
            (true, Some(source)) => write!(f, "present (from {source})"),
            (true, None) => f.write_str("present"),
            (false, Some(why)) => write!(f, "absent ({why})"),
            (false, None) => f.write_str("absent"),
        }
    }
}

/// Where [`HubConfig::from_vars`] would take the token from, in its order
/// (huggingface_hub's `utils/_auth.py`): `HF_HUB_DISABLE_IMPLICIT_TOKEN` disables it;
/// else `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, then the file `HF_TOKEN_PATH` or
/// `$HF_HOME/token` when it holds more than whitespace.
pub fn token_source(var: impl Fn(&str) -> Option<String>) -> TokenSource {
    if var("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some() {
        return TokenSource {
            present: false,
            source: Some("HF_HUB_DISABLE_IMPLICIT_TOKEN is set".into()),
        };
    }
    for name in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] {
        if var(name).is_some() {
            return TokenSource {
                present: true,
                source: Some(name.into()),
            };
        }
    }
    let home = var("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        var("XDG_CACHE_HOME")
            .map_or_else(|| home.join(".cache"), PathBuf::from)
            .join("huggingface")
    });
    let file = var("HF_TOKEN_PATH").map_or_else(|| hf_home.join("token"), PathBuf::from);
    let filled = std::fs::read_to_string(&file).is_ok_and(|text| !text.trim().is_empty());
    TokenSource {
        present: filled,
        source: filled.then(|| file.display().to_string()),
    }
}

/// Asks the Hub for one model, within [`LIMIT`], without the token.
pub async fn probe(config: &HubConfig, token: TokenSource) -> Hub {
    let mut hub = Hub {
        endpoint: config.endpoint.clone(),
        offline: config.offline,
        reachable: None,
        status: None,
        latency_ms: None,
        error: None,
        token,
    };
    if config.offline {
        return hub;
    }
    let client = match reqwest::Client::builder()
        .timeout(LIMIT)
        .user_agent(concat!("sous/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            hub.reachable = Some(false);
            hub.error = Some(describe(&e));
            return hub;
        }
    };
    let url = format!("{}/api/models?limit=1", config.endpoint);
    let started = Instant::now();
    match client.get(&url).send().await {
        Ok(response) => {
            hub.reachable = Some(true);
            hub.status = Some(response.status().as_u16());
            hub.latency_ms = Some(started.elapsed().as_millis() as u64);
        }
        Err(e) => {
            hub.reachable = Some(false);
            hub.error = Some(describe(&e));
        }
    }
    hub
}

/// `cannot connect: Connection refused (os error 111)`, `no answer within 5 s`.
fn describe(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("no answer within {} s", LIMIT.as_secs());
    }
    let mut root: &dyn std::error::Error = error;
    while let Some(source) = root.source() {
        root = source;
    }
    if error.is_connect() {
        format!("cannot connect: {root}")
    } else if error.is_builder() {
        format!("bad endpoint: {root}")
    } else {
        root.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn names_where_the_token_comes_from_as_hub_config_finds_it() {
        let home = tempfile::tempdir().expect("tempdir");
        let home_str = home.path().display().to_string();
        let cases: Vec<(Vec<(&'static str, String)>, TokenSource)> = vec![
            (
                vec![("HOME", home_str.clone())],
                TokenSource {
                    present: false,
                    source: None,
                },
            ),
            (
                vec![("HOME", home_str.clone()), ("HF_TOKEN", "hf_secret".into())],
                TokenSource {
                    present: true,
                    source: Some("HF_TOKEN".into()),
                },
            ),
            (
                vec![("HUGGING_FACE_HUB_TOKEN", "hf_secret".into())],
                TokenSource {
                    present: true,
                    source: Some("HUGGING_FACE_HUB_TOKEN".into()),
                },
            ),
            (
                vec![
                    ("HF_TOKEN", "hf_secret".into()),
                    ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1".into()),
                ],
                TokenSource {
                    present: false,
                    source: Some("HF_HUB_DISABLE_IMPLICIT_TOKEN is set".into()),
                },
            ),
        ];
        for (env, expected) in cases {
            let source = token_source(vars(env.clone()));
            assert_eq!(source, expected, "{env:?}");
            let config = HubConfig::from_vars(vars(env.clone()));
            assert_eq!(config.token.is_some(), source.present, "{env:?}");
        }
        // The login file, where `hf auth login` writes it.
        let file = home.path().join(".cache/huggingface/token");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, "  \n").expect("write");
        let env = vec![("HOME", home_str.clone())];
        assert!(
            !token_source(vars(env.clone())).present,
            "a blank file is no token"
        );
        std::fs::write(&file, "hf_from_file\n").expect("write");
        let source = token_source(vars(env.clone()));
        assert_eq!(source.source, Some(file.display().to_string()));
        assert!(HubConfig::from_vars(vars(env)).token.is_some());
        assert_eq!(source.to_string(), format!("present (from {})", file.display()));
        assert!(!source.to_string().contains("hf_from_file"));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_offline_is_not_asked() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let env = vec![("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))];
        let hub = probe(&HubConfig::from_vars(vars(env)), token_source(|_| None)).await;
        assert_eq!(hub.reachable, Some(false));
        assert!(
            hub.error
                .as_deref()
                .is_some_and(|e| e.starts_with("cannot connect")),
            "{hub:?}"
        );
        let env = vec![("HF_HUB_OFFLINE", "1".into())];
        let hub = probe(&HubConfig::from_vars(vars(env)), token_source(|_| None)).await;
        assert!(hub.offline);
        assert_eq!(hub.reachable, None);
    }
}

//! Where the Hub is and who we are to it: endpoint, token and cache directory, read
//! from the environment in the order huggingface_hub uses (huggingface_hub 2.4.0
//! `src/huggingface_hub/constants.py` and `utils/_auth.py`; the table in `docs/hub.md`),
//! so that sous and Python tools share one cache and one login.

use std::path::{Path, PathBuf};

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A token, never printed: `Debug` and `Display` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The secret itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

/// Resolved Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL, without a trailing `/`.
    pub endpoint: String,
    /// Bearer token, if any.
    pub token: Option<Token>,
    /// The Hub cache (`models--org--name/...` lives here).
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE`: no network at all.
    pub offline: bool,
}

impl HubConfig {
    /// From the process environment.
    pub fn from_env() -> HubConfig {
        HubConfig::from_vars(sous_engine::env::lookup)
    }

    /// From an environment lookup (tests pass their own).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> HubConfig {
        let home = var("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map_or_else(|| home.join(".cache"), PathBuf::from)
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map_or_else(|| hf_home.join("hub"), PathBuf::from);
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
            .trim_end_matches('/')
            .to_owned();
        let token = if var("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some() {
            None
        } else {
            var("HF_TOKEN")
                .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
                .or_else(|| {
                    let path = var("HF_TOKEN_PATH").map_or_else(|| hf_home.join("token"), PathBuf::from);
                    read_token_file(&path)
                })
                .map(Token)
        };
        let offline = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"].iter().any(|name| {
            var(name).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        });
        HubConfig {
            endpoint,
            token,
            cache_dir,
            offline,
        }
    }
}

fn read_token_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn follows_huggingface_hub_precedence() {
        let c = HubConfig::from_vars(vars(&[("HOME", "/h")]));
        assert_eq!(c.cache_dir, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert!(!c.offline);
        let c = HubConfig::from_vars(vars(&[
            ("HF_HOME", "/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "1"),
        ]));
        assert_eq!(c.cache_dir, PathBuf::from("/hf/hub"));
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert!(c.offline);
        let c = HubConfig::from_vars(vars(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/cache"),
            ("HF_TOKEN", "hf_secret"),
        ]));
        assert_eq!(c.cache_dir, PathBuf::from("/cache"));
        assert_eq!(c.token.as_ref().map(Token::expose), Some("hf_secret"));
        assert!(
            !format!("{c:?}").contains("hf_secret"),
            "the token never shows in Debug"
        );
    }
}

//! Hugging Face Hub repository ids: one type, [`RepoId`], checked by one rule, the
//! Hub's own, and the names sous derives from an id (the Hub cache's folder).
//!
//! The rule is huggingface_hub 2.4.0's `validate_repo_id`
//! (`src/huggingface_hub/utils/_validators.py`): `name` or `namespace/name`; each part
//! 1 to 96 ASCII letters, digits, `_`, `-` or `.`, starting and ending with a letter,
//! digit or `_`; no `--` or `..` anywhere; not ending in `.git`. A name without a
//! namespace (`gpt2`) is an id: the Hub still redirects those to their organisations.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A valid Hub repository id, `namespace/name` or `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoId(String);

/// Why a text is not a repository id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoIdError {
    /// More than one `/`.
    #[error("`{0}` is not a repository id: it has more than one `/` (write `name` or `namespace/name`)")]
    TooManyParts(String),
    /// A part is empty, too long, or has a character the Hub refuses.
    #[error(
        "`{0}` is not a repository id: each part is 1 to 96 letters, digits, `_`, `-` or `.`, and starts and ends with a letter, digit or `_`"
    )]
    Characters(String),
    /// `--` or `..`, which the Hub refuses (and `--` separates parts in cache folders).
    #[error("`{0}` is not a repository id: `--` and `..` are not allowed")]
    Sequence(String),
    /// A name ending in `.git`.
    #[error("`{0}` is not a repository id: it cannot end in `.git`")]
    DotGit(String),
}

impl crate::diagnose::Diagnose for RepoIdError {
    /// An id the user wrote.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        Some("write `org/name`, e.g. `HuggingFaceTB/SmolLM2-135M-Instruct`".into())
    }
}

/// One part of an id: 1 to 96 allowed characters, a word character at both ends (the
/// `\b` of the Hub's pattern).
fn valid_part(part: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (1..=96).contains(&part.len())
        && part.chars().all(|c| word(c) || matches!(c, '-' | '.'))
        && part.starts_with(word)
        && part.ends_with(word)
}

impl FromStr for RepoId {
    type Err = RepoIdError;

    fn from_str(text: &str) -> Result<RepoId, RepoIdError> {
        let parts: Vec<&str> = text.split('/').collect();
        if parts.len() > 2 {
            return Err(RepoIdError::TooManyParts(text.to_owned()));
        }
        if !parts.iter().all(|p| valid_part(p)) {
            return Err(RepoIdError::Characters(text.to_owned()));
        }
        if text.contains("--") || text.contains("..") {
            return Err(RepoIdError::Sequence(text.to_owned()));
        }
        if text.ends_with(".git") {
            return Err(RepoIdError::DotGit(text.to_owned()));
        }
        Ok(RepoId(text.to_owned()))
    }
}

impl RepoId {
    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `models--org--name`: the repository's folder in the Hub cache (huggingface_hub
    /// 2.4.0 `file_download.py` `repo_folder_name`, for model repositories).
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }

    /// The id a Hub cache folder (`models--org--name`) belongs to. Ids cannot hold
    /// `--`, so the folder name reads back unambiguously.
    pub fn from_cache_folder(folder: &str) -> Option<RepoId> {
        folder
            .strip_prefix("models--")?
            .replacen("--", "/", 1)
            .parse()
            .ok()
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RepoId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Serialize for RepoId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RepoId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RepoId, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> bool {
        text.parse::<RepoId>().is_ok()
    }

    #[test]
    fn accepts_what_the_hub_accepts() {
        for id in [
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "Qwen/Qwen3.8-27B",
            "gpt2",
            "bert-base-uncased",
            "_org/_name_",
            "a/b",
            "org/model.v1.0",
        ] {
            assert!(ok(id), "{id}");
        }
        assert!(ok(&"a".repeat(96)));
    }

    #[test]
    fn refuses_what_the_hub_refuses() {
        assert!(matches!(
            "a/b/c".parse::<RepoId>(),
            Err(RepoIdError::TooManyParts(_))
        ));
        for id in [
            "",
            "/",
            "org/",
            "/name",
            "-org/name",
            "org/name-",
            ".name",
            "org/na me",
            "café",
            "org/ñ",
        ] {
            assert!(
                matches!(id.parse::<RepoId>(), Err(RepoIdError::Characters(_))),
                "{id}"
            );
        }
        assert!(!ok(&"a".repeat(97)));
        assert!(matches!(
            "org/a--b".parse::<RepoId>(),
            Err(RepoIdError::Sequence(_))
        ));
        assert!(matches!(
            "org/a..b".parse::<RepoId>(),
            Err(RepoIdError::Sequence(_))
        ));
        assert!(matches!(
            "org/name.git".parse::<RepoId>(),
            Err(RepoIdError::DotGit(_))
        ));
    }

    #[test]
    fn names_the_cache_folder_and_reads_it_back() {
        let id: RepoId = "acme/tiny-1.5b".parse().expect("an id");
        assert_eq!(id.cache_folder(), "models--acme--tiny-1.5b");
        assert_eq!(RepoId::from_cache_folder("models--acme--tiny-1.5b"), Some(id));
        let bare: RepoId = "gpt2".parse().expect("an id");
        assert_eq!(bare.cache_folder(), "models--gpt2");
        assert_eq!(RepoId::from_cache_folder("models--gpt2"), Some(bare));
        assert_eq!(RepoId::from_cache_folder("datasets--acme--x"), None);
    }

    #[test]
    fn serializes_as_the_string() {
        let id: RepoId = "acme/tiny".parse().expect("an id");
        assert_eq!(serde_json::to_string(&id).expect("json"), "\"acme/tiny\"");
        assert!(serde_json::from_str::<RepoId>("\"a/b/c\"").is_err());
    }
}

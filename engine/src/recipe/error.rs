//! What can be wrong with a recipe, and where: one error variant per mistake a
//! caller may handle, each pointing at the file and line, the environment variable or
//! the `--set` argument that caused it, with a hint when there is an obvious fix.
//!
//! Rendering is plain text in the shape rustc and cargo use (`--> file:line:col`, the
//! offending line, a caret underline), because people read these in terminals and CI
//! logs alike. Colour is the binary's business, not this module's.

use std::fmt;
use std::path::PathBuf;

use crate::diagnose::{Class, Diagnose};

/// Where a recipe value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A span in a recipe file.
    File {
        /// The file, as the user would name it (relative paths kept relative).
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// The text of that line.
        text: String,
        /// How many characters to underline.
        width: usize,
    },
    /// A recipe file, without a known position.
    FileOnly(PathBuf),
    /// A `SOUS_*` environment variable.
    Env(String),
    /// A `--set key=value` argument.
    Set(String),
}

impl Location {
    /// Locates a byte span in `text`, a file's contents.
    pub fn in_file(path: PathBuf, text: &str, span: std::ops::Range<usize>) -> Location {
        let start = span.start.min(text.len());
        let before = &text[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i);
        let line_text = text[line_start..line_end].trim_end_matches('\r').to_owned();
        let column = text[line_start..start].chars().count() + 1;
        let end = span.end.clamp(start, line_end);
        let width = text[start..end].chars().count().max(1);
        Location::File {
            path,
            line,
            column,
            text: line_text,
            width,
        }
    }

    /// A one-line description: `recipes/x.toml:12:5`, `environment variable SOUS_X`.
    pub fn short(&self) -> String {
        match self {
            Location::File {
                path, line, column, ..
            } => format!("{}:{line}:{column}", path.display()),
            Location::FileOnly(path) => path.display().to_string(),
            Location::Env(var) => format!("environment variable {var}"),
            Location::Set(arg) => format!("--set {arg}"),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  --> {}", self.short())?;
        if let Location::File {
            line,
            column,
            text,
            width,
            ..
        } = self
        {
            let gutter = line.to_string().len();
            let pad = " ".repeat(gutter);
            // Tabs keep the caret aligned when the line is indented with them.
            let lead: String = text
                .chars()
                .take(column.saturating_sub(1))
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            write!(
                f,
                "\n{pad} |\n{line} | {text}\n{pad} | {lead}{}",
                "^".repeat(*width)
            )?;
        }
        Ok(())
    }
}

/// An optional location, rendered on its own lines after a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct At(pub Option<Box<Location>>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(location) => write!(f, "\n{location}"),
            None => Ok(()),
        }
    }
}

impl From<Option<Location>> for At {
    fn from(location: Option<Location>) -> At {
        At(location.map(Box::new))
    }
}

/// A recipe that cannot be loaded or resolved. Every variant is the user's to fix.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    /// A recipe file, or a parent named by `extends`, cannot be read.
    #[error("cannot read recipe `{}`: {error}{at}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (part of the message rather than a `source`, so it is said once).
        error: std::io::Error,
        /// The `extends` that named it, if any.
        at: At,
    },

    /// `extends` leads back to a file already in the chain.
    #[error("recipe `extends` forms a cycle: {}", chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> "))]
    CyclicExtends {
        /// The files, from the first back to the repeated one.
        chain: Vec<PathBuf>,
    },

    /// The file is not valid TOML.
    #[error("invalid TOML: {message}{at}")]
    Syntax {
        /// The parser's message.
        message: String,
        /// Where.
        at: At,
    },

    /// A key the recipe format does not have.
    #[error("unknown key `{key}` in {section}{at}")]
    UnknownKey {
        /// The key as written.
        key: String,
        /// `[serving]`, or `the top level`.
        section: String,
        /// Where.
        at: At,
        /// The closest valid key, or a note on where the key belongs.
        hint: Option<String>,
    },

    /// A value of the right type that is not one of the allowed names.
    #[error("`{key}` cannot be `{value}`: expected one of {}{at}", expected.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", "))]
    UnknownVariant {
        /// The dotted key.
        key: String,
        /// The value as written.
        value: String,
        /// The allowed values.
        expected: Vec<String>,
        /// Where.
        at: At,
        /// The closest allowed value.
        hint: Option<String>,
    },

    /// A value of the wrong type, out of range, or malformed.
    #[error("invalid `{key}`: {message}{at}")]
    InvalidValue {
        /// The dotted key.
        key: String,
        /// What is wrong with it.
        message: String,
        /// Where.
        at: At,
        /// How to fix it, when there is an obvious way.
        hint: Option<String>,
    },

    /// Settings that cannot hold together.
    #[error("conflicting settings: {message}{at}")]
    Conflict {
        /// What conflicts with what, and why.
        message: String,
        /// Where the later of the two was set.
        at: At,
        /// How to fix it.
        hint: Option<String>,
    },

    /// A setting the recipe must have, after all layers are merged.
    #[error("missing `{key}`: {message}")]
    Missing {
        /// The dotted key.
        key: String,
        /// Why it is needed.
        message: String,
        /// How to fix it.
        hint: Option<String>,
    },

    /// A `--set` argument that is not `key.path=value`.
    #[error("invalid override `{arg}`: expected `key.path=value`, e.g. `serving.max_num_seqs=8`")]
    MalformedOverride {
        /// The argument.
        arg: String,
    },
}

impl Diagnose for RecipeError {
    /// Every recipe error is the author's to fix.
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        self.hint_text().map(str::to_owned)
    }
}

impl RecipeError {
    /// A next step for the user, when there is an obvious one.
    fn hint_text(&self) -> Option<&str> {
        match self {
            RecipeError::UnknownKey { hint, .. }
            | RecipeError::UnknownVariant { hint, .. }
            | RecipeError::InvalidValue { hint, .. }
            | RecipeError::Conflict { hint, .. }
            | RecipeError::Missing { hint, .. } => hint.as_deref(),
            RecipeError::Read { error, at, .. } => match (error.kind(), &at.0) {
                (std::io::ErrorKind::NotFound, Some(_)) => {
                    Some("`extends` paths are relative to the file that names them")
                }
                _ => None,
            },
            RecipeError::CyclicExtends { .. } => {
                Some("remove one of the `extends` so that the chain ends in a recipe without a parent")
            }
            RecipeError::Syntax { .. } | RecipeError::MalformedOverride { .. } => None,
        }
    }
}

/// The closest candidate to `word`, if one is close enough to be a likely typo.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|candidate| {
            (
                strsim::jaro_winkler(&word, &candidate.to_ascii_lowercase()),
                candidate,
            )
        })
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_caret_under_the_span() {
        let text = "[serving]\nmax_model_lenn = 4\n";
        let location = Location::in_file("r.toml".into(), text, 10..24);
        assert_eq!(
            location.to_string(),
            "  --> r.toml:2:1\n  |\n2 | max_model_lenn = 4\n  | ^^^^^^^^^^^^^^"
        );
    }

    #[test]
    fn suggests_near_misses_only() {
        let keys = ["max_model_len", "max_num_seqs", "max_batched_tokens"];
        assert_eq!(closest("max_model_lenn", keys), Some("max_model_len"));
        assert_eq!(closest("max_num_seq", keys), Some("max_num_seqs"));
        assert_eq!(closest("colour", keys), None);
    }
}

//! Which files of a repository a pull takes: `--include` / `--exclude` globs over the
//! repository paths, and by default what serving needs (safetensors, configs,
//! tokenizer files, chat templates), without the duplicate weight formats a repository
//! often carries (`*.bin`, `*.pth`, `original/`) when safetensors are there.

use globset::{Glob, GlobSet, GlobSetBuilder};

/// Paths skipped by default when the repository has `*.safetensors` weights:
/// the same weights in other formats, and exports for other runtimes.
const DUPLICATE_WEIGHTS: &[&str] = &[
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.onnx_data",
    "*.gguf",
    "*.tflite",
    "*.mlmodel",
    "original/**",
    "onnx/**",
    "openvino/**",
    "coreml/**",
    "flax_model*",
    "tf_model*",
    "rust_model*",
];

/// A bad glob.
#[derive(Debug, thiserror::Error)]
#[error("invalid glob `{glob}`: {source}")]
pub struct GlobError {
    glob: String,
    source: globset::Error,
}

impl sous_engine::diagnose::Diagnose for GlobError {
    /// A glob the user wrote.
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }
}

/// The selection rules of one pull.
#[derive(Debug)]
pub struct Selection {
    include: Option<GlobSet>,
    exclude: GlobSet,
    defaults: bool,
    duplicates: GlobSet,
}

fn build(globs: &[impl AsRef<str>]) -> Result<GlobSet, GlobError> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        let glob = glob.as_ref();
        builder.add(Glob::new(glob).map_err(|source| GlobError {
            glob: glob.to_owned(),
            source,
        })?);
    }
    builder.build().map_err(|source| GlobError {
        glob: String::new(),
        source,
    })
}

impl Selection {
    /// `include` empty means "everything but the defaults' exclusions".
    pub fn new(include: &[String], exclude: &[String]) -> Result<Selection, GlobError> {
        Ok(Selection {
            include: (!include.is_empty()).then(|| build(include)).transpose()?,
            exclude: build(exclude)?,
            defaults: include.is_empty(),
            duplicates: build(DUPLICATE_WEIGHTS)?,
        })
    }

    /// The paths to pull, from all the repository's paths.
    pub fn apply<'a>(&self, paths: impl IntoIterator<Item = &'a str> + Clone) -> Vec<&'a str> {
        let has_safetensors = paths.clone().into_iter().any(|p| p.ends_with(".safetensors"));
        paths
            .into_iter()
            .filter(|p| self.include.as_ref().is_none_or(|set| set.is_match(p)))
            .filter(|p| !self.exclude.is_match(p))
            .filter(|p| !(self.defaults && has_safetensors && self.duplicates.is_match(p)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO: &[&str] = &[
        ".gitattributes",
        "README.md",
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "tokenizer.json",
        "onnx/model.onnx",
    ];

    #[test]
    fn defaults_skip_duplicate_weights() {
        let s = Selection::new(&[], &[]).expect("valid");
        let picked = s.apply(REPO.iter().copied());
        assert!(picked.contains(&"model-00001-of-00002.safetensors"));
        assert!(picked.contains(&"tokenizer.json"));
        assert!(!picked.contains(&"pytorch_model.bin"));
        assert!(
            !picked
                .iter()
                .any(|p| p.starts_with("original/") || p.starts_with("onnx/"))
        );
    }

    #[test]
    fn globs_override_defaults() {
        let s =
            Selection::new(&["*.bin".into(), "*.json".into()], &["tokenizer.json".into()]).expect("valid");
        assert_eq!(
            s.apply(REPO.iter().copied()),
            ["config.json", "model.safetensors.index.json", "pytorch_model.bin"]
        );
        // Without safetensors, `.bin` weights are what there is.
        let s = Selection::new(&[], &[]).expect("valid");
        assert!(
            s.apply(["pytorch_model.bin", "config.json"])
                .contains(&"pytorch_model.bin")
        );
        assert!(Selection::new(&["[".into()], &[]).is_err());
    }
}

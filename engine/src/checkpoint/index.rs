//! Which files hold a checkpoint's tensors: one `model.safetensors`, or shards
//! `model-00001-of-00003.safetensors` … listed by `model.safetensors.index.json`, whose
//! `weight_map` names the file of every tensor.
//!
//! Writers follow transformers' `save_pretrained` (transformers `modeling_utils.py`,
//! with `SAFE_WEIGHTS_NAME` and `SAFE_WEIGHTS_INDEX_NAME` from `utils/__init__.py`): a
//! single file when everything fits in one shard, otherwise numbered shards and an
//! index `{"metadata": {"total_size": N}, "weight_map": {tensor: file}}`. Readers
//! take the files from the index when there is one, else `model.safetensors`, else
//! every `*.safetensors` in the directory, as vLLM does (`vllm/model_executor/
//! model_loader/weight_utils.py`, which globs `*.safetensors` and filters by the index).
//!
//! Not here: the shards' contents (headers, tensor data).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The weights file of an unsharded checkpoint.
pub const SINGLE: &str = "model.safetensors";
/// The index file of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// Why the weights files could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The index or the directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The index is not an index.
    #[error("{}: {message}", path.display())]
    Malformed {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The file name of shard `shard` (from 0) of `count`.
pub fn shard_name(shard: usize, count: usize) -> String {
    if count == 1 {
        SINGLE.to_owned()
    } else {
        format!("model-{:05}-of-{count:05}.safetensors", shard + 1)
    }
}

/// The contents of `model.safetensors.index.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Tensor name → the file that holds it.
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`: bytes of tensor data in all shards, when given.
    pub total_size: Option<u64>,
}

impl Index {
    /// The index a writer records for shards holding `total_size` bytes of tensor data.
    pub fn new(weight_map: BTreeMap<String, String>, total_size: u64) -> Index {
        Index {
            weight_map,
            total_size: Some(total_size),
        }
    }

    /// The index of the checkpoint in `dir`, `None` when it has none.
    pub fn read(dir: &Path) -> Result<Option<Index>, IndexError> {
        let path = dir.join(INDEX);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(IndexError::Io { path, source }),
        };
        let malformed = |message: &str| IndexError::Malformed {
            path: path.clone(),
            message: message.to_owned(),
        };
        let index: Value = serde_json::from_slice(&bytes).map_err(|e| malformed(&e.to_string()))?;
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| malformed("no `weight_map` object"))?;
        let mut weight_map = BTreeMap::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| malformed("a `weight_map` value is not a file name"))?;
            weight_map.insert(tensor.clone(), file.to_owned());
        }
        let total_size = index.pointer("/metadata/total_size").and_then(Value::as_u64);
        Ok(Some(Index {
            weight_map,
            total_size,
        }))
    }

    /// The files it names, each once, in name order.
    pub fn files(&self) -> Vec<String> {
        let files: BTreeSet<&String> = self.weight_map.values().collect();
        files.into_iter().cloned().collect()
    }

    /// The JSON a writer saves (keys sorted, as transformers' `json.dumps(...,
    /// sort_keys=True)` writes them).
    pub fn to_json(&self) -> Value {
        let mut metadata = serde_json::Map::new();
        if let Some(total) = self.total_size {
            metadata.insert("total_size".into(), json!(total));
        }
        json!({"metadata": metadata, "weight_map": self.weight_map})
    }
}

/// The weights files of the checkpoint in `dir` and its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    /// File names, in name order; empty when the directory holds no safetensors.
    pub files: Vec<String>,
    /// The index, when there is one.
    pub index: Option<Index>,
}

impl Shards {
    /// Lists them: the index's files if there is an index, else `model.safetensors`,
    /// else every `*.safetensors` in `dir`.
    pub fn find(dir: &Path) -> Result<Shards, IndexError> {
        if let Some(index) = Index::read(dir)? {
            return Ok(Shards {
                files: index.files(),
                index: Some(index),
            });
        }
        if dir.join(SINGLE).exists() {
            return Ok(Shards {
                files: vec![SINGLE.to_owned()],
                index: None,
            });
        }
        let entries = std::fs::read_dir(dir).map_err(|source| IndexError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        files.sort();
        Ok(Shards { files, index: None })
    }
}

impl crate::diagnose::Diagnose for IndexError {
    /// A model directory the user pointed at.
    fn class(&self) -> crate::diagnose::Class {
        crate::diagnose::Class::User
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn shards_are_named_as_transformers_names_them() {
        assert_eq!(shard_name(0, 1), "model.safetensors");
        assert_eq!(shard_name(0, 3), "model-00001-of-00003.safetensors");
        assert_eq!(shard_name(2, 3), "model-00003-of-00003.safetensors");
    }

    #[test]
    fn a_written_index_reads_back() -> Result {
        let dir = tempfile::tempdir()?;
        let map = BTreeMap::from([
            ("b".to_owned(), shard_name(1, 2)),
            ("a".to_owned(), shard_name(0, 2)),
            ("c".to_owned(), shard_name(0, 2)),
        ]);
        let index = Index::new(map, 12);
        assert_eq!(
            index.to_json().to_string(),
            r#"{"metadata":{"total_size":12},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#
        );
        std::fs::write(dir.path().join(INDEX), index.to_json().to_string())?;
        assert_eq!(Index::read(dir.path())?, Some(index.clone()));
        let shards = Shards::find(dir.path())?;
        assert_eq!(
            shards.files,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        assert_eq!(shards.index, Some(index));
        Ok(())
    }

    #[test]
    fn without_an_index_the_single_file_or_every_shard() -> Result {
        let dir = tempfile::tempdir()?;
        assert!(Shards::find(dir.path())?.files.is_empty());
        std::fs::write(dir.path().join("b.safetensors"), b"")?;
        std::fs::write(dir.path().join("a.safetensors"), b"")?;
        std::fs::write(dir.path().join("config.json"), b"{}")?;
        assert_eq!(
            Shards::find(dir.path())?.files,
            ["a.safetensors", "b.safetensors"]
        );
        std::fs::write(dir.path().join(SINGLE), b"")?;
        assert_eq!(Shards::find(dir.path())?.files, [SINGLE]);
        Ok(())
    }

    #[test]
    fn a_malformed_index_says_what_is_wrong() -> Result {
        let dir = tempfile::tempdir()?;
        let cases = [
            ("{", "EOF"),
            ("{}", "no `weight_map` object"),
            (r#"{"weight_map": {"a": 1}}"#, "not a file name"),
        ];
        for (text, needle) in cases {
            std::fs::write(dir.path().join(INDEX), text)?;
            let err = Index::read(dir.path()).expect_err(text);
            assert!(matches!(err, IndexError::Malformed { .. }), "{err}");
            assert!(err.to_string().contains(needle), "{err}");
        }
        Ok(())
    }
}

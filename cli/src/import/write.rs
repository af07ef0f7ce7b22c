//! The files of an imported model directory: safetensors shards laid out as
//! transformers' `save_pretrained` lays them out (`model-00001-of-00002.safetensors`
//! plus `model.safetensors.index.json`, or a single `model.safetensors` when it all
//! fits; names and index from [`sous_engine::checkpoint::index`]), and the JSON files
//! beside them.
//!
//! Everything is written into a [`StagingDir`] and moved into place only once
//! complete; if anything fails, or the import panics, the partial directory is removed,
//! so a reader never sees a half-written model. Not here: what the tensors hold
//! (`tensors.rs`) or the tokenizer (`tokenizer.rs`).

use std::path::Path;

use sous_engine::atomic::{AtomicError, Existing, StagingDir};
use sous_engine::checkpoint::index::{Index, shard_name};

use super::Dtype;
use super::ImportError;
use super::tensors::Planned;

/// The staging directory for `dest`. Refuses an existing `dest` unless `replace` is
/// set, in which case the commit replaces it whole.
pub fn staging(dest: &Path, replace: bool) -> Result<StagingDir, ImportError> {
    let existing = if replace {
        Existing::Replace
    } else {
        Existing::Refuse
    };
    StagingDir::create(dest, existing).map_err(ImportError::from)
}

impl From<AtomicError> for ImportError {
    fn from(e: AtomicError) -> ImportError {
        match e {
            AtomicError::Exists { path } => ImportError::OutputExists { path },
            AtomicError::NoName { path } => ImportError::BadOutput { path },
            AtomicError::Io { path, source } => ImportError::Write { path, source },
        }
    }
}

/// Writes `value` into `dir` as pretty JSON (two-space indent, trailing newline, as
/// transformers writes its JSON files).
pub fn write_json(dir: &Path, name: &str, value: &serde_json::Value) -> Result<(), ImportError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| ImportError::Write {
        path: dir.join(name),
        source: e.into(),
    })?;
    text.push('\n');
    write_bytes(dir, name, text.as_bytes())
}

/// Writes a file into `dir`.
pub fn write_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ImportError> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|source| ImportError::Write { path, source })
}

/// One output file and the tensors that go in it, in order.
#[derive(Debug, Clone)]
pub struct Shard {
    /// File name inside the model directory.
    pub file: String,
    /// Indices into the planned tensor list.
    pub tensors: Vec<usize>,
    /// Bytes of tensor data (without the safetensors header).
    pub bytes: u64,
}

/// Splits tensors into shards of at most `max_bytes` each (a tensor larger than the
/// limit gets a shard of its own, as in transformers `shard_checkpoint`).
pub fn shard(tensors: &[Planned], dtype: Dtype, max_bytes: u64) -> Vec<Shard> {
    let mut groups: Vec<(Vec<usize>, u64)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let size = t.bytes(dtype);
        match groups.last_mut() {
            Some((members, total)) if *total + size <= max_bytes => {
                members.push(i);
                *total += size;
            }
            _ => groups.push((vec![i], size)),
        }
    }
    let count = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, (tensors, bytes))| Shard {
            file: shard_name(i, count),
            tensors,
            bytes,
        })
        .collect()
}

/// The index of a sharded checkpoint.
pub fn index(tensors: &[Planned], shards: &[Shard]) -> Index {
    let mut weight_map = std::collections::BTreeMap::new();
    for shard in shards {
        for &i in &shard.tensors {
            weight_map.insert(tensors[i].hf_name.clone(), shard.file.clone());
        }
    }
    Index::new(weight_map, shards.iter().map(|s| s.bytes).sum())
}

/// Writes one safetensors file with `{"format": "pt"}` metadata, which transformers
/// requires to load it as PyTorch weights.
pub fn write_safetensors(
    path: &Path,
    tensors: Vec<(String, candle_core::Tensor)>,
) -> Result<(), ImportError> {
    let metadata = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(tensors, Some(metadata), path).map_err(|e| ImportError::Write {
        path: path.to_owned(),
        source: std::io::Error::other(e),
    })?;
    // safetensors creates the file owner-only (0600); a model directory is read by
    // engines running as other users (containers), like the JSON files beside it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|source| {
            ImportError::Write {
                path: path.to_owned(),
                source,
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_respect_the_limit() {
        let t = |name: &str, n: usize| Planned {
            gguf_name: name.to_owned(),
            hf_name: name.to_owned(),
            shape: vec![n],
            rows: crate::import::tensors::Rows::AsIs,
        };
        let tensors = [t("a", 10), t("b", 10), t("c", 30), t("d", 5)];
        let shards = shard(&tensors, Dtype::F32, 80);
        let groups: Vec<&[usize]> = shards.iter().map(|s| s.tensors.as_slice()).collect();
        assert_eq!(groups, [&[0, 1][..], &[2][..], &[3][..]]);
        assert_eq!(shards[0].file, "model-00001-of-00003.safetensors");
        assert_eq!(shard(&tensors, Dtype::F32, 1000)[0].file, "model.safetensors");
    }
}

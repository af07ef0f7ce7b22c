//! Writing the output directory atomically, and the safetensors shard layout.
//!
//! Everything is written into a hidden sibling of the destination (same filesystem, so
//! the final `rename` is atomic) and renamed into place only once complete. If anything
//! fails, or the import panics, [`Staging`]'s `Drop` removes the partial directory: a
//! reader never sees a half-written model. Shards follow transformers'
//! `save_pretrained` naming (`model-00001-of-00002.safetensors` plus
//! `model.safetensors.index.json`; a single `model.safetensors` when it all fits).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::Dtype;
use super::ImportError;
use super::tensors::Planned;

/// A directory being written, removed on drop unless [`Staging::commit`] moved it into place.
pub struct Staging {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates the staging directory beside `dest`. Refuses an existing `dest` unless
    /// `replace` is set.
    pub fn new(dest: &Path, replace: bool) -> Result<Staging, ImportError> {
        if dest.exists() && !replace {
            return Err(ImportError::OutputExists {
                path: dest.to_owned(),
            });
        }
        let name = dest
            .file_name()
            .ok_or_else(|| ImportError::BadOutput {
                path: dest.to_owned(),
            })?
            .to_string_lossy()
            .into_owned();
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|source| ImportError::Write {
            path: parent.clone(),
            source,
        })?;
        let tmp = parent.join(format!(".{name}.sous-import-{}", std::process::id()));
        if tmp.exists() {
            // Left by an earlier run of this process id that was killed.
            std::fs::remove_dir_all(&tmp).map_err(|source| ImportError::Write {
                path: tmp.clone(),
                source,
            })?;
        }
        std::fs::create_dir(&tmp).map_err(|source| ImportError::Write {
            path: tmp.clone(),
            source,
        })?;
        Ok(Staging {
            tmp,
            dest: dest.to_owned(),
            committed: false,
        })
    }

    /// Where to write files before the commit.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Writes `value` as pretty JSON (two-space indent, trailing newline, as
    /// transformers writes its JSON files).
    pub fn write_json(&self, name: &str, value: &serde_json::Value) -> Result<(), ImportError> {
        let mut text = serde_json::to_string_pretty(value).map_err(|e| ImportError::Write {
            path: self.tmp.join(name),
            source: e.into(),
        })?;
        text.push('\n');
        self.write_bytes(name, text.as_bytes())
    }

    /// Writes a file into the staging directory.
    pub fn write_bytes(&self, name: &str, bytes: &[u8]) -> Result<(), ImportError> {
        let path = self.tmp.join(name);
        std::fs::write(&path, bytes).map_err(|source| ImportError::Write { path, source })
    }

    /// Moves the finished directory to its destination (replacing an old one if asked).
    pub fn commit(mut self) -> Result<PathBuf, ImportError> {
        let write = |path: &Path| {
            let path = path.to_owned();
            move |source| ImportError::Write { path, source }
        };
        if self.dest.exists() {
            // Move the old directory aside first so the destination is never missing
            // something that the new one has, nor a mix of both.
            let old = self.tmp.with_extension("old");
            std::fs::rename(&self.dest, &old).map_err(write(&self.dest))?;
            std::fs::rename(&self.tmp, &self.dest).map_err(write(&self.dest))?;
            std::fs::remove_dir_all(&old).map_err(write(&old))?;
        } else {
            std::fs::rename(&self.tmp, &self.dest).map_err(write(&self.dest))?;
        }
        self.committed = true;
        Ok(self.dest.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the error that got us here matters more than this one.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
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
            file: if count == 1 {
                "model.safetensors".to_owned()
            } else {
                format!("model-{:05}-of-{count:05}.safetensors", i + 1)
            },
            tensors,
            bytes,
        })
        .collect()
}

/// `model.safetensors.index.json` for a sharded checkpoint.
pub fn index(tensors: &[Planned], shards: &[Shard]) -> serde_json::Value {
    let mut weight_map = BTreeMap::new();
    for shard in shards {
        for &i in &shard.tensors {
            weight_map.insert(tensors[i].hf_name.clone(), shard.file.clone());
        }
    }
    let total: u64 = shards.iter().map(|s| s.bytes).sum();
    json!({ "metadata": { "total_size": total }, "weight_map": weight_map })
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
    fn a_dropped_staging_directory_leaves_nothing() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("model");
        {
            let staging = Staging::new(&dest, false)?;
            staging.write_bytes("config.json", b"{}")?;
            assert!(staging.dir().join("config.json").is_file());
            // Dropped here, as when a later step returns an error or panics.
        }
        assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0);
        Ok(())
    }

    #[test]
    fn commit_moves_the_whole_directory_into_place() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("a/b/model");
        let staging = Staging::new(&dest, false)?;
        staging.write_bytes("x", b"1")?;
        assert!(!dest.exists(), "nothing at the destination before the commit");
        staging.commit()?;
        assert_eq!(std::fs::read(dest.join("x"))?, b"1");
        assert_eq!(std::fs::read_dir(dest.parent().ok_or("parent")?)?.count(), 1);
        Ok(())
    }

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

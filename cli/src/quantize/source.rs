//! The model being quantized: a Hub-layout directory (`config.json`, one or more
//! `*.safetensors` shards, optionally `model.safetensors.index.json`, found by
//! [`sous_engine::checkpoint::index::Shards`]), its tensor table read from the shard
//! headers and checked against the index, and where it came from.
//!
//! Tensor data is never read whole: callers map a window of a tensor at a time
//! ([`Source::map`]), so memory stays bounded by the window, not the model or even the
//! largest tensor. Not here: deciding what to quantize (`select.rs`) or writing.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};
use safetensors::tensor::Metadata;
use serde_json::Value;
use sous_engine::checkpoint::index::{INDEX, Index, IndexError, Shards};
use sous_engine::repo::RepoId;

use super::error::{QuantizeError, io};

/// One tensor of the source checkpoint.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// Its name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Index into [`Source::shards`].
    pub shard: usize,
    /// Element type.
    pub dtype: safetensors::Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Offset of its first byte in the shard file.
    pub offset: u64,
    /// Its size in bytes.
    pub len: u64,
}

/// One safetensors file.
#[derive(Debug)]
pub struct Shard {
    /// Path.
    pub path: PathBuf,
    /// File name.
    pub name: String,
    /// Open for reading.
    file: File,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch (for the rerun check).
    pub mtime_ns: u128,
}

/// Where the weights came from, for the output's metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Hub repository id.
    pub repo: Option<String>,
    /// Commit.
    pub commit: Option<String>,
}

/// A source model directory.
#[derive(Debug)]
pub struct Source {
    /// The directory.
    pub dir: PathBuf,
    /// `config.json`, parsed.
    pub config: serde_json::Map<String, Value>,
    /// The raw bytes of `config.json` (fingerprinted).
    pub config_bytes: Vec<u8>,
    /// Shards, in name order.
    pub shards: Vec<Shard>,
    /// Every tensor, in file order (shard, then offset).
    pub tensors: Vec<SourceTensor>,
    /// Where it came from.
    pub provenance: Provenance,
}

impl Source {
    /// Reads the directory's config and every shard header.
    pub fn open(dir: &Path) -> Result<Source, QuantizeError> {
        let no_model = |reason: &str| QuantizeError::NoModel {
            dir: dir.to_path_buf(),
            reason: reason.to_owned(),
        };
        if !dir.is_dir() {
            return Err(no_model("not a directory"));
        }
        let config_path = dir.join("config.json");
        let config_bytes = std::fs::read(&config_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                no_model("no config.json")
            } else {
                io(&config_path)(e)
            }
        })?;
        let config = match serde_json::from_slice::<Value>(&config_bytes) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(bad(&config_path, "not a JSON object")),
            Err(e) => return Err(bad(&config_path, &e.to_string())),
        };
        if let Some(q) = config.get("quantization_config") {
            let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
            return Err(QuantizeError::AlreadyQuantized {
                dir: dir.to_path_buf(),
                method: method.to_owned(),
            });
        }
        let Shards { files: names, index } = Shards::find(dir).map_err(|e| match e {
            IndexError::Io { path, source } => QuantizeError::Io { path, source },
            IndexError::Malformed { path, message } => QuantizeError::BadSource { file: path, message },
        })?;
        if names.is_empty() {
            return Err(no_model("no *.safetensors files (sous reads safetensors only)"));
        }
        let mut shards = Vec::with_capacity(names.len());
        let mut tensors = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let (shard, mut found) = read_shard(dir, name, i)?;
            shards.push(shard);
            tensors.append(&mut found);
        }
        let mut seen = BTreeSet::new();
        for t in &tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(bad(
                    &dir.join(INDEX),
                    &format!("tensor {} appears in two shards", t.name),
                ));
            }
        }
        if let Some(index) = &index {
            check_index(&dir.join(INDEX), index, &tensors, &shards)?;
        }
        Ok(Source {
            dir: dir.to_path_buf(),
            config,
            config_bytes,
            shards,
            tensors,
            provenance: provenance(dir),
        })
    }

    /// Maps `len` bytes of `tensor` starting `start` bytes into it, read-only.
    ///
    /// Windows rather than whole files: a process under an address-space limit smaller
    /// than a shard can still quantize it.
    /// Reads a whole tensor into `dst` (its length), in parallel chunks of `chunk`
    /// bytes with positioned reads: no page faults, which cost more than the copy
    /// when the destination is pinned memory for a GPU.
    pub fn read_into(
        &self,
        tensor: &SourceTensor,
        dst: &mut [u8],
        chunk: usize,
    ) -> Result<(), QuantizeError> {
        use rayon::prelude::*;
        use std::os::unix::fs::FileExt;
        let shard = &self.shards[tensor.shard];
        if dst.len() as u64 != tensor.len {
            return Err(bad(
                &shard.path,
                &format!("read of {} into {} bytes", tensor.name, dst.len()),
            ));
        }
        dst.par_chunks_mut(chunk.max(1))
            .enumerate()
            .try_for_each(|(i, part)| {
                shard
                    .file
                    .read_exact_at(part, tensor.offset + (i * chunk) as u64)
                    .map_err(io(&shard.path))
            })
    }

    pub fn map(&self, tensor: &SourceTensor, start: u64, len: u64) -> Result<Mmap, QuantizeError> {
        let shard = &self.shards[tensor.shard];
        if start + len > tensor.len {
            return Err(bad(&shard.path, &format!("read past the end of {}", tensor.name)));
        }
        map_window(&shard.file, tensor.offset + start, len).map_err(io(&shard.path))
    }
}

/// A read-only map of `len` bytes of `file` from `offset` (any alignment: memmap2
/// maps from the page boundary below and hides the difference).
#[allow(unsafe_code)]
fn map_window(file: &File, offset: u64, len: u64) -> std::io::Result<Mmap> {
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: the map is read-only and private to this process. Its one hazard is
    // another process truncating or rewriting the source file while it is mapped,
    // which would make the bytes change under us (or SIGBUS); sous never writes its
    // sources, and a model directory being rewritten during a quantization is a
    // corrupt input however it is read.
    unsafe { MmapOptions::new().offset(offset).len(len).populate().map(file) }
}

fn bad(path: &Path, message: &str) -> QuantizeError {
    QuantizeError::BadSource {
        file: path.to_path_buf(),
        message: message.to_owned(),
    }
}

/// Parses one shard's header (validated by the safetensors crate: contiguous, in-bounds
/// offsets that match every shape and dtype).
fn read_shard(dir: &Path, name: &str, index: usize) -> Result<(Shard, Vec<SourceTensor>), QuantizeError> {
    let path = dir.join(name);
    let mut file = File::open(&path).map_err(io(&path))?;
    let meta = file.metadata().map_err(io(&path))?;
    let size = meta.len();
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let (tensors, data_start, data_len) = read_header(&mut file, &path, size, index)?;
    if data_start + data_len != size {
        return Err(bad(
            &path,
            "the header's tensors do not cover the file (truncated or damaged download?)",
        ));
    }
    Ok((
        Shard {
            path,
            name: name.to_owned(),
            file,
            size,
            mtime_ns,
        },
        tensors,
    ))
}

/// Reads the header of the safetensors file `file` (at `path`, `size` bytes long) from
/// its start: the tensors it describes for shard `index` (see [`header_tensors`]), where
/// their data starts, and how many bytes of data it covers.
pub fn read_header(
    file: &mut File,
    path: &Path,
    size: u64,
    index: usize,
) -> Result<(Vec<SourceTensor>, u64, u64), QuantizeError> {
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| bad(path, "too short for a safetensors file"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    // The safetensors crate's own limit.
    if header_len > 100_000_000 || 8 + header_len > size {
        return Err(bad(path, "not a safetensors file (bad header length)"));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io(path))?;
    let data_start = 8 + header_len;
    let (tensors, data_len) = header_tensors(&header, index, data_start).map_err(|m| bad(path, &m))?;
    Ok((tensors, data_start, data_len))
}

/// The tensors a safetensors header (the JSON after the 8-byte length) describes, in
/// file order, for shard `index` whose data starts at `data_start`; and the bytes of
/// data the header covers. `sous plan` reads headers fetched by range requests with it.
pub fn header_tensors(
    header: &[u8],
    index: usize,
    data_start: u64,
) -> Result<(Vec<SourceTensor>, u64), String> {
    let metadata: Metadata =
        serde_json::from_slice(header).map_err(|e| format!("bad safetensors header: {e}"))?;
    let mut tensors: Vec<SourceTensor> = metadata
        .tensors()
        .into_iter()
        .map(|(tensor, info)| SourceTensor {
            name: tensor,
            shard: index,
            dtype: info.dtype,
            shape: info.shape.clone(),
            offset: data_start + info.data_offsets.0 as u64,
            len: (info.data_offsets.1 - info.data_offsets.0) as u64,
        })
        .collect();
    tensors.sort_by_key(|t| t.offset);
    Ok((tensors, metadata.data_len() as u64))
}

/// Every tensor the index lists must be in the shard it names, and the reverse.
fn check_index(
    index_path: &Path,
    index: &Index,
    tensors: &[SourceTensor],
    shards: &[Shard],
) -> Result<(), QuantizeError> {
    for t in tensors {
        let file = &shards[t.shard].name;
        if index.weight_map.get(&t.name) != Some(file) {
            return Err(bad(
                index_path,
                &format!("{} is in {file} but the index does not say so", t.name),
            ));
        }
    }
    if index.weight_map.len() != tensors.len() {
        return Err(bad(index_path, "the index lists tensors that no shard holds"));
    }
    Ok(())
}

/// The repository and commit: from `sous pull --local-dir`'s `.download-complete`
/// marker, or from the Hub cache path `models--org--name/snapshots/<commit>`.
fn provenance(dir: &Path) -> Provenance {
    if let Some(marker) = crate::hub::cache::Marker::read(&dir.join(".download-complete")) {
        return Provenance {
            repo: Some(marker.repo),
            commit: Some(marker.commit),
        };
    }
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let parts: Vec<String> = canonical
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let [.., folder, snapshots, commit] = parts.as_slice()
        && snapshots == "snapshots"
        && crate::hub::cache::is_commit(commit)
        && let Some(repo) = RepoId::from_cache_folder(folder)
    {
        return Provenance {
            repo: Some(repo.to_string()),
            commit: Some(commit.clone()),
        };
    }
    Provenance::default()
}

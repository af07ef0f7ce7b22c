//! Making the output appear all at once, or not at all.
//!
//! Everything is written into `.<name>.sous-tmp-<pid>` beside the output directory.
//! Last, a completion marker (`.sous-quantize.json`: the input fingerprint and the
//! summary) is written into it, and the directory is renamed to its final name. An
//! interrupted run leaves only a hidden temporary directory, which looks like nothing
//! and is removed by the next run once its process is gone. A rerun whose inputs have
//! the same fingerprint finds the marker and does nothing.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{QuantizeError, io};

/// The completion marker's file name, inside the output directory.
pub const MARKER: &str = ".sous-quantize.json";

/// What the marker holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Marker<T> {
    /// The inputs' fingerprint.
    pub fingerprint: String,
    /// The run's summary.
    pub summary: T,
}

/// The fingerprint of everything that decides the output: a SHA-256 over a
/// canonical description of the inputs.
pub fn fingerprint(inputs: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(inputs.to_string().as_bytes()))
}

/// The summary of a finished quantization of the same inputs at `out`, if there is one.
pub fn completed<T: for<'de> Deserialize<'de>>(out: &Path, fingerprint: &str) -> Option<T> {
    let bytes = fs::read(out.join(MARKER)).ok()?;
    let marker: Marker<T> = serde_json::from_slice(&bytes).ok()?;
    (marker.fingerprint == fingerprint).then_some(marker.summary)
}

/// A temporary output directory, removed unless committed.
#[derive(Debug)]
pub struct Staging {
    tmp: PathBuf,
    out: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates the temporary directory beside `out` (same file system, so the final
    /// rename is atomic), after removing those that dead runs left behind.
    pub fn create(out: &Path) -> Result<Staging, QuantizeError> {
        let parent = parent(out);
        fs::create_dir_all(&parent).map_err(io(&parent))?;
        let prefix = format!(".{}.sous-tmp-", file_name(out));
        if let Ok(entries) = fs::read_dir(&parent) {
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix(&prefix)
                    && !Path::new("/proc").join(pid).exists()
                {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
        let tmp = parent.join(format!("{prefix}{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(io(&tmp))?;
        Ok(Staging {
            tmp,
            out: out.to_path_buf(),
            committed: false,
        })
    }

    /// Where to write.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Writes the marker and moves the directory into place, replacing what was there.
    pub fn commit<T: Serialize>(mut self, marker: &Marker<T>) -> Result<(), QuantizeError> {
        let path = self.tmp.join(MARKER);
        let json = serde_json::to_vec_pretty(marker).map_err(|e| QuantizeError::Bug(e.to_string()))?;
        fs::write(&path, json).map_err(io(&path))?;
        let old = parent(&self.out).join(format!(
            ".{}.sous-old-{}",
            file_name(&self.out),
            std::process::id()
        ));
        let replaced = self.out.exists();
        if replaced {
            fs::rename(&self.out, &old).map_err(io(&self.out))?;
        }
        fs::rename(&self.tmp, &self.out).map_err(io(&self.out))?;
        self.committed = true;
        if replaced {
            let _ = fs::remove_dir_all(&old);
        }
        // The rename is durable once the parent directory is.
        if let Ok(dir) = fs::File::open(parent(&self.out)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "out".to_owned(), |n| n.to_string_lossy().into_owned())
}

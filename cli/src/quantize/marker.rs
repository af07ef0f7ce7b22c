//! Telling a finished quantization from anything else at the output path, and a rerun
//! of the same inputs from a new one.
//!
//! The output is written into a [`StagingDir`] beside it (`.<name>.sous-tmp-<pid>`, see
//! [`sous_engine::atomic`]). Last, a completion marker (`.sous-quantize.json`: the input
//! fingerprint and the summary) is written into it, and the directory is renamed to its
//! final name, replacing an earlier output. An interrupted run leaves only a hidden
//! staging directory, which looks like nothing and is removed by the next run once its
//! process is gone. A rerun whose inputs have the same fingerprint finds the marker and
//! does nothing.
//!
//! Two runs for the same output (two pods whose init containers share a volume, two
//! shells) take turns: each holds an exclusive lock on `.<name>.sous-lock` beside the
//! output for its whole run, so the second finds the first's marker and does nothing,
//! and no run ever removes a staging directory another is writing (process ids say
//! nothing across containers).
//!
//! Not here: whether an existing output may be replaced (`check_output` in `mod.rs`).

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sous_engine::atomic::StagingDir;

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

/// The lock of one output, held while it lives; the lock file is removed when it is
/// dropped, so nothing is left beside the output.
#[derive(Debug)]
pub struct OutputLock {
    path: std::path::PathBuf,
    _file: fs::File,
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still locked: a waiter then holds a lock on a file no longer at
        // the path, notices, and takes the path's new file instead (see `lock`).
        let _ = fs::remove_file(&self.path);
    }
}

/// Takes the lock of the output at `out`, waiting (and saying so) while another run
/// holds it.
pub fn lock(out: &Path, reporter: &dyn sous_engine::reporter::Reporter) -> Result<OutputLock, QuantizeError> {
    use std::os::unix::fs::MetadataExt;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(format!(".{name}.sous-lock"));
    let mut said = false;
    loop {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                if !said {
                    reporter.status(
                        "waiting",
                        &format!("another quantization into {} is running", out.display()),
                    );
                    said = true;
                }
                file.lock().map_err(io(&path))?;
            }
            Err(fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        // The holder before us may have removed the file we waited on.
        let held = file.metadata().map_err(io(&path))?;
        let current = fs::metadata(&path);
        if current.is_ok_and(|m| m.ino() == held.ino() && m.dev() == held.dev()) {
            return Ok(OutputLock { path, _file: file });
        }
    }
}

/// The summary of a finished quantization of the same inputs at `out`, if there is one.
pub fn completed<T: for<'de> Deserialize<'de>>(out: &Path, fingerprint: &str) -> Option<T> {
    let bytes = fs::read(out.join(MARKER)).ok()?;
    let marker: Marker<T> = serde_json::from_slice(&bytes).ok()?;
    (marker.fingerprint == fingerprint).then_some(marker.summary)
}

/// Writes the marker into the staged output and moves it into place.
pub fn commit<T: Serialize>(staging: StagingDir, marker: &Marker<T>) -> Result<(), QuantizeError> {
    let path = staging.path().join(MARKER);
    let json = serde_json::to_vec_pretty(marker).map_err(|e| QuantizeError::Bug(e.to_string()))?;
    fs::write(&path, json).map_err(io(&path))?;
    staging.commit()?;
    Ok(())
}

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

//! Free space where sous writes: the Hub cache (models), sous's cache (quantized
//! checkpoints) and its state (instance directories). A directory that does not exist
//! yet is measured at its nearest existing ancestor, where it will be created.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Below this much free space a cache counts as full: no model fits.
pub const LOW_SPACE: u64 = 1 << 30;

/// Free space at one directory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Disk {
    /// `hub cache`, `sous cache` or `sous state`.
    pub what: &'static str,
    /// The directory.
    pub path: String,
    /// The existing directory measured (the path itself or an ancestor).
    pub measured_at: Option<String>,
    /// Bytes free for this user.
    pub available_bytes: Option<u64>,
    /// Less than [`LOW_SPACE`] free.
    pub low: bool,
    /// Why it could not be measured.
    pub problem: Option<String>,
}

/// The nearest existing ancestor of `path`, itself included; a relative path ends at
/// the current directory.
pub fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find(|p| p.exists())
        .map(Path::to_path_buf)
}

/// Measures the free space at `path`.
pub fn probe(what: &'static str, path: &Path) -> Disk {
    let mut disk = Disk {
        what,
        path: path.display().to_string(),
        measured_at: None,
        available_bytes: None,
        low: false,
        problem: None,
    };
    let Some(at) = existing_ancestor(path) else {
        disk.problem = Some("no part of the path exists".into());
        return disk;
    };
    disk.measured_at = Some(at.display().to_string());
    match fs4::available_space(&at) {
        Ok(bytes) => {
            disk.available_bytes = Some(bytes);
            disk.low = bytes < LOW_SPACE;
        }
        Err(e) => disk.problem = Some(format!("cannot measure {}: {e}", at.display())),
    }
    disk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_measured_where_it_will_be_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("a/b/c");
        assert_eq!(existing_ancestor(&missing).as_deref(), Some(dir.path()));
        assert_eq!(
            existing_ancestor(Path::new("no-such-dir/x")).as_deref(),
            Some(Path::new("."))
        );
        let disk = probe("sous cache", &missing);
        assert_eq!(disk.measured_at, Some(dir.path().display().to_string()));
        assert!(disk.available_bytes.is_some_and(|b| b > 0), "{disk:?}");
        assert_eq!(disk.low, disk.available_bytes.is_some_and(|b| b < LOW_SPACE));
    }
}

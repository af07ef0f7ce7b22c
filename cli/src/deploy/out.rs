//! A rendering in a directory: `sous deploy render --out DIR` writes it, and `sous
//! deploy diff` compares one with what is there.
//!
//! The directory is sous's only where sous says so: a manifest (`.sous-deploy`)
//! lists the files it wrote. sous refuses (unless forced) a directory it never
//! rendered into that holds anything, a file of its own name that it did not write,
//! and a file it wrote that was edited since; a file the operator added beside a
//! rendering (an `.env`) is theirs and is left alone. Files sous wrote before and no longer renders are removed; every file
//! is replaced atomically, the manifest last, and everything is rendered before the
//! first byte is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use similar::TextDiff;
use sous_engine::atomic;

use super::{DeployError, Rendering};

/// The manifest's file name.
pub const MANIFEST: &str = ".sous-deploy";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    /// The target rendered (`k8s`, `compose`, `systemd`).
    #[serde(default)]
    target: Option<String>,
    /// The file names sous wrote, with the SHA-256 of what it wrote.
    files: BTreeMap<String, String>,
}

/// The target a directory was rendered for, from its manifest.
pub fn rendered_target(dir: &Path) -> Result<Option<String>, DeployError> {
    Ok(Manifest::read(dir)?.and_then(|m| m.target))
}

impl Manifest {
    fn read(dir: &Path) -> Result<Option<Manifest>, DeployError> {
        let path = dir.join(MANIFEST);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DeployError::Io {
                what: "reading",
                path,
                source,
            }),
        }
    }
}

/// What [`write`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Files whose contents changed or that are new.
    pub changed: Vec<String>,
    /// Files already as rendered.
    pub unchanged: Vec<String>,
    /// Files of an earlier rendering that this one no longer has, removed.
    pub removed: Vec<String>,
}

/// Writes `rendering` into `dir` (created if missing). Refuses a directory holding
/// files sous did not write unless `force`.
pub fn write(rendering: &Rendering, dir: &Path, force: bool) -> Result<Written, DeployError> {
    if dir.exists() && !dir.is_dir() {
        return Err(DeployError::NotADirectory(dir.to_path_buf()));
    }
    let previous = Manifest::read(dir)?;
    let rendered: BTreeSet<&str> = rendering.files.iter().map(|f| f.name.as_str()).collect();
    if dir.is_dir() && !force {
        let foreign: Vec<String> = entries(dir)?
            .into_iter()
            .filter(|name| match &previous {
                None => true,
                Some(m) => {
                    name != MANIFEST && !m.files.contains_key(name) && rendered.contains(name.as_str())
                }
            })
            .collect();
        if !foreign.is_empty() {
            return Err(DeployError::ForeignFiles {
                dir: dir.to_path_buf(),
                files: foreign,
            });
        }
    }
    let manifest = previous.unwrap_or_default();
    if !force {
        // A file sous wrote and someone edited since: a hand fix the rendering would lose.
        let edited: Vec<String> = manifest
            .files
            .iter()
            .filter(|(name, written)| {
                std::fs::read(dir.join(name))
                    .is_ok_and(|bytes| hex::encode(Sha256::digest(&bytes)) != **written)
            })
            .map(|(name, _)| name.clone())
            .collect();
        if !edited.is_empty() {
            return Err(DeployError::Edited {
                dir: dir.to_path_buf(),
                files: edited,
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| DeployError::Io {
        what: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Written::default();
    let mut files = BTreeMap::new();
    for file in &rendering.files {
        let path = dir.join(&file.name);
        let unchanged = std::fs::read(&path).is_ok_and(|bytes| bytes == file.contents.as_bytes());
        if unchanged {
            written.unchanged.push(file.name.clone());
        } else {
            atomic::write_file(&path, file.contents.as_bytes()).map_err(io("writing", &path))?;
            written.changed.push(file.name.clone());
        }
        files.insert(
            file.name.clone(),
            hex::encode(Sha256::digest(file.contents.as_bytes())),
        );
    }
    for stale in manifest.files.keys().filter(|n| !rendered.contains(n.as_str())) {
        let path = dir.join(stale);
        match std::fs::remove_file(&path) {
            Ok(()) => written.removed.push(stale.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(DeployError::Io {
                    what: "removing",
                    path,
                    source,
                });
            }
        }
    }
    let manifest = Manifest {
        target: Some(rendering.target.as_str().to_owned()),
        files,
    };
    let json = serde_json::to_string_pretty(&manifest).map_err(|e| DeployError::Serialize {
        what: MANIFEST.into(),
        message: e.to_string(),
    })?;
    let path = dir.join(MANIFEST);
    atomic::write_file(&path, format!("{json}\n").as_bytes()).map_err(io("writing", &path))?;
    Ok(written)
}

/// The differences between `rendering` and `dir`, as a unified diff (`a/` what is
/// there, `b/` what would be written); empty when there are none. Files of an earlier
/// rendering that this one drops show as removed.
pub fn diff(rendering: &Rendering, dir: &Path) -> Result<String, DeployError> {
    if !dir.is_dir() {
        return Err(DeployError::NotADirectory(dir.to_path_buf()));
    }
    let manifest = Manifest::read(dir)?.unwrap_or_default();
    let mut out = String::new();
    let rendered: BTreeSet<&str> = rendering.files.iter().map(|f| f.name.as_str()).collect();
    for file in &rendering.files {
        let path = dir.join(&file.name);
        let old = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(DeployError::Io {
                    what: "reading",
                    path,
                    source,
                });
            }
        };
        if old.as_deref() == Some(file.contents.as_str()) {
            continue;
        }
        let (from, before) = match &old {
            Some(text) => (format!("a/{}", file.name), text.as_str()),
            None => ("/dev/null".to_owned(), ""),
        };
        let _ = write!(
            out,
            "{}",
            TextDiff::from_lines(before, &file.contents)
                .unified_diff()
                .header(&from, &format!("b/{}", file.name))
        );
    }
    for stale in manifest.files.keys().filter(|n| !rendered.contains(n.as_str())) {
        let path = dir.join(stale);
        if let Ok(text) = std::fs::read_to_string(&path) {
            let _ = write!(
                out,
                "{}",
                TextDiff::from_lines(text.as_str(), "")
                    .unified_diff()
                    .header(&format!("a/{stale}"), "/dev/null")
            );
        }
    }
    Ok(out)
}

fn entries(dir: &Path) -> Result<Vec<String>, DeployError> {
    let read = std::fs::read_dir(dir).map_err(io("reading", dir))?;
    let mut names = Vec::new();
    for entry in read {
        let entry = entry.map_err(io("reading", dir))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DeployError {
    let path: PathBuf = path.to_path_buf();
    move |source| DeployError::Io { what, path, source }
}

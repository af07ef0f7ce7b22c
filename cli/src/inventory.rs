//! What the caches hold, for `sous list` and `sous rm`: the models of the Hugging Face
//! cache (the layout huggingface_hub writes, see [`crate::hub::cache`]) and the quantized
//! variants in sous's cache (`<cache>/quantized/<recipe name>`, each with the completion
//! marker of [`crate::quantize::marker`]).
//!
//! A revision is *complete* when sous's pull marker lists it and every listed file is in
//! its snapshot, *partial* while blobs are half-downloaded (`*.incomplete`, ours or
//! huggingface_hub's) or a listed file is missing, and *unverified* when another tool
//! wrote it: sous cannot tell whether every file of the repository is there.
//!
//! Removal ([`plan_removal`], [`remove`]) touches only what the layout names —
//! `blobs/`, `snapshots/`, `refs/`, `.no_exist/`, sous's `.sous/` and huggingface_hub's
//! `.locks/` entry; a quantized variant only with its completion marker — and leaves
//! anything else it finds where it is, saying so. Removing one revision keeps the blobs
//! another snapshot still links to, as huggingface_hub's `DeleteCacheStrategy` does
//! (huggingface_hub 2.4.0 `src/huggingface_hub/utils/_cache_manager.py`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sous_engine::repo::RepoId;

use crate::hub::cache::Marker;
use crate::quantize::marker::MARKER as QUANTIZE_MARKER;

/// Why the caches could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// A file system operation failed.
    #[error("{action} `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing in the caches has that name.
    #[error("nothing named `{name}` in the Hub cache ({}) or sous's quantized variants ({})", hub.display(), quantized.display())]
    Unknown {
        /// What the user asked for.
        name: String,
        /// The Hub cache.
        hub: PathBuf,
        /// sous's quantized variants.
        quantized: PathBuf,
        /// The closest existing name.
        suggestion: Option<String>,
    },
    /// The model has no such revision in the cache.
    #[error("`{repo}` has no revision `{revision}` in the cache (it has {})", known.join(", "))]
    UnknownRevision {
        /// The repository.
        repo: String,
        /// What the user asked for.
        revision: String,
        /// Its refs and commits.
        known: Vec<String>,
    },
    /// A running instance serves it.
    #[error("`{name}` is served by the running instance `{instance}` ({url})")]
    InUse {
        /// What the user asked to remove.
        name: String,
        /// The instance.
        instance: String,
        /// Its URL.
        url: String,
    },
    /// A quantization is writing the variant now.
    #[error("a quantization into `{}` is running", path.display())]
    Busy {
        /// The variant's directory.
        path: PathBuf,
    },
}

impl sous_engine::diagnose::Diagnose for InventoryError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            InventoryError::Io { .. } => None,
            InventoryError::Unknown {
                suggestion: Some(s), ..
            } => Some(format!("did you mean `{s}`? (`sous list` shows what there is)")),
            InventoryError::Unknown { .. } => Some("`sous list` shows what the caches hold".into()),
            InventoryError::UnknownRevision { .. } => {
                Some("name a ref (`main`) or a full commit hash".into())
            }
            InventoryError::InUse { instance, .. } => Some(format!("stop it first: `sous stop {instance}`")),
            InventoryError::Busy { .. } => Some("wait for it to finish, then remove the variant".into()),
        }
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InventoryError + use<> {
    let path = path.to_path_buf();
    move |source| InventoryError::Io { action, path, source }
}

/// A model in the Hub cache.
#[derive(Debug, Clone, Serialize)]
pub struct Model {
    /// `org/name`.
    pub repo: String,
    /// `<hub cache>/models--org--name`.
    pub path: PathBuf,
    /// Bytes of its blobs (each blob once, as huggingface_hub's `size_on_disk`).
    pub size_on_disk: u64,
    /// Its snapshots.
    pub revisions: Vec<Revision>,
}

/// One snapshot of a model.
#[derive(Debug, Clone, Serialize)]
pub struct Revision {
    /// The commit.
    pub commit: String,
    /// The refs pointing at it (`main`, a tag).
    pub refs: Vec<String>,
    /// `complete`, `partial` or `unverified`.
    pub status: &'static str,
    /// Files in the snapshot.
    pub files: usize,
    /// Bytes of the blobs the snapshot links to.
    pub size: u64,
    /// The snapshot directory.
    pub path: PathBuf,
}

/// A quantized variant in sous's cache.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    /// The recipe name it was built for (the directory's name).
    pub name: String,
    /// Its directory.
    pub path: PathBuf,
    /// Bytes of its files.
    pub size_on_disk: u64,
    /// Whether its completion marker is there (else an interrupted or foreign output).
    pub complete: bool,
    /// The source repository.
    pub repo: Option<String>,
    /// The source commit.
    pub commit: Option<String>,
    /// The source directory.
    pub source: Option<PathBuf>,
    /// `nvfp4a16` or `nvfp4`.
    pub scheme: Option<String>,
    /// `compressed-tensors` or `modelopt`.
    pub format: Option<String>,
    /// Where it was quantized (`cpu`, `cuda:0 (...)`).
    pub device: Option<String>,
    /// The sous that wrote it.
    pub sous_version: Option<String>,
}

/// Everything in both caches.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The Hub cache.
    pub hub_cache: PathBuf,
    /// sous's quantized variants.
    pub quantized_dir: PathBuf,
    /// Models, by repository.
    pub models: Vec<Model>,
    /// Variants, by name.
    pub variants: Vec<Variant>,
}

/// Reads both caches. Directories that do not exist yet hold nothing.
pub fn list(hub_cache: &Path, quantized_dir: &Path) -> Result<Listing, InventoryError> {
    let mut models = Vec::new();
    for (folder, path) in children(hub_cache)? {
        let Some(repo) = RepoId::from_cache_folder(&folder) else {
            continue;
        };
        if path.is_dir() {
            models.push(read_model(repo.as_str(), &path)?);
        }
    }
    models.sort_by(|a, b| a.repo.cmp(&b.repo));
    let mut variants = Vec::new();
    for (name, path) in children(quantized_dir)? {
        if name.starts_with('.') || !path.is_dir() {
            continue;
        }
        variants.push(read_variant(&name, &path)?);
    }
    variants.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing {
        hub_cache: hub_cache.to_path_buf(),
        quantized_dir: quantized_dir.to_path_buf(),
        models,
        variants,
    })
}

/// The entries of a directory, by name; none when it does not exist.
fn children(dir: &Path) -> Result<Vec<(String, PathBuf)>, InventoryError> {
    let read = match fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("reading", dir)(e)),
    };
    let mut out = Vec::new();
    for item in read {
        let item = item.map_err(io("reading", dir))?;
        if let Some(name) = item.file_name().to_str() {
            out.push((name.to_owned(), item.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The blob names a snapshot's links point to, with the snapshot's file count.
fn snapshot_blobs(snapshot: &Path) -> Result<(usize, BTreeSet<String>), InventoryError> {
    let mut files = 0;
    let mut blobs = BTreeSet::new();
    let mut stack = vec![snapshot.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for (_, path) in children(&dir)? {
            let meta = fs::symlink_metadata(&path).map_err(io("reading", &path))?;
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            files += 1;
            if meta.file_type().is_symlink()
                && let Ok(target) = fs::read_link(&path)
                && let Some(blob) = target.file_name().and_then(|n| n.to_str())
            {
                blobs.insert(blob.to_owned());
            }
        }
    }
    Ok((files, blobs))
}

fn read_model(repo: &str, path: &Path) -> Result<Model, InventoryError> {
    let blob_dir = path.join("blobs");
    let mut blob_sizes = BTreeMap::new();
    let mut incomplete = false;
    for (name, blob) in children(&blob_dir)? {
        let len = fs::symlink_metadata(&blob).map_err(io("reading", &blob))?.len();
        if name.ends_with(".incomplete") {
            incomplete = true;
        } else if name.ends_with(".sous.state") {
            continue;
        }
        blob_sizes.insert(name, len);
    }
    let mut refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let refs_dir = path.join("refs");
    let mut stack = vec![refs_dir.clone()];
    while let Some(dir) = stack.pop() {
        for (_, p) in children(&dir)? {
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(text) = fs::read_to_string(&p) {
                let name = p
                    .strip_prefix(&refs_dir)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_default();
                refs.entry(text.trim().to_owned()).or_default().push(name);
            }
        }
    }
    let mut revisions = Vec::new();
    for (commit, snapshot) in children(&path.join("snapshots"))? {
        if !snapshot.is_dir() {
            continue;
        }
        let (files, blobs) = snapshot_blobs(&snapshot)?;
        let size = blobs.iter().filter_map(|b| blob_sizes.get(b)).sum();
        let marker = Marker::read(&path.join(".sous").join(format!("{commit}.download-complete")));
        let status = match marker {
            Some(m) if m.files.iter().all(|f| snapshot.join(&f.path).exists()) => "complete",
            Some(_) => "partial",
            None if incomplete => "partial",
            None => "unverified",
        };
        revisions.push(Revision {
            refs: refs.remove(&commit).unwrap_or_default(),
            commit,
            status,
            files,
            size,
            path: snapshot,
        });
    }
    Ok(Model {
        repo: repo.to_owned(),
        path: path.to_path_buf(),
        size_on_disk: blob_sizes.values().sum(),
        revisions,
    })
}

fn dir_size(dir: &Path) -> Result<u64, InventoryError> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for (_, p) in children(&d)? {
            let meta = fs::symlink_metadata(&p).map_err(io("reading", &p))?;
            if meta.is_dir() {
                stack.push(p);
            } else {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

fn read_variant(name: &str, path: &Path) -> Result<Variant, InventoryError> {
    let marker: Option<serde_json::Value> = fs::read(path.join(QUANTIZE_MARKER))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let summary = marker.as_ref().map(|m| &m["summary"]);
    let text = |key: &str| summary.and_then(|s| s[key].as_str()).map(str::to_owned);
    Ok(Variant {
        name: name.to_owned(),
        path: path.to_path_buf(),
        size_on_disk: dir_size(path)?,
        complete: marker.is_some(),
        repo: text("repo"),
        commit: text("commit"),
        source: text("source").map(PathBuf::from),
        scheme: text("scheme"),
        format: text("format"),
        device: text("device").filter(|d| !d.is_empty()),
        sous_version: text("sous_version"),
    })
}

/// What `sous rm NAME` names: a model (`org/name`), one of its revisions
/// (`org/name@revision`) or a quantized variant (a recipe name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every revision of a model.
    Model(String),
    /// One revision.
    Revision(String, String),
    /// A quantized variant.
    Variant(String),
}

impl Target {
    /// Reads `NAME` as the user wrote it.
    pub fn parse(name: &str) -> Target {
        match name.split_once('@') {
            Some((repo, rev)) if repo.contains('/') => Target::Revision(repo.to_owned(), rev.to_owned()),
            _ if name.contains('/') => Target::Model(name.to_owned()),
            _ => Target::Variant(name.to_owned()),
        }
    }
}

/// What a removal will delete (and keep), before it does.
#[derive(Debug, Clone, Serialize)]
pub struct Removal {
    /// What the user named.
    pub target: String,
    /// `model`, `revision` or `variant`.
    pub kind: &'static str,
    /// Files and directories to delete, deepest last (deleted in this order).
    pub paths: Vec<PathBuf>,
    /// Bytes freed.
    pub bytes: u64,
    /// Entries found that sous and huggingface_hub do not write, left in place.
    pub kept: Vec<PathBuf>,
    /// The directory removed when nothing else is left in it.
    #[serde(skip)]
    root: Option<PathBuf>,
}

/// The layout's entries in a model's folder; anything else is left alone.
const MODEL_ENTRIES: [&str; 5] = ["blobs", "snapshots", "refs", ".no_exist", ".sous"];

/// Works out what removing `target` deletes, refusing when it is unknown.
pub fn plan_removal(listing: &Listing, target: &Target) -> Result<Removal, InventoryError> {
    let unknown = |name: &str| {
        let names: Vec<String> = listing
            .models
            .iter()
            .map(|m| m.repo.clone())
            .chain(listing.variants.iter().map(|v| v.name.clone()))
            .collect();
        InventoryError::Unknown {
            name: name.to_owned(),
            hub: listing.hub_cache.clone(),
            quantized: listing.quantized_dir.clone(),
            suggestion: sous_engine::recipe::closest(name, names.iter().map(String::as_str))
                .map(str::to_owned),
        }
    };
    match target {
        Target::Variant(name) => {
            let variant = listing
                .variants
                .iter()
                .find(|v| &v.name == name)
                .ok_or_else(|| unknown(name))?;
            if !variant.complete {
                // Without the marker it may be someone else's directory.
                return Ok(Removal {
                    target: name.clone(),
                    kind: "variant",
                    paths: Vec::new(),
                    bytes: 0,
                    kept: vec![variant.path.clone()],
                    root: None,
                });
            }
            let mut paths = Vec::new();
            walk(&variant.path, &mut paths)?;
            Ok(Removal {
                target: name.clone(),
                kind: "variant",
                paths,
                bytes: variant.size_on_disk,
                kept: Vec::new(),
                root: Some(variant.path.clone()),
            })
        }
        Target::Model(repo) => {
            let model = listing
                .models
                .iter()
                .find(|m| &m.repo == repo)
                .ok_or_else(|| unknown(repo))?;
            let mut paths = Vec::new();
            let mut kept = Vec::new();
            for (name, path) in children(&model.path)? {
                if MODEL_ENTRIES.contains(&name.as_str()) {
                    walk(&path, &mut paths)?;
                } else {
                    kept.push(path);
                }
            }
            let locks = listing
                .hub_cache
                .join(".locks")
                .join(model.path.file_name().unwrap_or_default());
            if locks.is_dir() {
                walk(&locks, &mut paths)?;
            }
            Ok(Removal {
                target: repo.clone(),
                kind: "model",
                paths,
                bytes: model.size_on_disk,
                kept,
                root: Some(model.path.clone()),
            })
        }
        Target::Revision(repo, revision) => {
            let model = listing
                .models
                .iter()
                .find(|m| &m.repo == repo)
                .ok_or_else(|| unknown(repo))?;
            let chosen = model
                .revisions
                .iter()
                .find(|r| &r.commit == revision || r.refs.iter().any(|x| x == revision))
                .ok_or_else(|| InventoryError::UnknownRevision {
                    repo: repo.clone(),
                    revision: revision.clone(),
                    known: model
                        .revisions
                        .iter()
                        .flat_map(|r| r.refs.iter().cloned().chain([r.commit.clone()]))
                        .collect(),
                })?;
            if model.revisions.len() == 1 {
                let mut whole = plan_removal(listing, &Target::Model(repo.clone()))?;
                whole.target = format!("{repo}@{revision}");
                whole.kind = "revision";
                return Ok(whole);
            }
            // Blobs the other snapshots still link to stay.
            let mut still = BTreeSet::new();
            for other in model.revisions.iter().filter(|r| r.commit != chosen.commit) {
                still.extend(snapshot_blobs(&other.path)?.1);
            }
            let (_, mine) = snapshot_blobs(&chosen.path)?;
            let mut paths = Vec::new();
            let mut bytes = 0;
            for blob in mine.difference(&still) {
                let path = model.path.join("blobs").join(blob);
                if let Ok(meta) = fs::symlink_metadata(&path) {
                    bytes += meta.len();
                    paths.push(path);
                }
            }
            walk(&chosen.path, &mut paths)?;
            for name in &chosen.refs {
                paths.push(model.path.join("refs").join(name));
            }
            let marker = model
                .path
                .join(".sous")
                .join(format!("{}.download-complete", chosen.commit));
            if marker.exists() {
                paths.push(marker);
            }
            Ok(Removal {
                target: format!("{repo}@{revision}"),
                kind: "revision",
                paths,
                bytes,
                kept: Vec::new(),
                root: None,
            })
        }
    }
}

/// Every file under `dir`, then the directories, deepest last.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), InventoryError> {
    let meta = fs::symlink_metadata(dir).map_err(io("reading", dir))?;
    if !meta.is_dir() {
        out.push(dir.to_path_buf());
        return Ok(());
    }
    for (_, path) in children(dir)? {
        walk(&path, out)?;
    }
    out.push(dir.to_path_buf());
    Ok(())
}

/// Whether `path` is `root` or inside it, comparing canonical paths where they exist.
pub fn within(path: &Path, root: &Path) -> bool {
    let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    canon(path).starts_with(canon(root))
}

/// The names of the running instances in `live` that serve from `path` (their served
/// directory is in it) or, for a model (`repo` given), that were given its repository id
/// and read the Hub cache themselves.
pub fn served_by(
    path: &Path,
    repo: Option<&str>,
    live: &[sous_engine::serve::instance::InstanceState],
) -> Vec<String> {
    live.iter()
        .filter(|s| match (&s.weights, repo) {
            (Some(weights), _) => within(weights, path),
            (None, Some(repo)) => s
                .model
                .as_deref()
                .is_some_and(|m| m.split('@').next() == Some(repo)),
            (None, None) => false,
        })
        .map(|s| s.name.clone())
        .collect()
}

/// Deletes what `removal` lists (symlinks themselves, never their targets), then its
/// root directory if nothing is left in it. A variant is deleted under its output lock,
/// so a quantization running into it is never cut short.
pub fn remove(removal: &Removal) -> Result<(), InventoryError> {
    let _lock = match (removal.kind, &removal.root) {
        ("variant", Some(root)) => Some(variant_lock(root)?),
        _ => None,
    };
    for path in &removal.paths {
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("reading", path)(e)),
        };
        let result = if meta.is_dir() {
            fs::remove_dir(path)
        } else {
            fs::remove_file(path)
        };
        result.map_err(io("removing", path))?;
    }
    if let Some(root) = &removal.root
        && root.exists()
        && children(root)?.is_empty()
    {
        fs::remove_dir(root).map_err(io("removing", root))?;
    }
    Ok(())
}

/// The variant's output lock (`.<name>.sous-lock` beside it), taken without waiting.
fn variant_lock(root: &Path) -> Result<fs::File, InventoryError> {
    let name = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = root.with_file_name(format!(".{name}.sous-lock"));
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("opening", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(InventoryError::Busy {
            path: root.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(io("locking", &path)(e)),
    }
}

#[cfg(test)]
mod tests;

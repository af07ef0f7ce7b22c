//! The mirror's repositories: plain directories `ROOT/org/name/...`, one revision each,
//! indexed on first use. A file's identity is what the Hub would give it: the git blob
//! sha1 for small files, and for large ones (what a Hub repository keeps in Git LFS,
//! by the extensions of the Hub's default `.gitattributes`) the sha256 of the content,
//! with the git oid of its LFS pointer. The commit id is a hash of every path and oid,
//! so it changes exactly when the content does.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha1::Sha1;
use sha2::Digest;
use sous_engine::recipe::DEFAULT_REVISION;

/// Extensions the Hub's default `.gitattributes` stores in LFS.
const LFS_EXTENSIONS: &[&str] = &[
    "7z",
    "arrow",
    "bin",
    "bz2",
    "ckpt",
    "ftz",
    "gguf",
    "gz",
    "h5",
    "joblib",
    "mlmodel",
    "model",
    "msgpack",
    "npy",
    "npz",
    "onnx",
    "ot",
    "parquet",
    "pb",
    "pickle",
    "pkl",
    "pt",
    "pth",
    "rar",
    "safetensors",
    "tar",
    "tflite",
    "tgz",
    "wasm",
    "xz",
    "zip",
    "zst",
];
/// Files larger than this go to LFS whatever their name (the Hub refuses larger
/// regular git files).
const LFS_MIN_SIZE: u64 = 10 << 20;

/// One file of a repository.
#[derive(Debug, Clone)]
pub struct IndexedFile {
    /// Path in the repository, `/`-separated.
    pub path: String,
    /// Where it is on disk.
    pub disk: PathBuf,
    /// Size.
    pub size: u64,
    /// git object id: of the content, or of the LFS pointer.
    pub oid: String,
    /// sha256 of the content, for LFS files.
    pub lfs_sha256: Option<String>,
    /// The Xet hash of the content, for LFS files when the mirror publishes them.
    pub xet_hash: Option<String>,
    /// Size of the LFS pointer file.
    pub pointer_size: u64,
}

impl IndexedFile {
    /// The etag clients key blobs by.
    pub fn etag(&self) -> &str {
        self.lfs_sha256.as_deref().unwrap_or(&self.oid)
    }
}

/// A repository's single revision.
#[derive(Debug)]
pub struct RepoIndex {
    /// `org/name`.
    pub repo: String,
    /// The commit id.
    pub commit: String,
    /// Files, sorted by path.
    pub files: Vec<IndexedFile>,
}

impl RepoIndex {
    /// Whether `revision` names this repository's revision.
    pub fn has_revision(&self, revision: &str) -> bool {
        revision == DEFAULT_REVISION || revision == self.commit
    }

    /// A file by path.
    pub fn file(&self, path: &str) -> Option<&IndexedFile> {
        self.files
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }
}

/// All repositories under a root, indexed lazily.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    /// Whether LFS files get a Xet hash.
    xet: bool,
    indexes: Mutex<HashMap<String, Arc<RepoIndex>>>,
}

impl Store {
    /// A store over `root`, its LFS files with a Xet hash if `xet`.
    pub fn new(root: PathBuf, xet: bool) -> Store {
        Store {
            root,
            xet,
            indexes: Mutex::new(HashMap::new()),
        }
    }

    /// The index of `org/name`, or `None` when there is no such directory.
    pub fn repo(&self, org: &str, name: &str) -> io::Result<Option<Arc<RepoIndex>>> {
        let valid = |s: &str| !s.is_empty() && !s.starts_with('.') && !s.contains(['/', '\\']);
        if !valid(org) || !valid(name) {
            return Ok(None);
        }
        let repo = format!("{org}/{name}");
        if let Some(index) = self.indexes.lock().map_err(poisoned)?.get(&repo) {
            return Ok(Some(index.clone()));
        }
        let dir = self.root.join(org).join(name);
        if !dir.is_dir() {
            return Ok(None);
        }
        let index = Arc::new(index_repo(&repo, &dir, self.xet)?);
        self.indexes.lock().map_err(poisoned)?.insert(repo, index.clone());
        Ok(Some(index))
    }
}

fn poisoned<T>(_: T) -> io::Error {
    io::Error::other("mirror index lock poisoned")
}

fn index_repo(repo: &str, dir: &Path, xet: bool) -> io::Result<RepoIndex> {
    let mut files = Vec::new();
    walk(dir, dir, xet, &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut commit = Sha1::new();
    commit.update(b"sous-mirror\n");
    for file in &files {
        commit.update(file.path.as_bytes());
        commit.update(b"\0");
        commit.update(file.oid.as_bytes());
        commit.update(b"\n");
    }
    Ok(RepoIndex {
        repo: repo.to_owned(),
        commit: hex::encode(commit.finalize()),
        files,
    })
}

fn walk(root: &Path, dir: &Path, xet: bool, out: &mut Vec<IndexedFile>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Dot files are bookkeeping (.git, .cache, .download-complete), not content;
        // `.gitattributes` is the exception real repositories carry.
        if name.starts_with('.') && name != ".gitattributes" {
            continue;
        }
        let path = entry.path();
        let meta = fs::metadata(&path)?; // follows symlinks: a Hub cache snapshot works as a root
        if meta.is_dir() {
            walk(root, &path, xet, out)?;
        } else if meta.is_file() {
            let relative = path
                .strip_prefix(root)
                .map_err(io::Error::other)?
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push(index_file(relative, path, meta.len(), xet)?);
        }
    }
    Ok(())
}

fn index_file(path: String, disk: PathBuf, size: u64, xet: bool) -> io::Result<IndexedFile> {
    let extension = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let lfs = size >= LFS_MIN_SIZE || LFS_EXTENSIONS.contains(&extension.as_str());
    // The same hashes a pull verifies the file against.
    let (digest, xet_hash) = if lfs && xet {
        let (sha256, xet) = crate::hub::download::lfs_hashes(&disk)?;
        (sha256, Some(xet))
    } else {
        (crate::hub::download::hash_file(&disk, lfs)?, None)
    };
    if lfs {
        let pointer =
            format!("version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {size}\n");
        Ok(IndexedFile {
            oid: git_blob_sha1(pointer.as_bytes()),
            pointer_size: pointer.len() as u64,
            lfs_sha256: Some(digest),
            xet_hash,
            path,
            disk,
            size,
        })
    } else {
        Ok(IndexedFile {
            oid: digest,
            pointer_size: 0,
            lfs_sha256: None,
            xet_hash: None,
            path,
            disk,
            size,
        })
    }
}

fn git_blob_sha1(data: &[u8]) -> String {
    let mut sha = Sha1::new();
    sha.update(format!("blob {}\0", data.len()).as_bytes());
    sha.update(data);
    hex::encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_like_the_hub() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("acme/tiny");
        fs::create_dir_all(repo.join("sub")).expect("dirs");
        fs::write(repo.join("config.json"), b"hello\n").expect("write");
        fs::write(repo.join("sub/model.safetensors"), b"hello\n").expect("write");
        fs::write(repo.join(".download-complete"), b"{}").expect("write");
        let store = Store::new(dir.path().to_path_buf(), true);
        let index = store.repo("acme", "tiny").expect("io").expect("found");
        assert_eq!(index.files.len(), 2, "dot files are not content");
        let config = index.file("config.json").expect("config");
        assert_eq!(config.etag(), "ce013625030ba8dba906f756967f9e9ca394464a");
        let weights = index.file("sub/model.safetensors").expect("weights");
        assert_eq!(
            weights.etag(),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert!(weights.pointer_size > 100);
        // LFS files get a Xet hash (hf_xet 1.8.0's of "hello\n"), others none.
        assert_eq!(
            weights.xet_hash.as_deref(),
            Some("fbf3242e7f6725a9dc46e5030d43ca9dd5265dd3690ccd1b1b8dcbdee88cb81b")
        );
        assert_eq!(config.xet_hash, None);
        let plain = Store::new(dir.path().to_path_buf(), false);
        let index_plain = plain.repo("acme", "tiny").expect("io").expect("found");
        assert_eq!(
            index_plain
                .file("sub/model.safetensors")
                .expect("weights")
                .xet_hash,
            None
        );
        assert_eq!(index_plain.commit, index.commit);
        assert_eq!(index.commit.len(), 40);
        assert!(store.repo("acme", "missing").expect("io").is_none());
        assert!(store.repo("..", "tiny").expect("io").is_none());
    }
}

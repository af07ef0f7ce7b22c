//! The Hugging Face cache layout, written the way huggingface_hub writes it
//! (huggingface_hub 2.4.0 `src/huggingface_hub/file_download.py`; `docs/hub.md`) so
//! that vLLM, transformers and huggingface_hub read what sous pulled, and sous reads
//! what they pulled:
//!
//! ```text
//! <cache>/models--org--name/blobs/<etag>              sha256 (LFS) or git sha1
//!                          /snapshots/<commit>/<path> relative symlink to the blob
//!                          /refs/<revision>           commit hash, no newline
//! <cache>/.locks/models--org--name/<etag>.lock        flock, shared with Python
//! ```
//!
//! sous adds `models--org--name/.sous/<commit>.download-complete`, a JSON record of a
//! finished pull (like the `.download-complete` marker of the DGX Spark field report's
//! initContainer, `docs/field-reports.md`), outside the folders huggingface_hub scans.
//! Refs and markers are written with [`sous_engine::atomic::write_file`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sous_engine::atomic::write_file;
use sous_engine::repo::RepoId;

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    /// The cache root.
    pub root: PathBuf,
    /// `models--org--name`.
    pub folder: String,
}

impl RepoCache {
    /// The cache folder of a model repository.
    pub fn new(root: &Path, repo: &RepoId) -> RepoCache {
        RepoCache {
            root: root.to_path_buf(),
            folder: repo.cache_folder(),
        }
    }

    /// `models--org--name/`.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.folder)
    }

    /// Where a blob lives.
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir().join("blobs").join(etag)
    }

    /// The snapshot folder of a commit.
    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir().join("snapshots").join(commit)
    }

    /// The lock file huggingface_hub uses for a blob.
    pub fn lock(&self, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(&self.folder)
            .join(format!("{etag}.lock"))
    }

    /// The commit a revision points to, if the cache knows it.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_owned());
        }
        let text = fs::read_to_string(self.dir().join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_owned())
    }

    /// Records `revision → commit`, atomically and without a trailing newline
    /// (huggingface_hub reads refs without stripping).
    pub fn write_ref(&self, revision: &str, commit: &str) -> io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.dir().join("refs").join(revision);
        write_file(&path, commit.as_bytes())
    }

    /// Points `snapshots/<commit>/<path>` at the blob with a relative symlink.
    pub fn link(&self, commit: &str, path: &str, etag: &str) -> io::Result<()> {
        let link = self.snapshot(commit).join(path);
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent)?;
        }
        let depth = path.split('/').count() + 1; // snapshots/<commit>/ and the path's folders
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        // Through a temporary name and a rename, so that two pulls laying out the same
        // snapshot at once both succeed.
        let name = link
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = link.with_file_name(format!(".{name}.{}.link", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)?;
        fs::rename(&tmp, &link)
    }

    /// The completion marker of a commit.
    pub fn marker(&self, commit: &str) -> PathBuf {
        self.dir()
            .join(".sous")
            .join(format!("{commit}.download-complete"))
    }
}

/// What a finished pull wrote: enough to know, without the network, that every file
/// is there and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// Repository id.
    pub repo: String,
    /// The commit pulled.
    pub commit: String,
    /// The `--include` / `--exclude` globs of that pull: a pull with other globs
    /// lists the repository again.
    #[serde(default)]
    pub selection: String,
    /// The files, in path order.
    pub files: Vec<MarkerFile>,
}

/// One file of a [`Marker`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerFile {
    /// Path in the repository.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 (LFS files) or git blob sha1 (others), hex.
    pub etag: String,
    /// Whether `etag` is a sha256.
    pub lfs: bool,
}

impl Marker {
    /// Reads a marker; `None` when absent or unreadable (then the pull runs again).
    pub fn read(path: &Path) -> Option<Marker> {
        serde_json::from_slice(&fs::read(path).ok()?).ok()
    }

    /// Writes it atomically.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        write_file(path, &json)
    }
}

/// A full 40-hex commit id.
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lays_out_like_huggingface_hub() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = RepoCache::new(dir.path(), &"acme/tiny".parse().expect("an id"));
        assert!(repo.dir().ends_with("models--acme--tiny"));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        fs::create_dir_all(repo.dir().join("blobs")).expect("blobs");
        fs::write(repo.blob("e1"), b"x").expect("blob");
        repo.link(commit, "sub/dir/file.json", "e1").expect("link");
        let link = repo.snapshot(commit).join("sub/dir/file.json");
        assert_eq!(
            fs::read_link(&link).expect("symlink"),
            PathBuf::from("../../../../blobs/e1")
        );
        assert_eq!(fs::read(&link).expect("through the link"), b"x");
        repo.write_ref("main", commit).expect("ref");
        assert_eq!(
            fs::read_to_string(repo.dir().join("refs/main")).expect("ref"),
            commit
        );
        assert_eq!(repo.read_ref("main").as_deref(), Some(commit));
        assert_eq!(repo.read_ref(commit).as_deref(), Some(commit));
        assert_eq!(repo.read_ref("other"), None);
    }
}

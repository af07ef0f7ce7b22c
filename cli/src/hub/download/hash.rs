//! Verification hashes: the sha256 (LFS files) or git blob sha1 (others) of a whole
//! file on disk ([`hash_file`]), or of a partial file read back range by range as the
//! ranges complete (`hash_in_order`, woken by `Chunks`), so that the digest is ready
//! moments after the last byte arrives. Comparing it with the Hub's etag, and
//! deleting bad bytes, is `download`'s `fetch`.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Condvar, Mutex};

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::CHUNK;

/// Which ranges are complete, for the hashing thread.
pub(super) struct Chunks {
    state: Mutex<(Vec<bool>, bool)>,
    changed: Condvar,
}

impl Chunks {
    pub(super) fn new(count: usize) -> Chunks {
        Chunks {
            state: Mutex::new((vec![false; count], false)),
            changed: Condvar::new(),
        }
    }

    pub(super) fn complete(&self, index: usize) {
        if let Ok(mut state) = self.state.lock() {
            if let Some(slot) = state.0.get_mut(index) {
                *slot = true;
            }
            self.changed.notify_all();
        }
    }

    pub(super) fn cancel(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.1 = true;
            self.changed.notify_all();
        }
    }

    /// Waits until range `index` is complete; false when the download was cancelled.
    fn wait(&self, index: usize) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        loop {
            if state.1 {
                return false;
            }
            if state.0.get(index).copied().unwrap_or(true) {
                return true;
            }
            state = match self.changed.wait(state) {
                Ok(s) => s,
                Err(_) => return false,
            };
        }
    }
}

/// Hashes the partial file range by range, as each completes.
pub(super) fn hash_in_order(path: &Path, lfs: bool, size: u64, chunks: &Chunks) -> io::Result<String> {
    let file = File::open(path)?;
    let mut sha256 = Sha256::new();
    let mut sha1 = Sha1::new();
    if !lfs {
        sha1.update(format!("blob {size}\0").as_bytes());
    }
    let mut buffer = vec![0u8; 1 << 20];
    let count = size.div_ceil(CHUNK).max(1);
    for index in 0..count {
        if !chunks.wait(index as usize) {
            return Err(io::Error::other("download cancelled"));
        }
        let (mut at, end) = (index * CHUNK, ((index + 1) * CHUNK).min(size));
        while at < end {
            let n = ((end - at) as usize).min(buffer.len());
            file.read_exact_at(&mut buffer[..n], at)?;
            if lfs {
                sha256.update(&buffer[..n]);
            } else {
                sha1.update(&buffer[..n]);
            }
            at += n as u64;
        }
    }
    Ok(if lfs {
        hex::encode(sha256.finalize())
    } else {
        hex::encode(sha1.finalize())
    })
}

/// sha256 of a file (LFS), or its git blob sha1 (`sha1("blob <len>\0" + data)`).
pub fn hash_file(path: &Path, lfs: bool) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut buffer = vec![0u8; 1 << 20];
    if lfs {
        let mut hasher = Sha256::new();
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
        Ok(hex::encode(hasher.finalize()))
    } else {
        let mut hasher = Sha1::new();
        hasher.update(format!("blob {len}\0").as_bytes());
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        fs::write(&path, b"hello\n").expect("write");
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            hash_file(&path, false).expect("hash"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            hash_file(&path, true).expect("hash"),
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
    }
}

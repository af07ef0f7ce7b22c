//! Verification hashes: the Xet hash (files the Hub gave one for, `xet`), the sha256
//! (other LFS files, with the backend `sha256` picks) or the git blob sha1 (the rest)
//! of a whole file on disk ([`hash_file`]), or of a partial file read back in order
//! (past the page cache where it was written so) as the ranges fill it
//! (`hash_in_order`, woken by `Chunks`), so that the digest is ready moments after the
//! last byte arrives. Comparing it with what the Hub announced, and deleting bad
//! bytes, is `download`'s `fetch`.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use sha1::{Digest, Sha1};

use super::sha256::{Backend, Sha256};
use super::sink::{Aligned, BLOCK, Partial, read_block};
use super::xet::XetHasher;
use super::{CHUNK, Check};

/// How far each range has written, for the hashing thread: bytes on disk from the
/// start of each chunk. Writers raise a chunk's count as they go and wake the
/// hasher every megabyte and at the end, so it follows the ranges inside a chunk
/// instead of waiting for whole chunks (which would leave the last few chunks to
/// hash after the download ends).
pub(super) struct Chunks {
    filled: Vec<AtomicU64>,
    cancelled: Mutex<bool>,
    changed: Condvar,
}

impl Chunks {
    pub(super) fn new(count: usize) -> Chunks {
        Chunks {
            filled: (0..count).map(|_| AtomicU64::new(0)).collect(),
            cancelled: Mutex::new(false),
            changed: Condvar::new(),
        }
    }

    /// Records that chunk `index` holds `bytes` from its start; `wake` the hasher.
    pub(super) fn fill(&self, index: usize, bytes: u64, wake: bool) {
        if let Some(filled) = self.filled.get(index) {
            filled.fetch_max(bytes, Ordering::Release);
        }
        if wake {
            // Taking the lock orders the store before a waiting hasher's re-check.
            drop(self.cancelled.lock());
            self.changed.notify_all();
        }
    }

    pub(super) fn cancel(&self) {
        if let Ok(mut cancelled) = self.cancelled.lock() {
            *cancelled = true;
            self.changed.notify_all();
        }
    }

    /// Waits until chunk `index` holds more than `have` bytes; the count it holds, or
    /// `None` when the download was cancelled.
    fn wait_past(&self, index: usize, have: u64) -> Option<u64> {
        let filled = self.filled.get(index)?;
        let mut cancelled = self.cancelled.lock().ok()?;
        loop {
            if *cancelled {
                return None;
            }
            let now = filled.load(Ordering::Acquire);
            if now > have {
                return Some(now);
            }
            // The timeout only bounds the cost of a missed wake-up.
            cancelled = self
                .changed
                .wait_timeout(cancelled, Duration::from_millis(50))
                .ok()?
                .0;
        }
    }
}

/// A finished hash: the digest and the time spent computing it (waits excluded).
pub(super) struct Hashed {
    pub hex: String,
    pub busy: Duration,
}

/// Hashes the partial file in order as the ranges fill it with `check`'s hash,
/// counting hashed bytes in `verified`. A reader thread reads the next blocks while
/// this one hashes: a read past the page cache waits for the disk, and would otherwise
/// leave the hash idle for it.
pub(super) fn hash_in_order(
    file: &Partial,
    check: Check,
    size: u64,
    chunks: &Chunks,
    verified: &AtomicU64,
) -> io::Result<Hashed> {
    let mut hasher = FileHasher::new(check, size);
    let (full_tx, full_rx) = mpsc::sync_channel::<(Aligned, usize)>(READ_AHEAD);
    let (empty_tx, empty_rx) = mpsc::channel::<Aligned>();
    for _ in 0..READ_AHEAD + 1 {
        // Aligned, so that a file written past the page cache is read back so.
        let _ = empty_tx.send(Aligned::new());
    }
    let mut busy = Duration::ZERO;
    let read = std::thread::scope(|scope| {
        let reader = scope.spawn(move || read_in_order(file, size, chunks, &empty_rx, &full_tx));
        for (block, n) in full_rx {
            let began = Instant::now();
            hasher.update(&block.bytes()[..n]);
            busy += began.elapsed();
            verified.fetch_add(n as u64, Ordering::Relaxed);
            let _ = empty_tx.send(block);
        }
        reader
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the reading thread panicked")))
    });
    read?;
    Ok(Hashed {
        hex: hasher.finish_hex(),
        busy,
    })
}

/// Blocks read ahead of the hash.
const READ_AHEAD: usize = 2;

/// Reads the file in order as the ranges fill it, in blocks taken from `empty` and sent
/// full to `full`. Returns when the file is read, or the hash stopped taking blocks.
fn read_in_order(
    file: &Partial,
    size: u64,
    chunks: &Chunks,
    empty: &mpsc::Receiver<Aligned>,
    full: &mpsc::SyncSender<(Aligned, usize)>,
) -> io::Result<()> {
    let count = size.div_ceil(CHUNK).max(1);
    for index in 0..count {
        let (start, end) = (index * CHUNK, ((index + 1) * CHUNK).min(size));
        let mut at = start;
        while at < end {
            let Some(filled) = chunks.wait_past(index as usize, at - start) else {
                return Err(io::Error::other("download cancelled"));
            };
            let ready = (start + filled).min(end);
            while at < ready {
                let Ok(mut block) = empty.recv() else {
                    return Ok(());
                };
                let n = ((ready - at) as usize).min(BLOCK);
                read_block(file, &mut block, n, at)?;
                if full.send((block, n)).is_err() {
                    return Ok(());
                }
                at += n as u64;
            }
        }
    }
    Ok(())
}

/// The hash a file is checked with, under way.
enum FileHasher {
    Sha256(Sha256),
    GitSha1(Box<Sha1>),
    Xet(Box<XetHasher>),
}

impl FileHasher {
    fn new(check: Check, size: u64) -> FileHasher {
        match check {
            Check::Sha256 => FileHasher::Sha256(Backend::current().hasher()),
            Check::GitSha1 => {
                let mut sha1 = Sha1::new();
                sha1.update(format!("blob {size}\0").as_bytes());
                FileHasher::GitSha1(Box::new(sha1))
            }
            Check::Xet => FileHasher::Xet(Box::default()),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            FileHasher::Sha256(h) => h.update(data),
            FileHasher::GitSha1(h) => h.update(data),
            FileHasher::Xet(h) => h.update(data),
        }
    }

    fn finish_hex(self) -> String {
        match self {
            FileHasher::Sha256(h) => h.finish_hex(),
            FileHasher::GitSha1(h) => hex::encode(h.finalize()),
            FileHasher::Xet(h) => h.finalize(),
        }
    }
}

/// sha256 of a file (LFS), or its git blob sha1 (`sha1("blob <len>\0" + data)`).
pub fn hash_file(path: &Path, lfs: bool) -> io::Result<String> {
    let check = if lfs { Check::Sha256 } else { Check::GitSha1 };
    hash_with(path, &[check])?
        .pop()
        .ok_or_else(|| io::Error::other("one hash asked, none computed"))
}

/// The sha256 and the Xet hash of a file, read once: what the Hub announces for a file
/// in Xet storage.
pub fn lfs_hashes(path: &Path) -> io::Result<(String, String)> {
    let mut digests = hash_with(path, &[Check::Sha256, Check::Xet])?.into_iter();
    match (digests.next(), digests.next()) {
        (Some(sha256), Some(xet)) => Ok((sha256, xet)),
        _ => Err(io::Error::other("two hashes asked, fewer computed")),
    }
}

/// The hex digests of `path` with each of `checks`, reading the file once.
fn hash_with(path: &Path, checks: &[Check]) -> io::Result<Vec<String>> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut hashers: Vec<FileHasher> = checks.iter().map(|&c| FileHasher::new(c, len)).collect();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        for hasher in &mut hashers {
            hasher.update(&buffer[..n]);
        }
    }
    Ok(hashers.into_iter().map(FileHasher::finish_hex).collect())
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

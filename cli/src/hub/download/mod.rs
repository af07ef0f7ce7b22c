//! One file from the Hub: parallel ranged GETs written at their offsets into a
//! preallocated `.incomplete` file, resumable after a kill, verified before it is
//! moved into place.
//!
//! Resume state is an append-only log beside the partial file (`<file>.state`), one
//! line `chunk offset` per megabyte written, so a killed pull loses at most the last
//! megabyte of each range in flight: less than one chunk per file. The Hub's own
//! clients cannot resume across processes: huggingface_hub (since 1.18; see
//! `_download_to_tmp_and_move` in `src/huggingface_hub/file_download.py`, 2.4.0)
//! downloads into a partial file with a fresh random name and deletes it on failure,
//! and hf-hub 1.0 starts an interrupted file again from its first byte
//! (huggingface/hf-hub issue #196). Ollama keeps per-part state the way we do
//! (`server/download.go`).
//!
//! Verification: a hash of the whole file against the one the Hub announced, computed
//! by a thread that follows the ranges in file order as they complete (reading back
//! from the page cache, or from the disk for a file written past it), so the hash is
//! ready moments after the last byte arrives. For a file in Xet storage it is the Xet
//! hash of its tree entry ([`xet`]: keyed BLAKE3 over content-defined chunks, 5 times
//! the speed of SHA-256 without SHA extensions, 1.6 times with them); for another LFS
//! file the sha256 of its etag; for the rest the git blob sha1. `SOUS_VERIFY=sha256` checks the sha256 even where a Xet hash is
//! given. A mismatch deletes the partial
//! file and its state, so bad bytes never reach `blobs/` or `snapshots/`. Like
//! huggingface_hub, the file is not fsynced: a torn write after a power cut fails the
//! hash on the next pull instead.
//!
//! The partial file is preallocated (`fallocate`) where the filesystem allows, so a
//! disk that cannot hold the file fails before any byte is spent on it. A file of a
//! gigabyte or more is written and read back with `O_DIRECT`, past the page cache
//! (`sink`).
//!
//! This file holds the job, its errors and [`fetch`], which prepares the partial
//! file, runs the ranges and verifies the result; `ranges` is the fetch loop, `sink`
//! the writes, `state` the resume log and `hash` the hashing.

mod hash;
mod ranges;
pub mod sha256;
mod sink;
mod state;
pub mod xet;

use hash::{Chunks, Hashed, hash_in_order};
pub use hash::{hash_file, lfs_hashes};
use ranges::{Timing, fetch_ranges};
use sink::{ALIGN, Partial};
pub use sink::{DIRECT_MIN, IO_ENV, Io, takes_direct};
use state::read_state;

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sous_engine::diagnose::{Class, Diagnose, user_unless};
use tokio::sync::Semaphore;

use super::api::{HubClient, HubError};

/// Size of one ranged request.
pub const CHUNK: u64 = 16 << 20;

/// A file to fetch.
#[derive(Debug, Clone)]
pub struct FileJob {
    /// Repository id (for messages).
    pub repo: String,
    /// Commit (for messages).
    pub commit: String,
    /// Path in the repository.
    pub path: String,
    /// The `resolve` URL.
    pub url: String,
    /// Expected size.
    pub size: u64,
    /// Expected sha256 (LFS) or git blob sha1, hex.
    pub etag: String,
    /// Whether `etag` is a sha256.
    pub lfs: bool,
    /// The Xet hash to check the file against: the Hub's, if the file is in Xet
    /// storage and [`Verify`] does not ask for the sha256 instead.
    pub xet_hash: Option<String>,
    /// Where the verified file goes.
    pub dest: PathBuf,
    /// How its bytes are written: through the page cache or directly.
    pub io: Io,
}

/// The environment variable that chooses the verification: `auto` (the default: the
/// Xet hash where the Hub gives one) or `sha256` (the sha256 of every LFS file).
pub const VERIFY_ENV: &str = sous_engine::env::VERIFY.name;

/// The hash a downloaded file is checked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// The Xet hash (`xet`).
    Xet,
    /// The sha256 of the content (an LFS file's etag).
    Sha256,
    /// The git blob sha1 (a small file's etag).
    GitSha1,
}

impl Check {
    /// Its name in reports and messages.
    pub fn name(self) -> &'static str {
        match self {
            Check::Xet => "xet",
            Check::Sha256 => "sha256",
            Check::GitSha1 => "git sha1",
        }
    }
}

/// What `SOUS_VERIFY` asks for, read once when a pull starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// The Xet hash where the Hub gives one, else the sha256 (`auto`, or unset).
    #[default]
    Auto,
    /// The sha256 of every LFS file, Xet hash or not (`sha256`).
    Sha256,
}

impl Verify {
    /// `SOUS_VERIFY`'s value; anything but `auto`, `sha256` or unset is refused.
    pub fn from_env() -> Result<Verify, String> {
        match sous_engine::env::VERIFY.get() {
            None => Ok(Verify::Auto),
            Some(v) if v == "auto" => Ok(Verify::Auto),
            Some(v) if v == "sha256" => Ok(Verify::Sha256),
            Some(v) => Err(format!(
                "{VERIFY_ENV}={v} is not a verification sous knows: use `auto` (the Xet hash where the Hub gives one, else sha256) or `sha256`"
            )),
        }
    }

    /// The Xet hash to check a file against, of the one the Hub `listed`: none when
    /// the sha256 is asked for.
    pub fn xet_hash(self, listed: Option<&str>) -> Option<String> {
        match self {
            Verify::Auto => listed.map(str::to_owned),
            Verify::Sha256 => None,
        }
    }
}

impl FileJob {
    /// The partial file.
    pub fn partial(&self) -> PathBuf {
        with_suffix(&self.dest, ".sous.incomplete")
    }

    /// The resume log.
    pub fn state(&self) -> PathBuf {
        with_suffix(&self.dest, ".sous.state")
    }

    /// The hash this file is checked with, and the value it must have.
    pub fn check(&self) -> (Check, &str) {
        match &self.xet_hash {
            Some(xet) if self.lfs => (Check::Xet, xet),
            _ if self.lfs => (Check::Sha256, &self.etag),
            _ => (Check::GitSha1, &self.etag),
        }
    }

    fn chunks(&self) -> u64 {
        self.size.div_ceil(CHUNK).max(1)
    }

    fn chunk_range(&self, index: u64) -> (u64, u64) {
        let start = index * CHUNK;
        (start, ((index + 1) * CHUNK).min(self.size))
    }

    /// Bytes already on disk from an earlier, interrupted pull.
    pub fn resumable_bytes(&self) -> u64 {
        if !self.partial().exists() {
            return 0;
        }
        read_state(&self.state())
            .iter()
            .map(|(index, done)| {
                let (start, end) = self.chunk_range(*index);
                (*done).min(end - start)
            })
            .sum()
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

/// Why a file could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The Hub or the network failed.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The bytes received do not hash to what the Hub announced.
    #[error(
        "`{path}` of `{repo}` is corrupt: expected {algorithm} {expected}, got {actual}; the partial file was deleted"
    )]
    Corrupt {
        /// Repository.
        repo: String,
        /// File.
        path: String,
        /// `xet`, `sha256` or `git sha1`.
        algorithm: &'static str,
        /// Announced.
        expected: String,
        /// Received.
        actual: String,
    },
    /// A local file could not be written or read.
    #[error("{action} `{}`", path.display())]
    Io {
        /// What sous was doing.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Whether a local I/O error is sous's fault: not when it is about permissions, a
/// full disk, a read-only filesystem or a missing path, which the user can fix.
pub(crate) fn io_is_internal(source: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    !matches!(
        source.kind(),
        ErrorKind::PermissionDenied
            | ErrorKind::StorageFull
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::NotFound
    ) && source.raw_os_error() != Some(28)
}

impl Diagnose for DownloadError {
    fn class(&self) -> Class {
        match self {
            DownloadError::Io { source, .. } => user_unless(io_is_internal(source)),
            DownloadError::Hub(e) => e.class(),
            _ => Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            DownloadError::Hub(e) => e.hint(),
            DownloadError::Corrupt { .. } => Some(
                "the mirror or a proxy served wrong bytes; run the pull again, and check the server if it repeats"
                    .into(),
            ),
            DownloadError::Io { source, .. } if source.raw_os_error() == Some(28) => Some(DISK_FULL.into()),
            _ => None,
        }
    }
}

/// What to do when the disk filled up during a pull.
pub(crate) const DISK_FULL: &str =
    "the disk is full: free space and run the same command again; finished files are kept";

impl DownloadError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DownloadError + use<> {
        let path = path.to_path_buf();
        move |source| DownloadError::Io { action, path, source }
    }
}

/// What a finished download did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fetched {
    /// Bytes received over the network in this run.
    pub downloaded: u64,
    /// Bytes kept from an interrupted run.
    pub resumed: u64,
    /// Bytes hashed.
    pub hashed: u64,
    /// The hash they were checked with (`None`: nothing was fetched).
    pub check: Option<Check>,
    /// Time the hashing thread spent computing (waiting for bytes excluded).
    pub hash_busy: std::time::Duration,
    /// Time the ranges spent inside writes through the page cache, summed over them.
    pub write_busy: std::time::Duration,
    /// Time the ranges waited for direct writes, summed over them.
    pub direct_write_busy: std::time::Duration,
    /// When the last byte was on disk.
    pub downloaded_at: Option<Instant>,
    /// When the digest was ready.
    pub verified_at: Option<Instant>,
    /// Its blocks were written with `O_DIRECT`, past the page cache.
    pub direct: bool,
}

/// Counters a download bumps as it goes: bytes on disk, bytes verified.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Bytes of the file received (resumed ones included): on disk, or in a block a
    /// range is gathering for a direct write.
    pub written: Arc<AtomicU64>,
    /// Bytes hashed so far.
    pub verified: Arc<AtomicU64>,
}

/// Fetches `job` into `job.dest`, using at most `per_file` ranges at once and taking a
/// permit from `connections` for each, reporting through `counters`.
pub async fn fetch(
    client: &HubClient,
    job: &FileJob,
    per_file: usize,
    connections: Arc<Semaphore>,
    counters: Counters,
) -> Result<Fetched, DownloadError> {
    let progress = counters.written.clone();
    let partial = job.partial();
    let state_path = job.state();
    if let Some(dir) = partial.parent() {
        fs::create_dir_all(dir).map_err(DownloadError::io("creating", dir))?;
    }
    // Resume only when both the data and its log are there and the sizes agree.
    let mut done: HashMap<u64, u64> = HashMap::new();
    let resuming = partial.metadata().map(|m| m.len() == job.size).unwrap_or(false);
    if resuming {
        done = read_state(&state_path);
    } else {
        let _ = fs::remove_file(&state_path);
    }
    let file = Partial::open(&partial, job.io, job.size).map_err(DownloadError::io("creating", &partial))?;
    if let Err(source) = preallocate(file.file(), job.size) {
        // Nothing of this file is on disk yet (or a resumed file lost nothing): leave
        // no empty partial file behind.
        drop(file);
        if !resuming {
            let _ = fs::remove_file(&partial);
            let _ = fs::remove_file(&state_path);
        }
        return Err(DownloadError::Io {
            action: "allocating",
            path: partial,
            source,
        });
    }
    let file = Arc::new(file);
    let log = Arc::new(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&state_path)
            .map_err(DownloadError::io("creating", &state_path))?,
    ));

    let mut resumed = 0;
    let mut pending = Vec::new();
    let chunks = Arc::new(Chunks::new(job.chunks() as usize));
    for index in 0..job.chunks() {
        let (start, end) = job.chunk_range(index);
        let mut have = done.get(&index).copied().unwrap_or(0).min(end - start);
        if file.is_direct() && start + have < end {
            // Direct writes start on a page: fetch again the few bytes before it.
            have -= have % ALIGN as u64;
        }
        resumed += have;
        if start + have < end || job.size == 0 {
            pending.push((index, start + have, end));
        }
        chunks.fill(index as usize, have, false);
    }
    progress.store(resumed, Ordering::Relaxed);
    // If this future is dropped (another file failed and the pull aborts the rest),
    // the hashing thread must stop waiting for ranges that will never come: the
    // runtime waits for blocking threads when it shuts down.
    let _stop_hasher = CancelOnDrop(chunks.clone());
    let (check, expected) = job.check();
    let hasher = {
        let (chunks, file, check, size) = (chunks.clone(), file.clone(), check, job.size);
        let verified = counters.verified.clone();
        tokio::task::spawn_blocking(move || hash_in_order(&file, check, size, &chunks, &verified))
    };
    let timing = Arc::new(Timing::default());
    let result = fetch_ranges(
        client,
        job,
        per_file,
        connections,
        pending,
        &file,
        &log,
        &progress,
        &chunks,
        &timing,
    )
    .await;
    if result.is_err() {
        chunks.cancel();
    }
    let downloaded_at = Instant::now();
    let hashed = hasher.await.map_err(|e| join_error(partial.clone(), e))?;
    let verified_at = Instant::now();
    result?;
    let direct = file.is_direct();
    drop(file);
    let Hashed { hex: actual, busy } = hashed.map_err(DownloadError::io("reading back", &partial))?;
    if actual != expected {
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&state_path);
        return Err(DownloadError::Corrupt {
            repo: job.repo.clone(),
            path: job.path.clone(),
            algorithm: check.name(),
            expected: expected.to_owned(),
            actual,
        });
    }
    fs::rename(&partial, &job.dest).map_err(DownloadError::io("moving into place", &job.dest))?;
    let _ = fs::remove_file(&state_path);
    Ok(Fetched {
        downloaded: job.size - resumed,
        resumed,
        hashed: job.size,
        check: Some(check),
        hash_busy: busy,
        write_busy: timing.buffered(),
        direct_write_busy: timing.direct(),
        downloaded_at: Some(downloaded_at),
        verified_at: Some(verified_at),
        direct,
    })
}

/// Cancels the hashing thread's wait when dropped (after the digest, a no-op).
struct CancelOnDrop(Arc<Chunks>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Gives the file its final size, with its blocks reserved where the filesystem can
/// (`fallocate` through fs4), else sparse (`set_len`).
fn preallocate(file: &fs::File, size: u64) -> io::Result<()> {
    use fs4::fs_std::FileExt;
    if size > 0 {
        match FileExt::allocate(file, size) {
            Ok(()) => {}
            Err(e) if is_unsupported(&e) => {}
            Err(e) => return Err(e),
        }
    }
    file.set_len(size)
}

fn is_unsupported(e: &io::Error) -> bool {
    // EOPNOTSUPP (95 on Linux) and ENOSYS: the filesystem cannot reserve blocks.
    e.kind() == io::ErrorKind::Unsupported || matches!(e.raw_os_error(), Some(95 | 38))
}

fn join_error(path: PathBuf, e: tokio::task::JoinError) -> DownloadError {
    DownloadError::Io {
        action: "downloading",
        path,
        source: io::Error::other(e.to_string()),
    }
}

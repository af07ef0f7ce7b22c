//! One file from the Hub: parallel ranged GETs written at their offsets into a
//! preallocated `.incomplete` file, resumable after a kill, verified before it is
//! moved into place.
//!
//! Resume state is an append-only log beside the partial file (`<file>.state`), one
//! line `chunk offset` per megabyte written, so a killed pull loses at most the last
//! megabyte of each range in flight: less than one chunk per file. huggingface_hub
//! keeps no state across processes (≥ 1.18) and hf-hub 1.0 truncates partial files
//! (shared/reference/hub.md §1.6, §2.3); Ollama keeps per-part state the same way
//! (`server/download.go`).
//!
//! Verification: the sha256 (LFS files) or the git blob sha1 (others) of the whole
//! file against the etag the Hub announced, computed by a thread that follows the
//! ranges in file order as they complete (reading back from the page cache), so the
//! hash is ready moments after the last byte arrives. A mismatch deletes the partial
//! file and its state, so bad bytes never reach `blobs/` or `snapshots/`. Like
//! huggingface_hub, the file is not fsynced: a torn write after a power cut fails the
//! hash on the next pull instead.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{StatusCode, header};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::api::{HubClient, HubError, classify, is_retryable};

/// Size of one ranged request.
pub const CHUNK: u64 = 16 << 20;
/// Progress is logged every this many bytes of a range.
const RECORD_EVERY: u64 = 1 << 20;
/// Attempts per range before the pull gives up (and can be resumed).
const ATTEMPTS: u32 = 5;

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
    /// Where the verified file goes.
    pub dest: PathBuf,
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
        /// `sha256` or `git sha1`.
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
}

/// Fetches `job` into `job.dest`, using at most `per_file` ranges at once and taking a
/// permit from `connections` for each. `progress` counts bytes on disk for this file.
pub async fn fetch(
    client: &HubClient,
    job: &FileJob,
    per_file: usize,
    connections: Arc<Semaphore>,
    progress: Arc<AtomicU64>,
) -> Result<Fetched, DownloadError> {
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
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&partial)
        .map_err(DownloadError::io("creating", &partial))?;
    file.set_len(job.size)
        .map_err(DownloadError::io("allocating", &partial))?;
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
        let have = done.get(&index).copied().unwrap_or(0).min(end - start);
        resumed += have;
        if start + have < end || job.size == 0 {
            pending.push((index, start + have, end));
        } else {
            chunks.complete(index as usize);
        }
    }
    progress.store(resumed, Ordering::Relaxed);
    let hasher = {
        let (chunks, path, lfs, size) = (chunks.clone(), partial.clone(), job.lfs, job.size);
        tokio::task::spawn_blocking(move || hash_in_order(&path, lfs, size, &chunks))
    };
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
    )
    .await;
    if result.is_err() {
        chunks.cancel();
    }
    let hashed = hasher.await.map_err(|e| join_error(partial.clone(), e))?;
    result?;
    drop(file);
    let actual = hashed.map_err(DownloadError::io("reading back", &partial))?;
    if actual != job.etag {
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&state_path);
        return Err(DownloadError::Corrupt {
            repo: job.repo.clone(),
            path: job.path.clone(),
            algorithm: if job.lfs { "sha256" } else { "git sha1" },
            expected: job.etag.clone(),
            actual,
        });
    }
    fs::rename(&partial, &job.dest).map_err(DownloadError::io("moving into place", &job.dest))?;
    let _ = fs::remove_file(&state_path);
    Ok(Fetched {
        downloaded: job.size - resumed,
        resumed,
    })
}

/// Runs the ranges: the first alone (it follows the Hub's redirect), then the rest
/// `per_file` at a time.
#[allow(clippy::too_many_arguments)]
async fn fetch_ranges(
    client: &HubClient,
    job: &FileJob,
    per_file: usize,
    connections: Arc<Semaphore>,
    pending: Vec<(u64, u64, u64)>,
    file: &Arc<File>,
    log: &Arc<Mutex<File>>,
    progress: &Arc<AtomicU64>,
    chunks: &Arc<Chunks>,
) -> Result<(), DownloadError> {
    let partial = job.partial();

    // The first range follows the Hub's redirect; the others go straight to where it
    // led (a CDN, on the real Hub), so `/resolve` is asked once per file.
    let mut url = job.url.clone();
    let mut send_auth = true;
    let mut pending = pending.into_iter();
    if let Some(first) = pending.next() {
        let permit = connections
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed(job))?;
        let final_url = fetch_range(client, job, &url, send_auth, first, file, log, progress, chunks).await?;
        drop(permit);
        if final_url != url {
            send_auth = same_origin(&final_url, &url);
            url = final_url;
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    let per_file = Arc::new(Semaphore::new(per_file.max(1)));
    for range in pending {
        let file_permit = per_file.clone().acquire_owned().await.map_err(|_| closed(job))?;
        let permit = connections
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed(job))?;
        let (client, job, url, file, log, progress, chunks) = (
            client.clone(),
            job.clone(),
            url.clone(),
            file.clone(),
            log.clone(),
            progress.clone(),
            chunks.clone(),
        );
        tasks.spawn(async move {
            let result = fetch_range(
                &client, &job, &url, send_auth, range, &file, &log, &progress, &chunks,
            )
            .await;
            drop((permit, file_permit));
            result
        });
        // Fail fast: stop starting ranges once one has failed.
        while let Some(joined) = tasks.try_join_next() {
            joined.map_err(|e| join_error(job_path(&partial), e))??;
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| join_error(job_path(&partial), e))??;
    }
    Ok(())
}

/// Which ranges are complete, for the hashing thread.
struct Chunks {
    state: Mutex<(Vec<bool>, bool)>,
    changed: Condvar,
}

impl Chunks {
    fn new(count: usize) -> Chunks {
        Chunks {
            state: Mutex::new((vec![false; count], false)),
            changed: Condvar::new(),
        }
    }

    fn complete(&self, index: usize) {
        if let Ok(mut state) = self.state.lock() {
            if let Some(slot) = state.0.get_mut(index) {
                *slot = true;
            }
            self.changed.notify_all();
        }
    }

    fn cancel(&self) {
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
fn hash_in_order(path: &Path, lfs: bool, size: u64, chunks: &Chunks) -> io::Result<String> {
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

fn job_path(path: &Path) -> PathBuf {
    path.to_path_buf()
}

fn closed(job: &FileJob) -> DownloadError {
    DownloadError::Io {
        action: "scheduling",
        path: job.dest.clone(),
        source: io::Error::other("the download was cancelled"),
    }
}

fn join_error(path: PathBuf, e: tokio::task::JoinError) -> DownloadError {
    DownloadError::Io {
        action: "downloading",
        path,
        source: io::Error::other(e.to_string()),
    }
}

fn same_origin(a: &str, b: &str) -> bool {
    let origin = |u: &str| {
        let rest = u.find("://").map_or(0, |i| i + 3);
        u[..u[rest..].find('/').map_or(u.len(), |i| rest + i)].to_owned()
    };
    origin(a) == origin(b)
}

/// Fetches bytes `[from, end)` of chunk `index`, retrying from where each attempt
/// stopped. Returns the URL the request ended at (after redirects).
#[allow(clippy::too_many_arguments)]
async fn fetch_range(
    client: &HubClient,
    job: &FileJob,
    url: &str,
    send_auth: bool,
    (index, from, end): (u64, u64, u64),
    file: &File,
    log: &Mutex<File>,
    progress: &AtomicU64,
    chunks: &Chunks,
) -> Result<String, DownloadError> {
    let chunk_start = index * CHUNK;
    let mut offset = from;
    let mut attempt = 1;
    let mut delay = Duration::from_millis(250);
    let mut final_url = url.to_owned();
    loop {
        if offset >= end && job.size > 0 {
            chunks.complete(index as usize);
            return Ok(final_url);
        }
        let mut request = client.http().get(url);
        if job.size > 0 {
            request = request.header(header::RANGE, format!("bytes={offset}-{}", end - 1));
        }
        if send_auth {
            request = client.authorize(request);
        }
        let outcome: Result<(), DownloadError> = async {
            let response = request.send().await.map_err(|source| HubError::Http {
                url: url.to_owned(),
                source,
            })?;
            let status = response.status();
            if !status.is_success() {
                if is_retryable(status) {
                    return Err(HubError::Protocol {
                        url: url.to_owned(),
                        message: format!("HTTP {status}"),
                    }
                    .into());
                }
                return Err(classify(response, url, &job.repo, &job.commit, Some(&job.path)).into());
            }
            final_url = response.url().to_string();
            // A server that ignores Range sends the whole file with 200: usable only
            // when that is what was asked for.
            if status == StatusCode::OK && !(offset == 0 && end == job.size) && job.size > 0 {
                return Err(HubError::Protocol {
                    url: url.to_owned(),
                    message: "the server ignores Range requests".into(),
                }
                .into());
            }
            let mut stream = response.bytes_stream();
            let mut since_record = 0;
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|source| HubError::Http {
                    url: url.to_owned(),
                    source,
                })?;
                let room = end.saturating_sub(offset) as usize;
                let piece = &piece[..piece.len().min(room)];
                // Blocking, but a write of one network chunk into the page cache.
                file.write_all_at(piece, offset)
                    .map_err(|source| DownloadError::Io {
                        action: "writing",
                        path: job.partial(),
                        source,
                    })?;
                offset += piece.len() as u64;
                since_record += piece.len() as u64;
                progress.fetch_add(piece.len() as u64, Ordering::Relaxed);
                if since_record >= RECORD_EVERY {
                    record(log, index, offset - chunk_start);
                    since_record = 0;
                }
                if offset >= end {
                    break;
                }
            }
            record(log, index, offset - chunk_start);
            if offset < end {
                return Err(HubError::Protocol {
                    url: url.to_owned(),
                    message: format!("the connection closed after byte {offset} of {end}"),
                }
                .into());
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => {
                chunks.complete(index as usize);
                return Ok(final_url);
            }
            Err(e) if retryable(&e) && attempt < ATTEMPTS => {
                tracing::debug!(path = %job.path, error = %e, attempt, "range failed, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn retryable(e: &DownloadError) -> bool {
    match e {
        DownloadError::Hub(HubError::Http { .. }) => true,
        DownloadError::Hub(HubError::Protocol { message, .. }) => {
            message.starts_with("HTTP 5")
                || message.starts_with("HTTP 4")
                || message.starts_with("the connection closed")
        }
        _ => false,
    }
}

fn record(log: &Mutex<File>, index: u64, done: u64) {
    if let Ok(mut file) = log.lock() {
        // A failed record only costs re-downloading that megabyte later.
        let _ = writeln!(file, "{index} {done}");
    }
}

fn read_state(path: &Path) -> HashMap<u64, u64> {
    let mut done = HashMap::new();
    let Ok(text) = fs::read_to_string(path) else {
        return done;
    };
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some(Ok(index)), Some(Ok(bytes))) = (
            parts.next().map(str::parse::<u64>),
            parts.next().map(str::parse::<u64>),
        ) {
            let entry = done.entry(index).or_insert(0);
            *entry = (*entry).max(bytes);
        }
    }
    done
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

    #[test]
    fn state_log_keeps_the_furthest_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        fs::write(&path, "0 1048576\n1 5\n0 2097152\ngarbage\n").expect("write");
        let state = read_state(&path);
        assert_eq!(state.get(&0), Some(&2_097_152));
        assert_eq!(state.get(&1), Some(&5));
    }
}

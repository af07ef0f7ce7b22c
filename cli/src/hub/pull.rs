//! A whole pull: resolve the revision, list and select the files, check the disk, fetch
//! what is missing (several files at once, several ranges per file), lay the snapshot
//! out, and write the completion marker last.
//!
//! A second pull of the same revision with the marker present asks the Hub one
//! question (what commit the revision is), or none when the revision is a commit id or
//! the pull is offline. When the Hub cannot answer that question (no connection, a
//! timeout, a server error after retries) and the revision's last pull is complete on
//! disk, that snapshot is used, with a warning naming its commit: a restart must not
//! wait for the Hub (huggingface_hub's `snapshot_download` falls back the same way).
//! An answer from a reachable Hub (401, 403, 404) is not an outage and fails the pull.

mod error;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use sous_engine::repo::RepoId;
use sous_engine::reporter::Reporter;
use tokio::sync::Semaphore;

use super::api::{HubClient, TreeEntry};
use super::cache::{Marker, MarkerFile, RepoCache, is_commit};
use super::download::{self, FileJob};
use super::select::Selection;
use super::transfer::Tracker;

pub use error::PullError;

/// Files fetched at once, at least: each has its own hashing thread, so a model of
/// many shards is verified on as many cores as the machine has (up to
/// [`MAX_FILES_AT_ONCE`]), while one file's hash follows its ranges in order.
const FILES_AT_ONCE: usize = 4;
/// Files fetched at once, at most.
const MAX_FILES_AT_ONCE: usize = 16;
/// Ranges of one file fetched at once.
const RANGES_PER_FILE: usize = 8;
/// Connections at once over all files, unless the caller says otherwise
/// (`sous pull --connections`).
pub const DEFAULT_CONNECTIONS: usize = 16;

/// What to pull.
#[derive(Debug, Clone)]
pub struct PullRequest {
    /// Repository id.
    pub repo: RepoId,
    /// Branch, tag or commit.
    pub revision: String,
    /// Globs of paths to take (empty: the defaults).
    pub include: Vec<String>,
    /// Globs of paths to leave.
    pub exclude: Vec<String>,
    /// A plain directory instead of the Hub cache.
    pub local_dir: Option<PathBuf>,
    /// No network at all.
    pub offline: bool,
    /// Connections at once, over all files.
    pub connections: usize,
}

/// What a pull did (`sous pull --json`).
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// Repository id.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The snapshot (or local) directory holding the files.
    pub path: PathBuf,
    /// Files in the pull.
    pub files: usize,
    /// Their total size.
    pub bytes: u64,
    /// Bytes received in this run.
    pub downloaded_bytes: u64,
    /// Bytes kept from an interrupted run.
    pub resumed_bytes: u64,
    /// Files already present.
    pub cached_files: usize,
    /// Their size.
    pub cached_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// `downloaded_bytes` per second of the whole pull, in MB (10^6 bytes).
    pub mb_per_s: f64,
    /// Download rate: `downloaded_bytes` per second from the first request to the
    /// last byte on disk, in MB/s.
    pub download_mb_per_s: f64,
    /// Verification rate: bytes hashed per second from the first request to the last
    /// digest, in MB/s. Close to `download_mb_per_s` when the network bounds the pull,
    /// below it when hashing does.
    pub verify_mb_per_s: f64,
    /// Bytes hashed per second of one hashing thread's compute, in MB/s: this CPU's
    /// speed with `sha256` (sha1 for small non-LFS files).
    pub verify_mb_per_cpu_s: f64,
    /// Seconds between the last byte on disk and the last digest: what verification
    /// added to the pull.
    pub verify_tail_seconds: f64,
    /// The share of the time, from the first request to the last byte, spent inside
    /// writes into the partial files (0 to 1): of the async runtime's worker time for
    /// writes through the page cache (small while the page cache takes the bytes, large
    /// when the kernel holds the writers back for its writeback to the disk), of the
    /// ranges' time for direct writes; the larger of the two.
    pub write_share: f64,
    /// What bounded the pull: `verification` (hashing added more than a tenth to the
    /// download), `disk` (writes took more than half the time: `write_share`), else
    /// `download`.
    pub bound: &'static str,
    /// The SHA-256 implementation and the CPU path it took (`sha2 (SHA-NI)`).
    pub sha256: String,
    /// How many of the fetched files each hash verified: `xet` (the Xet hash the Hub
    /// gave), `sha256` (LFS files without one), `git sha1` (small files).
    pub verified_with: BTreeMap<&'static str, usize>,
    /// Files fetched (and hashed) at once.
    pub files_at_once: usize,
    /// Fetched files written with `O_DIRECT`, past the page cache (`SOUS_PULL_IO`).
    pub direct_files: usize,
    /// Nothing was fetched: the marker said the pull was complete.
    pub up_to_date: bool,
    /// The Hub could not be reached, so the revision's snapshot already on disk was
    /// used without learning whether the revision has moved since.
    pub hub_unreachable: bool,
}

/// Where the files of a pull go, and where its bookkeeping lives.
enum Target {
    Cache(RepoCache),
    Local(PathBuf),
}

impl Target {
    fn dest(&self, file: &MarkerFile) -> PathBuf {
        match self {
            Target::Cache(cache) => cache.blob(&file.etag),
            Target::Local(dir) => dir.join(&file.path),
        }
    }

    /// Whether file names are content hashes (a file of the right size is the file).
    fn content_addressed(&self) -> bool {
        matches!(self, Target::Cache(_))
    }

    fn lock(&self, etag: &str) -> PathBuf {
        match self {
            Target::Cache(cache) => cache.lock(etag),
            Target::Local(dir) => dir.join(".cache/sous").join(format!("{etag}.lock")),
        }
    }

    fn marker(&self, commit: &str) -> PathBuf {
        match self {
            Target::Cache(cache) => cache.marker(commit),
            Target::Local(dir) => dir.join(".download-complete"),
        }
    }

    fn root(&self, commit: &str) -> PathBuf {
        match self {
            Target::Cache(cache) => cache.snapshot(commit),
            Target::Local(dir) => dir.clone(),
        }
    }

    /// Whether a file is already in place (verified when it was put there).
    fn present(&self, commit: &str, file: &MarkerFile, marker: Option<&Marker>) -> bool {
        let dest = self.dest(file);
        let size_ok = fs::metadata(&dest).map(|m| m.len() == file.size).unwrap_or(false);
        match self {
            // Blobs are named by their hash and only ever renamed into place verified.
            Target::Cache(_) => size_ok,
            // A plain directory may have been edited: trust the marker, else rehash.
            Target::Local(_) => {
                size_ok
                    && (marker.is_some_and(|m| m.commit == commit && m.files.contains(file))
                        || download::hash_file(&dest, file.lfs).is_ok_and(|h| h == file.etag))
            }
        }
    }
}

/// Runs a pull, reporting its progress to `reporter`.
pub async fn pull(
    client: &HubClient,
    request: &PullRequest,
    reporter: &dyn Reporter,
) -> Result<PullReport, PullError> {
    let started = Instant::now();
    let verify = download::Verify::from_env().map_err(PullError::Verify)?;
    let io = download::Io::from_env().map_err(PullError::WriteMode)?;
    let config = client.config();
    let target = match &request.local_dir {
        Some(dir) => Target::Local(dir.clone()),
        None => Target::Cache(RepoCache::new(&config.cache_dir, &request.repo)),
    };
    let report = |commit: &str, marker: &Marker, up_to_date: bool, hub_unreachable: bool| PullReport {
        repo: request.repo.to_string(),
        revision: request.revision.clone(),
        commit: commit.to_owned(),
        path: target.root(commit),
        files: marker.files.len(),
        bytes: marker.files.iter().map(|f| f.size).sum(),
        downloaded_bytes: 0,
        resumed_bytes: 0,
        cached_files: marker.files.len(),
        cached_bytes: marker.files.iter().map(|f| f.size).sum(),
        seconds: started.elapsed().as_secs_f64(),
        mb_per_s: 0.0,
        download_mb_per_s: 0.0,
        verify_mb_per_s: 0.0,
        verify_mb_per_cpu_s: 0.0,
        verify_tail_seconds: 0.0,
        write_share: 0.0,
        bound: "download",
        sha256: download::sha256::Backend::current().describe(),
        verified_with: BTreeMap::new(),
        files_at_once: 0,
        direct_files: 0,
        up_to_date,
        hub_unreachable,
    };

    // Without the network: the marker or nothing.
    let known_commit = match &target {
        Target::Cache(cache) => cache.read_ref(&request.revision),
        // A plain directory holds one pull; its marker says which commit.
        Target::Local(dir) => Marker::read(&dir.join(".download-complete"))
            .filter(|m| m.repo == request.repo.as_str())
            .map(|m| m.commit)
            .filter(|c| !is_commit(&request.revision) || *c == request.revision),
    };
    let selection = selection_key(request);
    if let Some(commit) = &known_commit
        && let Some(marker) = complete(&target, commit, &selection)
        && (request.offline || is_commit(&request.revision))
    {
        return Ok(report(commit, &marker, true, false));
    }
    if request.offline {
        return Err(PullError::NotCached {
            repo: request.repo.to_string(),
            revision: request.revision.clone(),
        });
    }

    // One request to learn the commit; if the marker for it is there, done.
    let commit = match client.revision(request.repo.as_str(), &request.revision).await {
        Ok(info) => info.sha,
        Err(e) if e.is_outage() => {
            let Some((commit, marker)) = known_commit
                .as_ref()
                .and_then(|c| Some((c, complete(&target, c, &selection)?)))
            else {
                return Err(e.into());
            };
            reporter.warn(&format!(
                "{e}: using `{}` at `{}` as last pulled, commit {commit}, from {}; the Hub may have moved `{}` since",
                request.repo,
                request.revision,
                target.root(commit).display(),
                request.revision
            ));
            return Ok(report(commit, &marker, true, true));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(marker) = complete(&target, &commit, &selection) {
        if let Target::Cache(cache) = &target {
            cache
                .write_ref(&request.revision, &commit)
                .map_err(PullError::io("writing", &cache.dir()))?;
        }
        return Ok(report(&commit, &marker, true, false));
    }

    let tree = client.tree(request.repo.as_str(), &commit).await?;
    let chosen: Vec<&str> =
        Selection::new(&request.include, &request.exclude)?.apply(tree.iter().map(|e| e.path.as_str()));
    if chosen.is_empty() {
        return Err(PullError::NothingSelected {
            repo: request.repo.to_string(),
            commit,
        });
    }
    let files: Vec<MarkerFile> = tree
        .iter()
        .filter(|e| chosen.contains(&e.path.as_str()))
        .map(marker_file)
        .collect();
    let xet_hashes: HashMap<&str, &str> = tree
        .iter()
        .filter_map(|e| Some((e.path.as_str(), e.xet_hash.as_deref()?)))
        .collect();
    let previous = Marker::read(&target.marker(&commit));
    let (present, missing): (Vec<&MarkerFile>, Vec<&MarkerFile>) = files
        .iter()
        .partition(|f| target.present(&commit, f, previous.as_ref()));

    let jobs: Vec<FileJob> = missing
        .iter()
        .map(|f| FileJob {
            repo: request.repo.to_string(),
            commit: commit.clone(),
            path: f.path.clone(),
            url: client.resolve_url(request.repo.as_str(), &commit, &f.path),
            size: f.size,
            etag: f.etag.clone(),
            lfs: f.lfs,
            xet_hash: verify.xet_hash(xet_hashes.get(f.path.as_str()).copied()),
            dest: target.dest(f),
            io,
        })
        .collect();
    let resumable: u64 = jobs.iter().map(FileJob::resumable_bytes).sum();
    let needed: u64 = jobs.iter().map(|j| j.size).sum::<u64>() - resumable;
    let data_dir = match &target {
        Target::Cache(cache) => cache.dir().join("blobs"),
        Target::Local(dir) => dir.clone(),
    };
    fs::create_dir_all(&data_dir).map_err(PullError::io("creating", &data_dir))?;
    let available =
        fs4::available_space(&data_dir).map_err(PullError::io("measuring free space in", &data_dir))?;
    if needed > available {
        return Err(PullError::DiskFull {
            path: data_dir,
            needed,
            available,
        });
    }

    let total: u64 = files.iter().map(|f| f.size).sum();
    let already: u64 = present.iter().map(|f| f.size).sum();
    let cached_files = present.len();
    let cached_bytes = already;
    let tracker = Tracker::new(reporter, total, already);
    let ticker = tracker.spawn_ticker();
    let connections = Arc::new(Semaphore::new(request.connections.max(1)));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let files_at_once_count = cores.clamp(FILES_AT_ONCE, MAX_FILES_AT_ONCE);
    let files_at_once = Arc::new(Semaphore::new(files_at_once_count));
    let fetch_started = Instant::now();
    let content_addressed = target.content_addressed();
    let mut tasks = tokio::task::JoinSet::new();
    for job in jobs {
        let (client, connections, files_at_once, tracker) = (
            client.clone(),
            connections.clone(),
            files_at_once.clone(),
            tracker.clone(),
        );
        let lock = target.lock(&job.etag);
        tasks.spawn(async move {
            let _slot = files_at_once.acquire_owned().await;
            let _lock = acquire_lock(&lock, &job).await?;
            // Another process may have finished it while we waited.
            if content_addressed && fs::metadata(&job.dest).is_ok_and(|m| m.len() == job.size) {
                tracker.finish_file(&job.path);
                return Ok(download::Fetched::default());
            }
            let counters = tracker.file(&job.path, job.size);
            let fetched = download::fetch(&client, &job, RANGES_PER_FILE, connections, counters).await?;
            tracker.finish_file(&job.path);
            Ok::<_, PullError>(fetched)
        });
    }
    let mut downloaded = 0;
    let mut resumed = 0;
    let (mut hashed, mut hash_busy) = (0, std::time::Duration::ZERO);
    let (mut write_busy, mut direct_write_busy) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    let mut direct_files = 0;
    let (mut downloaded_at, mut verified_at) = (fetch_started, fetch_started);
    let mut verified_with = BTreeMap::new();
    let mut failure = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(fetched)) => {
                downloaded += fetched.downloaded;
                resumed += fetched.resumed;
                hashed += fetched.hashed;
                hash_busy += fetched.hash_busy;
                write_busy += fetched.write_busy;
                direct_write_busy += fetched.direct_write_busy;
                direct_files += usize::from(fetched.direct);
                if let Some(check) = fetched.check {
                    *verified_with.entry(check.name()).or_insert(0) += 1;
                }
                downloaded_at = downloaded_at.max(fetched.downloaded_at.unwrap_or(fetch_started));
                verified_at = verified_at.max(fetched.verified_at.unwrap_or(fetch_started));
            }
            Ok(Err(e)) => {
                // Stop the others: their progress is logged, the next run resumes it.
                tasks.abort_all();
                failure.get_or_insert(e);
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                failure.get_or_insert(PullError::Io {
                    action: "downloading into",
                    path: data_dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                });
            }
        }
    }
    ticker.abort();
    tracker.finish();
    if let Some(e) = failure {
        return Err(e);
    }

    // Lay out the snapshot, then the ref, then the marker: the marker last.
    let marker = Marker {
        repo: request.repo.to_string(),
        commit: commit.clone(),
        selection: selection_key(request),
        files,
    };
    if let Target::Cache(cache) = &target {
        for file in &marker.files {
            cache
                .link(&commit, &file.path, &file.etag)
                .map_err(PullError::io("linking", &cache.snapshot(&commit)))?;
        }
        cache
            .write_ref(&request.revision, &commit)
            .map_err(PullError::io("writing", &cache.dir()))?;
    }
    let marker_path = target.marker(&commit);
    marker
        .write(&marker_path)
        .map_err(PullError::io("writing", &marker_path))?;
    let seconds = started.elapsed().as_secs_f64();
    let rate = |bytes: u64, secs: f64| bytes as f64 / 1e6 / secs.max(1e-9);
    let download_seconds = (downloaded_at - fetch_started).as_secs_f64();
    let verify_seconds = (verified_at - fetch_started).as_secs_f64();
    let tail = (verified_at - downloaded_at).as_secs_f64();
    // Writes through the page cache run on the runtime's workers (a write of one
    // network chunk is too short to hand to a blocking thread), so their share of the
    // workers' time says whether the disk held the pull; a direct write holds its range
    // while it runs, so its share is of the ranges' time.
    let workers = tokio::runtime::Handle::current().metrics().num_workers().max(1);
    let share = |busy: std::time::Duration, lanes: usize| {
        (busy.as_secs_f64() / (download_seconds.max(1e-9) * lanes.max(1) as f64)).min(1.0)
    };
    let write_share = share(write_busy, workers).max(share(
        direct_write_busy,
        request.connections.min(files_at_once_count * RANGES_PER_FILE),
    ));
    Ok(PullReport {
        downloaded_bytes: downloaded,
        resumed_bytes: resumed,
        cached_files,
        cached_bytes,
        seconds,
        mb_per_s: rate(downloaded, seconds),
        download_mb_per_s: rate(downloaded, download_seconds),
        verify_mb_per_s: rate(hashed, verify_seconds),
        verify_mb_per_cpu_s: rate(hashed, hash_busy.as_secs_f64()),
        verify_tail_seconds: tail,
        write_share,
        bound: bound(tail, verify_seconds, write_share),
        files_at_once: files_at_once_count,
        direct_files,
        verified_with,
        up_to_date: false,
        ..report(&commit, &marker, false, false)
    })
}

/// What bounded a pull. Verification, when it added more than a tenth to the time the
/// bytes took to arrive (the hash of the last megabytes always comes after them); else
/// the disk, when more than half the writers' time went inside writes (the kernel holds
/// writers back once more dirty pages wait for the disk than it allows, and a direct
/// write waits for the disk itself); else the
/// download itself: the network, or on loopback the CPU that serves and receives.
fn bound(tail: f64, verify_seconds: f64, write_share: f64) -> &'static str {
    if tail > 0.1 * (verify_seconds - tail).max(0.0) && tail > 0.05 {
        "verification"
    } else if write_share > 0.5 {
        "disk"
    } else {
        "download"
    }
}

fn marker_file(entry: &TreeEntry) -> MarkerFile {
    match &entry.lfs {
        Some(lfs) => MarkerFile {
            path: entry.path.clone(),
            size: lfs.size,
            etag: lfs.oid.clone(),
            lfs: true,
        },
        None => MarkerFile {
            path: entry.path.clone(),
            size: entry.size,
            etag: entry.oid.clone(),
            lfs: false,
        },
    }
}

/// The globs of a request, as recorded in the marker.
fn selection_key(request: &PullRequest) -> String {
    format!("include={:?} exclude={:?}", request.include, request.exclude)
}

/// The marker of a commit, when it exists, was made with the same globs, and every
/// file it lists is in place.
fn complete(target: &Target, commit: &str, selection: &str) -> Option<Marker> {
    let marker =
        Marker::read(&target.marker(commit)).filter(|m| m.commit == commit && m.selection == selection)?;
    let all_there = marker.files.iter().all(|f| {
        let path = match target {
            Target::Cache(cache) => cache.snapshot(commit).join(&f.path),
            Target::Local(dir) => dir.join(&f.path),
        };
        fs::metadata(path).is_ok_and(|m| m.len() == f.size)
    });
    all_there.then_some(marker)
}

/// Takes the blob's lock (the same file and `flock` huggingface_hub uses), waiting
/// for another pull of the same file to finish rather than racing it.
async fn acquire_lock(path: &Path, job: &FileJob) -> Result<fs::File, PullError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(PullError::io("creating", dir))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(PullError::io("opening lock", path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => {
            tracing::info!(path = %job.path, "another pull is fetching this file; waiting for it");
            let path_buf = path.to_path_buf();
            tokio::task::spawn_blocking(move || file.lock().map(|()| file))
                .await
                .map_err(|e| PullError::Io {
                    action: "waiting for lock",
                    path: path_buf.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?
                .map_err(PullError::io("waiting for lock", path))
        }
        Err(fs::TryLockError::Error(e)) => Err(PullError::Io {
            action: "locking",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::bound;

    #[test]
    fn the_bound_is_the_hash_then_the_disk_then_the_download() {
        // Hashing finished 2 s after a 10 s download: verification.
        assert_eq!(bound(2.0, 12.0, 0.9), "verification");
        // Hashing kept up; the workers spent 70 % of their time writing: the disk.
        assert_eq!(bound(0.01, 10.0, 0.7), "disk");
        // Neither: the download.
        assert_eq!(bound(0.01, 10.0, 0.05), "download");
        assert_eq!(bound(0.01, 10.0, 0.5), "download");
    }
}

//! The fetch loop: the ranges of one file, the first alone to follow the Hub's
//! redirect and the rest in parallel against where it led, each retried from the
//! byte where its last attempt stopped. Bytes go to the partial file at their offset
//! (gathered into blocks first where the file is written past the page cache, see
//! `sink`) and into the resume log once written; what happens to the file before and
//! after is `fetch`'s, in `download`.
//!
//! The Hub redirects LFS files to a CDN with a signed link that expires (an hour on
//! huggingface.co). A range that gets 403 from such a link goes back to the Hub's
//! `resolve` URL, which signs a fresh one, and the ranges after it use that one: a
//! pull longer than a link's life completes. 429 and 503 are retried after the
//! server's `Retry-After` when it sends one, else with exponential back-off.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{StatusCode, header};
use tokio::sync::Semaphore;

use super::hash::Chunks;
use super::sink::{Partial, RangeWriter, Writing};
use super::state::record;
use super::{CHUNK, DownloadError, FileJob, join_error};
use crate::hub::api::{HubClient, HubError, classify, is_retryable};

/// Progress is logged every this many bytes of a range.
const RECORD_EVERY: u64 = 1 << 20;
/// Attempts per range before the pull gives up (and can be resumed).
const ATTEMPTS: u32 = 5;

/// Time the ranges spent inside writes into the partial file, summed over them, in
/// nanoseconds. Writes through the page cache run on the async runtime's worker
/// threads: while the page cache takes the bytes a write costs microseconds, but once
/// more dirty pages wait for the disk than the kernel allows, it holds each writer back
/// until its writeback catches up, and the workers spend their time there instead of
/// reading the network. A direct write runs on a blocking thread while its range waits.
#[derive(Debug, Default)]
pub(super) struct Timing {
    buffered: AtomicU64,
    direct: AtomicU64,
}

impl Timing {
    fn add(&self, writing: Writing) {
        self.buffered
            .fetch_add(writing.buffered.as_nanos() as u64, Ordering::Relaxed);
        self.direct
            .fetch_add(writing.direct.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Time inside writes through the page cache.
    pub(super) fn buffered(&self) -> Duration {
        Duration::from_nanos(self.buffered.load(Ordering::Relaxed))
    }

    /// Time inside direct writes.
    pub(super) fn direct(&self) -> Duration {
        Duration::from_nanos(self.direct.load(Ordering::Relaxed))
    }
}

/// Runs the ranges: the first alone (it follows the Hub's redirect), then the rest
/// `per_file` at a time.
#[allow(clippy::too_many_arguments)]
pub(super) async fn fetch_ranges(
    client: &HubClient,
    job: &FileJob,
    per_file: usize,
    connections: Arc<Semaphore>,
    pending: Vec<(u64, u64, u64)>,
    file: &Arc<Partial>,
    log: &Arc<Mutex<File>>,
    progress: &Arc<AtomicU64>,
    chunks: &Arc<Chunks>,
    timing: &Arc<Timing>,
) -> Result<(), DownloadError> {
    let partial = job.partial();

    // The first range follows the Hub's redirect; the others go straight to where it
    // led (a CDN, on the real Hub), so `/resolve` is asked once per file, and again
    // only when the link expires.
    let source = Arc::new(Source::new(&job.url));
    let mut pending = pending.into_iter();
    if let Some(first) = pending.next() {
        let permit = connections
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed(job))?;
        fetch_range(client, job, &source, first, file, log, progress, chunks, timing).await?;
        drop(permit);
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
        let (client, job, source, file, log, progress, chunks, timing) = (
            client.clone(),
            job.clone(),
            source.clone(),
            file.clone(),
            log.clone(),
            progress.clone(),
            chunks.clone(),
            timing.clone(),
        );
        tasks.spawn(async move {
            let result = fetch_range(
                &client, &job, &source, range, &file, &log, &progress, &chunks, &timing,
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

/// Where a file's bytes come from: the URL its ranges use (the Hub's `resolve` URL
/// until a request lands elsewhere) and whether the token goes with them.
struct Source {
    resolve: String,
    current: Mutex<String>,
}

impl Source {
    fn new(resolve: &str) -> Source {
        Source {
            resolve: resolve.to_owned(),
            current: Mutex::new(resolve.to_owned()),
        }
    }

    fn current(&self) -> String {
        self.current
            .lock()
            .map(|u| u.clone())
            .unwrap_or_else(|_| self.resolve.clone())
    }

    /// A request to `used` ended at `landed` (after redirects): later ranges go there.
    fn landed(&self, used: &str, landed: &str) {
        if let Ok(mut current) = self.current.lock()
            && *current == used
        {
            landed.clone_into(&mut current);
        }
    }

    /// `used` answered 403: the next request goes through `resolve` again, unless
    /// another range has already found a fresh link.
    fn expired(&self, used: &str) {
        if let Ok(mut current) = self.current.lock()
            && *current == used
        {
            self.resolve.clone_into(&mut current);
        }
    }

    /// The token is sent to the Hub, never to a CDN on another origin.
    fn send_auth(&self, url: &str) -> bool {
        same_origin(url, &self.resolve)
    }
}

fn same_origin(a: &str, b: &str) -> bool {
    let origin = |u: &str| {
        let rest = u.find("://").map_or(0, |i| i + 3);
        u[..u[rest..].find('/').map_or(u.len(), |i| rest + i)].to_owned()
    };
    origin(a) == origin(b)
}

/// Fetches bytes `[from, end)` of chunk `index` from `source`, retrying from where
/// each attempt stopped.
#[allow(clippy::too_many_arguments)]
async fn fetch_range(
    client: &HubClient,
    job: &FileJob,
    source: &Source,
    (index, from, end): (u64, u64, u64),
    file: &Arc<Partial>,
    log: &Mutex<File>,
    progress: &AtomicU64,
    chunks: &Chunks,
    timing: &Timing,
) -> Result<(), DownloadError> {
    let chunk_start = index * CHUNK;
    let mut offset = from;
    // Kept across attempts: a retry goes on from the last byte received, gathered or not.
    let mut writer = RangeWriter::new(file.clone(), from);
    let mut recorded = from;
    let mut attempt = 1;
    let mut renewals = 0;
    let mut delay = Duration::from_millis(250);
    loop {
        if offset >= end && job.size > 0 {
            chunks.fill(index as usize, end - chunk_start, true);
            return Ok(());
        }
        let url = source.current();
        let url = url.as_str();
        let mut request = client.http().get(url);
        if job.size > 0 {
            request = request.header(header::RANGE, format!("bytes={offset}-{}", end - 1));
        }
        if source.send_auth(url) {
            request = client.authorize(request);
        }
        let mut wait = None;
        let outcome: Result<(), DownloadError> = async {
            let response = request.send().await.map_err(|source| HubError::Http {
                url: url.to_owned(),
                source,
            })?;
            let status = response.status();
            if !status.is_success() {
                if status == StatusCode::FORBIDDEN && !same_origin(response.url().as_str(), &source.resolve) {
                    // A signed CDN link that expired (or was revoked): sign a new one.
                    source.expired(url);
                    return Err(HubError::Protocol {
                        url: url.to_owned(),
                        message: EXPIRED.into(),
                    }
                    .into());
                }
                if is_retryable(status) {
                    wait = retry_after(&response);
                    return Err(HubError::Protocol {
                        url: url.to_owned(),
                        message: format!("HTTP {status}"),
                    }
                    .into());
                }
                return Err(classify(response, url, &job.repo, &job.commit, Some(&job.path)).into());
            }
            source.landed(url, response.url().as_str());
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
            let failed = |source| DownloadError::Io {
                action: "writing",
                path: job.partial(),
                source,
            };
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|source| HubError::Http {
                    url: url.to_owned(),
                    source,
                })?;
                let room = end.saturating_sub(offset) as usize;
                let piece = &piece[..piece.len().min(room)];
                let moved = writer.push(piece).await;
                timing.add(writer.take_writing());
                offset += piece.len() as u64;
                progress.fetch_add(piece.len() as u64, Ordering::Relaxed);
                if moved.map_err(failed)? {
                    let written = writer.written();
                    let wake = written - recorded >= RECORD_EVERY;
                    chunks.fill(index as usize, written - chunk_start, wake);
                    if wake {
                        record(log, index, written - chunk_start);
                        recorded = written;
                    }
                }
                if offset >= end {
                    break;
                }
            }
            if offset >= end {
                let flushed = writer.flush().await;
                timing.add(writer.take_writing());
                flushed.map_err(failed)?;
            }
            record(log, index, writer.written() - chunk_start);
            recorded = writer.written();
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
                chunks.fill(index as usize, end - chunk_start, true);
                return Ok(());
            }
            // An expired link is renewed at once; it is not the network failing.
            Err(e) if is_expired(&e) && renewals < RENEWALS => {
                tracing::debug!(path = %job.path, "signed link expired, resolving again");
                renewals += 1;
            }
            Err(e) if retryable(&e) && attempt < ATTEMPTS => {
                let pause = wait.unwrap_or(delay);
                tracing::debug!(path = %job.path, error = %e, attempt, ?pause, "range failed, retrying");
                tokio::time::sleep(pause).await;
                delay = (delay * 2).min(Duration::from_secs(8));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What an expired link's error says.
const EXPIRED: &str = "HTTP 403 from a signed link: it expired";
/// Fresh links one range may ask for before the pull gives up: a link that expires
/// again at once is a broken server, not an old link.
const RENEWALS: u32 = 8;
/// The longest `Retry-After` honoured; longer asks are capped to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

fn is_expired(e: &DownloadError) -> bool {
    matches!(e, DownloadError::Hub(HubError::Protocol { message, .. }) if message == EXPIRED)
}

/// A `Retry-After` in seconds (the HTTP-date form is rare on 429/503 and ignored).
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let seconds: u64 = response
        .headers()
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
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

//! The fetch loop: the ranges of one file, the first alone to follow the Hub's
//! redirect and the rest in parallel against where it led, each retried from the
//! byte where its last attempt stopped. Bytes go to the partial file at their offset
//! and into the resume log as they arrive; what happens to the file before and after
//! is `fetch`'s, in `download`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{StatusCode, header};
use tokio::sync::Semaphore;

use super::hash::Chunks;
use super::state::record;
use super::{CHUNK, DownloadError, FileJob, join_error};
use crate::hub::api::{HubClient, HubError, classify, is_retryable};

/// Progress is logged every this many bytes of a range.
const RECORD_EVERY: u64 = 1 << 20;
/// Attempts per range before the pull gives up (and can be resumed).
const ATTEMPTS: u32 = 5;

/// Runs the ranges: the first alone (it follows the Hub's redirect), then the rest
/// `per_file` at a time.
#[allow(clippy::too_many_arguments)]
pub(super) async fn fetch_ranges(
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

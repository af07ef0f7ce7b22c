//! The mirror's answer with a file's bytes, for `resolve` and the CDN alike: the
//! whole file or the one range asked (`Range: bytes=...`), HEAD without a body, the
//! faults of [`super::faults`] applied to the body, and every byte sent counted for
//! the mirror's statistics.
//!
//! Not here: which file a request names, or the headers the Hub sends with it
//! ([`super`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::store::IndexedFile;
use super::{Mirror, error, faults};

/// The bytes of `file` (one range of them when asked), with headers `h`.
pub(super) async fn send_file(
    mirror: &Mirror,
    method: &Method,
    file: &IndexedFile,
    headers: &HeaderMap,
    mut h: HeaderMap,
    fault_key: &str,
) -> Response {
    let path = &file.path;
    let insert = |h: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => None,
        Some(spec) => match parse_range(spec, file.size) {
            RangeSpec::Ignore => None,
            RangeSpec::Range(start, end) => Some((start, end)),
            RangeSpec::Unsatisfiable => {
                insert(&mut h, "content-range", &format!("bytes */{}", file.size));
                return (StatusCode::RANGE_NOT_SATISFIABLE, h).into_response();
            }
        },
    };
    let (status, start, end) = match range {
        Some((start, end)) => {
            insert(
                &mut h,
                "content-range",
                &format!("bytes {start}-{}/{}", end - 1, file.size),
            );
            (StatusCode::PARTIAL_CONTENT, start, end)
        }
        None => (StatusCode::OK, 0, file.size),
    };
    insert(&mut h, "content-length", &(end - start).to_string());
    if method == Method::HEAD {
        return (status, h).into_response();
    }
    let mut handle = match tokio::fs::File::open(&file.disk).await {
        Ok(f) => f,
        // Removed from disk after the index was built.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return error(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                &format!("{path} does not exist any more"),
                None,
            );
        }
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                &format!("cannot read {path}: {e}"),
                None,
            );
        }
    };
    if let Err(e) = handle.seek(std::io::SeekFrom::Start(start)).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            &format!("cannot read {path}: {e}"),
            None,
        );
    }
    let reader = ReaderStream::with_capacity(handle.take(end - start), 256 << 10);
    let plan = mirror.faults.body(fault_key);
    let counter = mirror.body_bytes.clone();
    let count = move |piece: &std::io::Result<Bytes>| {
        if let Ok(bytes) = piece {
            counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
    };
    let body = if plan.is_clean() {
        Body::from_stream(reader.inspect(count))
    } else {
        Body::from_stream(faulty(reader, plan).inspect(count))
    };
    (status, h, body).into_response()
}

pub(super) enum RangeSpec {
    Ignore,
    Range(u64, u64),
    Unsatisfiable,
}

/// One `bytes=a-b`, `a-` or `-n` range, as an end-exclusive pair. Several ranges are
/// answered with the whole file, which RFC 9110 allows.
pub(super) fn parse_range(spec: &str, size: u64) -> RangeSpec {
    let Some(ranges) = spec.trim().strip_prefix("bytes=") else {
        return RangeSpec::Ignore;
    };
    if ranges.contains(',') {
        return RangeSpec::Ignore;
    }
    let Some((a, b)) = ranges.trim().split_once('-') else {
        return RangeSpec::Ignore;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.is_empty(), b.is_empty()) {
        (true, false) => b.parse::<u64>().ok().map(|n| (size.saturating_sub(n), size)),
        (false, true) => a.parse::<u64>().ok().map(|s| (s, size)),
        (false, false) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(s), Ok(e)) if e >= s => Some((s, (e + 1).min(size))),
            _ => return RangeSpec::Ignore,
        },
        (true, true) => return RangeSpec::Ignore,
    };
    match parsed {
        Some((start, end)) if start < end && start < size => RangeSpec::Range(start, end),
        Some(_) => RangeSpec::Unsatisfiable,
        None => RangeSpec::Ignore,
    }
}

/// A body with faults applied.
fn faulty(
    inner: ReaderStream<tokio::io::Take<tokio::fs::File>>,
    plan: faults::BodyPlan,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    futures_util::stream::unfold(
        (inner, 0u64, plan, false),
        |(mut inner, sent, mut plan, done)| async move {
            if done {
                return None;
            }
            let mut chunk = match inner.next().await? {
                Ok(chunk) => chunk,
                Err(e) => return Some((Err(e), (inner, sent, plan, true))),
            };
            if let Some(limit) = plan.drop_after
                && sent + chunk.len() as u64 > limit
            {
                let keep = limit.saturating_sub(sent) as usize;
                if keep == 0 {
                    return Some((
                        Err(std::io::Error::other("injected fault: connection dropped")),
                        (inner, sent, plan, true),
                    ));
                }
                // Send what fits, then fail on the next poll.
                let head = chunk.split_to(keep);
                plan.drop_after = Some(sent + keep as u64);
                return Some((Ok(head), (inner, sent + keep as u64, plan, false)));
            }
            if plan.corrupt && !chunk.is_empty() {
                let mut bytes = chunk.to_vec();
                bytes[0] ^= 0xff;
                chunk = Bytes::from(bytes);
                plan.corrupt = false;
            }
            if let Some((at, pause)) = plan.stall
                && sent + chunk.len() as u64 > at
            {
                tokio::time::sleep(pause).await;
                plan.stall = None;
            }
            if let Some(rate) = plan.rate {
                tokio::time::sleep(Duration::from_secs_f64(chunk.len() as f64 / rate as f64)).await;
            }
            let sent = sent + chunk.len() as u64;
            Some((Ok(chunk), (inner, sent, plan, false)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(matches!(parse_range("bytes=0-9", 100), RangeSpec::Range(0, 10)));
        assert!(matches!(parse_range("bytes=90-", 100), RangeSpec::Range(90, 100)));
        assert!(matches!(parse_range("bytes=-10", 100), RangeSpec::Range(90, 100)));
        assert!(matches!(
            parse_range("bytes=95-200", 100),
            RangeSpec::Range(95, 100)
        ));
        assert!(matches!(parse_range("bytes=100-", 100), RangeSpec::Unsatisfiable));
        assert!(matches!(parse_range("bytes=0-1,5-6", 100), RangeSpec::Ignore));
        assert!(matches!(parse_range("items=0-1", 100), RangeSpec::Ignore));
    }
}

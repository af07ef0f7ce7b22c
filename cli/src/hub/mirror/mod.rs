//! `sous hub serve`: a local, read-only Hugging Face Hub mirror over plain directories,
//! for air-gapped clusters (`HF_ENDPOINT=http://mirror:8090`) and as the test double of
//! every pull test.
//!
//! It serves the part of the Hub HTTP API that huggingface_hub (1.x, 2.x), hf-hub and
//! `sous pull` use (`docs/hub.md`, "A mirror all these clients accept"): revision info
//! with siblings, the recursive file tree with LFS metadata, and `resolve` (HEAD and
//! GET, single byte ranges, `If-None-Match`) with the headers clients rely on,
//! answering errors with the Hub's `X-Error-Code`s. It never sends `X-Xet-Hash`, so
//! clients stay on plain HTTP.
//!
//! With `--cdn-host NAME` it also plays the Hub's CDN: `resolve` of an LFS file
//! answers 302 with the Hub's metadata headers on the redirect itself, to a signed,
//! expiring link on another origin (`http://NAME:PORT/cdn/...?expires=..&signature=..`,
//! the same server reached by another host name); the link answers 403 once expired,
//! as a CloudFront or S3 signed URL does. `GET /api/sous-mirror/stats` counts the
//! requests and body bytes served, so tests can tell how many bytes a client fetched
//! twice.

mod faults;
mod send;
mod store;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sous_engine::recipe::DEFAULT_REVISION;

pub use faults::Faults;
use send::{RangeSpec, parse_range, send_file};
use store::{IndexedFile, RepoIndex, Store};

/// How a mirror runs.
#[derive(Debug)]
pub struct MirrorOptions {
    /// Directory of `org/name/` repositories.
    pub root: PathBuf,
    /// Repositories that need a token.
    pub gated: Vec<String>,
    /// The token gated repositories accept.
    pub token: Option<String>,
    /// Injected faults.
    pub faults: Faults,
    /// Log every request on stderr.
    pub access_log: bool,
    /// Redirect LFS files to signed links on this host name.
    pub cdn_host: Option<String>,
    /// How long a signed link lives.
    pub link_ttl: Duration,
    /// Publish each LFS file's Xet hash (`xetHash` in tree listings), as the Hub does
    /// for files in Xet storage. Off by default: huggingface_hub 2.4 with hf_xet
    /// installed downloads a file its tree listing gives a Xet hash for through the Xet
    /// protocol (`_snapshot_download.py` keeps `xet_hash` from the listing), and the
    /// `X-Xet-Hash` header does the same for hf-hub; a mirror speaks neither, so it
    /// never sends the header.
    pub xet_hashes: bool,
}

struct Mirror {
    store: Store,
    gated: Vec<String>,
    token: Option<String>,
    faults: Faults,
    access_log: bool,
    cdn_host: Option<String>,
    link_ttl: Duration,
    /// Signs links; fresh per process, so links do not outlive the mirror.
    secret: String,
    /// Bytes asked through each signed link, and the links expired by a fault.
    links: Mutex<(HashMap<String, u64>, HashSet<String>)>,
    requests: AtomicU64,
    body_bytes: Arc<AtomicU64>,
}

/// Binds the listener (so the caller learns the port before serving).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: MirrorOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mirror = Arc::new(Mirror {
        store: Store::new(options.root, options.xet_hashes),
        gated: options.gated,
        token: options.token,
        faults: options.faults,
        access_log: options.access_log,
        cdn_host: options.cdn_host,
        link_ttl: options.link_ttl,
        secret: hex::encode(rand::random::<[u8; 16]>()),
        links: Mutex::new((HashMap::new(), HashSet::new())),
        requests: AtomicU64::new(0),
        body_bytes: Arc::new(AtomicU64::new(0)),
    });
    let app = Router::new().fallback(handle).with_state(mirror);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[allow(clippy::print_stderr)]
async fn handle(State(mirror): State<Arc<Mirror>>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let response = route(&mirror, &method, &uri, &headers).await;
    if mirror.access_log {
        eprintln!("hub: {method} {} {}", uri.path(), response.status().as_u16());
    }
    response
}

async fn route(mirror: &Mirror, method: &Method, uri: &Uri, headers: &HeaderMap) -> Response {
    mirror.requests.fetch_add(1, Ordering::Relaxed); // also numbers signed links
    let segments: Vec<String> = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    if let Some(code) = mirror.faults.status(uri.path()) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, None, "injected fault", None);
    }
    let query = uri.query().unwrap_or_default();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (method, segs.as_slice()) {
        (&Method::GET, ["api", "models", org, name]) => {
            info(mirror, org, name, DEFAULT_REVISION, query, headers).await
        }
        (&Method::GET, ["api", "models", org, name, "revision", revision]) => {
            info(mirror, org, name, revision, query, headers).await
        }
        (&Method::GET, ["api", "models", org, name, "tree", revision, rest @ ..]) => {
            tree(mirror, org, name, revision, &rest.join("/"), query, headers).await
        }
        (&Method::GET | &Method::HEAD, [org, name, "resolve", revision, rest @ ..]) if !rest.is_empty() => {
            resolve(mirror, method, org, name, revision, &rest.join("/"), headers).await
        }
        (&Method::GET | &Method::HEAD, ["cdn", org, name, sha256]) => {
            cdn(mirror, method, org, name, sha256, query, headers).await
        }
        (&Method::GET, ["api", "sous-mirror", "stats"]) => axum::Json(json!({
            "requests": mirror.requests.load(Ordering::Relaxed),
            "body_bytes": mirror.body_bytes.load(Ordering::Relaxed),
        }))
        .into_response(),
        _ => error(StatusCode::NOT_FOUND, None, "not found", None),
    }
}

fn error(status: StatusCode, code: Option<&str>, message: &str, commit: Option<&str>) -> Response {
    let mut response = (status, axum::Json(json!({ "error": message }))).into_response();
    let h = response.headers_mut();
    if let Some(code) = code {
        h.insert(
            "x-error-code",
            HeaderValue::from_str(code).unwrap_or(HeaderValue::from_static("Error")),
        );
    }
    if let Ok(v) = HeaderValue::from_str(message) {
        h.insert("x-error-message", v);
    }
    if let Some(commit) = commit.and_then(|c| HeaderValue::from_str(c).ok()) {
        h.insert("x-repo-commit", commit);
    }
    response
}

/// The repository at a revision, or the Hub's error for why not.
async fn lookup(
    mirror: &Mirror,
    org: &str,
    name: &str,
    revision: &str,
    headers: &HeaderMap,
) -> Result<Arc<RepoIndex>, Response> {
    let repo = format!("{org}/{name}");
    if mirror.gated.contains(&repo) {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match (sent, &mirror.token) {
            (None, _) => {
                return Err(error(
                    StatusCode::UNAUTHORIZED,
                    Some("GatedRepo"),
                    &format!(
                        "Access to model {repo} is restricted. You must have access to it and be authenticated to access it. Please log in."
                    ),
                    None,
                ));
            }
            (Some(t), Some(expected)) if t == expected => {}
            (Some(_), _) => {
                return Err(error(
                    StatusCode::FORBIDDEN,
                    Some("GatedRepo"),
                    &format!("Access to model {repo} is restricted and you are not in the authorized list."),
                    None,
                ));
            }
        }
    }
    let (org, name) = (org.to_owned(), name.to_owned());
    let store_result = tokio::task::block_in_place(|| mirror.store.repo(&org, &name));
    let index = match store_result {
        Ok(Some(index)) => index,
        Ok(None) => {
            return Err(error(
                StatusCode::NOT_FOUND,
                Some("RepoNotFound"),
                "Repository not found",
                None,
            ));
        }
        Err(e) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                &format!("cannot read the repository: {e}"),
                None,
            ));
        }
    };
    if !index.has_revision(revision) {
        return Err(error(
            StatusCode::NOT_FOUND,
            Some("RevisionNotFound"),
            &format!("Invalid rev id: {revision}"),
            None,
        ));
    }
    Ok(index)
}

async fn info(
    mirror: &Mirror,
    org: &str,
    name: &str,
    revision: &str,
    query: &str,
    headers: &HeaderMap,
) -> Response {
    let index = match lookup(mirror, org, name, revision, headers).await {
        Ok(index) => index,
        Err(response) => return response,
    };
    let blobs = query.split('&').any(|p| p == "blobs=true" || p == "blobs=1");
    let siblings: Vec<serde_json::Value> = index
        .files
        .iter()
        .map(|f| {
            if blobs {
                let mut v = json!({ "rfilename": f.path, "size": f.size, "blobId": f.oid });
                if let Some(sha) = &f.lfs_sha256 {
                    v["lfs"] = json!({ "sha256": sha, "size": f.size, "pointerSize": f.pointer_size });
                }
                v
            } else {
                json!({ "rfilename": f.path })
            }
        })
        .collect();
    let gated = mirror.gated.contains(&index.repo);
    axum::Json(json!({
        "id": index.repo,
        "modelId": index.repo,
        "sha": index.commit,
        "private": false,
        "gated": if gated { json!("manual") } else { json!(false) },
        "disabled": false,
        "tags": [],
        "siblings": siblings,
    }))
    .into_response()
}

async fn tree(
    mirror: &Mirror,
    org: &str,
    name: &str,
    revision: &str,
    prefix: &str,
    query: &str,
    headers: &HeaderMap,
) -> Response {
    let index = match lookup(mirror, org, name, revision, headers).await {
        Ok(index) => index,
        Err(response) => return response,
    };
    let recursive = query
        .split('&')
        .any(|p| p == "recursive=true" || p == "recursive=1");
    let prefix = prefix.trim_matches('/');
    let under = |path: &str| prefix.is_empty() || path.starts_with(&format!("{prefix}/"));
    let mut entries = Vec::new();
    let mut dirs = std::collections::BTreeSet::new();
    for file in index.files.iter().filter(|f| under(&f.path)) {
        let rest = if prefix.is_empty() {
            file.path.as_str()
        } else {
            &file.path[prefix.len() + 1..]
        };
        if !recursive && rest.contains('/') {
            let dir = rest.split('/').next().unwrap_or_default();
            dirs.insert(if prefix.is_empty() {
                dir.to_owned()
            } else {
                format!("{prefix}/{dir}")
            });
            continue;
        }
        if recursive {
            let mut parts: Vec<&str> = file.path.split('/').collect();
            parts.pop();
            for i in 1..=parts.len() {
                let dir = parts[..i].join("/");
                if under(&dir) && dir != prefix {
                    dirs.insert(dir);
                }
            }
        }
        entries.push(tree_entry(file));
    }
    if !prefix.is_empty() && entries.is_empty() && dirs.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            &format!("{prefix} does not exist"),
            Some(&index.commit),
        );
    }
    let mut all: Vec<serde_json::Value> = dirs
        .into_iter()
        .map(|d| json!({ "type": "directory", "oid": "0000000000000000000000000000000000000000", "size": 0, "path": d }))
        .collect();
    all.extend(entries);
    axum::Json(all).into_response()
}

fn tree_entry(file: &IndexedFile) -> serde_json::Value {
    let mut v = json!({ "type": "file", "oid": file.oid, "size": file.size, "path": file.path });
    if let Some(sha) = &file.lfs_sha256 {
        v["lfs"] = json!({ "oid": sha, "size": file.size, "pointerSize": file.pointer_size });
    }
    if let Some(xet) = &file.xet_hash {
        v["xetHash"] = json!(xet);
    }
    v
}

#[allow(clippy::too_many_arguments)]
async fn resolve(
    mirror: &Mirror,
    method: &Method,
    org: &str,
    name: &str,
    revision: &str,
    path: &str,
    headers: &HeaderMap,
) -> Response {
    let index = match lookup(mirror, org, name, revision, headers).await {
        Ok(index) => index,
        Err(response) => return response,
    };
    let Some(file) = index.file(path) else {
        return error(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            &format!("{path} does not exist at {revision}"),
            Some(&index.commit),
        );
    };
    let etag = format!("\"{}\"", file.etag());
    let mut h = HeaderMap::new();
    let insert = |h: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    insert(&mut h, "x-repo-commit", &index.commit);
    insert(&mut h, "etag", &etag);
    insert(&mut h, "accept-ranges", "bytes");
    insert(&mut h, "content-type", "application/octet-stream");
    if file.lfs_sha256.is_some() {
        insert(&mut h, "x-linked-etag", &etag);
        insert(&mut h, "x-linked-size", &file.size.to_string());
    }
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start_matches("W/") == etag)
    {
        return (StatusCode::NOT_MODIFIED, h).into_response();
    }
    if let (Some(cdn_host), Some(sha256)) = (&mirror.cdn_host, &file.lfs_sha256) {
        // The Hub's metadata rides on the redirect; the CDN's answer carries none.
        let location = mirror.sign(cdn_host, headers, org, name, sha256);
        insert(&mut h, "location", &location);
        insert(&mut h, "x-linked-size", &file.size.to_string());
        return (StatusCode::FOUND, h).into_response();
    }
    let fault_key = format!("/{org}/{name}/resolve/{path}");
    send_file(mirror, method, file, headers, h, &fault_key).await
}

impl Mirror {
    /// A signed link to an LFS object on the CDN host, on the port the request came to.
    fn sign(&self, cdn_host: &str, headers: &HeaderMap, org: &str, name: &str, sha256: &str) -> String {
        let port = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| h.rsplit_once(':'))
            .map(|(_, p)| format!(":{p}"))
            .unwrap_or_default();
        let expires = unix_now() + self.link_ttl.as_secs();
        // Every link is new, even two signed in the same second: an expired link must
        // not come back from the next `resolve`.
        let id = self.requests.load(Ordering::Relaxed);
        let path = format!("/cdn/{org}/{name}/{sha256}");
        let signature = self.signature(&path, expires, id);
        format!("http://{cdn_host}{port}{path}?expires={expires}&id={id}&signature={signature}")
    }

    fn signature(&self, path: &str, expires: u64, id: u64) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("{}\n{path}\n{expires}\n{id}", self.secret));
        hex::encode(&digest[..16])
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The CDN's answer to a signed link: the object, or 403 as a signed URL answers
/// when expired or forged.
async fn cdn(
    mirror: &Mirror,
    method: &Method,
    org: &str,
    name: &str,
    sha256: &str,
    query: &str,
    headers: &HeaderMap,
) -> Response {
    let param = |key: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_default()
            .to_owned()
    };
    let (expires, id, signature) = (param("expires"), param("id"), param("signature"));
    let path = format!("/cdn/{org}/{name}/{sha256}");
    let valid = match (expires.parse::<u64>(), id.parse::<u64>()) {
        (Ok(e), Ok(id)) => e >= unix_now() && mirror.signature(&path, e, id) == signature,
        _ => false,
    };
    let denied = || {
        (
            StatusCode::FORBIDDEN,
            [("content-type", "application/xml")],
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>",
        )
            .into_response()
    };
    if !valid {
        return denied();
    }
    let Ok(Some(index)) = tokio::task::block_in_place(|| mirror.store.repo(org, name)) else {
        return error(StatusCode::NOT_FOUND, None, "not found", None);
    };
    let Some(file) = index
        .files
        .iter()
        .find(|f| f.lfs_sha256.as_deref() == Some(sha256))
    else {
        return error(StatusCode::NOT_FOUND, None, "not found", None);
    };
    if method == Method::GET
        && let Ok(mut links) = mirror.links.lock()
    {
        let (served, expired) = &mut *links;
        let so_far = served.get(&signature).copied().unwrap_or(0);
        if expired.contains(&signature) || mirror.faults.expires(&path, so_far) {
            expired.insert(signature);
            return denied();
        }
        let asked = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
            Some(spec) => match parse_range(spec, file.size) {
                RangeSpec::Range(start, end) => end - start,
                _ => file.size,
            },
            None => file.size,
        };
        *served.entry(signature).or_insert(0) += asked;
    }
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{sha256}\"")) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let fault_key = format!("/{org}/{name}/resolve/{}", file.path);
    send_file(mirror, method, file, headers, h, &fault_key).await
}

//! The server's lifecycle: starting the engine thread, binding the listen address
//! with `SO_REUSEPORT`, announcing readiness, and on shutdown refusing new requests
//! while in-flight ones get the recipe's grace period. What the routes answer is
//! `routes`'; this file only runs them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::mpsc::unbounded_channel;

use super::routes::router;
use super::{App, now_secs};
use crate::native::core::Command;
use crate::native::{Engine, NativeError};
use crate::reporter::Reporter;

/// Listens on `addr` with `SO_REUSEPORT`, as vLLM does, so that `sous serve --replace`
/// can start a new instance on the port while the old one still answers.
async fn listen(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for resolved in tokio::net::lookup_host(addr).await? {
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        match socket.bind(resolved).and_then(|()| socket.listen(1024)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")))
}

/// Runs the engine: starts its loop, binds the listen address, serves until `shutdown`
/// resolves, then lets in-flight requests finish for the recipe's grace period before
/// aborting them. Log lines go to `reporter` as engine output, and a `listening`
/// status says when it answers.
pub async fn serve(
    engine: Engine,
    reporter: Arc<dyn Reporter>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NativeError> {
    let (started, kv_tokens, concurrency) = (engine.started, engine.kv_tokens, engine.max_concurrency);
    let settings = engine.settings.clone();
    let (tx, rx) = unbounded_channel();
    let core = engine.core;
    let worker = std::thread::Builder::new()
        .name("sous-native-engine".into())
        .spawn(move || core.run(rx))
        .map_err(|e| NativeError::Internal(format!("cannot start the engine thread: {e}")))?;
    let app = Arc::new(App {
        text: engine.text,
        served_name: settings.served_name.clone(),
        root: settings.model_dir.display().to_string(),
        max_model_len: engine.max_model_len,
        engine: tx.clone(),
        metrics: engine.metrics,
        api_key: settings.api_key.clone(),
        ready: AtomicBool::new(false),
        created: now_secs(),
        next_id: AtomicU64::new(0),
    });
    let addr = format!("{}:{}", settings.host, settings.port);
    let listener = listen(&addr).await.map_err(|source| NativeError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(settings.port);
    let router = router(app.clone());
    app.ready.store(true, Ordering::SeqCst);
    let shown_host = if settings.host == "0.0.0.0" || settings.host == "::" {
        "localhost".to_owned()
    } else {
        settings.host.clone()
    };
    crate::native::log(
        reporter.as_ref(),
        "INFO",
        crate::native::here!(),
        &format!("{} http://{addr}", crate::dialect::log::vllm::NATIVE_STARTING),
    );
    reporter.status(
        "listening",
        &format!(
            "on http://{shown_host}:{port} after {:.1} s, KV cache {kv_tokens} tokens, max concurrency {concurrency:.2}x",
            started.elapsed().as_secs_f64()
        ),
    );
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let grace = settings.stop_grace;
    let abort = tx.clone();
    let events = reporter.clone();
    let ready = app.clone();
    let signal = async move {
        shutdown.await;
        ready.ready.store(false, Ordering::SeqCst);
        events.output(
            None,
            &format!(
                "Shutting down: no new requests; in-flight requests have {} s to finish",
                grace.as_secs()
            ),
        );
        let _ = stopping_tx.send(());
    };
    let (served_tx, served_rx) = tokio::sync::oneshot::channel::<()>();
    let timer = tokio::spawn(async move {
        if stopping_rx.await.is_ok() {
            tokio::select! {
                _ = tokio::time::sleep(grace) => { let _ = abort.send(Command::AbortAll); }
                _ = served_rx => {}
            }
        }
    });
    drop(tx);
    // Tokens go out as they are made: no Nagle delay on small SSE writes (uvicorn, in
    // front of vLLM, sets TCP_NODELAY on every connection too).
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream: &mut tokio::net::TcpStream| {
        let _ = stream.set_nodelay(true);
    });
    let result = axum::serve(listener, router).with_graceful_shutdown(signal).await;
    let _ = served_tx.send(());
    let _ = timer.await;
    drop(app);
    // Every sender is gone once the router is: the loop drains and exits.
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    result.map_err(|e| NativeError::Internal(format!("the HTTP server failed: {e}")))
}

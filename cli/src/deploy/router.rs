//! The router in front of the replicas (`[deploy.router]`): its command line, decided
//! once for every target, which only says where the workers are. sous renders an
//! existing router and never routes itself.
//!
//! Flags are the launchers' own: vllm-project/router 0.1.17
//! (`py_src/vllm_router/router_args.py`, the `vllm-router` console script) and
//! `sglang-router` 0.3.2 (`sglang_router/router_args.py`, run as
//! `python3 -m sglang_router.launch_router`). Both wait for static workers to answer
//! `/health` before they serve (`--worker-startup-timeout-secs`), so that wait covers
//! the download and the start-up the engine itself is given; with Kubernetes discovery
//! they add pods as they appear and serve from the start.

use sous_engine::launch::Arg;
use sous_engine::recipe::{Recipe, RouterKind, RouterPolicy};

/// Where the router publishes its own Prometheus metrics (both routers' default).
pub const METRICS_PORT: u16 = 29000;
/// The router's health path (both answer it once a worker is healthy).
pub const HEALTH_PATH: &str = "/health";

/// Where the router finds the replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workers {
    /// Fixed base URLs (compose, systemd).
    Urls(Vec<String>),
    /// Kubernetes pods with these labels, in this namespace, on this port.
    Discover {
        /// `key=value` labels of the engine pods.
        selector: Vec<String>,
        /// The namespace to watch: a literal, or a variable of the container's
        /// environment.
        namespace: Arg,
        /// The engine's port.
        port: u16,
    },
}

/// The router's program: argv before the flags.
pub fn program(kind: RouterKind) -> Vec<String> {
    let argv: &[&str] = match kind {
        RouterKind::SglangRouter => &["python3", "-m", "sglang_router.launch_router"],
        _ => &["vllm-router"],
    };
    argv.iter().map(|a| (*a).to_owned()).collect()
}

/// The router's flags (not the program), listening on `host`; a secret (the API key
/// the workers want) as [`Arg::FromEnv`].
pub fn args(recipe: &Recipe, host: &str, workers: &Workers) -> Vec<Arg> {
    let router = &recipe.deploy.router;
    let mut args: Vec<Arg> = Vec::new();
    let push = |args: &mut Vec<Arg>, flag: &str, value: String| {
        args.push(Arg::from(flag));
        args.push(Arg::Lit(value));
    };
    push(&mut args, "--host", host.to_owned());
    push(&mut args, "--port", recipe.server.port.to_string());
    push(&mut args, "--policy", router.policy.as_str().to_owned());
    if router.policy == RouterPolicy::CacheAware {
        if let Some(t) = router.cache_threshold {
            push(&mut args, "--cache-threshold", t.to_string());
        }
        if let Some(t) = router.balance_abs_threshold {
            push(&mut args, "--balance-abs-threshold", t.to_string());
        }
        if let Some(t) = router.balance_rel_threshold {
            push(&mut args, "--balance-rel-threshold", t.to_string());
        }
    }
    // A static worker that is still downloading or loading is waited for as long as
    // the engine itself is.
    let wait = recipe.deploy.download_timeout + recipe.server.startup_timeout;
    push(
        &mut args,
        "--worker-startup-timeout-secs",
        wait.as_secs().to_string(),
    );
    push(&mut args, "--prometheus-host", host.to_owned());
    push(&mut args, "--prometheus-port", METRICS_PORT.to_string());
    match workers {
        Workers::Urls(urls) => {
            args.push(Arg::from("--worker-urls"));
            args.extend(urls.iter().map(|u| Arg::Lit(u.clone())));
        }
        Workers::Discover {
            selector,
            namespace,
            port,
        } => {
            args.push(Arg::from("--service-discovery"));
            args.push(Arg::from("--selector"));
            args.extend(selector.iter().map(|s| Arg::Lit(s.clone())));
            push(&mut args, "--service-discovery-port", port.to_string());
            args.push(Arg::from("--service-discovery-namespace"));
            args.push(namespace.clone());
        }
    }
    if let Some(var) = &recipe.server.api_key_env {
        args.push(Arg::from("--api-key"));
        args.push(Arg::FromEnv(var.clone()));
    }
    args
}

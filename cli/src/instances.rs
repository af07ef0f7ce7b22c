//! The instances `sous serve` runs on this machine, as `sous ps`, `logs`, `stop`, `list`,
//! `rm` and `run` see them: one directory per recipe name under sous's state directory,
//! holding `engine.log` and, while the instance serves, `instance.json`
//! ([`sous_engine::serve::instance`]).
//!
//! A record whose `sous serve` is gone (SIGKILL, a crash, a reboot) is *stale*: the
//! directory says an instance runs and none does. [`scan`] tells the two apart by the
//! pid and its start time; [`prune`] removes stale records and nothing else.
//!
//! [`probe`] asks a live instance how it is: `/health`, and from its metrics page the
//! running and waiting requests and the KV cache usage, in the metric names of its
//! engine's family ([`sous_engine::dialect`]); [`router_workers`] asks a router which
//! instances it routes to, which [`probe_url`] then asks the same.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sous_engine::dialect::{Family, metrics};
use sous_engine::serve::instance::{self, InstanceState};

use crate::bench::prom::Scrape;

/// The engine's output, appended by every `sous serve` of the recipe.
pub const LOG_FILE: &str = "engine.log";

/// One recipe's directory in the state directory.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The recipe's name (the directory's).
    pub name: String,
    /// `<state>/<name>`.
    pub dir: PathBuf,
    /// What its record says.
    pub record: Record,
}

/// The state of a directory's `instance.json`.
#[derive(Debug, Clone)]
pub enum Record {
    /// No record: nothing serves the recipe now (its log may remain).
    None,
    /// Its `sous serve` runs.
    Live(InstanceState),
    /// Its `sous serve` is gone and left the record behind.
    Stale(InstanceState),
    /// The file cannot be read as a record.
    Unreadable(String),
}

impl Entry {
    /// The engine log.
    pub fn log(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// The record when its instance runs.
    pub fn live(&self) -> Option<&InstanceState> {
        match &self.record {
            Record::Live(state) => Some(state),
            _ => None,
        }
    }
}

/// Why an instance could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum InstancesError {
    /// Listing the state directory failed.
    #[error("reading the state directory `{}`", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No recipe of that name was ever served here.
    #[error("no instance named `{name}` in {}", state_dir.display())]
    Unknown {
        /// What the user asked for.
        name: String,
        /// Where sous looked.
        state_dir: PathBuf,
        /// The closest existing name, if one is close.
        suggestion: Option<String>,
        /// Every name there is.
        known: Vec<String>,
    },
}

impl sous_engine::diagnose::Diagnose for InstancesError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            InstancesError::Io { .. } => {
                Some("set SOUS_STATE_DIR to the state directory `sous serve` used".into())
            }
            InstancesError::Unknown {
                suggestion: Some(s), ..
            } => Some(format!("did you mean `{s}`?")),
            InstancesError::Unknown { known, .. } if known.is_empty() => Some(
                "no recipe has been served on this machine yet (or SOUS_STATE_DIR points elsewhere)".into(),
            ),
            InstancesError::Unknown { known, .. } => Some(format!("known instances: {}", known.join(", "))),
        }
    }
}

/// Every recipe directory in `state_dir`, by name. A state directory that does not
/// exist yet has none.
pub fn scan(state_dir: &Path) -> Result<Vec<Entry>, InstancesError> {
    let io = |source| InstancesError::Io {
        path: state_dir.to_path_buf(),
        source,
    };
    let read = match std::fs::read_dir(state_dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut entries = Vec::new();
    for item in read {
        let item = item.map_err(io)?;
        let dir = item.path();
        // Only directories sous made: a recipe name, not a hidden staging entry.
        let Some(name) = item.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.starts_with('.') || !dir.is_dir() {
            continue;
        }
        let record = match instance::read(&dir) {
            Ok(None) => Record::None,
            Ok(Some(state)) if state.alive() => Record::Live(state),
            Ok(Some(state)) => Record::Stale(state),
            Err(e) => Record::Unreadable(e.to_string()),
        };
        entries.push(Entry { name, dir, record });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// The entry named `name`, or an error naming the closest one.
pub fn find(state_dir: &Path, name: &str) -> Result<Entry, InstancesError> {
    let entries = scan(state_dir)?;
    let known: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    if let Some(entry) = entries.into_iter().find(|e| e.name == name) {
        return Ok(entry);
    }
    let suggestion = sous_engine::recipe::closest(name, known.iter().map(String::as_str)).map(str::to_owned);
    Err(InstancesError::Unknown {
        name: name.to_owned(),
        state_dir: state_dir.to_path_buf(),
        suggestion,
        known,
    })
}

/// Removes the stale records among `entries` (never a live one: each is checked again
/// just before), returning the names pruned.
pub fn prune(entries: &[Entry]) -> Vec<String> {
    let mut pruned = Vec::new();
    for entry in entries {
        if let Record::Stale(_) = entry.record
            && let Ok(Some(state)) = instance::read(&entry.dir)
            && !state.alive()
            && std::fs::remove_file(entry.dir.join(instance::FILE)).is_ok()
        {
            pruned.push(entry.name.clone());
        }
    }
    pruned
}

/// How a live instance answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Probe {
    /// `ok`, `unhealthy (HTTP 503)`, or `unreachable (...)`.
    pub health: String,
    /// Requests running, from the engine's metrics.
    pub running: Option<f64>,
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// KV cache usage, 0 to 1.
    pub kv_cache_usage: Option<f64>,
}

/// Asks `state`'s instance for `/health` and its metrics page, each with `timeout`.
pub async fn probe(state: &InstanceState, timeout: Duration) -> Probe {
    let family = state.engine.map_or(Family::Vllm, Family::of_engine);
    probe_url(&state.url, &[family], timeout).await
}

/// Asks the server at `url` for `/health` and its metrics page, each with `timeout`; the
/// load is read in the first of `families` whose names the page has.
pub async fn probe_url(url: &str, families: &[Family], timeout: Duration) -> Probe {
    let Ok(client) = reqwest::Client::builder().timeout(timeout).build() else {
        return Probe {
            health: "unreachable (no HTTP client)".into(),
            ..Probe::default()
        };
    };
    let health = match client.get(format!("{url}/health")).send().await {
        Ok(r) if r.status().is_success() => "ok".to_owned(),
        Ok(r) => format!("unhealthy (HTTP {})", r.status().as_u16()),
        Err(e) if e.is_timeout() => "unreachable (timed out)".to_owned(),
        Err(_) => "unreachable (connection refused)".to_owned(),
    };
    let mut gauges = (None, None, None);
    for family in families {
        let text = match client.get(format!("{url}{}", family.metrics_path())).send().await {
            Ok(r) if r.status().is_success() => r.text().await.ok(),
            _ => None,
        };
        let scrape = text.as_deref().map(Scrape::parse);
        gauges = load_gauges(*family, scrape.as_ref());
        if gauges != (None, None, None) {
            break;
        }
    }
    Probe {
        health,
        running: gauges.0,
        waiting: gauges.1,
        kv_cache_usage: gauges.2,
    }
}

/// The workers a router routes to, from its own API: `/workers` (vllm-router 0.1,
/// sglang-router 0.2 and later: `{"workers": [{"url": ..}]}`), else `/list_workers`
/// (older sglang-router: `{"urls": [..]}`).
pub async fn router_workers(router: &str, timeout: Duration) -> Result<Vec<String>, String> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let get = |path: &str| {
        let client = client.clone();
        let url = format!("{router}{path}");
        async move {
            let response = client.get(&url).send().await.map_err(|e| format!("{url}: {e}"))?;
            if !response.status().is_success() {
                return Err(format!("{url}: HTTP {}", response.status().as_u16()));
            }
            response
                .json::<serde_json::Value>()
                .await
                .map_err(|e| format!("{url}: {e}"))
        }
    };
    let urls = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.get("url").unwrap_or(w).as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    match get("/workers").await {
        Ok(body) if body.get("workers").is_some() => Ok(urls(&body["workers"])),
        first => match get("/list_workers").await {
            Ok(body) if body.get("urls").is_some() => Ok(urls(&body["urls"])),
            Ok(_) | Err(_) => Err(first.err().unwrap_or_else(|| {
                format!("{router} does not list its workers (`/workers`, `/list_workers`): is it vllm-router or sglang-router?")
            })),
        },
    }
}

/// Running requests, waiting requests and KV cache usage (0–1) in `family`'s names.
fn load_gauges(family: Family, scrape: Option<&Scrape>) -> (Option<f64>, Option<f64>, Option<f64>) {
    let Some(scrape) = scrape else {
        return (None, None, None);
    };
    match family {
        Family::Vllm => (
            scrape.sum(metrics::vllm::NUM_REQUESTS_RUNNING),
            scrape.sum(metrics::vllm::NUM_REQUESTS_WAITING),
            // vLLM's V1 name, then the V0 name older releases expose.
            scrape
                .max(metrics::vllm::KV_CACHE_USAGE_PERC)
                .or_else(|| scrape.max(metrics::vllm::GPU_CACHE_USAGE_PERC)),
        ),
        Family::Sglang => (
            scrape.sum(metrics::sglang::NUM_RUNNING_REQS),
            scrape.sum(metrics::sglang::NUM_QUEUE_REQS),
            scrape.max(metrics::sglang::TOKEN_USAGE),
        ),
        Family::Trtllm => (
            scrape.sum(metrics::trtllm::NUM_REQUESTS_RUNNING),
            scrape.sum(metrics::trtllm::NUM_REQUESTS_WAITING),
            scrape.max(metrics::trtllm::KV_CACHE_UTILIZATION),
        ),
    }
}

/// When the instance's `sous serve` became ready (else started), in seconds since the
/// Unix epoch.
pub fn started_unix(state: &InstanceState) -> Option<u64> {
    if let Some(at) = state.ready_unix {
        return Some(at);
    }
    // Older records: the supervisor's start, from its start time in clock ticks.
    let ticks = instance::process_start(state.sous_pid)?;
    let boot = procfs::boot_time_secs().ok()?;
    Some(boot + ticks / procfs::ticks_per_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32) -> InstanceState {
        InstanceState {
            name: "r".into(),
            sous_pid: pid,
            sous_started: instance::process_start(pid),
            engine_pid: None,
            engine: None,
            runtime: None,
            port: Some(1),
            url: "http://127.0.0.1:1".into(),
            recipe_hash: "h".into(),
            utilization: None,
            stop_grace_ms: None,
            model: None,
            weights: None,
            phases: Vec::new(),
            ready_unix: None,
        }
    }

    #[test]
    fn scan_tells_live_stale_and_unreadable_records_apart_and_prune_removes_only_stale() {
        let state = tempfile::tempdir().expect("tempdir");
        assert!(scan(&state.path().join("absent")).expect("scan").is_empty());
        for (name, body) in [
            (
                "live",
                Some(serde_json::to_string(&record(std::process::id())).expect("json")),
            ),
            (
                "stale",
                Some(serde_json::to_string(&record(u32::MAX / 2)).expect("json")),
            ),
            ("broken", Some("{".to_owned())),
            ("stopped", None),
        ] {
            let dir = state.path().join(name);
            std::fs::create_dir_all(&dir).expect("mkdir");
            if let Some(body) = body {
                std::fs::write(dir.join(instance::FILE), body).expect("write");
            }
        }
        std::fs::create_dir_all(state.path().join(".staging")).expect("mkdir");
        let entries = scan(state.path()).expect("scan");
        let kinds: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| {
                let kind = match e.record {
                    Record::None => "none",
                    Record::Live(_) => "live",
                    Record::Stale(_) => "stale",
                    Record::Unreadable(_) => "unreadable",
                };
                (e.name.as_str(), kind)
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("broken", "unreadable"),
                ("live", "live"),
                ("stale", "stale"),
                ("stopped", "none")
            ]
        );
        assert_eq!(prune(&entries), ["stale"]);
        assert!(state.path().join("live").join(instance::FILE).exists());
        assert!(state.path().join("broken").join(instance::FILE).exists());
        assert!(!state.path().join("stale").join(instance::FILE).exists());
    }

    #[test]
    fn an_unknown_name_suggests_the_closest_one() {
        let state = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(state.path().join("smollm2-135m")).expect("mkdir");
        let err = find(state.path(), "smollm2-135").expect_err("unknown");
        let InstancesError::Unknown { suggestion, .. } = err else {
            panic!("{err}");
        };
        assert_eq!(suggestion.as_deref(), Some("smollm2-135m"));
        assert!(find(state.path(), "smollm2-135m").is_ok());
    }

    #[test]
    fn gauges_follow_each_family_s_names() {
        let vllm = Scrape::parse(
            "vllm:num_requests_running{model_name=\"m\"} 2\nvllm:num_requests_waiting{model_name=\"m\"} 3\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n",
        );
        assert_eq!(
            load_gauges(Family::Vllm, Some(&vllm)),
            (Some(2.0), Some(3.0), Some(0.25))
        );
        let old = Scrape::parse("vllm:gpu_cache_usage_perc 0.5\n");
        assert_eq!(load_gauges(Family::Vllm, Some(&old)).2, Some(0.5));
        let sglang =
            Scrape::parse("sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:token_usage 0.1\n");
        assert_eq!(
            load_gauges(Family::Sglang, Some(&sglang)),
            (Some(1.0), Some(0.0), Some(0.1))
        );
        assert_eq!(load_gauges(Family::Trtllm, None), (None, None, None));
    }
}

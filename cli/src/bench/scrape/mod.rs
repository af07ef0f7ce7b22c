//! `sous bench scrape`: passive figures of a production server from the scrapes of its
//! Prometheus `/metrics` over a window, with no request of ours. Given the scrapes of
//! each URL (taking them is the command's job), this computes the increase of every
//! counter and histogram between the first and the last scrape, the rates over the
//! window, and the peak and mean of the gauges. Which metrics make which figure is in
//! [`names`] (the names themselves in [`sous_engine::dialect::metrics`]); the
//! exposition is parsed by [`super::prom`]; the terminal rendering is in [`render`].
//!
//! Latency percentiles come from histogram buckets, so they are estimates: they are
//! computed exactly as Prometheus's `histogram_quantile` computes them
//! (`bucketQuantile` in prometheus `promql/quantile.go`): rank = q × count, the first
//! bucket whose cumulative count reaches the rank, and linear interpolation between
//! that bucket's lower bound (the previous `le`, 0 for the first) and its `le`; a rank
//! in the `+Inf` bucket gives the largest finite bound, which the report flags.
//!
//! Increases treat a counter that went down as a restart, as Prometheus's `increase()`
//! does (`promql/functions.go`): the pre-reset delta plus the value after the reset.
//! Unlike `increase()`, nothing is extrapolated to the window's edges: the figures are
//! those between the first and the last scrape.
//!
//! With `--prometheus`, the same figures of a past window come from a Prometheus
//! server instead, computed there by PromQL ([`promql`] writes it, [`prometheus`] asks
//! it); the `--svg` chart of either is drawn by [`chart`].

mod analyze;
mod chart;
mod names;
mod prometheus;
pub mod promql;
pub mod quantile;
mod render;
pub mod report;
mod watch;

use std::collections::BTreeSet;
use std::time::Duration;

use sous_engine::diagnose::{Class, Diagnose};
use sous_engine::dialect::Family;

use super::prom::Scrape;

pub use analyze::analyze;
pub use chart::{
    Series, draw as draw_chart, draw_live as draw_live_chart, draw_prometheus as draw_prometheus_chart,
};
pub use prometheus::{Ask, ask};
pub use watch::watch;

/// What the report says about how its percentiles were computed.
pub const PERCENTILE_METHOD: &str = "prometheus histogram_quantile (linear within buckets)";

/// What the `--prometheus` report says about how its percentiles were computed.
pub const PROMETHEUS_PERCENTILE_METHOD: &str =
    "prometheus histogram_quantile (linear within buckets), evaluated by the Prometheus server";

/// What the `--prometheus` report says about how its counts were computed.
pub const PROMETHEUS_INCREASE_METHOD: &str =
    "prometheus increase() over the window, extrapolated to its edges (up to 1.1 scrape intervals each)";

/// The quantiles reported for each histogram, with their JSON names.
pub(crate) const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")];

/// Why a window cannot be watched or analysed, or a flag read.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// A duration is not `N` followed by `ms`, `s`, `m` or `h` (repeated, e.g. `1m30s`).
    #[error("`{0}` is not a duration (write e.g. `30s`, `10m`, `1h` or `1m30s`)")]
    Duration(String),
    /// A duration of zero where a positive one is needed.
    #[error("a duration must be longer than zero")]
    ZeroDuration,
    /// No URL has a single scrape.
    #[error("no scrape to analyse")]
    NoScrapes,
    /// A URL's first scrape holds no metric of a known engine.
    #[error("{url} has no vLLM, SGLang or TensorRT-LLM metrics")]
    NoMetrics {
        /// The metrics URL.
        url: String,
    },
    /// A URL cannot be scraped at the first round.
    #[error("cannot scrape {url}: {error}")]
    Unreachable {
        /// The metrics URL.
        url: String,
        /// Why, with its causes.
        error: String,
    },
    /// `--selector` is not a PromQL label matcher set.
    #[error("--selector `{selector}` is not a PromQL label matcher set: {why}")]
    Selector {
        /// As given.
        selector: String,
        /// What is wrong with it.
        why: String,
    },
    /// The Prometheus server does not answer.
    #[error("cannot reach Prometheus at {url}: {error}")]
    PrometheusUnreachable {
        /// The API URL asked.
        url: String,
        /// Why, with its causes.
        error: String,
    },
    /// The Prometheus server answered with an error status and no error of its API.
    #[error("{url} answered {status} to `{query}`{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    PrometheusStatus {
        /// The API URL asked.
        url: String,
        /// The query (or API request) sent.
        query: String,
        /// The HTTP status.
        status: u16,
        /// The start of what it said.
        body: String,
    },
    /// The Prometheus API answered `status: error`.
    #[error("Prometheus at {url} refused `{query}`: {error}")]
    PrometheusRefused {
        /// The API URL asked.
        url: String,
        /// The query sent.
        query: String,
        /// Its `errorType` and `error`.
        error: String,
    },
    /// The Prometheus API answered something that is not its JSON.
    #[error("{url} did not answer `{query}` with Prometheus's JSON: {error}")]
    PrometheusBody {
        /// The API URL asked.
        url: String,
        /// The query sent.
        query: String,
        /// What is wrong with the answer.
        error: String,
    },
    /// Nothing matched: no engine metric, or no figure at all.
    #[error("no series matched `{query}` at {url} between {start} and {end}")]
    NoSeries {
        /// The Prometheus server.
        url: String,
        /// The query (or API request) that found nothing.
        query: String,
        /// `--selector`, as given (empty without one).
        selector: String,
        /// The window's first second, RFC 3339.
        start: String,
        /// The window's end, RFC 3339.
        end: String,
    },
    /// The window starts before what the Prometheus server keeps.
    #[error(
        "the window starts at {start}, before what Prometheus at {url} retains: its storage retention is {retention} (data from {retained_from} at the earliest)"
    )]
    BeyondRetention {
        /// The Prometheus server.
        url: String,
        /// The window's first second, RFC 3339.
        start: String,
        /// `storageRetention` as the server states it.
        retention: String,
        /// Now less the retention, RFC 3339.
        retained_from: String,
    },
    /// The window starts before the data: no sample at its start.
    #[error(
        "the window is longer than the data: Prometheus at {url} has no sample of `{query}` at the window's start {start} (nor in the 5 minutes before){}",
        first.as_ref().map_or(String::new(), |f| format!("; its samples begin at about {f}"))
    )]
    BeforeData {
        /// The Prometheus server.
        url: String,
        /// The query evaluated at the start.
        query: String,
        /// The window's first second, RFC 3339.
        start: String,
        /// When the series begin within the window, RFC 3339, when found.
        first: Option<String>,
    },
    /// `--svg` could not be drawn or written.
    #[error("cannot draw the chart {path}: {error}")]
    Chart {
        /// The file.
        path: String,
        /// Why.
        error: String,
    },
}

impl Diagnose for ScrapeError {
    /// A flag the user wrote, or servers that gave nothing to analyse.
    fn class(&self) -> Class {
        Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            ScrapeError::NoMetrics { .. } => Some(
                "SGLang needs --enable-metrics; TensorRT-LLM serves Prometheus text at /prometheus/metrics"
                    .into(),
            ),
            ScrapeError::Unreachable { .. } => {
                Some("check the URL, and that the server is up and exposes /metrics".into())
            }
            ScrapeError::Selector { .. } => Some(
                r#"write label matchers in braces, e.g. --selector '{job="vllm",namespace!="test"}'"#.into(),
            ),
            ScrapeError::PrometheusUnreachable { .. } | ScrapeError::PrometheusStatus { .. } => Some(
                "--prometheus takes the Prometheus server's base URL, e.g. http://prometheus:9090".into(),
            ),
            ScrapeError::NoSeries { selector, .. } => Some(if selector.is_empty() {
                "no vLLM, SGLang or TensorRT-LLM metric was stored in that window; narrow or move it \
                 (--since/--until), or check that Prometheus scrapes the servers"
                    .into()
            } else {
                format!(
                    "check --selector {selector}: it must match the labels Prometheus gave the servers' \
                     series (job, instance, namespace, ...); try without it"
                )
            }),
            ScrapeError::BeyondRetention { .. } | ScrapeError::BeforeData { .. } => {
                Some("start the window later (--since), within the data Prometheus holds".into())
            }
            _ => None,
        }
    }
}

/// Reads `30s`, `10m`, `1h`, `500ms` or a sequence of those (`1h30m`), with `humantime`.
pub fn parse_duration(text: &str) -> Result<Duration, ScrapeError> {
    let total = humantime::parse_duration(text.trim()).map_err(|_| ScrapeError::Duration(text.to_owned()))?;
    if total.is_zero() {
        return Err(ScrapeError::ZeroDuration);
    }
    Ok(total)
}

/// The URL to scrape for a server's base URL: `/metrics` appended unless it is there.
pub fn metrics_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/metrics") {
        base.to_owned()
    } else {
        format!("{base}/metrics")
    }
}

/// When to scrape, from the start: now, then every `interval` before `window` has
/// passed, and once more at `window`.
pub fn schedule(window: Duration, interval: Duration) -> Vec<Duration> {
    let mut times = vec![Duration::ZERO];
    if interval.is_zero() {
        times.push(window);
        return times;
    }
    let mut at = interval;
    while at < window {
        times.push(at);
        at += interval;
    }
    times.push(window);
    times
}

/// The engines whose metrics `scrape` holds (empty: not an inference server's metrics),
/// by name in alphabetical order.
pub fn families(scrape: &Scrape) -> Vec<&'static str> {
    let set: BTreeSet<&'static str> = scrape
        .samples
        .iter()
        .filter_map(|s| Family::of_metric(&s.name))
        .map(Family::name)
        .collect();
    set.into_iter().collect()
}

/// One scrape that succeeded.
#[derive(Debug, Clone)]
pub struct Taken {
    /// Which round of the schedule, from 0.
    pub round: usize,
    /// Seconds since the first round began.
    pub at_s: f64,
    /// What `/metrics` said.
    pub scrape: Scrape,
}

/// The scrapes of one server, in order; the rounds it failed are absent.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The URL scraped.
    pub url: String,
    /// Its scrapes.
    pub taken: Vec<Taken>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_urls_and_schedules() {
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m").ok(), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m").ok(), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s").ok(), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms").ok(), Some(Duration::from_millis(250)));
        for bad in ["", "10", "5x", "s"] {
            assert!(
                matches!(parse_duration(bad), Err(ScrapeError::Duration(_))),
                "{bad}"
            );
        }
        assert!(matches!(parse_duration("0s"), Err(ScrapeError::ZeroDuration)));
        assert_eq!(metrics_url("http://h:8000/"), "http://h:8000/metrics");
        assert_eq!(
            metrics_url("http://h:8000/prometheus/metrics"),
            "http://h:8000/prometheus/metrics"
        );
        let s = |w, i| schedule(Duration::from_secs(w), Duration::from_secs(i));
        assert_eq!(s(2, 1), [0, 1, 2].map(Duration::from_secs));
        assert_eq!(s(25, 10), [0, 10, 20, 25].map(Duration::from_secs));
        assert_eq!(s(5, 10), [0, 5].map(Duration::from_secs));
        assert!(matches!(analyze(&[], 3), Err(ScrapeError::NoScrapes)));
    }
}

//! `sous bench scrape --prometheus URL --since ...`: the figures of a past window,
//! computed by a Prometheus server from the series it stored, through its HTTP API
//! (prometheus `docs/querying/api.md`): `/api/v1/label/__name__/values` for the engine
//! metrics stored in the window (narrowed by `--selector`), `/api/v1/status/runtimeinfo`
//! for the storage retention, then one instant query (`/api/v1/query`, `time=` the
//! window's end) per figure, per instance and for all instances summed. The PromQL is
//! [`super::promql`]'s.
//!
//! Percentiles are Prometheus's own `histogram_quantile` over the buckets' `increase()`
//! (linear interpolation within a bucket, the largest finite bound for a rank in
//! `+Inf`: `bucketQuantile` in `promql/quantile.go`, which [`super::quantile`] follows
//! step by step), so they are what a Grafana panel of the same PromQL shows.
//! `increase()` extrapolates (`extrapolatedRate` in `promql/functions.go`): the
//! increase between the first and the last sample in the window is scaled to the
//! window's edges (to a counter's zero point at most), up to 1.1 average scrape
//! intervals at each edge; counts are therefore fractional and may exceed the true
//! increase by a scrape interval's worth at each edge. The percentiles are unaffected
//! when every bucket of an instance is scaled alike. Not here: the live scrape
//! ([`super::watch`]).

mod api;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures_util::stream::{self, StreamExt};
use sous_engine::dialect::Family;
use sous_engine::reporter::Reporter;

use super::analyze::per_position_rates;
use super::names::{
    ACCEPTED_PER_POSITION, ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS, GENERATION_TOKENS, HISTOGRAMS, Names,
    POSITION, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS, REQUESTS,
};
use super::promql::{Queries, Scope, Selector};
use super::quantile::bucket_quantile;
use super::report::{Counters, Figures, Latency, PrometheusReport};
use super::{PROMETHEUS_INCREASE_METHOD, PROMETHEUS_PERCENTILE_METHOD, QUANTILES, ScrapeError};
use crate::bench::ratio::{WhenEmpty, ratio};
use crate::bench::window::format_utc;
use api::{Api, Vector, retention_s};

/// Queries in flight at once.
const PARALLEL: usize = 6;

/// What to ask which Prometheus server.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The server's base URL (`http://prometheus:9090`, or with a path prefix).
    pub url: &'a str,
    /// `--selector`, checked.
    pub selector: &'a Selector,
    /// `--selector` as the user wrote it, for the report and errors.
    pub selector_text: Option<&'a str>,
    /// The window's first second (Unix time).
    pub since: i64,
    /// The window's end (Unix time), after `since`.
    pub until: i64,
    /// Now (Unix time), for the retention check.
    pub now: i64,
}

/// Whose figures to read from a result.
#[derive(Clone, Copy)]
enum Who<'a> {
    All,
    Instance(&'a str),
}

impl Who<'_> {
    fn scope(self) -> Scope {
        match self {
            Who::All => Scope::All,
            Who::Instance(_) => Scope::PerInstance,
        }
    }

    fn holds(self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Who::All => true,
            Who::Instance(i) => labels.get("instance").map_or("", String::as_str) == i,
        }
    }
}

/// The answers, by query.
struct Results<'a> {
    queries: Queries<'a>,
    answers: HashMap<String, Vector>,
    window_s: f64,
}

impl Results<'_> {
    /// The samples of `promql` that belong to `who`.
    fn of<'r>(
        &'r self,
        promql: &str,
        who: Who<'r>,
    ) -> impl Iterator<Item = &'r (BTreeMap<String, String>, f64)> {
        self.answers
            .get(promql)
            .into_iter()
            .flatten()
            .filter(move |(labels, v)| who.holds(labels) && !v.is_nan())
    }

    /// The sum of `promql`'s samples of `who`, `None` without any.
    fn total(&self, promql: &str, who: Who<'_>) -> Option<f64> {
        self.of(promql, who).map(|(_, v)| *v).reduce(|a, b| a + b)
    }

    fn latency(
        &self,
        name: &'static str,
        label: &'static str,
        metric: &str,
        who: Who<'_>,
    ) -> Option<Latency> {
        let scope = who.scope();
        let by_le: Vec<(String, f64)> = self
            .of(&self.queries.buckets(metric, scope), who)
            .filter_map(|(labels, n)| Some((labels.get("le")?.clone(), *n)))
            .collect();
        let count = self
            .total(&self.queries.counter(&format!("{metric}_count"), scope), who)
            .unwrap_or(0.0);
        let sum_s = self
            .total(&self.queries.counter(&format!("{metric}_sum"), scope), who)
            .unwrap_or(0.0);
        let (mut latency, pairs) = Latency::from_buckets(name, label, metric, (count, sum_s), by_le);
        if latency.buckets.is_empty() {
            return None;
        }
        for (q, key) in QUANTILES {
            // Prometheus's figure; whether its rank fell in +Inf, from the same buckets.
            let ms = self
                .of(&self.queries.quantile(q, metric, scope), who)
                .map(|(_, v)| *v)
                .find(|v| v.is_finite())
                .map(|v| v * 1000.0);
            let beyond = ms.is_some() && bucket_quantile(q, &pairs).is_some_and(|e| e.beyond_last_bucket);
            latency.set_percentile(key, ms, beyond);
        }
        Some(latency)
    }

    fn counter(&self, chosen: &[&str], who: Who<'_>) -> Option<f64> {
        chosen
            .iter()
            .filter_map(|name| self.total(&self.queries.counter(name, who.scope()), who))
            .reduce(|a, b| a + b)
    }

    fn counters(&self, chosen: &Chosen, who: Who<'_>) -> Counters {
        let per_s = |v: Option<f64>| v.filter(|_| self.window_s > 0.0).map(|v| v / self.window_s);
        let window_ratio = |n, d| ratio(n, d, WhenEmpty::Absent);
        let mut c = Counters {
            generation_tokens: self.counter(&chosen.counter(GENERATION_TOKENS), who),
            prompt_tokens: self.counter(&chosen.counter(PROMPT_TOKENS), who),
            requests_completed: self.counter(&chosen.counter(REQUESTS), who),
            prefix_cache_hits: self.counter(&chosen.counter(PREFIX_HITS), who),
            prefix_cache_queries: self.counter(&chosen.counter(PREFIX_QUERIES), who),
            preemptions: self.counter(&chosen.counter(PREEMPTIONS), who),
            spec_decode_drafts: self.counter(&chosen.counter(DRAFTS), who),
            spec_decode_draft_tokens: self.counter(&chosen.counter(DRAFT_TOKENS), who),
            spec_decode_accepted_tokens: self.counter(&chosen.counter(ACCEPTED_TOKENS), who),
            ..Counters::default()
        };
        c.generation_tokens_per_s = per_s(c.generation_tokens);
        c.prompt_tokens_per_s = per_s(c.prompt_tokens);
        c.requests_per_s = per_s(c.requests_completed);
        c.prefix_cache_hit_rate = window_ratio(c.prefix_cache_hits, c.prefix_cache_queries);
        c.spec_decode_acceptance_rate =
            window_ratio(c.spec_decode_accepted_tokens, c.spec_decode_draft_tokens);
        c.spec_decode_acceptance_length =
            window_ratio(c.spec_decode_accepted_tokens, c.spec_decode_drafts).map(|r| 1.0 + r);
        let mut per_position: BTreeMap<String, f64> = BTreeMap::new();
        for name in chosen.counter(ACCEPTED_PER_POSITION) {
            for (labels, v) in self.of(&self.queries.counter_by(name, POSITION, who.scope()), who) {
                if let Some(p) = labels.get(POSITION) {
                    *per_position.entry(p.clone()).or_insert(0.0) += v;
                }
            }
        }
        c.spec_decode_per_position_acceptance_rates = per_position_rates(&per_position, c.spec_decode_drafts);
        c
    }

    fn figures(&self, chosen: &Chosen, who: Who<'_>) -> Figures {
        let mut latency = Vec::new();
        for (name, label, metric) in &chosen.histograms {
            latency.extend(self.latency(name, label, metric, who));
        }
        Figures {
            instance: match who {
                Who::All => None,
                Who::Instance(i) => Some(i.to_owned()),
            },
            latency,
            counters: self.counters(chosen, who),
        }
    }
}

/// The metric names stored in the window that make the figures.
struct Chosen {
    names: BTreeSet<String>,
    /// (report name, table name, metric without `_bucket`).
    histograms: Vec<(&'static str, &'static str, &'static str)>,
}

impl Chosen {
    fn new(names: BTreeSet<String>) -> Chosen {
        let mut histograms = Vec::new();
        for (name, label, groups) in HISTOGRAMS {
            for group in *groups {
                if let Some(m) = group.iter().find(|m| names.contains(&format!("{m}_bucket"))) {
                    histograms.push((*name, *label, *m));
                }
            }
        }
        Chosen { names, histograms }
    }

    /// The name each engine's group uses here.
    fn counter(&self, groups: Names) -> Vec<&'static str> {
        groups
            .iter()
            .filter_map(|g| g.iter().copied().find(|n| self.names.contains(*n)))
            .collect()
    }

    /// Every counter series a figure reads.
    fn counters(&self) -> Vec<&'static str> {
        let mut all = Vec::new();
        for groups in [
            GENERATION_TOKENS,
            PROMPT_TOKENS,
            REQUESTS,
            PREFIX_HITS,
            PREFIX_QUERIES,
            PREEMPTIONS,
            DRAFTS,
            DRAFT_TOKENS,
            ACCEPTED_TOKENS,
        ] {
            for name in self.counter(groups) {
                if !all.contains(&name) {
                    all.push(name);
                }
            }
        }
        all
    }

    /// The series whose presence at the window's start says the data reaches it.
    fn probe(&self) -> Option<String> {
        self.counter(GENERATION_TOKENS)
            .first()
            .map(|n| (*n).to_owned())
            .or_else(|| self.histograms.first().map(|(_, _, m)| format!("{m}_count")))
            .or_else(|| self.counters().first().map(|n| (*n).to_owned()))
    }

    /// Every query of the window, per instance and for all.
    fn queries(&self, q: &Queries<'_>) -> Vec<String> {
        let mut all = Vec::new();
        for scope in [Scope::All, Scope::PerInstance] {
            for (_, _, metric) in &self.histograms {
                all.push(q.buckets(metric, scope));
                all.push(q.counter(&format!("{metric}_count"), scope));
                all.push(q.counter(&format!("{metric}_sum"), scope));
                for (quantile, _) in QUANTILES {
                    all.push(q.quantile(quantile, metric, scope));
                }
            }
            for name in self.counters() {
                all.push(q.counter(name, scope));
            }
            for name in self.counter(ACCEPTED_PER_POSITION) {
                all.push(q.counter_by(name, POSITION, scope));
            }
        }
        all
    }
}

/// Asks the Prometheus server at `ask.url` for the window's figures.
pub async fn ask(ask: &Ask<'_>, reporter: &dyn Reporter) -> Result<PrometheusReport, ScrapeError> {
    let api = Api::new(ask.url, reporter)?;
    let (start, end) = (format_utc(ask.since), format_utc(ask.until));
    let window = ask.until - ask.since;
    let queries = Queries::new(ask.selector, window);
    let no_series = |query: String| ScrapeError::NoSeries {
        url: api.base.clone(),
        query,
        selector: ask.selector_text.unwrap_or_default().to_owned(),
        start: start.clone(),
        end: end.clone(),
    };

    let (names, names_query) = api.names(ask.selector, ask.since, ask.until).await?;
    let known: BTreeSet<String> = names
        .into_iter()
        .filter(|n| Family::of_metric(n).is_some())
        .collect();
    let families: BTreeSet<&'static str> = known
        .iter()
        .filter_map(|n| Family::of_metric(n))
        .map(Family::name)
        .collect();
    let chosen = Chosen::new(known);
    let Some(probe) = chosen.probe() else {
        return Err(no_series(names_query));
    };

    if let Some(retention) = api.retention().await
        && let Some(kept) = retention_s(&retention)
        && ask.since < ask.now - kept
    {
        return Err(ScrapeError::BeyondRetention {
            url: api.base.clone(),
            start,
            retention,
            retained_from: format_utc(ask.now - kept),
        });
    }
    let present = queries.present(&probe);
    if api.query(&present, ask.since).await?.is_empty() {
        let step = (window / 250).max(1);
        let first = api.first_value(&present, ask.since, ask.until, step).await?;
        return Err(ScrapeError::BeforeData {
            url: api.base.clone(),
            query: present,
            start,
            first: first.map(format_utc),
        });
    }

    let all = chosen.queries(&queries);
    reporter.status(
        "prometheus",
        &format!(
            "{} queries over {start} to {end} ({window} s) at {}",
            all.len(),
            api.base
        ),
    );
    let answers: Vec<Result<Vector, ScrapeError>> = stream::iter(all.iter())
        .map(|q| api.query(q, ask.until))
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut by_query = HashMap::new();
    for (q, answer) in all.iter().zip(answers) {
        by_query.insert(q.clone(), answer?);
    }
    let instances: BTreeSet<String> = by_query
        .values()
        .flatten()
        .filter_map(|(labels, _)| labels.get("instance").cloned())
        .collect();
    let results = Results {
        queries,
        answers: by_query,
        window_s: window as f64,
    };
    let total = results.figures(&chosen, Who::All);
    if total.latency.is_empty() && total.counters == Counters::default() {
        return Err(no_series(all.first().cloned().unwrap_or(names_query)));
    }
    let instances = instances
        .iter()
        .map(|i| results.figures(&chosen, Who::Instance(i)))
        .collect();
    Ok(PrometheusReport {
        source: "prometheus",
        percentile_method: PROMETHEUS_PERCENTILE_METHOD,
        increase_method: PROMETHEUS_INCREASE_METHOD,
        prometheus: api.base.clone(),
        selector: ask.selector_text.map(str::to_owned),
        start,
        end,
        window_s: window as f64,
        families: families.into_iter().collect(),
        total,
        instances,
        queries: all.len() + 3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_come_from_the_answers_per_instance_and_summed() {
        let sel = Selector::NONE;
        let q = Queries::new(&sel, 100);
        let ttft = "vllm:time_to_first_token_seconds";
        let chosen = Chosen::new(
            [
                format!("{ttft}_bucket"),
                format!("{ttft}_count"),
                format!("{ttft}_sum"),
                "vllm:generation_tokens_total".to_owned(),
                "vllm:spec_decode_num_drafts_total".to_owned(),
                "vllm:spec_decode_num_accepted_tokens_per_pos_total".to_owned(),
            ]
            .into_iter()
            .collect(),
        );
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let mut answers = HashMap::new();
        // Instance a: 50, 80, 95, 100, 100 cumulative (the live analysis's hand-worked
        // case); b: nothing but its counters.
        let buckets: Vector = ["0.01", "0.025", "0.05", "0.1", "+Inf"]
            .iter()
            .zip([50.0, 80.0, 95.0, 100.0, 100.0])
            .map(|(le, n)| (labels(&[("le", le), ("instance", "a")]), n))
            .collect();
        answers.insert(q.buckets(ttft, Scope::PerInstance), buckets);
        answers.insert(
            q.quantile(0.99, ttft, Scope::PerInstance),
            vec![(labels(&[("instance", "a")]), 0.09)],
        );
        answers.insert(
            q.quantile(0.5, ttft, Scope::PerInstance),
            vec![(labels(&[("instance", "a")]), f64::NAN)],
        );
        answers.insert(
            q.counter(&format!("{ttft}_count"), Scope::PerInstance),
            vec![(labels(&[("instance", "a")]), 100.0)],
        );
        answers.insert(
            q.counter(&format!("{ttft}_sum"), Scope::PerInstance),
            vec![(labels(&[("instance", "a")]), 2.5)],
        );
        answers.insert(
            q.counter("vllm:generation_tokens_total", Scope::PerInstance),
            vec![
                (labels(&[("instance", "a")]), 300.0),
                (labels(&[("instance", "b")]), 100.0),
            ],
        );
        answers.insert(
            q.counter("vllm:generation_tokens_total", Scope::All),
            vec![(labels(&[]), 400.0)],
        );
        answers.insert(
            q.counter("vllm:spec_decode_num_drafts_total", Scope::All),
            vec![(labels(&[]), 10.0)],
        );
        answers.insert(
            q.counter_by(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                POSITION,
                Scope::All,
            ),
            vec![
                (labels(&[("position", "1")]), 4.0),
                (labels(&[("position", "0")]), 7.0),
            ],
        );
        let results = Results {
            queries: q.clone(),
            answers,
            window_s: 100.0,
        };
        let a = results.figures(&chosen, Who::Instance("a"));
        assert_eq!(a.instance.as_deref(), Some("a"));
        let l = &a.latency[0];
        assert_eq!((l.name, l.count, l.mean_ms), ("ttft", 100.0, Some(25.0)));
        assert_eq!(l.p99_ms, Some(90.0));
        // NaN (no observations) is no figure.
        assert_eq!(l.p50_ms, None);
        assert_eq!(l.buckets.len(), 5);
        assert!(l.beyond_last_bucket.is_empty());
        assert_eq!(a.counters.generation_tokens, Some(300.0));
        assert_eq!(a.counters.generation_tokens_per_s, Some(3.0));
        let b = results.figures(&chosen, Who::Instance("b"));
        assert!(b.latency.is_empty());
        assert_eq!(b.counters.generation_tokens, Some(100.0));
        let all = results.figures(&chosen, Who::All);
        assert_eq!(all.counters.generation_tokens, Some(400.0));
        assert_eq!(
            all.counters.spec_decode_per_position_acceptance_rates,
            vec![0.7, 0.4]
        );
        // Every figure is asked per instance and for all: 7 per histogram, 1 per counter.
        assert_eq!(chosen.queries(&q).len(), 2 * (7 + 2 + 1));
        assert_eq!(chosen.probe().as_deref(), Some("vllm:generation_tokens_total"));
    }
}

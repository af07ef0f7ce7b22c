//! The computation of a window's figures from the scrapes of each URL: the increase of
//! every counter and histogram between the first and the last scrape (a counter that
//! went down is a restart, as Prometheus's `increase()` reads it in
//! `promql/functions.go`), the rates over the window, the peak and mean of the gauges.
//! Not here: the metric names ([`super::names`]) or the quantile estimate
//! ([`super::quantile`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::names::{
    ACCEPTED_PER_POSITION, ACCEPTED_TOKENS, Combine, DRAFT_TOKENS, DRAFTS, GAUGES, GENERATION_TOKENS,
    HISTOGRAMS, Names, POSITION, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS, REQUESTS,
};
use super::quantile::bucket_quantile;
use super::report::{Counters, Gauge, Latency, Report, Reset};
use super::{Instance, PERCENTILE_METHOD, QUANTILES, ScrapeError, families};
use crate::bench::ratio::{WhenEmpty, ratio};

/// The per-series increase of `name` over an instance's scrapes, summed per value of
/// the label `by` (all together under "" without one); `None` when no scrape has it.
/// The scrapes where a series went down are added to `resets`.
fn increase(
    instance: &Instance,
    name: &str,
    by: Option<&str>,
    resets: &mut BTreeSet<usize>,
) -> Option<BTreeMap<String, f64>> {
    let mut last: HashMap<Vec<(String, String)>, f64> = HashMap::new();
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let mut seen = false;
    for (i, taken) in instance.taken.iter().enumerate() {
        for s in taken
            .scrape
            .samples
            .iter()
            .filter(|s| s.name == name && s.value.is_finite())
        {
            seen = true;
            let mut key = s.labels.clone();
            key.sort();
            let group = by
                .and_then(|l| s.labels.iter().find(|(k, _)| k == l))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let grew = match last.get(&key) {
                Some(&prev) if s.value >= prev => s.value - prev,
                Some(_) => {
                    resets.insert(i);
                    s.value
                }
                // A series born after the first scrape started from zero.
                None if i > 0 => s.value,
                None => 0.0,
            };
            *out.entry(group).or_insert(0.0) += grew;
            last.insert(key, s.value);
        }
    }
    seen.then_some(out)
}

/// Computes a window's figures.
struct Analysis<'a> {
    instances: &'a [Instance],
    /// (instance, index into its scrapes) where a counter went down.
    resets: BTreeSet<(usize, usize)>,
}

impl Analysis<'_> {
    fn present(&self, name: &str) -> bool {
        self.instances
            .iter()
            .flat_map(|i| &i.taken)
            .any(|t| t.scrape.samples.iter().any(|s| s.name == name))
    }

    /// The name each engine's group uses here.
    fn chosen(&self, names: Names, suffix: &str) -> Vec<&'static str> {
        names
            .iter()
            .filter_map(|group| {
                group
                    .iter()
                    .copied()
                    .find(|n| self.present(&format!("{n}{suffix}")))
            })
            .collect()
    }

    /// The increase of `metric` per value of `by`, summed over the instances.
    fn increase_by(&mut self, metric: &str, by: Option<&str>) -> Option<BTreeMap<String, f64>> {
        let mut total: Option<BTreeMap<String, f64>> = None;
        for (i, instance) in self.instances.iter().enumerate() {
            let mut resets = BTreeSet::new();
            if let Some(grew) = increase(instance, metric, by, &mut resets) {
                let t = total.get_or_insert_with(BTreeMap::new);
                for (k, v) in grew {
                    *t.entry(k).or_insert(0.0) += v;
                }
            }
            self.resets.extend(resets.into_iter().map(|r| (i, r)));
        }
        total
    }

    /// The increase of a counter per value of `label`, over every other label, instance
    /// and engine.
    fn counter_by(&mut self, names: Names, label: &str) -> BTreeMap<String, f64> {
        let mut total = BTreeMap::new();
        for name in self.chosen(names, "") {
            for (k, v) in self.increase_by(name, Some(label)).unwrap_or_default() {
                *total.entry(k).or_insert(0.0) += v;
            }
        }
        total
    }

    /// The increase of a counter over every label, instance and engine.
    fn counter(&mut self, names: Names) -> Option<f64> {
        let mut total = None;
        for name in self.chosen(names, "") {
            if let Some(grew) = self.increase_by(name, None) {
                *total.get_or_insert(0.0) += grew.values().sum::<f64>();
            }
        }
        total
    }

    fn histogram(&mut self, name: &'static str, label: &'static str, metric: &str) -> Option<Latency> {
        let by_le = self.increase_by(&format!("{metric}_bucket"), Some("le"))?;
        let count = self
            .increase_by(&format!("{metric}_count"), None)
            .map_or(0.0, |m| m.values().sum());
        let sum_s = self
            .increase_by(&format!("{metric}_sum"), None)
            .map_or(0.0, |m| m.values().sum());
        let (mut latency, pairs) = Latency::from_buckets(name, label, metric, (count, sum_s), by_le);
        for (q, key) in QUANTILES {
            let estimate = bucket_quantile(q, &pairs);
            let beyond = estimate.is_some_and(|e| e.beyond_last_bucket);
            latency.set_percentile(key, estimate.map(|e| e.value * 1000.0), beyond);
        }
        Some(latency)
    }

    fn gauge(
        &self,
        name: &'static str,
        label: &'static str,
        combine: Combine,
        names: Names,
    ) -> Option<Gauge> {
        let metrics = self.chosen(names, "");
        let mut values = Vec::new();
        for taken in self.instances.iter().flat_map(|i| &i.taken) {
            let value = taken
                .scrape
                .samples
                .iter()
                .filter(|s| metrics.contains(&s.name.as_str()) && s.value.is_finite())
                .map(|s| s.value)
                .reduce(|a, b| match combine {
                    Combine::Sum => a + b,
                    Combine::Max => a.max(b),
                });
            values.extend(value);
        }
        let max = values.iter().copied().reduce(f64::max)?;
        Some(Gauge {
            name,
            metrics: metrics.iter().map(|m| (*m).to_owned()).collect(),
            max,
            mean: values.iter().sum::<f64>() / values.len() as f64,
            samples: values.len(),
            label,
        })
    }
}

/// Ratios over a window watched without sending anything: none when nothing was
/// counted ([`WhenEmpty::Absent`]).
fn window_ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    ratio(num, den, WhenEmpty::Absent)
}

/// Accepted tokens per draft position (the label's value, from 0) over the drafts, in
/// the order of the positions; empty without drafts. Positions that are not numbers
/// are left out.
pub(super) fn per_position_rates(accepted: &BTreeMap<String, f64>, drafts: Option<f64>) -> Vec<f64> {
    let mut positions: Vec<(u32, f64)> = accepted
        .iter()
        .filter_map(|(p, v)| Some((p.parse().ok()?, *v)))
        .collect();
    positions.sort_by_key(|(p, _)| *p);
    positions
        .into_iter()
        .map_while(|(_, v)| window_ratio(Some(v), drafts))
        .collect()
}

/// The figures of the window the instances' scrapes span; `scheduled` is the number of
/// rounds each URL was to be scraped.
pub fn analyze(instances: &[Instance], scheduled: usize) -> Result<Report, ScrapeError> {
    let times = || instances.iter().flat_map(|i| &i.taken).map(|t| t.at_s);
    let (Some(first), Some(last)) = (times().reduce(f64::min), times().reduce(f64::max)) else {
        return Err(ScrapeError::NoScrapes);
    };
    let window_s = last - first;
    let mut a = Analysis {
        instances,
        resets: BTreeSet::new(),
    };
    let mut latency = Vec::new();
    for (name, label, names) in HISTOGRAMS {
        for metric in a.chosen(names, "_bucket") {
            latency.extend(a.histogram(name, label, metric));
        }
    }
    let per_s = |v: Option<f64>| v.filter(|_| window_s > 0.0).map(|v| v / window_s);
    let mut c = Counters {
        generation_tokens: a.counter(GENERATION_TOKENS),
        prompt_tokens: a.counter(PROMPT_TOKENS),
        requests_completed: a.counter(REQUESTS),
        prefix_cache_hits: a.counter(PREFIX_HITS),
        prefix_cache_queries: a.counter(PREFIX_QUERIES),
        preemptions: a.counter(PREEMPTIONS),
        spec_decode_draft_tokens: a.counter(DRAFT_TOKENS),
        spec_decode_accepted_tokens: a.counter(ACCEPTED_TOKENS),
        ..Counters::default()
    };
    c.generation_tokens_per_s = per_s(c.generation_tokens);
    c.prompt_tokens_per_s = per_s(c.prompt_tokens);
    c.requests_per_s = per_s(c.requests_completed);
    c.prefix_cache_hit_rate = window_ratio(c.prefix_cache_hits, c.prefix_cache_queries);
    c.spec_decode_acceptance_rate = window_ratio(c.spec_decode_accepted_tokens, c.spec_decode_draft_tokens);
    c.spec_decode_drafts = a.counter(DRAFTS);
    c.spec_decode_acceptance_length =
        window_ratio(c.spec_decode_accepted_tokens, c.spec_decode_drafts).map(|r| 1.0 + r);
    let per_position = a.counter_by(ACCEPTED_PER_POSITION, POSITION);
    c.spec_decode_per_position_acceptance_rates = per_position_rates(&per_position, c.spec_decode_drafts);
    let gauges = GAUGES
        .iter()
        .filter_map(|(name, label, combine, names)| a.gauge(name, label, *combine, names))
        .collect();
    let counter_resets = a
        .resets
        .iter()
        .filter_map(|&(i, k)| {
            let taken = instances.get(i)?.taken.get(k)?;
            Some(Reset {
                url: instances[i].url.clone(),
                scrape: taken.round + 1,
                at_s: taken.at_s,
            })
        })
        .collect();
    let families: BTreeSet<&'static str> = instances
        .iter()
        .flat_map(|i| &i.taken)
        .flat_map(|t| families(&t.scrape))
        .collect();
    let taken: usize = instances.iter().map(|i| i.taken.len()).sum();
    Ok(Report {
        percentile_method: PERCENTILE_METHOD,
        urls: instances.iter().map(|i| i.url.clone()).collect(),
        families: families.into_iter().collect(),
        scrapes: scheduled,
        failed_scrapes: (scheduled * instances.len()).saturating_sub(taken),
        window_s,
        latency,
        counters: c,
        gauges,
        counter_resets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::prom::Scrape;
    use crate::bench::scrape::Taken;

    fn instance(url: &str, texts: &[&str]) -> Instance {
        Instance {
            url: url.to_owned(),
            taken: texts
                .iter()
                .enumerate()
                .map(|(i, t)| Taken {
                    round: i,
                    at_s: 10.0 * i as f64,
                    scrape: Scrape::parse(t),
                })
                .collect(),
        }
    }

    /// A TTFT histogram with buckets 0.01, 0.025, 0.05, 0.1, +Inf (cumulative counts).
    fn ttft(labels: &str, counts: [u32; 5], sum: f64) -> String {
        let mut text = String::new();
        for (le, n) in ["0.01", "0.025", "0.05", "0.1", "+Inf"].iter().zip(counts) {
            let sep = if labels.is_empty() { "" } else { "," };
            text.push_str(&format!(
                "vllm:time_to_first_token_seconds_bucket{{{labels}{sep}le=\"{le}\"}} {n}\n"
            ));
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        text.push_str(&format!(
            "vllm:time_to_first_token_seconds_count{braces} {}\n",
            counts[4]
        ));
        text.push_str(&format!("vllm:time_to_first_token_seconds_sum{braces} {sum}\n"));
        text
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn percentiles_interpolate_within_buckets_by_hand() {
        // Before: 10, 20, 30, 40, 40 (sum 1 s); after: 60, 100, 125, 140, 140 (sum 3.5 s).
        // Increase: 50, 80, 95, 100, 100 cumulative, 100 observations, 2.5 s.
        let i = instance(
            "a",
            &[
                &ttft("", [10, 20, 30, 40, 40], 1.0),
                &ttft("", [60, 100, 125, 140, 140], 3.5),
            ],
        );
        let r = analyze(&[i], 2).expect("report");
        let l = &r.latency[0];
        assert_eq!(l.name, "ttft");
        assert_eq!(l.count, 100.0);
        // mean = 2.5 s / 100 = 25 ms.
        assert!(close(l.mean_ms, 25.0));
        // P50: rank 50; the first bucket already holds 50: 0 + 10 ms × 50/50 = 10 ms.
        assert!(close(l.p50_ms, 10.0));
        // P90: rank 90 is in (25 ms, 50 ms], which holds 95 - 80 = 15; 10 of them are
        // below the rank: 25 + 25 × 10/15 = 41.667 ms.
        assert!(close(l.p90_ms, 25.0 + 25.0 * 10.0 / 15.0));
        // P95: rank 95 is the top of (25 ms, 50 ms]: 50 ms.
        assert!(close(l.p95_ms, 50.0));
        // P99: rank 99 is in (50 ms, 100 ms], holding 5, 4 below the rank: 50 + 50 × 4/5 = 90 ms.
        assert!(close(l.p99_ms, 90.0));
        assert!(l.beyond_last_bucket.is_empty());
        assert_eq!(r.percentile_method, PERCENTILE_METHOD);
        assert_eq!(r.window_s, 10.0);
        let buckets: Vec<(&str, f64)> = l.buckets.iter().map(|b| (b.le.as_str(), b.count)).collect();
        assert_eq!(
            buckets,
            vec![
                ("0.01", 50.0),
                ("0.025", 80.0),
                ("0.05", 95.0),
                ("0.1", 100.0),
                ("+Inf", 100.0)
            ]
        );
    }

    #[test]
    fn a_rank_in_the_inf_bucket_gives_the_largest_finite_bound() {
        // Increase 50, 80, 95, 98, 100: P99's rank 99 is above the 98 of le=0.1.
        let i = instance(
            "a",
            &[&ttft("", [0; 5], 0.0), &ttft("", [50, 80, 95, 98, 100], 4.0)],
        );
        let r = analyze(&[i], 2).expect("report");
        let l = &r.latency[0];
        assert!(close(l.p99_ms, 100.0));
        assert_eq!(l.beyond_last_bucket, vec!["p99"]);
        // P95: rank 95 is still the top of (25 ms, 50 ms].
        assert!(close(l.p95_ms, 50.0));
        assert!(r.to_table().contains("100.0+"), "{}", r.to_table());
        // Prometheus's special cases: no +Inf bucket, no observations, a bound <= 0.
        assert_eq!(bucket_quantile(0.5, &[(0.1, 3.0), (1.0, 4.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(
            bucket_quantile(0.5, &[(-1.0, 3.0), (f64::INFINITY, 4.0)]).map(|q| q.value),
            Some(-1.0)
        );
    }

    #[test]
    fn a_counter_that_goes_down_is_a_restart() {
        let i = instance(
            "http://a/metrics",
            &[
                "vllm:generation_tokens_total 100\nvllm:num_requests_running 2\n",
                "vllm:generation_tokens_total 150\nvllm:num_requests_running 6\n",
                // Restarted: 20 since.
                "vllm:generation_tokens_total 20\nvllm:num_requests_running 1\n",
                "vllm:generation_tokens_total 70\nvllm:num_requests_running 3\n",
            ],
        );
        let r = analyze(&[i], 4).expect("report");
        // 50 before the restart, 20 + 50 after.
        assert_eq!(r.counters.generation_tokens, Some(120.0));
        // Over the 30 s from the first scrape to the last.
        assert!(close(r.counters.generation_tokens_per_s, 4.0));
        assert_eq!(
            r.counter_resets,
            vec![Reset {
                url: "http://a/metrics".into(),
                scrape: 3,
                at_s: 20.0
            }]
        );
        assert!(
            r.to_table()
                .contains("counter reset: http://a/metrics restarted before scrape 3")
        );
        // Histograms restart with the counters: 10 per bucket before, 5 after.
        let h = instance(
            "b",
            &[
                &ttft("", [0; 5], 0.0),
                &ttft("", [10; 5], 0.5),
                &ttft("", [5; 5], 0.2),
            ],
        );
        let hr = analyze(&[h], 3).expect("report");
        assert_eq!(hr.latency[0].count, 15.0);
        assert!(close(Some(hr.latency[0].sum_s), 0.7));
        assert_eq!(hr.counter_resets.len(), 1);
        let running = &r.gauges[0];
        assert_eq!(
            (running.name, running.max, running.mean),
            ("running_requests", 6.0, 3.0)
        );
    }

    #[test]
    fn series_sum_over_labels_and_urls() {
        // URL a has two engines, URL b one; the increases per bucket add up to
        // 50, 80, 95, 100, 100 as in the hand-computed test above.
        let a = instance(
            "a",
            &[
                &(ttft("engine=\"0\"", [0; 5], 0.0) + &ttft("engine=\"1\"", [5, 5, 5, 5, 5], 0.1)),
                &(ttft("engine=\"0\"", [20, 30, 35, 40, 40], 1.0)
                    + &ttft("engine=\"1\"", [15, 25, 30, 30, 30], 0.6)),
            ],
        );
        let b = instance(
            "b",
            &[&ttft("", [0; 5], 0.0), &ttft("", [20, 30, 35, 35, 35], 1.0)],
        );
        // a: 20+10, 30+20, 35+25, 40+25, 40+25 = 30, 50, 60, 65, 65; b: 20, 30, 35, 35, 35.
        let r = analyze(&[a, b], 2).expect("report");
        let l = &r.latency[0];
        assert_eq!(l.count, 100.0);
        assert!(close(Some(l.sum_s), 2.5));
        assert!(close(l.p50_ms, 10.0));
        assert!(close(l.p90_ms, 25.0 + 25.0 * 10.0 / 15.0));
        assert!(close(l.p99_ms, 90.0));
    }

    #[test]
    fn hit_rates_acceptance_and_new_series() {
        let i = instance(
            "a",
            &[
                "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n\
                 vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n\
                 vllm:spec_decode_num_accepted_tokens_total 12\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.1\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 8\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 4\n\
                 vllm:kv_cache_usage_perc{engine=\"1\"} 0.3\n",
                "vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 160\n\
                 vllm:spec_decode_num_drafts_total 30\nvllm:spec_decode_num_draft_tokens_total 90\n\
                 vllm:spec_decode_num_accepted_tokens_total 42\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.7\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 12\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 24\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 6\n\
                 vllm:request_success_total{finished_reason=\"stop\"} 4\n",
            ],
        );
        let r = analyze(&[i], 2).expect("report");
        let c = &r.counters;
        assert_eq!(c.prefix_cache_hit_rate, Some(0.75));
        assert_eq!(c.spec_decode_acceptance_rate, Some(0.5));
        assert_eq!(c.spec_decode_acceptance_length, Some(2.5));
        // 16, 8 and 6 (a series born in the window) of the 30 accepted at positions 0, 1
        // and 2, over 20 drafts.
        assert_eq!(c.spec_decode_drafts, Some(20.0));
        assert_eq!(c.spec_decode_per_position_acceptance_rates, vec![0.8, 0.4, 0.3]);
        // Born after the first scrape: counted from zero.
        assert_eq!(c.requests_completed, Some(4.0));
        assert_eq!(c.preemptions, None);
        let kv = r.gauges.iter().find(|g| g.name == "kv_cache_usage").expect("kv");
        // The fuller engine of each scrape: 0.3, then 0.7.
        assert!(close(Some(kv.max), 0.7) && close(Some(kv.mean), 0.5));
        assert_eq!(r.families, vec!["vllm"]);
    }
}

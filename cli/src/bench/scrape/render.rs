//! `sous bench scrape`'s report for a terminal: the window, the latency table, the
//! counters and the gauges. Not here: the JSON (the report's own serialization).

use std::collections::BTreeSet;

use super::QUANTILES;
use super::report::{Counters, Latency, PrometheusReport, Report};
use crate::bench::table;

impl Report {
    /// The report for a terminal.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{} scraped {} time{} over {:.1} s ({}){}\n",
            match self.urls.as_slice() {
                [one] => one.clone(),
                many => format!("{} URLs", many.len()),
            },
            self.scrapes,
            if self.scrapes == 1 { "" } else { "s" },
            self.window_s,
            if self.families.is_empty() {
                "no known engine".to_owned()
            } else {
                self.families.join(", ")
            },
            if self.failed_scrapes > 0 {
                format!(", {} failed scrapes skipped", self.failed_scrapes)
            } else {
                String::new()
            },
        );
        if !self.latency.is_empty() {
            out.push_str(
                "\nlatency in ms; percentiles are bucket-interpolated estimates \
                 (Prometheus histogram_quantile, linear within buckets):\n",
            );
            let rows: Vec<(Option<&str>, &Latency)> = self.latency.iter().map(|l| (None, l)).collect();
            out.push_str(&latency_table(&rows));
            if self.latency.iter().map(|l| l.name).collect::<BTreeSet<_>>().len() < self.latency.len() {
                let names: Vec<&str> = self.latency.iter().map(|l| l.metric.as_str()).collect();
                out.push_str(&format!("(rows in order: {})\n", names.join(", ")));
            }
        }
        let lines = counter_lines(&self.counters);
        if !lines.is_empty() {
            out.push_str("\ncounters over the window:\n");
            for line in lines {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if !self.gauges.is_empty() {
            out.push_str("\ngauges per instance over the scrapes:\n");
            for g in &self.gauges {
                let v = |x: f64| {
                    if g.name == "kv_cache_usage" {
                        format!("{:.1}%", x * 100.0)
                    } else {
                        format!("{x:.1}")
                    }
                };
                out.push_str(&format!("  {}: max {}, mean {}\n", g.label, v(g.max), v(g.mean)));
            }
        }
        for r in &self.counter_resets {
            out.push_str(&format!(
                "\ncounter reset: {} restarted before scrape {} ({:.1} s); the figures add the \
                 increase before the reset and the values after it\n",
                r.url, r.scrape, r.at_s
            ));
        }
        out
    }
}

/// The latency table: a row per histogram (and instance, when given), the count, the
/// mean and the percentiles, `+` on those in the `+Inf` bucket (with a note under the
/// table).
fn latency_table(rows: &[(Option<&str>, &Latency)]) -> String {
    let with_instance = rows.iter().any(|(i, _)| i.is_some());
    let mut header = vec![""];
    if with_instance {
        header.push("instance");
    }
    header.extend(["count", "mean", "p50", "p90", "p95", "p99"]);
    let mut table = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    for (instance, l) in rows {
        let mut row = vec![l.label.to_owned()];
        if with_instance {
            row.push(instance.unwrap_or_default().to_owned());
        }
        row.extend([count(l.count), ms(l.mean_ms)]);
        for (_, key) in QUANTILES {
            let mark = if l.beyond_last_bucket.contains(&key) {
                "+"
            } else {
                ""
            };
            row.push(format!("{}{mark}", ms(l.percentile(key))));
        }
        table.push(row);
    }
    let mut out = if with_instance {
        table::layout_left(&table, "", 2)
    } else {
        table::layout(&table, "", table::First::Right)
    };
    if rows.iter().any(|(_, l)| !l.beyond_last_bucket.is_empty()) {
        out.push_str(
            "(+: in the +Inf bucket; the largest finite bound is shown, the true value is above it)\n",
        );
    }
    out
}

/// The counters' lines: rates with totals, the prefix-cache hit rate, preemptions,
/// speculative acceptance.
fn counter_lines(c: &Counters) -> Vec<String> {
    let mut lines = Vec::new();
    let rate = |what: &str, total: Option<f64>, per_s: Option<f64>, unit: &str| {
        total.map(|t| match per_s {
            Some(r) => format!("{what}: {r:.2} {unit}/s ({} in all)", count(t)),
            None => format!("{what}: {}", count(t)),
        })
    };
    lines.extend(rate(
        "generation",
        c.generation_tokens,
        c.generation_tokens_per_s,
        "tok",
    ));
    lines.extend(rate("prompt", c.prompt_tokens, c.prompt_tokens_per_s, "tok"));
    lines.extend(rate(
        "requests completed",
        c.requests_completed,
        c.requests_per_s,
        "req",
    ));
    if let (Some(r), Some(h), Some(q)) = (
        c.prefix_cache_hit_rate,
        c.prefix_cache_hits,
        c.prefix_cache_queries,
    ) {
        lines.push(format!(
            "prefix-cache hit rate: {:.1}% ({} of {})",
            r * 100.0,
            count(h),
            count(q)
        ));
    }
    if let Some(p) = c.preemptions {
        lines.push(format!("preemptions: {}", count(p)));
    }
    if let Some(r) = c.spec_decode_acceptance_rate {
        let per_position: Vec<String> = c
            .spec_decode_per_position_acceptance_rates
            .iter()
            .map(|r| format!("{:.1}%", r * 100.0))
            .collect();
        lines.push(format!(
            "spec decode: acceptance rate {:.1}%{}{}",
            r * 100.0,
            c.spec_decode_acceptance_length
                .map_or(String::new(), |l| format!(", mean acceptance length {l:.2}")),
            if per_position.is_empty() {
                String::new()
            } else {
                format!(", by position {}", per_position.join(" "))
            }
        ));
    }
    lines
}

impl PrometheusReport {
    /// The report for a terminal: the window, the latency table (all instances, then
    /// each), the counters summed, and a row of rates per instance.
    pub fn to_table(&self) -> String {
        let n = self.instances.len();
        let mut out = format!(
            "Prometheus {}{}: {} to {} ({:.0} s), {} instance{} ({})\n",
            self.prometheus,
            self.selector.as_ref().map_or(String::new(), |s| format!(" {s}")),
            self.start,
            self.end,
            self.window_s,
            n,
            if n == 1 { "" } else { "s" },
            if self.families.is_empty() {
                "no known engine".to_owned()
            } else {
                self.families.join(", ")
            },
        );
        let mut rows: Vec<(Option<&str>, &Latency)> = Vec::new();
        for l in &self.total.latency {
            if n != 1 {
                rows.push((Some("all"), l));
            }
            for f in &self.instances {
                let name = f.instance.as_deref().unwrap_or_default();
                let shown = if name.is_empty() { "(none)" } else { name };
                rows.extend(
                    f.latency
                        .iter()
                        .filter(|m| m.metric == l.metric)
                        .map(|m| (Some(shown), m)),
                );
            }
        }
        if !rows.is_empty() {
            out.push_str(
                "\nlatency in ms; percentiles computed by the Prometheus server \
                 (histogram_quantile over increase() of the buckets, linear within buckets):\n",
            );
            out.push_str(&latency_table(&rows));
        }
        let lines = counter_lines(&self.total.counters);
        if !lines.is_empty() {
            out.push_str(&format!(
                "\ncounters over the window{} (Prometheus increase(), extrapolated to the window's edges):\n",
                if n > 1 { ", all instances" } else { "" }
            ));
            for line in lines {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if n > 1 {
            let mut table = vec![
                [
                    "instance",
                    "gen tok/s",
                    "prompt tok/s",
                    "req/s",
                    "prefix hit",
                    "spec accept",
                ]
                .map(str::to_owned)
                .to_vec(),
            ];
            let num = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0));
            for f in &self.instances {
                let c = &f.counters;
                table.push(vec![
                    f.instance.clone().unwrap_or_default(),
                    num(c.generation_tokens_per_s),
                    num(c.prompt_tokens_per_s),
                    num(c.requests_per_s),
                    pct(c.prefix_cache_hit_rate),
                    pct(c.spec_decode_acceptance_rate),
                ]);
            }
            out.push_str("\nper instance:\n");
            out.push_str(&table::layout(&table, "", table::First::Left));
        }
        out
    }
}

/// A count: whole when it is (a live scrape's always is), else to a tenth (Prometheus's
/// `increase()` extrapolates).
fn count(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}"))
}

//! `sous bench scrape`'s report for a terminal: the window, the latency table, the
//! counters and the gauges. Not here: the JSON (the report's own serialization).

use std::collections::BTreeSet;

use super::QUANTILES;
use super::report::Report;
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
            let mut rows = vec![
                ["", "count", "mean", "p50", "p90", "p95", "p99"]
                    .map(str::to_owned)
                    .to_vec(),
            ];
            for l in &self.latency {
                let mut row = vec![l.label.to_owned(), format!("{:.0}", l.count), ms(l.mean_ms)];
                for (_, key) in QUANTILES {
                    let mark = if l.beyond_last_bucket.contains(&key) {
                        "+"
                    } else {
                        ""
                    };
                    row.push(format!("{}{mark}", ms(l.percentile(key))));
                }
                rows.push(row);
            }
            out.push_str(&table::layout(&rows, "", table::First::Right));
            if self.latency.iter().any(|l| !l.beyond_last_bucket.is_empty()) {
                out.push_str(
                    "(+: in the +Inf bucket; the largest finite bound is shown, the true value is above it)\n",
                );
            }
            if self.latency.iter().map(|l| l.name).collect::<BTreeSet<_>>().len() < self.latency.len() {
                let names: Vec<&str> = self.latency.iter().map(|l| l.metric.as_str()).collect();
                out.push_str(&format!("(rows in order: {})\n", names.join(", ")));
            }
        }
        let c = &self.counters;
        let mut lines = Vec::new();
        let rate = |what: &str, total: Option<f64>, per_s: Option<f64>, unit: &str| {
            total.map(|t| match per_s {
                Some(r) => format!("{what}: {r:.2} {unit}/s ({t:.0} in all)"),
                None => format!("{what}: {t:.0}"),
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
                "prefix-cache hit rate: {:.1}% ({h:.0} of {q:.0})",
                r * 100.0
            ));
        }
        if let Some(p) = c.preemptions {
            lines.push(format!("preemptions: {p:.0}"));
        }
        if let Some(r) = c.spec_decode_acceptance_rate {
            lines.push(format!(
                "spec decode: acceptance rate {:.1}%{}",
                r * 100.0,
                c.spec_decode_acceptance_length
                    .map_or(String::new(), |l| format!(", mean acceptance length {l:.2}"))
            ));
        }
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

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}"))
}

//! A benchmark's report: the JSON document (each level's keys named as in
//! `vllm bench serve`'s result file where the concept is the same: `mean_ttft_ms`,
//! `p99_itl_ms`, `output_throughput`, ...; sous's own additions beside them), one CSV row
//! per level, the terminal table, and `sous bench compare`.

use serde_json::{Map, Value, json};

use super::server::ServerFigures;
use super::stats::{RunMetrics, Summary};
use super::table::{self, First};

/// One level of a run (a concurrency level of a sweep, or a whole probe/prefix/agent run).
#[derive(Debug, Clone)]
pub struct Level {
    /// Client-side figures.
    pub metrics: RunMetrics,
    /// What the engine counted.
    pub server: ServerFigures,
    /// Workload-specific extras (probe repetitions, agent steps).
    pub extra: Map<String, Value>,
    /// Each completed request's TTFT, ms (for the CDF chart).
    pub ttfts_ms: Vec<f64>,
}

fn key_percentile(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("p{}", p as u64)
    } else {
        format!("p{p}")
    }
}

fn put_summary(map: &mut Map<String, Value>, name: &str, s: &Summary) {
    map.insert(format!("mean_{name}_ms"), json!(s.mean));
    map.insert(format!("median_{name}_ms"), json!(s.median));
    map.insert(format!("std_{name}_ms"), json!(s.std));
    for (p, v) in &s.percentiles {
        map.insert(format!("{}_{name}_ms", key_percentile(*p)), json!(v));
    }
}

impl Level {
    /// The level as `vllm bench serve`'s flat result object plus sous's fields.
    pub fn to_json(&self) -> Value {
        let m = &self.metrics;
        let mut map = Map::new();
        map.insert("request_rate".into(), json!("inf"));
        map.insert("burstiness".into(), json!(1.0));
        for (k, v) in [
            ("num_prompts", json!(m.num_prompts)),
            ("max_concurrency", json!(m.max_concurrency)),
            ("duration", json!(m.duration)),
            ("completed", json!(m.completed)),
            ("failed", json!(m.failed)),
            ("total_input_tokens", json!(m.total_input_tokens)),
            ("total_output_tokens", json!(m.total_output_tokens)),
            ("request_throughput", json!(m.request_throughput)),
            ("request_goodput", json!(m.request_goodput)),
            ("output_throughput", json!(m.output_throughput)),
            ("total_token_throughput", json!(m.total_token_throughput)),
            ("max_output_tokens_per_s", json!(m.max_output_tokens_per_s)),
            ("max_concurrent_requests", json!(m.max_concurrent_requests)),
        ] {
            map.insert(k.into(), v);
        }
        put_summary(&mut map, "ttft", &m.ttft);
        put_summary(&mut map, "tpot", &m.tpot);
        put_summary(&mut map, "itl", &m.itl);
        put_summary(&mut map, "e2el", &m.e2el);
        if self.server.spec_decode_num_drafts.is_some_and(|d| d > 0.0) {
            map.insert(
                "spec_decode_acceptance_rate".into(),
                json!(self.server.spec_decode_acceptance_rate.map(|r| r * 100.0)),
            );
            map.insert(
                "spec_decode_acceptance_length".into(),
                json!(self.server.spec_decode_acceptance_length),
            );
            map.insert(
                "spec_decode_per_position_acceptance_rates".into(),
                json!(self.server.spec_decode_per_position_acceptance_rates),
            );
        }
        map.insert(
            "mean_request_output_tokens_per_s".into(),
            json!(m.mean_request_output_tokens_per_s),
        );
        map.insert("usage_cached_fraction".into(), json!(m.usage_cached_fraction));
        map.insert("server".into(), json!(self.server));
        for (k, v) in &self.extra {
            map.insert(k.clone(), v.clone());
        }
        Value::Object(map)
    }
}

/// The CSV header and one row per level (numbers only, so no quoting is needed).
pub fn csv(levels: &[Level], percentiles: &[f64]) -> String {
    let mut header = vec![
        "max_concurrency",
        "num_prompts",
        "completed",
        "failed",
        "duration_s",
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "request_goodput",
        "mean_request_output_tokens_per_s",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        header.push(format!("mean_{metric}_ms"));
        for p in percentiles {
            header.push(format!("{}_{metric}_ms", key_percentile(*p)));
        }
    }
    header.extend(
        [
            "prefix_cache_hit_rate",
            "spec_decode_acceptance_rate",
            "kv_cache_usage_max",
            "preemptions",
        ]
        .map(str::to_owned),
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    let mut out = header.join(",");
    out.push('\n');
    for level in levels {
        let m = &level.metrics;
        let mut row = vec![
            m.max_concurrency.to_string(),
            m.num_prompts.to_string(),
            m.completed.to_string(),
            m.failed.to_string(),
            format!("{:.6}", m.duration),
            format!("{:.6}", m.output_throughput),
            format!("{:.6}", m.total_token_throughput),
            format!("{:.6}", m.request_throughput),
            opt(m.request_goodput),
            format!("{:.6}", m.mean_request_output_tokens_per_s),
        ];
        for s in [&m.ttft, &m.tpot, &m.itl, &m.e2el] {
            row.push(format!("{:.6}", s.mean));
            for p in percentiles {
                row.push(opt(s.at(*p)));
            }
        }
        let s = &level.server;
        row.extend([
            opt(s.prefix_cache_hit_rate),
            opt(s.spec_decode_acceptance_rate),
            opt(s.kv_cache_usage_max),
            opt(s.preemptions),
        ]);
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// The terminal table of a run's levels.
pub fn table(levels: &[Level]) -> String {
    let mut rows = vec![vec![
        "conc".to_owned(),
        "reqs".into(),
        "err".into(),
        "out tok/s".into(),
        "tok/s/req".into(),
        "TTFT p50".into(),
        "TTFT p99".into(),
        "TPOT p50".into(),
        "ITL p50".into(),
        "ITL p99".into(),
        "E2E p50".into(),
        "goodput".into(),
        "prefix hit".into(),
    ]];
    for level in levels {
        let m = &level.metrics;
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        rows.push(vec![
            m.max_concurrency.to_string(),
            m.num_prompts.to_string(),
            m.failed.to_string(),
            format!("{:.1}", m.output_throughput),
            format!("{:.1}", m.mean_request_output_tokens_per_s),
            format!("{:.1}", m.ttft.median),
            ms(m.ttft.at(99.0)),
            format!("{:.1}", m.tpot.median),
            format!("{:.1}", m.itl.median),
            ms(m.itl.at(99.0)),
            format!("{:.1}", m.e2el.median),
            m.request_goodput.map_or("-".into(), |g| format!("{g:.2}/s")),
            level
                .server
                .prefix_cache_hit_rate
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
        ]);
    }
    table::layout(&rows, "", First::Right) + "(times in ms; tok/s/req = mean of each request's 1/TPOT)\n"
}

/// `sous bench compare A B`: the levels of two reports side by side, matched by
/// concurrency, with B/A ratios.
pub fn compare(a: &Value, b: &Value) -> Result<String, String> {
    let levels = |v: &Value, which: &str| -> Result<Vec<Value>, String> {
        v["levels"]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("{which} is not a `sous bench` report (no `levels`)"))
    };
    let (la, lb) = (levels(a, "the first file")?, levels(b, "the second file")?);
    let label = |v: &Value| v["label"].as_str().map(str::to_owned).unwrap_or_default();
    let (name_a, name_b) = (label(a), label(b));
    let mut rows = vec![vec![
        "conc".to_owned(),
        "metric".into(),
        if name_a.is_empty() { "A".into() } else { name_a },
        if name_b.is_empty() { "B".into() } else { name_b },
        "B/A".into(),
    ]];
    const METRICS: [(&str, &str); 6] = [
        ("output_throughput", "out tok/s"),
        ("mean_request_output_tokens_per_s", "tok/s/req"),
        ("median_ttft_ms", "TTFT p50 ms"),
        ("median_tpot_ms", "TPOT p50 ms"),
        ("median_itl_ms", "ITL p50 ms"),
        ("median_e2el_ms", "E2E p50 ms"),
    ];
    let mut matched = 0;
    for x in &la {
        let Some(y) = lb.iter().find(|y| y["max_concurrency"] == x["max_concurrency"]) else {
            continue;
        };
        matched += 1;
        for (key, name) in METRICS {
            let (Some(va), Some(vb)) = (x[key].as_f64(), y[key].as_f64()) else {
                continue;
            };
            rows.push(vec![
                x["max_concurrency"].to_string(),
                name.into(),
                format!("{va:.1}"),
                format!("{vb:.1}"),
                if va != 0.0 {
                    format!("{:.2}x", vb / va)
                } else {
                    "-".into()
                },
            ]);
        }
    }
    if matched == 0 {
        return Err("the two reports have no concurrency level in common".into());
    }
    Ok(table::layout(&rows, "", First::Right))
}

//! A run's report for a terminal (the level table and the lines about the probe, the
//! agent and the server's prefix cache) and `sous bench compare`. Not here: the JSON or
//! the CSV.

use serde_json::Value;

use super::{Level, Report};
use crate::bench::arrivals;
use crate::bench::table::{self, First};

/// The terminal table of a run's levels; an open-loop sweep's begins with the offered
/// rate and ends with the completed requests per second.
pub fn table(levels: &[Level]) -> String {
    let open = levels.iter().any(|l| !l.traffic.is_closed());
    let mut header = if open { vec!["rate".to_owned()] } else { Vec::new() };
    header.extend([
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
    ]);
    if open {
        header.push("req/s".into());
    }
    let mut rows = vec![header];
    for level in levels {
        let m = &level.metrics;
        let t = &level.traffic;
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        let mut row = if open {
            vec![arrivals::rate_text(t.request_rate)]
        } else {
            Vec::new()
        };
        row.extend([
            t.max_concurrency.map_or("-".to_owned(), |c| c.to_string()),
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
        if open {
            row.push(format!("{:.2}", m.request_throughput));
        }
        rows.push(row);
    }
    let mut out =
        table::layout(&rows, "", First::Right) + "(times in ms; tok/s/req = mean of each request's 1/TPOT)\n";
    if open {
        out.push_str(
            "(rate: requests offered per second, gamma-distributed gaps; conc: the cap on requests \
             in flight, - for none; req/s: completed per second)\n",
        );
    }
    out
}

/// The text `sous bench probe|sweep|prefix|agent` prints: the level table, then the
/// probe's and the agent's lines and the server's prefix-cache hit rate per level.
pub fn summary(report: &Report) -> String {
    let mut out = table(&report.levels);
    for level in &report.levels {
        if let Some(probe) = &level.probe {
            out.push_str(&format!(
                "probe: TTFT median {:.1} ms (min {:.1}, max {:.1}); decode median {:.1} tok/s (min {:.1}, max {:.1}) over {} runs\n",
                probe.ttft_ms.median,
                probe.ttft_ms.min.unwrap_or(0.0),
                probe.ttft_ms.max.unwrap_or(0.0),
                probe.decode_tok_s.median,
                probe.decode_tok_s.min.unwrap_or(0.0),
                probe.decode_tok_s.max.unwrap_or(0.0),
                probe.repetitions.len(),
            ));
        }
        if let Some(agent) = &level.agent {
            out.push_str(&format!(
                "agent: prompt:generation {:.1}:1\n",
                agent.prompt_to_generation_ratio
            ));
        }
        let s = &level.server;
        let fleet = if level.instances.is_empty() {
            ""
        } else {
            " (all instances)"
        };
        if let (Some(rate), Some(q)) = (s.prefix_cache_hit_rate, s.prefix_cache_queries) {
            out.push_str(&format!(
                "server: prefix-cache hit rate {:.1}%{fleet} ({:.0} of {q:.0} prompt tokens)\n",
                rate * 100.0,
                s.prefix_cache_hits.unwrap_or(0.0)
            ));
        }
        if let Some(d) = &s.decode {
            out.push_str(&format!(
                "server: decode read {:.3} GB per step at {:.1} GB/s{} ({:.0} steps of {:.1} sequences on average)\n",
                d.gb_per_step,
                d.gb_per_s,
                match (d.bandwidth_fraction, d.read_bandwidth_gb_per_s) {
                    (Some(f), Some(b)) => format!(", {:.0}% of the read bandwidth ({b:.1} GB/s, measured at load)", f * 100.0),
                    _ => String::new(),
                },
                d.steps,
                d.sequences_per_step
            ));
        }
        for instance in &level.instances {
            let figures = instance.server.as_ref();
            match figures.and_then(|f| Some((f.prefix_cache_hit_rate?, f.prefix_cache_queries?))) {
                Some((rate, q)) => out.push_str(&format!(
                    "  {}: prefix-cache hit rate {:.1}% ({:.0} of {q:.0} prompt tokens)\n",
                    instance.url,
                    rate * 100.0,
                    figures.and_then(|f| f.prefix_cache_hits).unwrap_or(0.0)
                )),
                None => out.push_str(&format!(
                    "  {}: no prefix-cache figures (its /metrics)\n",
                    instance.url
                )),
            }
        }
        if let (Some(drafts), Some(rate), Some(length)) = (
            s.spec_decode_num_drafts,
            s.spec_decode_acceptance_rate,
            s.spec_decode_acceptance_length,
        ) && drafts > 0.0
        {
            let positions: Vec<String> = s
                .spec_decode_per_position_acceptance_rates
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect();
            out.push_str(&format!(
                "server: speculative decoding: acceptance rate {:.1}%, mean acceptance length {length:.2}, \
                 per position {} ({drafts:.0} drafts)\n",
                rate * 100.0,
                positions.join(", ")
            ));
        }
    }
    if report.workload == "sweep" {
        out.push_str("(output tok/s: all requests' tokens over the level's wall time)\n");
    }
    out
}

/// A level's request rate and cap as its JSON has them (`"inf"`/number, number/null):
/// what `compare` matches levels by.
fn level_key(level: &Value) -> (Value, Value) {
    (level["request_rate"].clone(), level["max_concurrency"].clone())
}

/// How `compare` names a level: its concurrency for a closed loop (every request at
/// once, a cap), else `20/s`, `20/s max 4`, `inf`.
fn level_name(level: &Value) -> String {
    let rate = match &level["request_rate"] {
        Value::String(s) => s.clone(),
        Value::Null => "inf".to_owned(),
        v => v.as_f64().map_or_else(|| v.to_string(), arrivals::rate_text),
    };
    match (&level["max_concurrency"], rate.as_str()) {
        (Value::Null, _) => rate,
        (c, "inf") => c.to_string(),
        (c, _) => format!("{rate} max {c}"),
    }
}

/// `sous bench compare A B`: the levels of two reports side by side, matched by
/// request rate and concurrency (a closed loop's: its concurrency), with B/A ratios.
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
    // Open loop: some level is not a closed loop (every request at once, a cap).
    let open = la.iter().any(|l| {
        let all_at_once = l["request_rate"] == "inf" || l["request_rate"].is_null();
        !all_at_once || l["max_concurrency"].is_null()
    });
    let mut rows = vec![vec![
        if open { "level" } else { "conc" }.to_owned(),
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
        let Some(y) = lb.iter().find(|y| level_key(y) == level_key(x)) else {
            continue;
        };
        matched += 1;
        for (key, name) in METRICS {
            let (Some(va), Some(vb)) = (x[key].as_f64(), y[key].as_f64()) else {
                continue;
            };
            rows.push(vec![
                level_name(x),
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

//! `sous bench compare` of a `bench logs --json` report with another one (or with an
//! active report): the before/after table of the DGX Spark report, per instance, from
//! the figures that mean the same thing on both sides.
//!
//! From a logs report: per running level the median generation throughput with its
//! p5-p95 range, the prefix-cache hit rate at the end of the window and its median over
//! active lines, the speculative-decoding acceptance rate and mean acceptance length,
//! the KV cache usage and the preemptions. From an active report (`sous bench sweep`,
//! `probe`...): per concurrency level the output throughput (the level's `N` requests in
//! flight is the logs' `Running: N reqs`), and the prefix-cache hit rate and speculative
//! figures the server's `/metrics` gave at its last level that has them. Instances are
//! matched by name, or in order when no name matches.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::bench::table::{self, First};

/// Whether `report` is a `bench logs` report.
pub fn is_logs_report(report: &Value) -> bool {
    report["instances"]
        .as_array()
        .is_some_and(|i| i.iter().all(|i| i["curve"].is_array()))
}

/// One side's figures.
#[derive(Debug, Default)]
struct Side {
    name: String,
    /// Running (or concurrency) → (median, p5, p95) generation tokens/s.
    levels: BTreeMap<u64, (f64, Option<(f64, f64)>)>,
    prefix_end: Option<f64>,
    prefix_median: Option<f64>,
    acceptance: Option<f64>,
    length: Option<f64>,
    kv_max: Option<f64>,
    kv_mean: Option<f64>,
    preemptions: Option<f64>,
}

fn from_instance(i: &Value) -> Side {
    let f = |v: &Value| v.as_f64();
    let mut side = Side {
        name: i["name"].as_str().unwrap_or("?").to_owned(),
        prefix_end: f(&i["prefix_cache_hit_rate_pct"]["last"]),
        prefix_median: f(&i["prefix_cache_hit_rate_pct"]["active"]["p50"]),
        acceptance: f(&i["spec_decode"]["acceptance_rate_pct"]),
        length: f(&i["spec_decode"]["mean_acceptance_length"]),
        kv_max: f(&i["max_kv_cache_usage_pct"]),
        kv_mean: f(&i["kv_cache_usage_pct"]["mean"]),
        preemptions: f(&i["preemptions"]),
        ..Side::default()
    };
    for p in i["curve"].as_array().into_iter().flatten() {
        let g = &p["generation_tok_s"];
        if let (Some(n), Some(median)) = (
            p["running"].as_u64(),
            f(&g["p50"]).or(f(&p["mean_generation_tok_s"])),
        ) {
            let range = f(&g["p5"]).zip(f(&g["p95"]));
            side.levels.insert(n, (median, range));
        }
    }
    side
}

fn from_active(report: &Value) -> Option<Side> {
    let levels = report["levels"].as_array()?;
    let mut side = Side {
        name: report["label"]
            .as_str()
            .filter(|l| !l.is_empty())
            .unwrap_or("active run")
            .to_owned(),
        ..Side::default()
    };
    for l in levels {
        if let (Some(n), Some(v)) = (l["max_concurrency"].as_u64(), l["output_throughput"].as_f64()) {
            side.levels.insert(n, (v, None));
        }
        if let Some(h) = l["server"]["prefix_cache_hit_rate"].as_f64() {
            side.prefix_end = Some(h * 100.0);
        }
        if let Some(a) = l["spec_decode_acceptance_rate"].as_f64() {
            side.acceptance = Some(a);
        }
        if let Some(len) = l["spec_decode_acceptance_length"].as_f64() {
            side.length = Some(len);
        }
    }
    Some(side)
}

/// The sides of a report: one per instance of a logs report, one for an active report.
fn sides(report: &Value, which: &str) -> Result<Vec<Side>, String> {
    if is_logs_report(report) {
        Ok(report["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .map(from_instance)
            .collect())
    } else {
        from_active(report).map(|s| vec![s]).ok_or_else(|| {
            format!("{which} is neither a `sous bench logs` report nor an active `sous bench` report")
        })
    }
}

/// How a figure of the table is written; only tokens per step get a ratio (the others
/// are percentages or counts, where a difference reads better than a ratio).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Percent,
    Ratio,
    Count,
}

impl Format {
    fn show(self, value: Option<f64>) -> String {
        match (self, value) {
            (_, None) => "-".into(),
            (Format::Percent, Some(v)) => format!("{v:.1}%"),
            (Format::Ratio, Some(v)) => format!("{v:.2}"),
            (Format::Count, Some(v)) => format!("{v:.0}"),
        }
    }
}

/// The before/after table of two reports, at least one of them from `bench logs`.
pub fn compare(a: &Value, b: &Value) -> Result<String, String> {
    let (sa, sb) = (sides(a, "the first file")?, sides(b, "the second file")?);
    let by_name: Vec<(usize, usize)> = sa
        .iter()
        .enumerate()
        .filter_map(|(i, x)| sb.iter().position(|y| y.name == x.name).map(|j| (i, j)))
        .collect();
    let pairs = if !by_name.is_empty() {
        by_name
    } else if sa.len() == sb.len() {
        (0..sa.len()).map(|i| (i, i)).collect()
    } else {
        return Err(format!(
            "the reports have {} and {} instances and no name in common",
            sa.len(),
            sb.len()
        ));
    };
    let mut out = String::new();
    for (i, j) in pairs {
        let (x, y) = (&sa[i], &sb[j]);
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&section(x, y));
    }
    Ok(out)
}

fn section(a: &Side, b: &Side) -> String {
    let mut rows = vec![vec![
        "figure".to_owned(),
        a.name.clone(),
        b.name.clone(),
        "after/before".to_owned(),
    ]];
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x != 0.0 => format!("{:.2}x", y / x),
        _ => "-".to_owned(),
    };
    let levels: Vec<u64> = a
        .levels
        .keys()
        .chain(b.levels.keys())
        .copied()
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .collect();
    for n in levels {
        let cell = |s: &Side| match s.levels.get(&n) {
            Some((m, Some((lo, hi)))) => format!("{m:.1} ({lo:.1}-{hi:.1})"),
            Some((m, None)) => format!("{m:.1}"),
            None => "-".into(),
        };
        rows.push(vec![
            format!("gen tok/s, {n} running"),
            cell(a),
            cell(b),
            ratio(a.levels.get(&n).map(|l| l.0), b.levels.get(&n).map(|l| l.0)),
        ]);
    }
    let figures = [
        (
            "prefix cache hit rate, end",
            a.prefix_end,
            b.prefix_end,
            Format::Percent,
        ),
        (
            "prefix cache hit rate, median",
            a.prefix_median,
            b.prefix_median,
            Format::Percent,
        ),
        (
            "spec decode acceptance",
            a.acceptance,
            b.acceptance,
            Format::Percent,
        ),
        ("mean acceptance length", a.length, b.length, Format::Ratio),
        ("KV cache usage, mean", a.kv_mean, b.kv_mean, Format::Percent),
        ("KV cache usage, max", a.kv_max, b.kv_max, Format::Percent),
        ("preemptions", a.preemptions, b.preemptions, Format::Count),
    ];
    for (label, x, y, format) in figures {
        if x.is_none() && y.is_none() {
            continue;
        }
        rows.push(vec![
            label.to_owned(),
            format.show(x),
            format.show(y),
            if format == Format::Ratio {
                ratio(x, y)
            } else {
                "-".into()
            },
        ]);
    }
    format!(
        "{} -> {} (gen tok/s: median (p5-p95) of the lines at each running level)\n{}",
        a.name,
        b.name,
        table::layout(&rows, "  ", First::Left)
    )
}

#[cfg(test)]
mod tests {
    use super::super::analyze;
    use super::super::testing::*;
    use super::*;

    fn json(inputs: &[super::super::LogInput]) -> Value {
        serde_json::to_value(analyze(inputs, &options()).expect("analyze")).expect("json")
    }

    #[test]
    fn two_logs_reports_side_by_side() {
        let a = json(&[fixture("instance-1.log")]);
        let b = json(&[fixture("instance-0.log")]);
        assert!(is_logs_report(&a));
        let table = compare(&a, &b).expect("compare");
        // Paired in order (no name in common); level 1: 87.5 → 82.0 median.
        assert!(table.starts_with("instance-1 -> instance-0"), "{table}");
        let row = table
            .lines()
            .find(|l| l.contains("gen tok/s, 1 running"))
            .expect("row");
        assert!(
            row.contains("87.5 (85.2-89.8)") && row.contains("82.0 (80.0-87.4)") && row.contains("0.94x"),
            "{row}"
        );
        // Level 8 only in the first: a dash.
        let row = table
            .lines()
            .find(|l| l.contains("gen tok/s, 8 running"))
            .expect("row");
        assert!(row.trim_end().ends_with('-'), "{row}");
        let row = table
            .lines()
            .find(|l| l.contains("spec decode acceptance"))
            .expect("row");
        assert!(row.contains("70.6%"), "{row}");
        let row = table
            .lines()
            .find(|l| l.contains("mean acceptance length"))
            .expect("row");
        assert!(row.contains("2.41"), "{row}");
        // Matched by name when names are shared.
        let three = json(&fixtures());
        let table = compare(&three, &json(&[fixture("instance-2.log")])).expect("compare");
        assert!(table.starts_with("instance-2 -> instance-2"), "{table}");
        assert!(
            compare(
                &three,
                &json(&[fixture("instance-0.log"), fixture("instance-1.log")])
            )
            .is_ok()
        );
        assert!(compare(&json(&[fixture("instance-0.log")]), &serde_json::json!({})).is_err());
    }
}

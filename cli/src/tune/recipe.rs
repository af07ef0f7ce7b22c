//! The tuned recipe: a file that `extends` the baseline and sets only what helped, each
//! value with its measured gain and the server metrics that explain it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::{Estimate, Objective, Outcome, Phase, Setting, TrialResult, change};

fn interval(e: &Estimate) -> String {
    if e.n < 2 {
        format!("{:.1} (1 run)", e.mean)
    } else {
        format!("{:.1} (95 % CI {:.1}–{:.1}, {} runs)", e.mean, e.low, e.high, e.n)
    }
}

/// What the tuned recipe says about itself and what it sets.
pub struct TunedRecipe<'a> {
    /// The baseline's path, as `extends` names it (relative to the tuned file).
    pub extends: &'a str,
    /// The tuned recipe's name.
    pub name: &'a str,
    /// The baseline's result.
    pub baseline: &'a TrialResult,
    /// The chosen trial (a lever's or the combination).
    pub chosen: &'a TrialResult,
    /// Each helping lever's own result (for its comment).
    pub helped: &'a [TrialResult],
    /// The objective.
    pub objective: Objective,
    /// A line describing the workload.
    pub workload: &'a str,
    /// For a chosen memory fraction: the next lower fraction that started, as the
    /// out-of-memory fallback.
    pub fallback: Option<String>,
}

/// The tuned recipe's text: `extends` the baseline, sets only what helped, each value
/// with its measured gain in a comment.
pub fn tuned_recipe(t: &TunedRecipe<'_>) -> String {
    let unit = t.objective.unit();
    let key = t.objective.key();
    let mut out = String::new();
    let (Some(base), Some(best)) = (t.baseline.estimate, t.chosen.estimate) else {
        return out;
    };
    let _ = writeln!(
        out,
        "# Tuned by `sous tune` (sous {}) on {}.",
        env!("CARGO_PKG_VERSION"),
        t.workload
    );
    let _ = writeln!(out, "# {key}: baseline {} {unit}", interval(&base));
    let _ = writeln!(
        out,
        "# tuned: {} {unit}, {} ({:.2}x).",
        interval(&best),
        change(base.mean, best.mean),
        best.mean / base.mean
    );
    let _ = writeln!(out, "extends = {}", toml_string(t.extends));
    let _ = writeln!(out, "name = {}", toml_string(t.name));
    // Group the settings by table, each with the gain its lever gave alone.
    let mut tables: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    let mut settings = t.chosen.trial.settings.clone();
    if let Some(fallback) = &t.fallback {
        settings.push(Setting {
            key: "memory.oom_fallback".into(),
            value: format!("[{fallback}]"),
        });
    }
    for s in &settings {
        let (table, leaf) = s.key.rsplit_once('.').unwrap_or(("", s.key.as_str()));
        let alone = t
            .helped
            .iter()
            .find(|r| r.trial.settings.iter().any(|x| x.key == s.key))
            .and_then(|r| r.estimate.map(|e| (r, e)));
        let comment = match alone {
            _ if s.key == "memory.oom_fallback" => {
                "the next fraction down that started, should this one run out of memory".to_owned()
            }
            Some((r, e)) => {
                let mut c = format!(
                    "{} alone: {:.1} -> {:.1} {unit}",
                    change(base.mean, e.mean),
                    base.mean,
                    e.mean
                );
                if let Some(ev) = evidence(&t.baseline.figures, &r.figures) {
                    c.push_str(&format!("; {ev}"));
                }
                c
            }
            None => "set with the lever above".into(),
        };
        tables
            .entry(table.to_owned())
            .or_default()
            .push((leaf.to_owned(), s.value.clone(), comment));
    }
    for (table, entries) in tables {
        let _ = writeln!(out, "\n[{table}]");
        for (leaf, value, comment) in entries {
            let _ = writeln!(out, "# {comment}");
            let _ = writeln!(out, "{leaf} = {}", toml_value(&value));
        }
    }
    out
}

/// The server's metrics that explain a change: prefix hit rate, acceptance, preemptions,
/// KV peak, where they moved.
pub fn evidence(base: &BTreeMap<String, f64>, trial: &BTreeMap<String, f64>) -> Option<String> {
    let mut parts = Vec::new();
    for (key, label, pct) in [
        ("prefix_cache_hit_rate", "prefix-cache hit rate", true),
        ("spec_decode_acceptance_rate", "draft acceptance", true),
        ("preemptions", "preemptions", false),
        ("kv_cache_usage_max", "KV peak", true),
        ("kld_mean", "KL divergence", false),
    ] {
        let (a, b) = (base.get(key).copied(), trial.get(key).copied());
        let show = |v: Option<f64>| match v {
            Some(v) if pct => format!("{:.0} %", v * 100.0),
            Some(v) if key == "kld_mean" => format!("{v:.4}"),
            Some(v) => format!("{v:.0}"),
            None => "-".into(),
        };
        match (a, b) {
            // Only the trial has it (draft acceptance with speculation switched on).
            (None, Some(_)) => parts.push(format!("{label} {}", show(b))),
            (Some(x), None) => parts.push(format!("{label} {} -> none", show(Some(x)))),
            (Some(x), Some(y)) if (x - y).abs() > 1e-9 => {
                parts.push(format!("{label} {} -> {}", show(a), show(b)))
            }
            _ => {}
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A value's text read as TOML (`8`, `true`, `"1GiB"`, `[0.85]`), or as a string when
/// it is a bare word, as `--set` reads it.
pub(super) fn parse_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// A value as a recipe file spells it: TOML as given, or a quoted string for a bare word.
pub(super) fn toml_value(text: &str) -> String {
    match parse_value(text) {
        toml::Value::String(s) if format!("v = {text}").parse::<toml::Table>().is_err() => toml_string(&s),
        _ => text.to_owned(),
    }
}

/// For a chosen memory fraction, the next one down that started (a lever trial that
/// measured): the tuned recipe's out-of-memory fallback.
pub fn fallback(chosen: &TrialResult, all: &[TrialResult]) -> Option<String> {
    let key = "memory.gpu_utilization";
    let setting = chosen.trial.settings.iter().find(|s| s.key == key)?;
    let fraction: f64 = setting.value.parse().ok()?;
    all.iter()
        .filter(|r| r.outcome == Outcome::Ok && r.trial.phase == Phase::Lever)
        .flat_map(|r| r.trial.settings.iter())
        .filter(|s| s.key == key)
        .filter_map(|s| s.value.parse::<f64>().ok())
        .filter(|v| *v < fraction)
        .max_by(f64::total_cmp)
        .map(|v| v.to_string())
}

/// `extends` for a file in `out_dir` naming `base`: relative when they share an
/// ancestor, else absolute.
pub fn relative_extends(base: &Path, out_dir: &Path) -> String {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (base, dir) = (canon(base), canon(out_dir));
    let common = base
        .components()
        .zip(dir.components())
        .take_while(|(a, b)| a == b)
        .count();
    if common <= 1 {
        return base.display().to_string();
    }
    let ups = dir.components().count() - common;
    let mut rel = std::path::PathBuf::new();
    for _ in 0..ups {
        rel.push("..");
    }
    for c in base.components().skip(common) {
        rel.push(c);
    }
    rel.display().to_string()
}

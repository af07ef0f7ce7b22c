//! The eval report: what was measured (the text, the cut, k), each served side's
//! perplexity and task results, and the candidate against the baseline; as JSON for
//! scripts and `sous bench compare`, and as a table.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::harness::TaskResult;
use super::quality::{Comparison, Estimate, Perplexity};
use super::windows::Cut;

/// The text perplexity was measured over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextInfo {
    /// Its file, or `builtin` (chapter I of Alice's Adventures in Wonderland).
    pub name: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
    /// Its tokens.
    pub tokens: usize,
}

/// One served side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Its name in the report: the recipe's name, or the URL.
    pub label: String,
    /// The recipe file, when sous served it.
    pub recipe: Option<String>,
    /// The server's base URL.
    pub url: String,
    /// The model name requests carried.
    pub model: String,
    /// Perplexity over the scored positions.
    pub perplexity: Perplexity,
    /// lm-evaluation-harness results.
    pub tasks: Vec<TaskResult>,
}

/// A whole eval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `eval` (tells `sous bench compare` what it reads).
    pub report: String,
    /// When it ran (UTC, RFC 3339).
    pub date: String,
    /// The text.
    pub text: TextInfo,
    /// How it was cut.
    pub cut: Cut,
    /// Windows scored.
    pub windows: usize,
    /// Top log-probabilities asked per position.
    pub top_k: usize,
    /// The baseline first when there is one, then the candidate.
    pub runs: Vec<Run>,
    /// The candidate against the baseline.
    pub comparison: Option<Comparison>,
}

impl Report {
    /// The candidate's run (the last).
    pub fn candidate(&self) -> Option<&Run> {
        self.runs.last()
    }
}

fn est(e: &Estimate, digits: usize) -> String {
    format!("{:.digits$} ± {:.digits$}", e.value, e.stderr)
}

/// The report as a table.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let scored = r.windows * r.cut.scored_per_window();
    let _ = writeln!(
        out,
        "text: {} ({} tokens); {} windows of {} tokens, {} scored per window from position {}, {} in all; top-{} log-probabilities",
        r.text.name,
        r.text.tokens,
        r.windows,
        r.cut.ctx,
        r.cut.scored_per_window(),
        r.cut.score_from + 1,
        scored,
        r.top_k
    );
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    rows.push((
        "perplexity".into(),
        r.runs
            .iter()
            .map(|run| est(&run.perplexity.perplexity, 4))
            .collect(),
    ));
    if let Some(c) = &r.comparison {
        let blank = || vec![String::new(); r.runs.len() - 1];
        let mut row = |name: &str, value: String| {
            let mut cells = blank();
            cells.push(value);
            rows.push((name.into(), cells));
        };
        row(
            "Δ perplexity",
            format!(
                "{:+.4} ± {:.4} ({:+.2} %)",
                c.delta_perplexity.value,
                c.delta_perplexity.stderr,
                (c.perplexity_ratio.value - 1.0) * 100.0
            ),
        );
        row("KL divergence, mean", est(&c.kld_mean, 6));
        row("KL divergence, p90", format!("{:.6}", c.kld_p90));
        row("KL divergence, p99", format!("{:.6}", c.kld_p99));
        row("KL divergence, max", format!("{:.6}", c.kld_max));
        row(
            "same top token",
            format!(
                "{:.2} ± {:.2} %",
                c.top1_agreement.value * 100.0,
                c.top1_agreement.stderr * 100.0
            ),
        );
        row(
            "mass outside the top-k (mean)",
            format!("{:.4} %", c.unseen_mass_mean * 100.0),
        );
    }
    let mut names: Vec<(String, String, String)> = Vec::new();
    for run in &r.runs {
        for t in &run.tasks {
            for m in &t.metrics {
                let key = (t.task.clone(), m.name.clone(), m.filter.clone());
                if !names.contains(&key) {
                    names.push(key);
                }
            }
        }
    }
    for (task, metric, filter) in names {
        let cells = r
            .runs
            .iter()
            .map(|run| {
                run.tasks
                    .iter()
                    .filter(|t| t.task == task)
                    .flat_map(|t| &t.metrics)
                    .find(|m| m.name == metric && m.filter == filter)
                    .map_or("-".into(), |m| match m.stderr {
                        Some(se) => format!("{:.4} ± {:.4}", m.value, se),
                        None => format!("{:.4}", m.value),
                    })
            })
            .collect();
        let filter = if filter == "none" {
            String::new()
        } else {
            format!(" ({filter})")
        };
        rows.push((format!("{task} {metric}{filter}"), cells));
    }
    let header: Vec<String> = r
        .runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            if r.runs.len() > 1 && i == 0 {
                format!("{} (baseline)", run.label)
            } else {
                run.label.clone()
            }
        })
        .collect();
    let first = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|(_, c)| c[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let _ = write!(out, "\n{:first$}", "");
    for (h, w) in header.iter().zip(&widths) {
        let _ = write!(out, "  {h:>w$}");
    }
    out.push('\n');
    for (name, cells) in rows {
        let _ = write!(out, "{name:first$}");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(out, "  {c:>w$}");
        }
        out.push('\n');
    }
    out.push_str("(± one standard error)\n");
    out
}

/// Whether a JSON report is `sous eval`'s.
pub fn is_eval_report(value: &serde_json::Value) -> bool {
    value["report"] == "eval"
}

/// A figure of a comparison: its name, how to read it, its decimals.
type Figure = (&'static str, fn(&Comparison) -> f64, usize);

/// Two eval reports side by side (`sous bench compare`): each one's candidate, its
/// perplexity, its figures against its baseline, and its task metrics, with b ÷ a.
/// Reports over different texts, cuts or k are refused: their figures do not compare.
pub fn compare(a: &Report, b: &Report) -> Result<String, String> {
    if a.text.sha256 != b.text.sha256 || a.cut != b.cut || a.windows != b.windows {
        return Err(format!(
            "the reports scored different windows ({} in {} windows of {} against {} in {} windows of {})",
            a.text.name, a.windows, a.cut.ctx, b.text.name, b.windows, b.cut.ctx
        ));
    }
    let (Some(ra), Some(rb)) = (a.candidate(), b.candidate()) else {
        return Err("a report without runs".into());
    };
    let mut rows: Vec<(String, Option<f64>, Option<f64>, usize)> = vec![(
        "perplexity".into(),
        Some(ra.perplexity.perplexity.value),
        Some(rb.perplexity.perplexity.value),
        4,
    )];
    let figure = |r: &Report, f: fn(&Comparison) -> f64| r.comparison.as_ref().map(f);
    let figures: [Figure; 5] = [
        ("Δ perplexity vs its baseline", |c| c.delta_perplexity.value, 4),
        ("KL divergence, mean", |c| c.kld_mean.value, 6),
        ("KL divergence, p99", |c| c.kld_p99, 6),
        ("same top token (%)", |c| c.top1_agreement.value * 100.0, 2),
        ("mass outside the top-k (%)", |c| c.unseen_mass_mean * 100.0, 4),
    ];
    for (name, f, digits) in figures {
        if a.comparison.is_some() || b.comparison.is_some() {
            rows.push((name.into(), figure(a, f), figure(b, f), digits));
        }
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    for t in ra.tasks.iter().chain(&rb.tasks) {
        for m in &t.metrics {
            let key = (t.task.clone(), m.name.clone());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    let metric = |run: &Run, task: &str, name: &str| {
        run.tasks
            .iter()
            .filter(|t| t.task == task)
            .flat_map(|t| &t.metrics)
            .find(|m| m.name == name)
            .map(|m| m.value)
    };
    for (task, name) in keys {
        rows.push((
            format!("{task} {name}"),
            metric(ra, &task, &name),
            metric(rb, &task, &name),
            4,
        ));
    }
    let baseline = |r: &Report| {
        r.comparison
            .as_ref()
            .and_then(|_| r.runs.first())
            .map_or(String::new(), |b| format!(" (against {})", b.label))
    };
    let mut out = format!(
        "a: {}{}\nb: {}{}\n\n| measure | a | b | b ÷ a |\n|---|---:|---:|---:|\n",
        ra.label,
        baseline(a),
        rb.label,
        baseline(b)
    );
    for (name, x, y, digits) in rows {
        let cell = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.digits$}"));
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.3}", y / x),
            _ => "-".into(),
        };
        let _ = writeln!(out, "| {name} | {} | {} | {ratio} |", cell(x), cell(y));
    }
    Ok(out)
}

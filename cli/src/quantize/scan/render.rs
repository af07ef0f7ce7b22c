//! A scan's report as people read it, and its proposal written into a recipe.

use std::fmt::Write as _;
use std::path::Path;

use sous_engine::size::human;

use super::super::error::QuantizeError;
use super::{Configuration, ScanReport};

/// Groups listed in the human report; `--json` lists them all.
const LISTED: usize = 24;

/// The report as a table.
pub fn render(report: &ScanReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scan of {} ({}): {} tokens of the built-in text; KL divergence from the unquantized model, nats per token",
        report.model.display(),
        report.architecture,
        report.tokens
    );
    let _ = writeln!(out);
    let width = report
        .groups
        .iter()
        .map(|g| g.group.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        out,
        "{:<width$}  {:>9}  {:>9}  {:>9}  {:>6}",
        "group", "16-bit", "NVFP4", "KL alone", "top-1"
    );
    for g in report.groups.iter().take(LISTED) {
        let note = if g.group.default_quantized {
            ""
        } else {
            "  (kept by default)"
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:>9}  {:>9}  {:>9.5}  {:>5.1}%{note}",
            g.group.name,
            human(g.group.bytes_source),
            human(g.group.bytes_nvfp4),
            g.alone.kld,
            100.0 * g.alone.top1,
        );
    }
    if report.groups.len() > LISTED {
        let _ = writeln!(
            out,
            "… and {} more (--json lists them all)",
            report.groups.len() - LISTED
        );
    }
    let _ = writeln!(out);
    let mut rows: Vec<&Configuration> = report.configurations.iter().collect();
    // The search's probes, the size and divergence curve it walked (the proposal aside).
    let chosen = report.proposal.as_ref().map(|p| p.configuration.kept.len());
    rows.extend(
        report
            .probes
            .iter()
            .filter(|p| Some(p.kept.len()) != chosen && !p.kept.is_empty()),
    );
    let proposed;
    if let Some(p) = &report.proposal {
        let target = match (report.max_kld, report.max_bytes) {
            (Some(kld), Some(bytes)) => format!("--max-kld {kld}, --max-size {}", human(bytes)),
            (Some(kld), None) => format!("--max-kld {kld}"),
            (None, Some(bytes)) => format!("--max-size {}", human(bytes)),
            (None, None) => String::new(),
        };
        proposed = Configuration {
            name: format!("proposed: {} groups kept ({target})", p.configuration.kept.len()),
            ..p.configuration.clone()
        };
        rows.push(&proposed);
    }
    let width = rows.iter().map(|c| c.name.len()).max().unwrap_or(13).max(13);
    let _ = writeln!(
        out,
        "{:<width$}  {:>9}  {:>9}  {:>6}",
        "configuration", "size", "KL", "top-1"
    );
    for c in rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:>9}  {:>9.5}  {:>5.1}%",
            c.name,
            human(c.bytes),
            c.divergence.kld,
            100.0 * c.divergence.top1
        );
    }
    let _ = writeln!(out);
    match &report.proposal {
        Some(p) => {
            if !p.met {
                let _ = writeln!(
                    out,
                    "no configuration meets every target; this is the closest within the size"
                );
            }
            let entries: Vec<String> = p
                .ignore
                .iter()
                .map(|e| toml_edit::Value::from(e.as_str()).to_string())
                .collect();
            let _ = writeln!(out, "proposed quantize.ignore = [{}]", entries.join(", "));
        }
        None => {
            let _ = writeln!(out, "give --max-kld or --max-size for a proposed quantize.ignore");
        }
    }
    out
}

/// Sets `quantize.ignore` of the recipe file at `path` to `ignore`, keeping the rest of
/// the file (comments, order) as it is.
pub fn write_ignore(path: &Path, ignore: &[String]) -> Result<(), QuantizeError> {
    let bad = |message: String| QuantizeError::Scan { message };
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("cannot read the recipe `{}`: {e}", path.display())))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| bad(format!("the recipe `{}` does not parse: {e}", path.display())))?;
    let Some(quantize) = doc
        .get_mut("quantize")
        .and_then(toml_edit::Item::as_table_like_mut)
    else {
        return Err(bad(format!(
            "the recipe `{}` has no [quantize] table to write `ignore` into",
            path.display()
        )));
    };
    let mut array = toml_edit::Array::new();
    for entry in ignore {
        array.push(entry.as_str());
    }
    quantize.insert("ignore", toml_edit::value(array));
    sous_engine::atomic::write_file(path, doc.to_string().as_bytes())
        .map_err(|e| bad(format!("cannot write the recipe `{}`: {e}", path.display())))
}

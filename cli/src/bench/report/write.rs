//! The files of `--out DIR`: `<workload>.json` (the document), `<workload>.csv` and the
//! SVG charts, each written atomically. Not here: what goes in them.

use std::path::{Path, PathBuf};

use super::{Report, csv};
use crate::bench::BenchError;

/// What [`write`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The JSON document.
    pub json: PathBuf,
    /// The CSV.
    pub csv: PathBuf,
    /// The charts.
    pub charts: Vec<PathBuf>,
}

/// Writes `report` into `dir` (created if need be); `percentiles` are the CSV's columns.
pub fn write(dir: &Path, report: &Report, percentiles: &[f64]) -> Result<Written, BenchError> {
    let text = report.to_json().map_err(BenchError::Json)?;
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    let json = dir.join(format!("{}.json", report.workload));
    let csv_path = dir.join(format!("{}.csv", report.workload));
    for (path, contents) in [(&json, text), (&csv_path, csv(&report.levels, percentiles))] {
        sous_engine::atomic::write_file(path, contents.as_bytes()).map_err(|source| BenchError::Write {
            path: path.clone(),
            source,
        })?;
    }
    let charts =
        crate::bench::charts::draw(dir, report.workload, &report.levels).map_err(BenchError::Charts)?;
    Ok(Written {
        json,
        csv: csv_path,
        charts,
    })
}

//! `sous bench compare A B`: which kind of report two JSON documents are (`sous eval`'s,
//! `sous bench logs`'s, or an active workload's) and the table that puts them side by
//! side, made by that kind's own comparison.
//!
//! Not here: reading the files (the command) or the tables themselves
//! ([`crate::eval::report::compare`], [`crate::bench::logs::compare`],
//! [`crate::bench::report::compare`]).

use std::path::Path;

use serde_json::Value;

use crate::bench::logs::compare as logs_compare;
use crate::bench::report;
use crate::eval::report as eval_report;

/// Why two reports do not compare, and what to compare instead.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CompareError {
    /// What is wrong.
    pub message: String,
    /// Which reports do compare.
    pub hint: &'static str,
}

impl CompareError {
    fn new(message: impl Into<String>, hint: &'static str) -> CompareError {
        CompareError {
            message: message.into(),
            hint,
        }
    }
}

/// The table comparing report `a` with report `b`, each given with the path it was
/// read from (for errors). Either one being an eval report makes both eval reports;
/// else either one being a logs report makes it a logs comparison (the other may be an
/// active report); else both are active reports.
pub fn compare(a: (&Path, Value), b: (&Path, Value)) -> Result<String, CompareError> {
    let ((a_path, a), (b_path, b)) = (a, b);
    if eval_report::is_eval_report(&a) || eval_report::is_eval_report(&b) {
        let hint = "compare two reports of `sous eval --json` (or --out DIR's eval.json)";
        let parse = |v: Value, path: &Path| {
            serde_json::from_value::<eval_report::Report>(v).map_err(|e| {
                CompareError::new(
                    format!("{} is not a `sous eval` report: {e}", path.display()),
                    hint,
                )
            })
        };
        let (a, b) = (parse(a, a_path)?, parse(b, b_path)?);
        return eval_report::compare(&a, &b).map_err(|e| CompareError::new(e, hint));
    }
    if logs_compare::is_logs_report(&a) || logs_compare::is_logs_report(&b) {
        return logs_compare::compare(&a, &b).map_err(|e| {
            CompareError::new(
                e,
                "compare two `sous bench logs --json` reports, or one and an active report",
            )
        });
    }
    report::compare(&a, &b)
        .map_err(|e| CompareError::new(e, "compare two reports of `sous bench sweep --out DIR`"))
}

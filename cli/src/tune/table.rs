//! The tune's report as a terminal table: every trial with its runs, its objective and
//! interval, its change against the baseline and the server metrics that explain it.

use super::{Objective, Outcome, Phase, TrialResult, change, evidence};
use crate::bench::table::layout_left;

/// The report's table: every trial with its runs, objective, change and evidence.
pub fn table(results: &[TrialResult], baseline: &TrialResult, objective: Objective) -> String {
    let unit = objective.unit();
    let mut rows = vec![vec![
        "TRIAL".to_owned(),
        "PHASE".into(),
        "OUTCOME".into(),
        format!("{} ({unit})", objective.key()),
        "95 % CI".into(),
        "VS BASELINE".into(),
        "EVIDENCE".into(),
    ]];
    let base_mean = baseline.estimate.map(|e| e.mean);
    for r in results {
        let (mean, ci) = match r.estimate {
            Some(e) if e.n >= 2 => (
                format!("{:.1}", e.mean),
                format!("{:.1}–{:.1} ({} runs)", e.low, e.high, e.n),
            ),
            Some(e) => (format!("{:.1}", e.mean), "1 run".into()),
            None => ("-".into(), "-".into()),
        };
        let vs = match (base_mean, r.estimate) {
            (Some(b), Some(e)) if r.trial.phase != Phase::Baseline => change(b, e.mean),
            _ => "-".into(),
        };
        // The first line of why (the JSON report has all of it).
        let why = r
            .message
            .as_deref()
            .and_then(|m| m.lines().next())
            .unwrap_or_default();
        let outcome = match r.outcome {
            Outcome::Ok => "ok".to_owned(),
            Outcome::Oom => format!("out of memory: {why}"),
            Outcome::SloBreach => format!("SLO: {why}"),
            Outcome::Failed => format!("failed: {why}"),
            Outcome::Unfit => format!("does not fit: {why}"),
            Outcome::QualityGate => format!("quality: {why}"),
        };
        let outcome: String = if outcome.chars().count() > 60 {
            outcome.chars().take(59).chain(['…']).collect()
        } else {
            outcome
        };
        let phase = match r.trial.phase {
            Phase::Baseline => "baseline",
            Phase::Lever => "lever",
            Phase::Combination => "combined",
        };
        rows.push(vec![
            r.trial.id.clone(),
            phase.into(),
            outcome,
            mean,
            ci,
            vs,
            evidence(&baseline.figures, &r.figures).unwrap_or_else(|| "-".into()),
        ]);
    }
    layout_left(&rows, "", 7)
}

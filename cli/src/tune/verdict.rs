//! What the runs say: a trial's samples folded into a mean and its 95 % interval
//! ([`Estimate`], [`TrialResult`]), each lever judged against the baseline
//! ([`Verdict`]), and the trial that combines the levers that helped.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Lever, Objective, Outcome, Phase, Sample, Trial};

/// A mean and its 95 % confidence interval (Student's t over the runs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    /// Runs.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Estimate {
    /// The estimate of `values`; one value has no interval (both ends infinite).
    pub fn of(values: &[f64]) -> Option<Estimate> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Estimate {
                n,
                mean,
                low: f64::NEG_INFINITY,
                high: f64::INFINITY,
            });
        }
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t95(n - 1) * (var / n as f64).sqrt();
        Some(Estimate {
            n,
            mean,
            low: mean - half,
            high: mean + half,
        })
    }

    /// Whether this is better than `other` beyond doubt: the intervals do not overlap.
    pub fn beats(&self, other: &Estimate, higher_is_better: bool) -> bool {
        if higher_is_better {
            self.low > other.high
        } else {
            self.high < other.low
        }
    }
}

/// The two-sided 95 % quantile of Student's t with `df` degrees of freedom (tabulated;
/// the normal's 1.96 beyond 30).
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042,
    ];
    TABLE.get(df.saturating_sub(1)).copied().unwrap_or(1.96)
}

/// What the samples say about one trial.
#[derive(Debug, Clone, Serialize)]
pub struct TrialResult {
    /// The trial.
    pub trial: Trial,
    /// `ok` when every run was; else the first run's failure.
    pub outcome: Outcome,
    /// The objective over its successful runs.
    pub estimate: Option<Estimate>,
    /// Its figures, averaged over the runs.
    pub figures: BTreeMap<String, f64>,
    /// The first failure's message.
    pub message: Option<String>,
}

/// Folds the samples of `trial`.
pub fn result(trial: &Trial, samples: &[Sample]) -> TrialResult {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.trial == trial.id).collect();
    let failure = mine.iter().find(|s| s.outcome != Outcome::Ok);
    let values: Vec<f64> = mine
        .iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .filter_map(|s| s.value)
        .collect();
    let mut figures: BTreeMap<String, f64> = BTreeMap::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in &mine {
        for (k, v) in &s.figures {
            *figures.entry(k.clone()).or_default() += v;
            *counts.entry(k.clone()).or_default() += 1;
        }
    }
    for (k, v) in figures.iter_mut() {
        *v /= counts.get(k).copied().unwrap_or(1) as f64;
    }
    TrialResult {
        trial: trial.clone(),
        outcome: failure.map_or(Outcome::Ok, |s| s.outcome),
        estimate: Estimate::of(&values),
        figures,
        message: failure.and_then(|s| s.message.clone()),
    }
}

/// Which lever helped, and the best value of each.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Per lever that helped: its best trial (beats the baseline beyond doubt).
    pub helped: Vec<TrialResult>,
    /// Levers that did not (their best trial, if any ran), with why.
    pub not_helped: Vec<(String, String)>,
    /// Levers whose best alternative overlaps the baseline: more runs could decide.
    pub undecided: Vec<String>,
}

/// Judges every lever against the baseline.
pub fn judge(
    baseline: &TrialResult,
    levers: &[Lever],
    results: &[TrialResult],
    objective: Objective,
) -> Verdict {
    let better = objective.higher_is_better();
    let mut verdict = Verdict {
        helped: Vec::new(),
        not_helped: Vec::new(),
        undecided: Vec::new(),
    };
    let Some(base) = baseline.estimate else {
        return verdict;
    };
    for lever in levers {
        let mine: Vec<&TrialResult> = results
            .iter()
            .filter(|r| r.trial.lever.as_deref() == Some(lever.key.as_str()) && r.trial.phase == Phase::Lever)
            .collect();
        let usable: Vec<&&TrialResult> = mine
            .iter()
            .filter(|r| r.outcome == Outcome::Ok && r.estimate.is_some())
            .collect();
        let best = usable.iter().max_by(|a, b| {
            let (x, y) = (
                a.estimate.map_or(0.0, |e| e.mean),
                b.estimate.map_or(0.0, |e| e.mean),
            );
            if better { x.total_cmp(&y) } else { y.total_cmp(&x) }
        });
        match best {
            Some(best) if best.estimate.is_some_and(|e| e.beats(&base, better)) => {
                verdict.helped.push((**best).clone())
            }
            // Neither better nor worse beyond doubt: more runs may tell.
            Some(best) if best.estimate.is_some_and(|e| !base.beats(&e, better)) => {
                verdict.undecided.push(lever.key.clone());
                verdict.not_helped.push((
                    lever.key.clone(),
                    "not told apart from the baseline by the runs".into(),
                ));
            }
            Some(_) => verdict
                .not_helped
                .push((lever.key.clone(), "worse than the baseline".into())),
            None if mine.is_empty() => verdict.not_helped.push((
                lever.key.clone(),
                "nothing to try: the baseline already sets it".into(),
            )),
            None => verdict.not_helped.push((
                lever.key.clone(),
                "every alternative failed (out of memory, SLO or start-up)".into(),
            )),
        }
    }
    verdict
}

/// The combination trial of the levers that helped (none for fewer than two).
pub fn combination(verdict: &Verdict) -> Option<Trial> {
    (verdict.helped.len() >= 2).then(|| {
        Trial::new(
            Phase::Combination,
            None,
            verdict
                .helped
                .iter()
                .flat_map(|r| r.trial.settings.clone())
                .collect(),
        )
    })
}

/// `+45 %` or `-12 %`, how `value` moved from `base`.
pub fn change(base: f64, value: f64) -> String {
    if base == 0.0 {
        return "n/a".into();
    }
    format!("{:+.0} %", (value / base - 1.0) * 100.0)
}

//! The tune's search, as a loop over trials that knows nothing of servers or terminals:
//! the baseline and each lever alone, more runs where a lever's best alternative and
//! the baseline cannot be told apart, then the levers that helped, together.
//!
//! Serving a trial and measuring it is the caller's [`Bench`]; every run it measures is
//! in the [`Journal`], which is also how a resumed tune skips what an earlier one
//! measured and never restarts a trial that could not start.

use std::future::Future;

use serde::Serialize;

use super::journal::{Journal, JournalError};
use super::{Lever, Objective, Outcome, Trial, TrialResult, Verdict, combination, judge, result};

/// Whether the tune's time budget lasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Everything asked was measured.
    Left,
    /// The budget ran out first: the tune goes on with what was measured.
    Spent,
}

/// What serves a trial and measures its runs.
pub trait Bench {
    /// What stops the whole tune (a run that fails is a [`super::Sample`], not an error).
    type Error: From<SearchError> + From<JournalError>;

    /// Serves `trial` and measures its runs `runs` (indices the journal lacks, never
    /// empty), recording each run in `journal` as it ends; a trial that cannot start
    /// records one sample that says why.
    fn measure(
        &mut self,
        trial: &Trial,
        runs: &[usize],
        journal: &mut Journal,
    ) -> impl Future<Output = Result<Budget, Self::Error>>;
}

/// Why the search stopped without a verdict.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The baseline did not measure, so nothing can be compared with it.
    #[error("the baseline itself did not measure ({outcome:?}): {message}")]
    Baseline {
        /// How its run ended.
        outcome: Outcome,
        /// Why.
        message: String,
    },
}

impl sous_engine::diagnose::Diagnose for SearchError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        Some(
            "fix the baseline recipe (`sous serve --recipe` it once), then run the tune again with --fresh"
                .into(),
        )
    }
}

/// What to search: the first pass's trials (the baseline first), the levers they move,
/// and how many runs each trial gets.
#[derive(Debug, Clone, Copy)]
pub struct Search<'a> {
    /// The baseline, then each lever's alternatives ([`super::first_pass`]).
    pub trials: &'a [Trial],
    /// The levers.
    pub levers: &'a [Lever],
    /// What is improved.
    pub objective: Objective,
    /// Measured runs per trial.
    pub runs: usize,
    /// Most runs of a trial while its interval and the baseline's overlap.
    pub max_runs: usize,
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct Findings {
    /// The first pass's results, in the order of [`Search::trials`] (the baseline first).
    pub results: Vec<TrialResult>,
    /// The combination of the levers that helped, when two or more did.
    pub combined: Option<TrialResult>,
    /// Which levers helped.
    pub verdict: Verdict,
    /// The best that beat the baseline: a lever's best trial, or the combination when it
    /// is better still.
    pub chosen: Option<TrialResult>,
    /// Whether the budget ran out.
    pub exhausted: bool,
}

/// The gain the tune predicts for its chosen trial: the ratio of the means, and the
/// range their 95 % intervals allow.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    /// Chosen over baseline.
    pub ratio: f64,
    /// The lowest ratio the intervals allow.
    pub low: f64,
    /// The highest.
    pub high: f64,
}

impl Findings {
    /// The baseline's result.
    pub fn baseline(&self) -> &TrialResult {
        &self.results[0]
    }

    /// Every trial's result, the combination last.
    pub fn all(&self) -> Vec<TrialResult> {
        self.results.iter().chain(&self.combined).cloned().collect()
    }

    /// The ids of the levers' trials that helped.
    pub fn helped(&self) -> Vec<String> {
        self.verdict.helped.iter().map(|r| r.trial.id.clone()).collect()
    }

    /// What the chosen trial is predicted to gain (none without a chosen trial, or with a
    /// baseline whose interval reaches zero).
    pub fn prediction(&self) -> Option<Prediction> {
        let (b, c) = (self.baseline().estimate?, self.chosen.as_ref()?.estimate?);
        if b.mean <= 0.0 || b.low <= 0.0 {
            return None;
        }
        Some(Prediction {
            ratio: c.mean / b.mean,
            low: (c.low / b.high).max(0.0),
            high: c.high / b.low,
        })
    }
}

impl Search<'_> {
    /// Runs the search, measuring through `bench` what `journal` lacks.
    pub async fn run<B: Bench>(&self, bench: &mut B, journal: &mut Journal) -> Result<Findings, B::Error> {
        let mut exhausted = false;
        // First pass: the baseline, then each lever alone (none if the baseline failed:
        // every trial would start the same way and fail again).
        for (i, trial) in self.trials.iter().enumerate() {
            exhausted |= measure(bench, trial, 0..self.runs, journal).await? == Budget::Spent;
            if i == 0 {
                let baseline = result(trial, &journal.samples);
                if baseline.outcome != Outcome::Ok || baseline.estimate.is_none() {
                    return Err(SearchError::Baseline {
                        outcome: baseline.outcome,
                        message: baseline.message.unwrap_or_else(|| "no run finished".into()),
                    }
                    .into());
                }
            }
        }
        let mut results = self.results(journal);
        let mut verdict = judge(&results[0], self.levers, &results, self.objective);
        // More runs where a lever's best alternative and the baseline overlap.
        let mut runs = self.runs;
        while !verdict.undecided.is_empty() && runs < self.max_runs && !exhausted {
            runs += 1;
            let mut again = vec![self.trials[0].clone()];
            for key in &verdict.undecided {
                if let Some(best) = self.best_of(&results, key) {
                    again.push(best.trial.clone());
                }
            }
            for trial in &again {
                exhausted |= measure(bench, trial, runs - 1..runs, journal).await? == Budget::Spent;
            }
            results = self.results(journal);
            verdict = judge(&results[0], self.levers, &results, self.objective);
        }
        // The levers that helped, together.
        let mut chosen = self.best(verdict.helped.iter()).cloned();
        let mut combined = None;
        if let Some(trial) = combination(&verdict) {
            if !exhausted {
                exhausted |= measure(bench, &trial, 0..self.runs, journal).await? == Budget::Spent;
            }
            let r = result(&trial, &journal.samples);
            if let (Some(c), Some(best)) = (r.estimate, chosen.as_ref().and_then(|b| b.estimate))
                && r.outcome == Outcome::Ok
                && self.better(c.mean, best.mean)
            {
                chosen = Some(r.clone());
            }
            combined = Some(r);
        }
        Ok(Findings {
            results,
            combined,
            verdict,
            chosen,
            exhausted,
        })
    }

    fn results(&self, journal: &Journal) -> Vec<TrialResult> {
        self.trials.iter().map(|t| result(t, &journal.samples)).collect()
    }

    /// The best trial of lever `key` by mean, among those that measured.
    fn best_of<'r>(&self, results: &'r [TrialResult], key: &str) -> Option<&'r TrialResult> {
        self.best(
            results
                .iter()
                .filter(|r| r.trial.lever.as_deref() == Some(key) && r.outcome == Outcome::Ok),
        )
    }

    /// The result with the best mean, of those with an estimate.
    fn best<'r>(&self, results: impl Iterator<Item = &'r TrialResult>) -> Option<&'r TrialResult> {
        results.filter(|r| r.estimate.is_some()).max_by(|a, b| {
            let (x, y) = (
                a.estimate.map_or(0.0, |e| e.mean),
                b.estimate.map_or(0.0, |e| e.mean),
            );
            if self.objective.higher_is_better() {
                x.total_cmp(&y)
            } else {
                y.total_cmp(&x)
            }
        })
    }

    /// Whether mean `a` is better than mean `b` for the objective.
    fn better(&self, a: f64, b: f64) -> bool {
        if self.objective.higher_is_better() {
            a > b
        } else {
            a < b
        }
    }
}

/// Measures the runs of `trial` in `runs` that the journal lacks, unless the trial
/// already failed to start (it would fail again).
async fn measure<B: Bench>(
    bench: &mut B,
    trial: &Trial,
    runs: std::ops::Range<usize>,
    journal: &mut Journal,
) -> Result<Budget, B::Error> {
    let missing: Vec<usize> = runs.filter(|r| !journal.has(&trial.id, *r)).collect();
    let failed = journal.samples.iter().any(|s| {
        s.trial == trial.id
            && matches!(
                s.outcome,
                Outcome::Oom | Outcome::Failed | Outcome::Unfit | Outcome::QualityGate
            )
    });
    if missing.is_empty() || failed {
        return Ok(Budget::Left);
    }
    bench.measure(trial, &missing, journal).await
}

#[cfg(test)]
mod tests;

//! The search driven by a scripted bench: which trials it measures, how often, what it
//! chooses, and how it resumes, stops on its budget and refuses a failed baseline.

use std::collections::BTreeMap;

use super::*;
use crate::tune::journal::Header;
use crate::tune::{Lever, Phase, Sample, Setting, first_pass};

/// A bench whose trials measure what a table says: per trial id, the value of each run,
/// or how the trial fails to start. It records what it was asked.
struct Scripted {
    values: BTreeMap<String, Vec<f64>>,
    fails: BTreeMap<String, Outcome>,
    /// Calls of `measure` before the budget is spent (none: never).
    budget: Option<usize>,
    asked: Vec<(String, Vec<usize>)>,
}

impl Scripted {
    fn new(values: &[(&str, &[f64])]) -> Scripted {
        Scripted {
            values: values
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
            fails: BTreeMap::new(),
            budget: None,
            asked: Vec::new(),
        }
    }

    fn runs_of(&self, id: &str) -> Vec<usize> {
        self.asked
            .iter()
            .filter(|(t, _)| t == id)
            .flat_map(|(_, r)| r.iter().copied())
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl Bench for Scripted {
    type Error = TestError;

    async fn measure(
        &mut self,
        trial: &Trial,
        runs: &[usize],
        journal: &mut Journal,
    ) -> Result<Budget, TestError> {
        if self.budget.is_some_and(|b| self.asked.len() >= b) {
            return Ok(Budget::Spent);
        }
        self.asked.push((trial.id.clone(), runs.to_vec()));
        if let Some(outcome) = self.fails.get(&trial.id) {
            journal.record(sample(&trial.id, runs[0], *outcome, None))?;
            return Ok(Budget::Left);
        }
        for &r in runs {
            let values = &self.values[&trial.id];
            journal.record(sample(&trial.id, r, Outcome::Ok, Some(values[r % values.len()])))?;
        }
        Ok(Budget::Left)
    }
}

fn sample(trial: &str, run: usize, outcome: Outcome, value: Option<f64>) -> Sample {
    Sample {
        trial: trial.into(),
        run,
        outcome,
        value,
        message: (outcome != Outcome::Ok).then(|| format!("{outcome:?}")),
        figures: BTreeMap::new(),
    }
}

fn lever(key: &str, values: &[&str]) -> Lever {
    Lever {
        key: key.into(),
        values: values
            .iter()
            .map(|v| {
                vec![Setting {
                    key: key.into(),
                    value: (*v).into(),
                }]
            })
            .collect(),
    }
}

fn journal(dir: &tempfile::TempDir) -> Journal {
    let header = Header {
        fingerprint: "test".into(),
        describes: "a scripted tune".into(),
    };
    Journal::open(&dir.path().join("journal.jsonl"), &header, false).expect("journal")
}

fn search<'a>(trials: &'a [Trial], levers: &'a [Lever]) -> Search<'a> {
    Search {
        trials,
        levers,
        objective: Objective::OutputThroughput,
        runs: 3,
        max_runs: 5,
    }
}

fn run<B: Bench>(search: &Search<'_>, bench: &mut B, journal: &mut Journal) -> Result<Findings, B::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(search.run(bench, journal))
}

const SEQS: &str = "serving.max_num_seqs=16";
const CACHE: &str = "serving.prefix_caching=true";
const BLOCK: &str = "serving.block_size=32";

/// Two levers that help clearly and one that makes no difference.
fn three_levers() -> (Vec<Lever>, Vec<Trial>) {
    let levers = vec![
        lever("serving.max_num_seqs", &["16"]),
        lever("serving.prefix_caching", &["true"]),
        lever("serving.block_size", &["32"]),
    ];
    let trials = first_pass(&levers, |_| None);
    (levers, trials)
}

const BASELINE: &[f64] = &[100.0, 101.0, 99.0];

/// A bench where the baseline measures about 100, `serving.max_num_seqs=16` 150 and
/// prefix caching 120 (both clear of the baseline), the block size and the combination
/// as given.
fn clear_gains(block: &[f64], combined: &[f64]) -> Scripted {
    Scripted::new(&[
        ("baseline", BASELINE),
        (SEQS, &[150.0, 151.0, 149.0]),
        (CACHE, &[120.0, 121.0, 119.0]),
        (BLOCK, block),
        (&format!("{SEQS}; {CACHE}"), combined),
    ])
}

/// The three-lever search against `bench`, with a fresh journal.
fn tune(bench: &mut Scripted) -> Result<Findings, TestError> {
    let (levers, trials) = three_levers();
    let dir = tempfile::tempdir().expect("tempdir");
    run(&search(&trials, &levers), bench, &mut journal(&dir))
}

#[test]
fn levers_that_clear_the_baseline_are_combined_and_the_best_is_chosen() {
    let mut bench = clear_gains(&[90.0, 110.0, 100.0], &[170.0, 171.0, 169.0]);
    let found = tune(&mut bench).expect("search");

    let helped = found.helped();
    assert_eq!(helped, vec![SEQS.to_owned(), CACHE.to_owned()]);
    // The undecided lever was measured again, with the baseline, up to --max-runs.
    assert_eq!(bench.runs_of(BLOCK), vec![0, 1, 2, 3, 4]);
    assert_eq!(bench.runs_of("baseline"), vec![0, 1, 2, 3, 4]);
    assert_eq!(bench.runs_of(SEQS), vec![0, 1, 2]);
    assert!(found.verdict.undecided.contains(&"serving.block_size".to_owned()));
    let combined = found.combined.as_ref().expect("the combination ran");
    assert_eq!(combined.trial.phase, Phase::Combination);
    assert_eq!(
        found.chosen.as_ref().map(|c| c.trial.id.as_str()),
        Some(combined.trial.id.as_str())
    );
    let p = found.prediction().expect("a prediction");
    assert!((p.ratio - 1.7).abs() < 0.02, "{p:?}");
    assert!(p.low < p.ratio && p.ratio < p.high);
    assert!(!found.exhausted);
    assert_eq!(found.all().len(), three_levers().1.len() + 1);
}

#[test]
fn a_combination_worse_than_its_best_lever_is_measured_but_not_chosen() {
    let mut bench = clear_gains(&[80.0, 81.0, 79.0], &[140.0, 141.0, 139.0]);
    let found = tune(&mut bench).expect("search");
    assert_eq!(found.chosen.map(|c| c.trial.id), Some(SEQS.to_owned()));
    assert!(found.combined.is_some());
    // A lever worse beyond doubt is decided in three runs.
    assert_eq!(bench.runs_of(BLOCK), vec![0, 1, 2]);
    assert!(found.verdict.undecided.is_empty());
}

#[test]
fn a_resumed_search_measures_nothing_twice_and_finds_the_same() {
    let (levers, trials) = three_levers();
    let values: &[(&str, &[f64])] = &[
        ("baseline", BASELINE),
        (SEQS, &[150.0, 151.0, 149.0]),
        (CACHE, &[100.0, 101.0, 99.5]),
        (BLOCK, &[50.0]),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Scripted::new(values);
    let before = run(&search(&trials, &levers), &mut first, &mut journal(&dir)).expect("first");
    let mut again = Scripted::new(values);
    let after = run(&search(&trials, &levers), &mut again, &mut journal(&dir)).expect("resumed");
    assert!(again.asked.is_empty(), "measured again: {:?}", again.asked);
    assert_eq!(
        before.chosen.map(|c| c.trial.id),
        after.chosen.map(|c| c.trial.id)
    );
    assert_eq!(before.verdict.not_helped, after.verdict.not_helped);
}

#[test]
fn a_trial_that_could_not_start_is_not_started_again() {
    let mut bench = Scripted::new(&[
        ("baseline", BASELINE),
        (CACHE, &[100.0, 120.0, 80.0]),
        (BLOCK, &[100.0]),
    ]);
    bench.fails.insert(SEQS.into(), Outcome::Oom);
    let found = tune(&mut bench).expect("search");
    assert_eq!(
        bench.runs_of(SEQS),
        vec![0, 1, 2],
        "asked once, for its first runs"
    );
    assert_eq!(bench.asked.iter().filter(|(t, _)| t == SEQS).count(), 1);
    let seqs = found.results.iter().find(|r| r.trial.id == SEQS).expect("seqs");
    assert_eq!(seqs.outcome, Outcome::Oom);
    assert!(found.chosen.is_none());
    assert!(
        found
            .verdict
            .not_helped
            .iter()
            .any(|(k, why)| k == "serving.max_num_seqs" && why.contains("failed"))
    );
}

#[test]
fn when_the_budget_runs_out_the_search_decides_on_what_was_measured() {
    let mut bench = clear_gains(&[90.0, 110.0, 100.0], &[170.0]);
    bench.budget = Some(3);
    let found = tune(&mut bench).expect("search");
    assert!(found.exhausted);
    assert_eq!(bench.asked.len(), 3, "{:?}", bench.asked);
    // Two levers helped, but their combination was never started.
    assert_eq!(found.helped().len(), 2);
    assert!(found.combined.as_ref().is_some_and(|c| c.estimate.is_none()));
    assert_eq!(found.chosen.map(|c| c.trial.id), Some(SEQS.to_owned()));
}

#[test]
fn a_baseline_that_does_not_measure_stops_the_search_before_any_lever() {
    let mut bench = Scripted::new(&[]);
    bench.fails.insert("baseline".into(), Outcome::Failed);
    let err = tune(&mut bench).expect_err("no baseline");
    assert!(matches!(
        err,
        TestError::Search(SearchError::Baseline {
            outcome: Outcome::Failed,
            ..
        })
    ));
    assert_eq!(bench.asked.len(), 1);
}

#[test]
fn for_a_latency_objective_lower_is_better() {
    let levers = vec![lever("serving.max_num_seqs", &["16", "64"])];
    let trials = first_pass(&levers, |_| None);
    let mut bench = Scripted::new(&[
        ("baseline", &[20.0, 20.5, 19.5]),
        (SEQS, &[15.0, 15.2, 14.8]),
        ("serving.max_num_seqs=64", &[30.0, 30.5, 29.5]),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = search(&trials, &levers);
    s.objective = Objective::Tpot;
    let found = run(&s, &mut bench, &mut journal(&dir)).expect("search");
    assert_eq!(found.chosen.map(|c| c.trial.id), Some(SEQS.to_owned()));
}

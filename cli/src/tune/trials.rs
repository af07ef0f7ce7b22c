//! Each trial of a tune, served and measured: the baseline recipe with the trial's
//! values ([`recipe`]), `sous plan`'s bound on the memory settings ([`fit()`]), and the
//! search's [`Bench`] ([`Trials`]), which serves a trial through the pipeline (as
//! `sous bench --recipe` serves), warms it, applies the quality gate and measures its
//! runs with `sous bench`'s runner, journaling each run as it ends.
//!
//! A trial that cannot start, that `sous plan` says cannot hold the model, or that is
//! over the quality gate is a journaled [`Sample`] that says why, not an error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use sous_engine::plan::Hardware;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::reporter::{Progress, Reporter, Silent, Task};
use sous_engine::serve::ServeError;

use super::fit::Fit;
use super::gate::Gate;
use super::journal::Journal;
use super::options::Options;
use super::search::{Bench, Budget};
use super::{Outcome, Sample, Trial};
use crate::bench::client::Endpoint;
use crate::bench::run::{self as bench_run, Target};
use crate::bench::stats::Slo;
use crate::bench::workload::{self, Workload};
use crate::hub::config::HubConfig;
use crate::pipeline::session;

/// The baseline with a trial's values, under a name and port of the tune's own (so that
/// an instance of the baseline may keep serving), without the out-of-memory fallback
/// (an OOM is the trial's result).
pub(super) fn recipe(options: &Options, trial: &Trial, port: u16) -> anyhow::Result<Recipe> {
    let mut set = options.set.clone();
    for s in &trial.settings {
        set.push(s.arg());
    }
    let base = session::load_recipe(&options.recipe, &options.set)?.recipe;
    set.push(format!("name=\"{}-tune\"", base.name));
    set.push("memory.oom_fallback=[]".into());
    if port != 0 {
        set.push(format!("server.port={port}"));
    }
    Ok(session::load_recipe(&options.recipe, &set)?.recipe)
}

/// `sous plan`'s verdict on the trials' memory settings, for `base`'s model on the
/// machine `options` names (this machine's RAM for the native engine), or none, said
/// once, when either is unknown.
pub(super) async fn fit(
    options: &Options,
    base: &Recipe,
    reporter: &dyn Reporter,
) -> anyhow::Result<Option<Fit>> {
    let hardware = match (&options.gpu, options.gpu_memory) {
        (Some(name), _) => Hardware::named(name)?,
        (None, Some(size)) => Hardware::with_memory(size.0),
        (None, None) if base.engine.kind == EngineKind::Native => Hardware::this_cpu()?,
        (None, None) => {
            if super::fit::touches_memory(&options.levers) {
                reporter.status("unplanned", "memory levers are not bounded by a plan: pass --gpu NAME or --gpu-memory SIZE to skip the settings that cannot fit");
            }
            return Ok(None);
        }
    };
    let model = match crate::plan::model_files(base, &HubConfig::from_env()).await {
        Ok(files) => crate::plan::model(&files, base).map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::Error::from(e)),
    };
    match model {
        Ok(model) => Ok(Some(Fit::new(model, hardware))),
        Err(e) => {
            reporter.status(
                "unplanned",
                &format!(
                    "no plan bounds the memory levers ({}): every trial is started",
                    crate::chain::message(&e)
                ),
            );
            Ok(None)
        }
    }
}

/// The tune's [`Bench`]: what it measures with, and what keeps a trial from starting or
/// from being measured.
pub(super) struct Trials<'a> {
    /// The tune's options.
    pub(super) options: &'a Options,
    /// The latency bounds runs are judged by.
    pub(super) slo: Slo,
    /// Where the tune's own lines go.
    pub(super) reporter: Arc<dyn Reporter>,
    /// When the tune started (its budget counts from here).
    pub(super) started: Instant,
    /// `sous plan`'s bound on the memory settings, when the machine and model are known.
    pub(super) fit: Option<Fit>,
    /// The quality gate, with `--max-kld`.
    pub(super) gate: Option<Gate>,
}

impl Bench for Trials<'_> {
    type Error = anyhow::Error;

    /// Serves the trial and measures the runs; one that cannot start, or that `sous plan`
    /// says cannot hold the model, is recorded as such.
    async fn measure(
        &mut self,
        trial: &Trial,
        missing: &[usize],
        journal: &mut Journal,
    ) -> anyhow::Result<Budget> {
        if self.started.elapsed() > self.options.budget {
            return Ok(Budget::Spent);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("finding a free port for the trial")?;
        let recipe = recipe(self.options, trial, port)?;
        if let Some(why) = self.fit.as_ref().and_then(|p| p.unfit(&recipe)) {
            self.reporter.warn(&format!("{}: not started: {why}", trial.id));
            journal.record(Sample {
                trial: trial.id.clone(),
                run: missing[0],
                outcome: Outcome::Unfit,
                value: None,
                message: Some(why),
                figures: BTreeMap::new(),
            })?;
            return Ok(Budget::Left);
        }
        self.reporter.status(
            "measuring",
            &format!(
                "{} (run{} {})",
                trial.id,
                if missing.len() > 1 { "s" } else { "" },
                missing
                    .iter()
                    .map(|r| (r + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        let quiet = Arc::new(Quiet(self.reporter.clone()));
        let (instance, url) = match session::session(&recipe, quiet, false).await {
            Ok(served) => served,
            Err(e) => {
                let oom = e.chain().any(|c| {
                    matches!(
                        c.downcast_ref::<ServeError>(),
                        Some(ServeError::OomExhausted { .. })
                    )
                });
                let outcome = if oom { Outcome::Oom } else { Outcome::Failed };
                let message = crate::chain::message(&e);
                self.reporter.warn(&format!("{}: {}", trial.id, message));
                journal.record(Sample {
                    trial: trial.id.clone(),
                    run: missing[0],
                    outcome,
                    value: None,
                    message: Some(message),
                    figures: BTreeMap::new(),
                })?;
                return Ok(Budget::Left);
            }
        };
        let measured = self.runs(trial, missing, &recipe, &url, journal).await;
        instance.stop().await?;
        measured
    }
}

impl Trials<'_> {
    /// Warms the served trial, applies the quality gate, and measures the runs.
    async fn runs(
        &mut self,
        trial: &Trial,
        missing: &[usize],
        recipe: &Recipe,
        url: &str,
        journal: &mut Journal,
    ) -> anyhow::Result<Budget> {
        let target = Target {
            url: url.to_owned(),
            model: None,
            api_key: session::api_key(recipe),
            endpoint: Endpoint::Completions,
            tokenizer: self.options.tokenizer.clone(),
            instances: Vec::new(),
        };
        let quiet = Quiet(self.reporter.clone());
        // Warm-up: one short request, not measured.
        let warm = Workload::Probe(workload::Probe {
            repeat: 1,
            input_len: 16,
            output_len: 4,
            prompt: None,
        });
        let (seed, slo) = (self.options.workload.seed, self.slo.clone());
        let options = |salt: u64| bench_run::Options {
            seed,
            salt: Some(salt),
            percentiles: vec![50.0, 90.0, 99.0],
            slo: slo.clone(),
            label: Some(trial.id.clone()),
        };
        bench_run::run(&target, &warm, &options(u64::MAX), &quiet).await?;
        let mut quality = BTreeMap::new();
        if let Some(gate) = self.gate.as_mut() {
            let verdict = gate
                .judge(trial, &target.url, target.api_key.as_deref(), &quiet)
                .await?;
            if let Some(why) = verdict.over {
                self.reporter.warn(&format!("{}: not measured: {why}", trial.id));
                journal.record(Sample {
                    trial: trial.id.clone(),
                    run: missing[0],
                    outcome: Outcome::QualityGate,
                    value: None,
                    message: Some(why),
                    figures: verdict.figures,
                })?;
                return Ok(Budget::Left);
            }
            quality = verdict.figures;
        }
        let objective = self.options.objective;
        for &r in missing {
            if self.started.elapsed() > self.options.budget {
                return Ok(Budget::Spent);
            }
            // The same salts for every trial: run r of each sees the same prompts.
            let report = bench_run::run(
                &target,
                &self.options.workload.workload(),
                &options(1000 + r as u64),
                &quiet,
            )
            .await?;
            let mut sample = Sample::of_run(trial, r, &report, objective, &self.slo);
            sample.figures.extend(quality.clone());
            self.reporter.status(
                "run",
                &format!(
                    "{} #{}: {}",
                    trial.id,
                    r + 1,
                    sample.value.map_or_else(
                        || format!("{:?}", sample.outcome),
                        |v| format!("{v:.1} {}", objective.unit())
                    )
                ),
            );
            journal.record(sample)?;
        }
        Ok(Budget::Left)
    }
}

/// What serving and measuring a trial say, as the tune shows it: warnings only. The
/// tune's own lines say what runs; the engine's output stays in its log, and no
/// progress is drawn.
struct Quiet(Arc<dyn Reporter>);

impl Reporter for Quiet {
    fn status(&self, _: &str, _: &str) {}

    fn warn(&self, message: &str) {
        self.0.warn(message);
    }

    fn output(&self, _: Option<&str>, _: &str) {}

    fn progress(&self, _: Task) -> Box<dyn Progress> {
        Box::new(Silent)
    }
}

#[cfg(test)]
mod tests {
    use sous_engine::reporter::{Recorded, Said};

    use super::*;

    #[test]
    fn a_trial_says_only_its_warnings() {
        let recorded = Arc::new(Recorded::default());
        let quiet = Quiet(recorded.clone());
        quiet.status("serving", "x");
        quiet.output(Some("vllm"), "a line");
        quiet.warn("careful");
        let progress = quiet.progress(Task::count("conc 4", "requests", 4));
        progress.add(1);
        progress.finish(Some("done"));
        assert_eq!(recorded.said(), vec![Said::Warning("careful".into())]);
    }
}

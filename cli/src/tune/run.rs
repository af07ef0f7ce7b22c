//! A whole tune, from a baseline recipe to a measured, tuned one ([`run()`]): the
//! options checked, the baseline and every trial's recipe loaded before anything is
//! served, the journal opened (or resumed), the [`search`](super::search) driven through
//! the trials' `Bench`, and what it found written into the tune's folder
//! ([`state_dir`]): the tuned recipe (checked by loading it before it replaces
//! anything), `report.json` and the chart `report.svg`.
//!
//! Not here: the flags, and printing the table and the verdict (the `tune` command).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use sha2::{Digest, Sha256};
use sous_engine::recipe::Recipe;
use sous_engine::reporter::Reporter;

use super::gate::Gate;
use super::journal::{Header, Journal};
use super::options::Options;
use super::search::{Findings, Search};
use super::trials::{self, Trials};
use super::{Lever, Objective, TrialResult};
use crate::bench::stats::Slo;
use crate::pipeline::session;

/// Why a tune's options cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The latency bounds do not parse.
    #[error("--slo: {0}")]
    Slo(String),
    /// Goodput counts the requests within latency bounds, and none were given.
    #[error("--objective goodput needs --slo")]
    GoodputWithoutSlo,
    /// The tuned recipe's path is not a `.toml` file.
    #[error("--out {}: the tuned recipe is a .toml file", .0.display())]
    Out(PathBuf),
    /// The quality gate is negative or not a number.
    #[error("--max-kld {0}: the gate is a KL divergence, 0 or more")]
    MaxKld(f64),
}

impl sous_engine::diagnose::Diagnose for TuneError {
    fn class(&self) -> sous_engine::diagnose::Class {
        sous_engine::diagnose::Class::User
    }

    fn hint(&self) -> Option<String> {
        match self {
            TuneError::Slo(_) | TuneError::GoodputWithoutSlo => Some("e.g. --slo ttft:500,tpot:50".into()),
            TuneError::Out(_) | TuneError::MaxKld(_) => None,
        }
    }
}

/// What a tune found and wrote.
#[derive(Debug, Clone)]
pub struct Tuned {
    /// The search's results, verdict and choice.
    pub findings: Findings,
    /// The tuned recipe, when a trial beat the baseline.
    pub written: Option<PathBuf>,
    /// The report, as written to `report_path`.
    pub report: serde_json::Value,
    /// `report.json`.
    pub report_path: PathBuf,
    /// The chart, `report.svg`.
    pub chart_path: PathBuf,
}

/// Where a tune keeps its journal and report: `tuned.toml` → `tuned.tune/`.
pub fn state_dir(out: &Path) -> PathBuf {
    out.with_extension("tune")
}

/// Runs the tune `options` describe, saying through `reporter` what it measures (a
/// trial's serving and runs say only their warnings), and writes what it found.
pub async fn run(options: &Options, reporter: Arc<dyn Reporter>) -> anyhow::Result<Tuned> {
    let base = session::load_recipe(&options.recipe, &options.set)?.recipe;
    let slo = match &options.slo {
        Some(text) => Slo::parse(text).map_err(TuneError::Slo)?,
        None => Slo::default(),
    };
    if options.objective == Objective::Goodput && options.slo.is_none() {
        return Err(TuneError::GoodputWithoutSlo.into());
    }
    if options.out.extension().and_then(|e| e.to_str()) != Some("toml") {
        return Err(TuneError::Out(options.out.clone()).into());
    }
    let levers: Vec<Lever> = if options.levers.is_empty() {
        let traits = base
            .model
            .path
            .as_deref()
            .map_or_else(super::ModelTraits::default, |p| {
                super::ModelTraits::of(p.as_ref())
            });
        super::default_levers(&base, traits)
    } else {
        options
            .levers
            .iter()
            .map(|l| Lever::parse(l))
            .collect::<Result<_, _>>()?
    };
    let resolved = toml::Value::try_from(base.to_file()).context("reading the resolved baseline")?;
    let current = |key: &str| {
        key.split('.')
            .try_fold(&resolved, |v, part| v.get(part))
            .map(|v| v.to_string())
    };
    let trials = super::first_pass(&levers, current);
    // Every trial's recipe must load before anything is served.
    for trial in &trials {
        trials::recipe(options, trial, 0).with_context(|| format!("trial `{}`", trial.id))?;
    }
    let describes = format!(
        "{} on {}, objective {}, levers {}",
        options.recipe.display(),
        options.workload.describe(),
        options.objective.key(),
        levers
            .iter()
            .map(|l| l.key.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let fingerprint = {
        let mut h = Sha256::new();
        h.update(format!("{:?}", base).as_bytes());
        h.update(describes.as_bytes());
        h.update(
            format!(
                "{levers:?}{:?}{:?}{}{:?}",
                options.slo, options.set, options.runs, options.max_kld
            )
            .as_bytes(),
        );
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        hex::encode(h.finalize())
    };
    let dir = state_dir(&options.out);
    let mut journal = Journal::open(
        &dir.join("journal.jsonl"),
        &Header {
            fingerprint,
            describes,
        },
        options.fresh,
    )?;
    if !journal.samples.is_empty() {
        reporter.status(
            "resuming",
            &format!(
                "{} runs already measured ({})",
                journal.samples.len(),
                dir.join("journal.jsonl").display()
            ),
        );
    }
    let started = Instant::now();
    let fit = trials::fit(options, &base, reporter.as_ref()).await?;
    if let Some(gate) = options.max_kld
        && (gate.is_nan() || gate < 0.0)
    {
        return Err(TuneError::MaxKld(gate).into());
    }
    let mut bench = Trials {
        options,
        slo,
        reporter,
        started,
        fit,
        gate: options
            .max_kld
            .map(|max| Gate::new(max, &dir.join("eval"), options.tokenizer.as_deref())),
    };
    let search = Search {
        trials: &trials,
        levers: &levers,
        objective: options.objective,
        runs: options.runs as usize,
        max_runs: options.max_runs as usize,
    };
    let found = search.run(&mut bench, &mut journal).await?;
    let baseline = found.baseline();
    let all = found.all();
    // Write the tuned recipe, checked by loading it before it replaces anything.
    let written = match &found.chosen {
        Some(chosen) => Some(write_tuned(
            options,
            &base,
            baseline,
            chosen,
            &found.verdict.helped,
            &all,
        )?),
        None => None,
    };
    let helped = found.helped();
    let chart_path = dir.join("report.svg");
    let svg = super::chart::draw(&all, &helped, options.objective)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", chart_path.display()))?;
    sous_engine::atomic::write_file(&chart_path, svg.as_bytes())
        .with_context(|| format!("writing {}", chart_path.display()))?;
    let report = json!({
        "baseline_recipe": options.recipe,
        "workload": options.workload.describe(),
        "objective": options.objective.key(),
        "unit": options.objective.unit(),
        "slo": options.slo,
        "budget_exhausted": found.exhausted,
        "seconds": started.elapsed().as_secs_f64(),
        "levers": levers,
        "trials": all,
        "helped": helped,
        "not_helped": found.verdict.not_helped,
        "chosen": found.chosen.as_ref().map(|c| c.trial.id.clone()),
        "prediction": found.prediction(),
        "tuned_recipe": written,
        "chart": chart_path,
    });
    let report_path = dir.join("report.json");
    sous_engine::atomic::write_file(&report_path, serde_json::to_string_pretty(&report)?.as_bytes())
        .with_context(|| format!("writing {}", report_path.display()))?;
    Ok(Tuned {
        findings: found,
        written,
        report,
        report_path,
        chart_path,
    })
}

/// Writes the tuned recipe (validated by loading it first) and returns its path.
fn write_tuned(
    options: &Options,
    base: &Recipe,
    baseline: &TrialResult,
    chosen: &TrialResult,
    helped: &[TrialResult],
    all: &[TrialResult],
) -> anyhow::Result<PathBuf> {
    let out_dir = options
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let extends = super::relative_extends(&options.recipe, &out_dir);
    // A chosen memory fraction keeps the next one down that started as its fallback.
    let fallback = super::fallback(chosen, all);
    let text = super::tuned_recipe(&super::TunedRecipe {
        extends: &extends,
        name: &format!("{}-tuned", base.name),
        baseline,
        chosen,
        helped,
        objective: options.objective,
        workload: &options.workload.describe(),
        fallback,
    });
    // Checked where it will live (its `extends` is relative to that directory).
    let name = options
        .out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let check = out_dir.join(format!(".{name}.sous-check-{}.toml", std::process::id()));
    std::fs::write(&check, &text).with_context(|| format!("writing {}", check.display()))?;
    let loaded = sous_engine::recipe::load(&check, &sous_engine::recipe::Overrides::new());
    let _ = std::fs::remove_file(&check);
    loaded.with_context(|| "the tuned recipe does not load; this is a bug in sous tune".to_owned())?;
    sous_engine::atomic::write_file(&options.out, text.as_bytes())
        .with_context(|| format!("writing {}", options.out.display()))?;
    Ok(options.out.clone())
}

#[cfg(test)]
mod tests {
    use sous_engine::diagnose::{Class, Diagnose};

    use super::*;

    #[test]
    fn the_state_sits_beside_the_tuned_recipe() {
        assert_eq!(
            state_dir(Path::new("out/tuned.toml")),
            PathBuf::from("out/tuned.tune")
        );
    }

    #[test]
    fn bad_options_are_the_users_with_the_flags_own_words() {
        let cases = [
            (
                TuneError::Slo("`x` is not KEY:MS".into()),
                "--slo: `x` is not KEY:MS",
                true,
            ),
            (
                TuneError::GoodputWithoutSlo,
                "--objective goodput needs --slo",
                true,
            ),
            (
                TuneError::Out(PathBuf::from("tuned.yaml")),
                "--out tuned.yaml: the tuned recipe is a .toml file",
                false,
            ),
            (
                TuneError::MaxKld(-1.0),
                "--max-kld -1: the gate is a KL divergence, 0 or more",
                false,
            ),
        ];
        for (e, message, hint) in cases {
            assert_eq!(e.to_string(), message);
            assert_eq!(e.class(), Class::User);
            assert_eq!(e.hint().is_some(), hint, "{message}");
        }
    }
}

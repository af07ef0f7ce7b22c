//! `sous tune --recipe BASE.toml --out TUNED.toml`: from a baseline recipe to a
//! measured, tuned one, lever by lever. Each trial is the baseline with some values
//! changed, served through the pipeline (as `sous bench --recipe` serves), warmed, and
//! measured with the same seeded workload a few times; the levers whose interval clears
//! the baseline's are combined, and the tuned recipe `extends` the baseline with only
//! those values, each with its measured gain. Every run is journaled as it ends
//! (`TUNED.tune/journal.jsonl`), so a killed tune resumes; the report (terminal table,
//! `TUNED.tune/report.json`, the chart `TUNED.tune/report.svg`) lists every trial,
//! failed ones included, with the server's metrics that explain it.
//!
//! The reasoning and the search loop are `sous::tune`'s; this file reads the flags,
//! serves and measures each trial the search asks for (its `Bench`), and writes and
//! prints what the search found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;
use sha2::{Digest, Sha256};
use sous::bench::client::Endpoint;
use sous::bench::run::{self, Options, Target};
use sous::bench::stats::Slo;
use sous::bench::workload::{self, Workload};
use sous::hub::config::HubConfig;
use sous::tune::fit::Fit;
use sous::tune::gate::Gate;
use sous::tune::journal::{Header, Journal};
use sous::tune::search::{Bench, Budget, Search};
use sous::tune::workload::{TrialWorkload, WorkloadKind};
use sous::tune::{self, Lever, Objective, Outcome, Sample, Trial, TrialResult};
use sous_engine::plan::Hardware;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::serve::ServeError;
use sous_engine::size::ByteSize;

use super::{OverrideArgs, RecipeArg, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  sous tune --recipe recipes/local/smollm2-135m.toml --out tuned.toml\n  sous tune --recipe base.toml --lever serving.max_num_seqs=4,16 --lever serving.speculative=ngram:3 --out tuned.toml\n  sous tune --recipe spark.toml --lever memory.gpu_utilization=0.95,0.9,0.85 --slo ttft:2000 --budget 1h --out spark-tuned.toml"
)]
pub struct TuneArgs {
    #[command(flatten)]
    recipe: RecipeArg,
    /// Where the tuned recipe goes; its journal and report go to `<OUT without .toml>.tune/`.
    #[arg(long, value_name = "TUNED.toml")]
    out: PathBuf,
    /// A lever and the values to try, `KEY=V1,V2,...` (repeatable); e.g.
    /// `serving.max_num_seqs=4,16`, `serving.speculative=ngram:3,mtp:2`. Default: what the
    /// engine honours (prefix caching, max_num_seqs, the KV budget or memory fraction,
    /// batched tokens, KV dtype, ngram speculation).
    #[arg(long = "lever", value_name = "KEY=V1,V2,...")]
    levers: Vec<String>,
    /// The workload every trial is measured with.
    #[arg(long, value_enum, default_value = "agent")]
    workload: WorkloadKind,
    /// What to improve.
    #[arg(long, value_enum, default_value = "output-throughput")]
    objective: Objective,
    /// Latency bounds, e.g. `ttft:500,tpot:50`: a trial whose p99 breaks one is recorded
    /// as failed and never chosen (and `goodput` counts the requests within them).
    #[arg(long, value_name = "KEY:MS,...")]
    slo: Option<String>,
    /// Stop starting trials after this long (what was measured is used).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    budget: Duration,
    /// Measured runs per trial.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..))]
    runs: u64,
    /// Most runs of a trial while its interval and the baseline's overlap.
    #[arg(long, default_value_t = 6)]
    max_runs: u64,
    /// Seed of the workload's prompts (the same for every trial).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Streams (sweep, prefix) or sessions (agent).
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Requests per session (agent) or per run (sweep, prefix: at least --concurrency).
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Prompt tokens (probe, sweep), or prompt tokens per generated token (agent: ratio).
    #[arg(long, default_value_t = 256)]
    input_len: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 32)]
    output_len: usize,
    /// The tokenizer prompts are measured with (a tokenizer.json or a model directory;
    /// default: the served model's).
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// The machine memory levers are planned for (`sous plan --gpu`): a trial whose
    /// memory settings `sous plan` says cannot hold the model is recorded, not started.
    /// Default for the native engine: this machine's RAM; for the others, none (every
    /// trial is started).
    #[arg(long, value_name = "NAME", conflicts_with = "gpu_memory")]
    gpu: Option<String>,
    /// The same, for a GPU sous has no entry for, by its memory: `48GiB`.
    #[arg(long, value_name = "SIZE")]
    gpu_memory: Option<ByteSize>,
    /// Quality gate: each trial's next-token distributions are scored over the built-in
    /// text (`sous eval`'s windows) and a lever whose mean KL divergence from the
    /// baseline's exceeds this (nats) is recorded as over the gate and never chosen.
    #[arg(long, value_name = "NATS")]
    max_kld: Option<f64>,
    /// Forget an earlier tune's journal for this --out and start over.
    #[arg(long)]
    fresh: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

impl TuneArgs {
    /// The workload every trial is measured with.
    fn workload(&self) -> TrialWorkload {
        TrialWorkload {
            kind: self.workload,
            concurrency: self.concurrency,
            steps: self.steps,
            input_len: self.input_len,
            output_len: self.output_len,
            seed: self.seed,
        }
    }
}

/// Where a tune keeps its journal and report: `tuned.toml` → `tuned.tune/`.
fn state_dir(out: &Path) -> PathBuf {
    out.with_extension("tune")
}

pub fn exec(args: TuneArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let loaded = load_recipe(&args.recipe.recipe, &args.overrides)?;
    let base = loaded.recipe;
    let slo = match &args.slo {
        Some(text) => Slo::parse(text)
            .map_err(|e| UserError::new(format!("--slo: {e}"), Some("e.g. --slo ttft:500,tpot:50")))?,
        None => Slo::default(),
    };
    if args.objective == Objective::Goodput && args.slo.is_none() {
        return Err(UserError::new(
            "--objective goodput needs --slo",
            Some("e.g. --slo ttft:500,tpot:50"),
        )
        .into());
    }
    if args.out.extension().and_then(|e| e.to_str()) != Some("toml") {
        return Err(UserError::new(
            format!("--out {}: the tuned recipe is a .toml file", args.out.display()),
            None,
        )
        .into());
    }
    let levers: Vec<Lever> = if args.levers.is_empty() {
        let traits = base
            .model
            .path
            .as_deref()
            .map_or_else(tune::ModelTraits::default, |p| tune::ModelTraits::of(p.as_ref()));
        tune::default_levers(&base, traits)
    } else {
        args.levers
            .iter()
            .map(|l| Lever::parse(l).map_err(|e| UserError::new(e.to_string(), None)))
            .collect::<Result<_, _>>()?
    };
    let resolved = toml::Value::try_from(base.to_file()).context("reading the resolved baseline")?;
    let current = |key: &str| {
        key.split('.')
            .try_fold(&resolved, |v, part| v.get(part))
            .map(|v| v.to_string())
    };
    let trials = tune::first_pass(&levers, current);
    // Every trial's recipe must load before anything is served.
    for trial in &trials {
        trial_recipe(&args, trial, 0).with_context(|| format!("trial `{}`", trial.id))?;
    }
    let describes = format!(
        "{} on {}, objective {}, levers {}",
        args.recipe.recipe.display(),
        args.workload().describe(),
        args.objective.key(),
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
                args.slo, args.overrides.set, args.runs, args.max_kld
            )
            .as_bytes(),
        );
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        hex::encode(h.finalize())
    };
    let dir = state_dir(&args.out);
    let mut journal = Journal::open(
        &dir.join("journal.jsonl"),
        &Header {
            fingerprint,
            describes,
        },
        args.fresh,
    )?;
    if !journal.samples.is_empty() {
        shell.status(
            "resuming",
            &format!(
                "{} runs already measured ({})",
                journal.samples.len(),
                dir.join("journal.jsonl").display()
            ),
        );
    }
    let started = Instant::now();
    let runtime = super::runtime()?;
    let fit = runtime.block_on(fit(&args, &base, shell))?;
    if let Some(gate) = args.max_kld
        && (gate.is_nan() || gate < 0.0)
    {
        return Err(UserError::new(
            format!("--max-kld {gate}: the gate is a KL divergence, 0 or more"),
            None,
        )
        .into());
    }
    let mut ctx = Ctx {
        args: &args,
        slo,
        shell,
        started,
        fit,
        gate: args
            .max_kld
            .map(|max| Gate::new(max, &dir.join("eval"), args.tokenizer.as_deref())),
    };
    let search = Search {
        trials: &trials,
        levers: &levers,
        objective: args.objective,
        runs: args.runs as usize,
        max_runs: args.max_runs as usize,
    };
    let found = runtime.block_on(search.run(&mut ctx, &mut journal))?;
    let baseline = found.baseline();
    let all = found.all();
    // Write the tuned recipe, checked by loading it before it replaces anything.
    let written = match &found.chosen {
        Some(chosen) => Some(write_tuned(
            &args,
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
    let svg = tune::chart::draw(&all, &helped, args.objective)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", chart_path.display()))?;
    sous_engine::atomic::write_file(&chart_path, svg.as_bytes())
        .with_context(|| format!("writing {}", chart_path.display()))?;
    let report = json!({
        "baseline_recipe": args.recipe.recipe,
        "workload": args.workload().describe(),
        "objective": args.objective.key(),
        "unit": args.objective.unit(),
        "slo": args.slo,
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
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&tune::table(&all, baseline, args.objective))?;
    }
    if found.exhausted {
        shell.warn(&format!(
            "the budget ({}) ran out: the verdict uses what was measured",
            humantime::format_duration(args.budget)
        ));
    }
    match (&found.chosen, &written) {
        (Some(c), Some(path)) => {
            if let Some(p) = found.prediction() {
                shell.status(
                    "tuned",
                    &format!(
                        "{}: {} (predicted {:.2}x, 95 % interval {:.2}x–{:.2}x); report {}, chart {}",
                        path.display(),
                        c.trial.id,
                        p.ratio,
                        p.low,
                        p.high,
                        report_path.display(),
                        chart_path.display()
                    ),
                );
            }
        }
        _ => shell.status(
            "unchanged",
            &format!(
                "no lever beat the baseline beyond the runs' noise; no recipe written; report {}, chart {}",
                report_path.display(),
                chart_path.display()
            ),
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The baseline with a trial's values, under a name and port of the tune's own (so that
/// an instance of the baseline may keep serving), without the out-of-memory fallback
/// (an OOM is the trial's result).
fn trial_recipe(args: &TuneArgs, trial: &Trial, port: u16) -> anyhow::Result<Recipe> {
    let mut overrides = args.overrides.clone();
    for s in &trial.settings {
        overrides.set.push(s.arg());
    }
    let base = load_recipe(&args.recipe.recipe, &args.overrides)?.recipe;
    overrides.set.push(format!("name=\"{}-tune\"", base.name));
    overrides.set.push("memory.oom_fallback=[]".into());
    if port != 0 {
        overrides.set.push(format!("server.port={port}"));
    }
    Ok(load_recipe(&args.recipe.recipe, &overrides)?.recipe)
}

struct Ctx<'a> {
    args: &'a TuneArgs,
    slo: Slo,
    shell: &'a Shell,
    started: Instant,
    fit: Option<Fit>,
    gate: Option<Gate>,
}

/// `sous plan`'s verdict on the trials' memory settings, for `base`'s model on the
/// machine `args` names (this machine's RAM for the native engine), or none, said once,
/// when either is unknown.
async fn fit(args: &TuneArgs, base: &Recipe, shell: &Shell) -> anyhow::Result<Option<Fit>> {
    let hardware = match (&args.gpu, args.gpu_memory) {
        (Some(name), _) => Hardware::named(name)?,
        (None, Some(size)) => Hardware::with_memory(size.0),
        (None, None) if base.engine.kind == EngineKind::Native => Hardware::this_cpu()?,
        (None, None) => {
            if tune::fit::touches_memory(&args.levers) {
                shell.status("unplanned", "memory levers are not bounded by a plan: pass --gpu NAME or --gpu-memory SIZE to skip the settings that cannot fit");
            }
            return Ok(None);
        }
    };
    let model = match sous::plan::model_files(base, &HubConfig::from_env()).await {
        Ok(files) => sous::plan::model(&files, base).map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::Error::from(e)),
    };
    match model {
        Ok(model) => Ok(Some(Fit::new(model, hardware))),
        Err(e) => {
            shell.status(
                "unplanned",
                &format!(
                    "no plan bounds the memory levers ({}): every trial is started",
                    crate::failure::message(&e)
                ),
            );
            Ok(None)
        }
    }
}

impl Bench for Ctx<'_> {
    type Error = anyhow::Error;

    /// Serves the trial and measures the runs; one that cannot start, or that `sous plan`
    /// says cannot hold the model, is recorded as such.
    async fn measure(
        &mut self,
        trial: &Trial,
        missing: &[usize],
        journal: &mut Journal,
    ) -> anyhow::Result<Budget> {
        if self.started.elapsed() > self.args.budget {
            return Ok(Budget::Spent);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("finding a free port for the trial")?;
        let recipe = trial_recipe(self.args, trial, port)?;
        if let Some(why) = self.fit.as_ref().and_then(|p| p.unfit(&recipe)) {
            self.shell.warn(&format!("{}: not started: {why}", trial.id));
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
        self.shell.status(
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
        let quiet = self.shell.quiet();
        let (instance, url) = match sous::pipeline::session::session(&recipe, Arc::new(quiet), false).await {
            Ok(served) => served,
            Err(e) => {
                let oom = e.chain().any(|c| {
                    matches!(
                        c.downcast_ref::<ServeError>(),
                        Some(ServeError::OomExhausted { .. })
                    )
                });
                let outcome = if oom { Outcome::Oom } else { Outcome::Failed };
                let message = crate::failure::message(&e);
                self.shell.warn(&format!("{}: {}", trial.id, message));
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

impl Ctx<'_> {
    /// Warms the served trial, applies the quality gate, and measures the runs.
    async fn runs(
        &mut self,
        trial: &Trial,
        missing: &[usize],
        recipe: &Recipe,
        url: &str,
        journal: &mut Journal,
    ) -> anyhow::Result<Budget> {
        let key = super::recipe_api_key(recipe);
        let target = Target {
            url: url.to_owned(),
            model: None,
            api_key: key,
            endpoint: Endpoint::Completions,
            tokenizer: self.args.tokenizer.clone(),
            instances: Vec::new(),
        };
        let silent = self.shell.quiet();
        // Warm-up: one short request, not measured.
        let warm = Workload::Probe(workload::Probe {
            repeat: 1,
            input_len: 16,
            output_len: 4,
            prompt: None,
        });
        let (seed, slo) = (self.args.seed, self.slo.clone());
        let options = |salt: u64| Options {
            seed,
            salt: Some(salt),
            percentiles: vec![50.0, 90.0, 99.0],
            slo: slo.clone(),
            label: Some(trial.id.clone()),
        };
        run::run(&target, &warm, &options(u64::MAX), &Silent(&silent)).await?;
        let mut quality = BTreeMap::new();
        if let Some(gate) = self.gate.as_mut() {
            let verdict = gate
                .judge(trial, &target.url, target.api_key.as_deref(), &Silent(&silent))
                .await?;
            if let Some(why) = verdict.over {
                self.shell.warn(&format!("{}: not measured: {why}", trial.id));
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
        for &r in missing {
            if self.started.elapsed() > self.args.budget {
                return Ok(Budget::Spent);
            }
            // The same salts for every trial: run r of each sees the same prompts.
            let report = run::run(
                &target,
                &self.args.workload().workload(),
                &options(1000 + r as u64),
                &Silent(&silent),
            )
            .await?;
            let mut sample = Sample::of_run(trial, r, &report, self.args.objective, &self.slo);
            sample.figures.extend(quality.clone());
            self.shell.status(
                "run",
                &format!(
                    "{} #{}: {}",
                    trial.id,
                    r + 1,
                    sample.value.map_or_else(
                        || format!("{:?}", sample.outcome),
                        |v| format!("{v:.1} {}", self.args.objective.unit())
                    )
                ),
            );
            journal.record(sample)?;
        }
        Ok(Budget::Left)
    }
}

/// Writes the tuned recipe (validated by loading it first) and returns its path.
fn write_tuned(
    args: &TuneArgs,
    base: &Recipe,
    baseline: &TrialResult,
    chosen: &TrialResult,
    helped: &[TrialResult],
    all: &[TrialResult],
) -> anyhow::Result<PathBuf> {
    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let extends = tune::relative_extends(&args.recipe.recipe, &out_dir);
    // A chosen memory fraction keeps the next one down that started as its fallback.
    let fallback = tune::fallback(chosen, all);
    let text = tune::tuned_recipe(&tune::TunedRecipe {
        extends: &extends,
        name: &format!("{}-tuned", base.name),
        baseline,
        chosen,
        helped,
        objective: args.objective,
        workload: &args.workload().describe(),
        fallback,
    });
    // Checked where it will live (its `extends` is relative to that directory).
    let name = args
        .out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let check = out_dir.join(format!(".{name}.sous-check-{}.toml", std::process::id()));
    std::fs::write(&check, &text).with_context(|| format!("writing {}", check.display()))?;
    let loaded = sous_engine::recipe::load(&check, &sous_engine::recipe::Overrides::new());
    let _ = std::fs::remove_file(&check);
    loaded.with_context(|| "the tuned recipe does not load; this is a bug in sous tune".to_owned())?;
    sous_engine::atomic::write_file(&args.out, text.as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(args.out.clone())
}

/// A reporter that shows nothing (the tune's own lines say what runs).
struct Silent<'a>(&'a Shell);

impl sous_engine::reporter::Reporter for Silent<'_> {
    fn status(&self, _: &str, _: &str) {}

    fn warn(&self, message: &str) {
        self.0.warn(message);
    }

    fn output(&self, _: Option<&str>, _: &str) {}

    fn progress(&self, task: sous_engine::reporter::Task) -> Box<dyn sous_engine::reporter::Progress> {
        sous_engine::reporter::Reporter::progress(self.0, task)
    }
}

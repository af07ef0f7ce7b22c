//! `sous tune --recipe BASE.toml --out TUNED.toml`: from a baseline recipe to a
//! measured, tuned one, lever by lever. Each trial is the baseline with some values
//! changed, served through the pipeline (as `sous bench --recipe` serves), warmed, and
//! measured with the same seeded workload a few times; the levers whose interval clears
//! the baseline's are combined, and the tuned recipe `extends` the baseline with only
//! those values, each with its measured gain. Every run is journaled as it ends
//! (`TUNED.tune/journal.jsonl`), so a killed tune resumes; the report (terminal table,
//! `TUNED.tune/report.json`, the chart `TUNED.tune/report.svg`) lists every trial, failed ones included, with the
//! server's metrics that explain it.
//!
//! The reasoning (levers, intervals, verdicts, the recipe's text) is `sous::tune`'s;
//! this file serves and measures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde_json::json;
use sha2::{Digest, Sha256};
use sous::bench::client::Endpoint;
use sous::bench::run::{self, Options, Target};
use sous::bench::stats::Slo;
use sous::bench::table;
use sous::bench::workload::{self, Workload};
use sous::hub::config::HubConfig;
use sous::tune::journal::{Header, Journal};
use sous::tune::{self, Lever, Objective, Outcome, Phase, Sample, Trial, TrialResult};
use sous_engine::plan::Hardware;
use sous_engine::recipe::{EngineKind, Recipe};
use sous_engine::serve::ServeError;
use sous_engine::size::ByteSize;

use super::{OverrideArgs, RecipeArg, load_recipe};
use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TuneWorkload {
    /// One stream: TTFT and decode speed.
    Probe,
    /// `--concurrency` streams of random prompts.
    Sweep,
    /// Requests sharing long prefixes.
    Prefix,
    /// Coding-agent sessions resending a growing context.
    Agent,
}

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
    workload: TuneWorkload,
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
    fn workload(&self) -> Workload {
        match self.workload {
            TuneWorkload::Probe => Workload::Probe(workload::Probe {
                repeat: self.steps.max(1),
                input_len: self.input_len,
                output_len: self.output_len,
                prompt: None,
            }),
            TuneWorkload::Sweep => Workload::Sweep(workload::Sweep {
                concurrency: vec![self.concurrency],
                request_rates: Vec::new(),
                burstiness: 1.0,
                max_concurrency: None,
                requests: Some(self.steps.max(self.concurrency)),
                input_len: self.input_len,
                output_len: self.output_len,
                range_ratio: 0.0,
                eos: false,
            }),
            TuneWorkload::Prefix => Workload::Prefix(workload::Prefix {
                prefixes: 2,
                prefix_len: self.input_len,
                suffix_len: 32,
                requests: self.steps.max(self.concurrency) * 2,
                output_len: self.output_len,
                concurrency: self.concurrency,
            }),
            TuneWorkload::Agent => Workload::Agent(workload::Agent {
                sessions: self.concurrency,
                steps: self.steps,
                output_len: self.output_len,
                ratio: self.input_len as f64 / self.output_len.max(1) as f64,
                max_context: None,
            }),
        }
    }

    fn describe(&self) -> String {
        let w = match self.workload {
            TuneWorkload::Probe => format!(
                "probe ({} × {} in, {} out)",
                self.steps, self.input_len, self.output_len
            ),
            TuneWorkload::Sweep => format!(
                "sweep ({} streams, {} in, {} out)",
                self.concurrency, self.input_len, self.output_len
            ),
            TuneWorkload::Prefix => format!(
                "prefix ({} streams, {}-token prefixes)",
                self.concurrency, self.input_len
            ),
            TuneWorkload::Agent => format!(
                "agent ({} sessions × {} steps, {} out, {} in per step)",
                self.concurrency, self.steps, self.output_len, self.input_len
            ),
        };
        format!("the {w} workload, seed {}", self.seed)
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
        tune::default_levers(&base)
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
        args.describe(),
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
    let planner = runtime.block_on(Planner::new(&args, &base, shell))?;
    if let Some(gate) = args.max_kld
        && (gate.is_nan() || gate < 0.0)
    {
        return Err(UserError::new(
            format!("--max-kld {gate}: the gate is a KL divergence, 0 or more"),
            None,
        )
        .into());
    }
    let ctx = Ctx {
        args: &args,
        slo,
        shell,
        started,
        planner,
        quality: args.max_kld.map(|gate| Quality {
            gate,
            dir: dir.join("eval"),
            job: std::sync::Mutex::new(None),
            baseline: std::sync::Mutex::new(None),
        }),
    };
    let min_runs = args.runs as usize;
    let mut exhausted = false;
    // First pass: the baseline, then each lever alone (none if the baseline failed: every
    // trial would start the same way and fail again).
    for (i, trial) in trials.iter().enumerate() {
        exhausted |= !runtime.block_on(ctx.measure(trial, 0..min_runs, &mut journal))?;
        if i == 0 {
            let baseline = tune::result(trial, &journal.samples);
            if baseline.outcome != Outcome::Ok || baseline.estimate.is_none() {
                return Err(UserError::new(
                    format!(
                        "the baseline itself did not measure ({:?}): {}",
                        baseline.outcome,
                        baseline.message.as_deref().unwrap_or("no run finished")
                    ),
                    Some("fix the baseline recipe (`sous serve --recipe` it once), then run the tune again with --fresh"),
                )
                .into());
            }
        }
    }
    let mut results: Vec<TrialResult> = trials.iter().map(|t| tune::result(t, &journal.samples)).collect();
    let mut verdict = tune::judge(&results[0], &levers, &results, args.objective);
    // More runs where a lever's best alternative and the baseline overlap.
    let mut runs = min_runs;
    while !verdict.undecided.is_empty() && runs < args.max_runs as usize && !exhausted {
        runs += 1;
        let mut again = vec![trials[0].clone()];
        for key in &verdict.undecided {
            if let Some(best) = best_of(&results, key, args.objective) {
                again.push(best.trial.clone());
            }
        }
        for trial in &again {
            exhausted |= !runtime.block_on(ctx.measure(trial, runs - 1..runs, &mut journal))?;
        }
        results = trials.iter().map(|t| tune::result(t, &journal.samples)).collect();
        verdict = tune::judge(&results[0], &levers, &results, args.objective);
    }
    // The levers that helped, together.
    let mut chosen = verdict
        .helped
        .iter()
        .max_by(|a, b| {
            let (x, y) = (
                a.estimate.map_or(0.0, |e| e.mean),
                b.estimate.map_or(0.0, |e| e.mean),
            );
            if args.objective.higher_is_better() {
                x.total_cmp(&y)
            } else {
                y.total_cmp(&x)
            }
        })
        .cloned();
    let mut combined = None;
    if let Some(trial) = tune::combination(&verdict) {
        if !exhausted {
            exhausted |= !runtime.block_on(ctx.measure(&trial, 0..min_runs, &mut journal))?;
        }
        let r = tune::result(&trial, &journal.samples);
        if let (Some(c), Some(best)) = (r.estimate, chosen.as_ref().and_then(|b| b.estimate))
            && r.outcome == Outcome::Ok
            && (if args.objective.higher_is_better() {
                c.mean > best.mean
            } else {
                c.mean < best.mean
            })
        {
            chosen = Some(r.clone());
        }
        combined = Some(r);
    }
    let baseline = results[0].clone();
    let mut all = results.clone();
    all.extend(combined.clone());
    // Write the tuned recipe, checked by loading it before it replaces anything.
    let written = match &chosen {
        Some(chosen) => Some(write_tuned(
            &args,
            &base,
            &baseline,
            chosen,
            &verdict.helped,
            &all,
        )?),
        None => None,
    };
    let helped: Vec<String> = verdict.helped.iter().map(|r| r.trial.id.clone()).collect();
    let chart_path = dir.join("report.svg");
    let svg = tune::chart::draw(&all, &helped, args.objective)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", chart_path.display()))?;
    sous_engine::atomic::write_file(&chart_path, svg.as_bytes())
        .with_context(|| format!("writing {}", chart_path.display()))?;
    let report = json!({
        "baseline_recipe": args.recipe.recipe,
        "workload": args.describe(),
        "objective": args.objective.key(),
        "unit": args.objective.unit(),
        "slo": args.slo,
        "budget_exhausted": exhausted,
        "seconds": started.elapsed().as_secs_f64(),
        "levers": levers,
        "trials": all,
        "helped": helped,
        "not_helped": verdict.not_helped,
        "chosen": chosen.as_ref().map(|c| c.trial.id.clone()),
        "prediction": chosen.as_ref().and_then(|c| prediction(&baseline, c)),
        "tuned_recipe": written,
        "chart": chart_path,
    });
    let report_path = dir.join("report.json");
    sous_engine::atomic::write_file(&report_path, serde_json::to_string_pretty(&report)?.as_bytes())
        .with_context(|| format!("writing {}", report_path.display()))?;
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&render(&all, &baseline, args.objective))?;
    }
    if exhausted {
        shell.warn(&format!(
            "the budget ({}) ran out: the verdict uses what was measured",
            humantime::format_duration(args.budget)
        ));
    }
    match (&chosen, &written) {
        (Some(c), Some(path)) => {
            if let Some(p) = prediction(&baseline, c) {
                shell.status(
                    "tuned",
                    &format!(
                        "{}: {} (predicted {:.2}x, 95 % interval {:.2}x–{:.2}x); report {}, chart {}",
                        path.display(),
                        c.trial.id,
                        p["ratio"].as_f64().unwrap_or(0.0),
                        p["low"].as_f64().unwrap_or(0.0),
                        p["high"].as_f64().unwrap_or(0.0),
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

/// The best trial of lever `key` by mean.
fn best_of<'a>(results: &'a [TrialResult], key: &str, objective: Objective) -> Option<&'a TrialResult> {
    results
        .iter()
        .filter(|r| r.trial.lever.as_deref() == Some(key) && r.outcome == Outcome::Ok && r.estimate.is_some())
        .max_by(|a, b| {
            let (x, y) = (
                a.estimate.map_or(0.0, |e| e.mean),
                b.estimate.map_or(0.0, |e| e.mean),
            );
            if objective.higher_is_better() {
                x.total_cmp(&y)
            } else {
                y.total_cmp(&x)
            }
        })
}

/// The gain the tune predicts for the chosen trial: the ratio of the means, and the
/// range its 95 % intervals allow.
fn prediction(baseline: &TrialResult, chosen: &TrialResult) -> Option<serde_json::Value> {
    let (b, c) = (baseline.estimate?, chosen.estimate?);
    if b.mean <= 0.0 || b.low <= 0.0 {
        return None;
    }
    Some(json!({
        "ratio": c.mean / b.mean,
        "low": (c.low / b.high).max(0.0),
        "high": c.high / b.low,
    }))
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
    planner: Option<Planner>,
    quality: Option<Quality>,
}

/// The quality gate: the windows every trial is scored on (made from the first served
/// trial's tokenizer), the baseline's scores, and where each trial's are kept.
struct Quality {
    gate: f64,
    dir: PathBuf,
    job: std::sync::Mutex<Option<sous::eval::Scoring>>,
    baseline: std::sync::Mutex<Option<Vec<sous::eval::quality::Position>>>,
}

/// What the quality gate says of a trial: its figures against the baseline, and why it
/// is over the gate, if it is.
struct Verdict {
    figures: BTreeMap<String, f64>,
    over: Option<String>,
}

/// `sous plan`'s verdict on a trial's memory settings: the model (read once: levers do
/// not change it) and the machine.
struct Planner {
    model: sous_engine::plan::Model,
    hardware: Hardware,
}

impl Planner {
    /// The planner for `base`'s model on the machine `args` names (this machine's RAM
    /// for the native engine), or none, said once, when either is unknown.
    async fn new(args: &TuneArgs, base: &Recipe, shell: &Shell) -> anyhow::Result<Option<Planner>> {
        let hardware = match (&args.gpu, args.gpu_memory) {
            (Some(name), _) => Hardware::named(name)?,
            (None, Some(size)) => Hardware::with_memory(size.0),
            (None, None) if base.engine.kind == EngineKind::Native => Hardware::this_cpu()?,
            (None, None) => {
                if tune_touches_memory(args) {
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
            Ok(model) => Ok(Some(Planner { model, hardware })),
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

    /// Why `recipe` cannot hold the model and one full-length request, if it cannot.
    fn unfit(&self, recipe: &Recipe) -> Option<String> {
        match sous_engine::plan::plan(recipe, &self.model, &self.hardware) {
            Ok(p) if p.fits => None,
            Ok(p) => Some(format!(
                "`sous plan` on {}: {} tokens of KV cache, less than one request of max_model_len {}{}",
                p.hardware,
                p.kv_tokens,
                p.max_model_len,
                p.advice.first().map(|a| format!(" ({a})")).unwrap_or_default()
            )),
            Err(sous_engine::plan::PlanError::Native(why)) => {
                Some(format!("`sous plan` on {}: {why}", self.hardware.name))
            }
            // What the planner does not model is left to the engine.
            Err(_) => None,
        }
    }
}

/// Whether any lever of the tune is a memory setting.
fn tune_touches_memory(args: &TuneArgs) -> bool {
    args.levers.is_empty() || args.levers.iter().any(|l| l.trim_start().starts_with("memory."))
}

impl Ctx<'_> {
    /// Measures the runs of `trial` in `runs` that the journal lacks. Returns false when
    /// the budget ran out first.
    async fn measure(
        &self,
        trial: &Trial,
        runs: std::ops::Range<usize>,
        journal: &mut Journal,
    ) -> anyhow::Result<bool> {
        let missing: Vec<usize> = runs.filter(|r| !journal.has(&trial.id, *r)).collect();
        // A trial that could not start is not started again.
        let failed = journal.samples.iter().any(|s| {
            s.trial == trial.id
                && matches!(
                    s.outcome,
                    Outcome::Oom | Outcome::Failed | Outcome::Unfit | Outcome::QualityGate
                )
        });
        if missing.is_empty() || failed {
            return Ok(true);
        }
        if self.started.elapsed() > self.args.budget {
            return Ok(false);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("finding a free port for the trial")?;
        let recipe = trial_recipe(self.args, trial, port)?;
        if let Some(why) = self.planner.as_ref().and_then(|p| p.unfit(&recipe)) {
            self.shell.warn(&format!("{}: not started: {why}", trial.id));
            journal.record(Sample {
                trial: trial.id.clone(),
                run: missing[0],
                outcome: Outcome::Unfit,
                value: None,
                message: Some(why),
                figures: BTreeMap::new(),
            })?;
            return Ok(true);
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
        let (instance, url) = match super::serve::session(&recipe, &quiet, false).await {
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
                return Ok(true);
            }
        };
        let measured = self.runs(trial, &missing, &recipe, &url, journal).await;
        instance.stop().await?;
        measured
    }

    async fn runs(
        &self,
        trial: &Trial,
        missing: &[usize],
        recipe: &Recipe,
        url: &str,
        journal: &mut Journal,
    ) -> anyhow::Result<bool> {
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
        let options = |salt: u64| Options {
            seed: self.args.seed,
            salt: Some(salt),
            percentiles: vec![50.0, 90.0, 99.0],
            slo: self.slo.clone(),
            label: Some(trial.id.clone()),
        };
        run::run(&target, &warm, &options(u64::MAX), &Silent(&silent)).await?;
        let mut quality = BTreeMap::new();
        if let Some(q) = &self.quality {
            let verdict = self.judge_quality(q, trial, &target).await?;
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
                return Ok(true);
            }
            quality = verdict.figures;
        }
        for &r in missing {
            if self.started.elapsed() > self.args.budget {
                return Ok(false);
            }
            // The same salts for every trial: run r of each sees the same prompts.
            let report = run::run(
                &target,
                &self.args.workload(),
                &options(1000 + r as u64),
                &Silent(&silent),
            )
            .await?;
            let mut sample = sample(trial, r, &report, self.args.objective, &self.slo);
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
        Ok(true)
    }
}

/// The run's sample: its objective, figures, evidence and whether a p99 broke the SLO.
fn sample(
    trial: &Trial,
    run: usize,
    report: &sous::bench::report::Report,
    objective: Objective,
    slo: &Slo,
) -> Sample {
    let mut figures = BTreeMap::new();
    let Some(level) = report.levels.first() else {
        return Sample {
            trial: trial.id.clone(),
            run,
            outcome: Outcome::Failed,
            value: None,
            message: Some("the workload ran no level".into()),
            figures,
        };
    };
    let m = &level.metrics;
    figures.insert("output_throughput".into(), m.output_throughput);
    figures.insert("request_throughput".into(), m.request_throughput);
    figures.insert("median_ttft_ms".into(), m.ttft.median);
    figures.insert("median_tpot_ms".into(), m.tpot.median);
    for (name, s) in [("ttft", &m.ttft), ("tpot", &m.tpot), ("e2el", &m.e2el)] {
        if let Some(p99) = s.at(99.0) {
            figures.insert(format!("p99_{name}_ms"), p99);
        }
    }
    if let Some(g) = m.request_goodput {
        figures.insert("request_goodput".into(), g);
    }
    let server = &level.server;
    for (k, v) in [
        ("prefix_cache_hit_rate", server.prefix_cache_hit_rate),
        ("spec_decode_acceptance_rate", server.spec_decode_acceptance_rate),
        (
            "spec_decode_acceptance_length",
            server.spec_decode_acceptance_length,
        ),
        ("preemptions", server.preemptions),
        ("kv_cache_usage_max", server.kv_cache_usage_max),
    ] {
        if let Some(v) = v {
            figures.insert(k.into(), v);
        }
    }
    let breach = [
        ("ttft", slo.ttft_ms),
        ("tpot", slo.tpot_ms),
        ("e2el", slo.e2el_ms),
    ]
    .into_iter()
    .find_map(|(name, bound)| {
        let p99 = figures.get(&format!("p99_{name}_ms")).copied()?;
        let bound = bound?;
        (p99 > bound).then(|| format!("p99 {} {p99:.1} ms > {bound} ms", name.to_uppercase()))
    });
    let failed = m.failed > 0;
    let value = figures.get(objective.key()).copied();
    Sample {
        trial: trial.id.clone(),
        run,
        outcome: if failed {
            Outcome::Failed
        } else if breach.is_some() {
            Outcome::SloBreach
        } else {
            Outcome::Ok
        },
        value,
        message: if failed {
            Some(format!("{} of {} requests failed", m.failed, m.num_prompts))
        } else {
            breach
        },
        figures,
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
    let fallback = chosen
        .trial
        .settings
        .iter()
        .find(|s| s.key == "memory.gpu_utilization")
        .and_then(|s| {
            let f: f64 = s.value.parse().ok()?;
            all.iter()
                .filter(|r| r.outcome == Outcome::Ok && r.trial.phase == Phase::Lever)
                .flat_map(|r| r.trial.settings.iter())
                .filter(|x| x.key == "memory.gpu_utilization")
                .filter_map(|x| x.value.parse::<f64>().ok())
                .filter(|v| *v < f)
                .max_by(f64::total_cmp)
                .map(|v| v.to_string())
        });
    let text = tune::tuned_recipe(&tune::TunedRecipe {
        extends: &extends,
        name: &format!("{}-tuned", base.name),
        baseline,
        chosen,
        helped,
        objective: args.objective,
        workload: &args.describe(),
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

/// The report's table: every trial with its runs, objective, change and evidence.
fn render(results: &[TrialResult], baseline: &TrialResult, objective: Objective) -> String {
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
            (Some(b), Some(e)) if r.trial.phase != Phase::Baseline => tune::change(b, e.mean),
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
            tune::evidence(&baseline.figures, &r.figures).unwrap_or_else(|| "-".into()),
        ]);
    }
    table::layout_left(&rows, "", 7)
}

impl Ctx<'_> {
    /// Scores the trial served at `target` over the gate's windows (kept in the tune's
    /// folder, so a resumed tune does not score it again) and, for a lever, compares it
    /// with the baseline.
    async fn judge_quality(&self, q: &Quality, trial: &Trial, target: &Target) -> anyhow::Result<Verdict> {
        let client = reqwest::Client::new();
        let served = sous::bench::discover::models(&client, &target.url, target.api_key.as_deref()).await?;
        let job = {
            let mut job = q
                .job
                .lock()
                .map_err(|_| anyhow::anyhow!("the quality gate's lock"))?;
            if job.is_none() {
                let (tokenizer, _) = sous::bench::discover::tokenizer(
                    self.args.tokenizer.as_deref(),
                    served.root.as_deref(),
                    &served.id,
                )?;
                let shape = sous::eval::windows::Shape::Windows {
                    ctx: 512,
                    score_from: None,
                    chunks: None,
                };
                let (windows, _) =
                    sous::eval::scoring(&tokenizer, sous::quantize::calibrate::BUILTIN, shape, 20)?;
                *job = Some(windows);
            }
            job.clone().context("the quality gate's windows")?
        };
        let server = sous::eval::score::Server {
            url: target.url.clone(),
            model: served.id.clone(),
            api_key: target.api_key.clone(),
        };
        let saved = |id: &str| sous::eval::resume::Saved::new(&q.dir, id);
        let silent = self.shell.quiet();
        let positions = sous::eval::score_all(
            &client,
            &server,
            &job,
            &saved(&trial.id),
            &Silent(&silent),
            &trial.id,
        )
        .await?;
        if trial.phase == Phase::Baseline {
            *q.baseline
                .lock()
                .map_err(|_| anyhow::anyhow!("the quality gate's lock"))? = Some(positions);
            return Ok(Verdict {
                figures: BTreeMap::new(),
                over: None,
            });
        }
        let baseline = {
            let mut held = q
                .baseline
                .lock()
                .map_err(|_| anyhow::anyhow!("the quality gate's lock"))?;
            if held.is_none() {
                // A resumed tune whose baseline was measured before: its saved scores.
                let windows = saved(&Trial::baseline().id).load()?;
                if windows.len() == job.windows.len() && windows.iter().all(Option::is_some) {
                    *held = Some(windows.into_iter().flatten().flatten().collect());
                }
            }
            held.clone().ok_or_else(|| {
                UserError::new(
                    "the baseline's quality scores are missing",
                    Some("run the tune again with --fresh"),
                )
            })?
        };
        let c = sous::eval::quality::compare(&baseline, &positions, job.top_k)
            .map_err(sous::eval::EvalError::from)?;
        let figures = BTreeMap::from([
            ("kld_mean".to_owned(), c.kld_mean.value),
            ("kld_p99".to_owned(), c.kld_p99),
            ("top1_agreement".to_owned(), c.top1_agreement.value),
            ("delta_perplexity".to_owned(), c.delta_perplexity.value),
        ]);
        let over = (c.kld_mean.value > q.gate).then(|| {
            format!(
                "mean KL divergence {:.4} from the baseline exceeds --max-kld {} (same top token {:.1} %, perplexity {:+.2})",
                c.kld_mean.value,
                q.gate,
                c.top1_agreement.value * 100.0,
                c.delta_perplexity.value
            )
        });
        Ok(Verdict { figures, over })
    }
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

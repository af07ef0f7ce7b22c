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
//! The tune itself is `sous::tune::run`'s; this file reads the flags, runs it, and
//! prints what it found.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sous::tune::options::Options;
use sous::tune::run;
use sous::tune::workload::{TrialWorkload, WorkloadKind};
use sous::tune::{self, Objective};
use sous_engine::reporter::Reporter;
use sous_engine::size::ByteSize;

use super::{OverrideArgs, RecipeArg};
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
    /// The tune the flags ask for.
    fn options(&self) -> Options {
        Options {
            recipe: self.recipe.recipe.clone(),
            set: self.overrides.set.clone(),
            out: self.out.clone(),
            levers: self.levers.clone(),
            workload: TrialWorkload {
                kind: self.workload,
                concurrency: self.concurrency,
                steps: self.steps,
                input_len: self.input_len,
                output_len: self.output_len,
                seed: self.seed,
            },
            objective: self.objective,
            slo: self.slo.clone(),
            budget: self.budget,
            runs: self.runs,
            max_runs: self.max_runs,
            tokenizer: self.tokenizer.clone(),
            gpu: self.gpu.clone(),
            gpu_memory: self.gpu_memory,
            max_kld: self.max_kld,
            fresh: self.fresh,
        }
    }
}

pub fn exec(args: TuneArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let reporter: Arc<dyn Reporter> = Arc::new(shell.clone());
    let runtime = super::runtime()?;
    let tuned = runtime.block_on(run::run(&args.options(), reporter))?;
    let found = &tuned.findings;
    if args.json {
        shell.data(&serde_json::to_string_pretty(&tuned.report)?)?;
    } else {
        shell.data(&tune::table(&found.all(), found.baseline(), args.objective))?;
    }
    if found.exhausted {
        shell.warn(&format!(
            "the budget ({}) ran out: the verdict uses what was measured",
            humantime::format_duration(args.budget)
        ));
    }
    let (report, chart) = (tuned.report_path.display(), tuned.chart_path.display());
    match (&found.chosen, &tuned.written) {
        (Some(c), Some(path)) => {
            if let Some(p) = found.prediction() {
                shell.status(
                    "tuned",
                    &format!(
                        "{}: {} (predicted {:.2}x, 95 % interval {:.2}x–{:.2}x); report {report}, chart {chart}",
                        path.display(),
                        c.trial.id,
                        p.ratio,
                        p.low,
                        p.high,
                    ),
                );
            }
        }
        _ => shell.status(
            "unchanged",
            &format!(
                "no lever beat the baseline beyond the runs' noise; no recipe written; report {report}, chart {chart}"
            ),
        ),
    }
    Ok(ExitCode::SUCCESS)
}

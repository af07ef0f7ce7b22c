//! What a tune is asked to do: `sous tune`'s flags as a plain struct, which the whole
//! run ([`super::run::run`]) and each trial ([`super::trials`]) read.

use std::path::PathBuf;
use std::time::Duration;

use sous_engine::size::ByteSize;

use super::Objective;
use super::workload::TrialWorkload;

/// What a tune is asked to do (`sous tune`'s flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// The baseline recipe.
    pub recipe: PathBuf,
    /// `KEY=VALUE` overrides of the baseline (`--set`), kept by every trial.
    pub set: Vec<String>,
    /// Where the tuned recipe goes, a `.toml` file; the journal and the report go to its
    /// [`state_dir`](super::run::state_dir).
    pub out: PathBuf,
    /// The levers and the values to try, `KEY=V1,V2,...`; none: what the engine honours
    /// ([`super::default_levers`]).
    pub levers: Vec<String>,
    /// The workload every trial is measured with.
    pub workload: TrialWorkload,
    /// What to improve.
    pub objective: Objective,
    /// Latency bounds, `ttft:500,tpot:50`: a trial whose p99 breaks one fails.
    pub slo: Option<String>,
    /// No trial starts after this long (what was measured is used).
    pub budget: Duration,
    /// Measured runs per trial (2 or more).
    pub runs: u64,
    /// Most runs of a trial while its interval and the baseline's overlap.
    pub max_runs: u64,
    /// The tokenizer prompts are measured with (default: the served model's).
    pub tokenizer: Option<PathBuf>,
    /// The machine memory levers are planned for, by name (`sous plan --gpu`).
    pub gpu: Option<String>,
    /// The same, by its memory, when `gpu` is not given.
    pub gpu_memory: Option<ByteSize>,
    /// The quality gate: the most mean KL divergence from the baseline (nats).
    pub max_kld: Option<f64>,
    /// Forget an earlier tune's journal for `out` and start over.
    pub fresh: bool,
}

//! The workload every trial of a tune is measured with: one of `sous bench`'s
//! workloads, shaped by the tune's few flags, and the line that describes it.

use crate::bench::workload::{self, Workload};

/// Which of `sous bench`'s workloads the trials are measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// One stream: TTFT and decode speed.
    Probe,
    /// `--concurrency` streams of random prompts.
    Sweep,
    /// Requests sharing long prefixes.
    Prefix,
    /// Coding-agent sessions resending a growing context.
    Agent,
}

/// The tune's workload flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrialWorkload {
    /// Which workload.
    pub kind: WorkloadKind,
    /// Streams (sweep, prefix) or sessions (agent).
    pub concurrency: usize,
    /// Requests per session (agent) or per run (sweep, prefix: at least `concurrency`).
    pub steps: usize,
    /// Prompt tokens (probe, sweep), or prompt tokens per generated token (agent).
    pub input_len: usize,
    /// Output tokens per request.
    pub output_len: usize,
    /// Seed of the prompts.
    pub seed: u64,
}

impl TrialWorkload {
    /// The workload.
    pub fn workload(&self) -> Workload {
        match self.kind {
            WorkloadKind::Probe => Workload::Probe(workload::Probe {
                repeat: self.steps.max(1),
                input_len: self.input_len,
                output_len: self.output_len,
                prompt: None,
            }),
            WorkloadKind::Sweep => Workload::Sweep(workload::Sweep {
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
            WorkloadKind::Prefix => Workload::Prefix(workload::Prefix {
                prefixes: 2,
                prefix_len: self.input_len,
                suffix_len: 32,
                requests: self.steps.max(self.concurrency) * 2,
                output_len: self.output_len,
                concurrency: self.concurrency,
            }),
            WorkloadKind::Agent => Workload::Agent(workload::Agent {
                sessions: self.concurrency,
                steps: self.steps,
                output_len: self.output_len,
                ratio: self.input_len as f64 / self.output_len.max(1) as f64,
                max_context: None,
            }),
        }
    }

    /// A line that says what it is, for the report and the tuned recipe.
    pub fn describe(&self) -> String {
        let w = match self.kind {
            WorkloadKind::Probe => format!(
                "probe ({} × {} in, {} out)",
                self.steps, self.input_len, self.output_len
            ),
            WorkloadKind::Sweep => format!(
                "sweep ({} streams, {} in, {} out)",
                self.concurrency, self.input_len, self.output_len
            ),
            WorkloadKind::Prefix => format!(
                "prefix ({} streams, {}-token prefixes)",
                self.concurrency, self.input_len
            ),
            WorkloadKind::Agent => format!(
                "agent ({} sessions × {} steps, {} out, {} in per step)",
                self.concurrency, self.steps, self.output_len, self.input_len
            ),
        };
        format!("the {w} workload, seed {}", self.seed)
    }
}

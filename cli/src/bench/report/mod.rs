//! A benchmark's report: the typed document `sous bench probe|sweep|prefix|agent` writes
//! as JSON (each level's keys named as in `vllm bench serve`'s result file where the
//! concept is the same: `mean_ttft_ms`, `p99_itl_ms`, `output_throughput`, ...; sous's
//! own additions beside them), one CSV row per level, the terminal text, `sous bench
//! compare`, and the files of `--out`. Not here: running the workload
//! ([`super::run`]).

mod csv;
pub mod extras;
mod level;
mod render;
pub mod write;

use serde::Serialize;

use super::client::Endpoint;

pub use csv::csv;
pub use extras::{AgentSummary, ErrorCount, ProbeSummary};
pub use level::{InstanceFigures, Level};
pub use render::{compare, summary};
pub use write::write;

/// The document of one run. The fields are in alphabetical order because that is the
/// order of the keys sous has always written (serde_json's map is sorted); the
/// serialization must not change, since scripts and `compare` read it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `openai`: the API the requests used (as `vllm bench serve`'s `backend`).
    pub backend: &'static str,
    /// The server's base URL.
    pub base_url: String,
    /// When the run ended, UTC, `YYYYMMDD-HHMMSS` (as `vllm bench serve` writes `date`).
    pub date: String,
    /// The endpoint called.
    pub endpoint_type: Endpoint,
    /// The run's name in reports and comparisons.
    pub label: Option<String>,
    /// One per concurrency level, in the order run.
    pub levels: Vec<Level>,
    /// The model name sent.
    pub model_id: String,
    /// The salt of the cold prompts' first words.
    pub salt: u64,
    /// The seed of the prompt text and lengths.
    pub seed: u64,
    /// The sous that ran it.
    pub sous_version: &'static str,
    /// The tokenizer file prompts were measured with.
    pub tokenizer_id: String,
    /// `probe`, `sweep`, `prefix` or `agent`.
    pub workload: &'static str,
}

impl Report {
    /// Requests that failed, over every level.
    pub fn failed(&self) -> usize {
        self.levels.iter().map(|l| l.metrics.failed).sum()
    }

    /// The document as it is printed and written: pretty JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

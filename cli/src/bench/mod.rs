//! `sous bench`: the measurements of the field reports, from a live server (active
//! workloads with client-side timing and `/metrics` deltas) or from what a production
//! server left behind (vLLM's periodic stats lines, Prometheus histograms).
//!
//! Definitions follow `vllm bench serve` (`vllm/benchmarks/serve.py`) so that figures
//! are comparable with it; see [`stats`]. The active runner is [`run`] (what to run in
//! [`workload`], their prompts in [`prompts`], when open-loop requests arrive in
//! [`arrivals`], the report in
//! [`report`]); the passive ones are [`logs`] and [`scrape`]; [`compare`] puts two
//! reports of any kind side by side; [`coldstart`] summarizes repeated starts; engines' metric names
//! and log lines come from `sous_engine::dialect`. Nothing here prints: progress and
//! warnings go to a `Reporter`, and the command prints the rest.

pub mod arrivals;
pub mod charts;
pub mod client;
pub mod coldstart;
mod error;
pub mod logs;
pub mod prom;
pub mod prompts;
pub mod ratio;
pub mod report;
pub mod run;
pub mod scrape;
pub mod server;
pub mod stats;
pub mod table;
pub mod window;
pub mod workload;

pub use error::BenchError;

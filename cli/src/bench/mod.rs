//! `sous bench`: the measurements of the field reports, from a live server (active
//! workloads with client-side timing and `/metrics` deltas) or from what a production
//! server left behind (vLLM's periodic stats lines, Prometheus histograms).
//!
//! Definitions follow `vllm bench serve` (`vllm/benchmarks/serve.py`) so that figures
//! are comparable with it; see [`stats`].

pub mod charts;
pub mod client;
pub mod logs;
pub mod prom;
pub mod ratio;
pub mod report;
pub mod scrape;
pub mod server;
pub mod stats;
pub mod table;
pub mod workload;

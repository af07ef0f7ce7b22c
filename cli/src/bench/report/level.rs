//! One level of a run (a concurrency level or a request rate of a sweep, or a whole
//! probe, prefix or agent run) and its JSON object: `vllm bench serve`'s flat result
//! keys (`request_rate`, `burstiness`, `max_concurrency`, `mean_ttft_ms`, `p99_itl_ms`
//! for each percentile asked, ...) plus sous's (`server`, `errors`, `probe`, `agent`).
//! Not here: measuring it ([`crate::bench::run`]).

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};
use serde_json::{Value, json};

use super::extras::{AgentSummary, ErrorCount, ProbeSummary};
use crate::bench::arrivals::Traffic;
use crate::bench::server::ServerFigures;
use crate::bench::stats::RunMetrics;
use crate::stats::Summary;

/// One level of a run.
#[derive(Debug, Clone)]
pub struct Level {
    /// How its requests arrived (for a closed loop of N streams: all at once, N at a
    /// time).
    pub traffic: Traffic,
    /// Client-side figures.
    pub metrics: RunMetrics,
    /// What the engine counted (with `--instances`, every instance together).
    pub server: ServerFigures,
    /// With `--instances`: what each instance counted.
    pub instances: Vec<InstanceFigures>,
    /// The probe's repetitions (`sous bench probe`).
    pub probe: Option<ProbeSummary>,
    /// The agent's steps (`sous bench agent`).
    pub agent: Option<AgentSummary>,
    /// Each distinct failure once, with how often it happened.
    pub errors: Vec<ErrorCount>,
    /// Each completed request's TTFT, ms (for the CDF chart; not in the JSON).
    pub ttfts_ms: Vec<f64>,
}

/// What one instance behind a router counted during a level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceFigures {
    /// Its base URL.
    pub url: String,
    /// Its figures; `None` when its `/metrics` did not answer before and after.
    pub server: Option<ServerFigures>,
}

/// `p99`, `p99.9`: a percentile as the keys name it.
pub(super) fn key_percentile(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("p{}", p as u64)
    } else {
        format!("p{p}")
    }
}

fn put_summary(map: &mut BTreeMap<String, Value>, name: &str, s: &Summary) {
    map.insert(format!("mean_{name}_ms"), json!(s.mean));
    map.insert(format!("median_{name}_ms"), json!(s.median));
    map.insert(format!("std_{name}_ms"), json!(s.std));
    for (p, v) in &s.percentiles {
        map.insert(format!("{}_{name}_ms", key_percentile(*p)), json!(v));
    }
}

impl Level {
    /// The level as `vllm bench serve`'s flat result object plus sous's fields, keys in
    /// alphabetical order (the order sous has always written them).
    fn fields(&self) -> BTreeMap<String, Value> {
        let m = &self.metrics;
        let mut map = BTreeMap::new();
        // As `vllm bench serve` writes them: the rate a number or "inf", no cap null.
        let t = &self.traffic;
        let number_or_inf = |v: f64| if v.is_finite() { json!(v) } else { json!("inf") };
        map.insert("request_rate".into(), number_or_inf(t.request_rate));
        map.insert("burstiness".into(), number_or_inf(t.burstiness));
        for (k, v) in [
            ("num_prompts", json!(m.num_prompts)),
            ("max_concurrency", json!(t.max_concurrency)),
            ("duration", json!(m.duration)),
            ("completed", json!(m.completed)),
            ("failed", json!(m.failed)),
            ("total_input_tokens", json!(m.total_input_tokens)),
            ("total_output_tokens", json!(m.total_output_tokens)),
            ("request_throughput", json!(m.request_throughput)),
            ("request_goodput", json!(m.request_goodput)),
            ("output_throughput", json!(m.output_throughput)),
            ("total_token_throughput", json!(m.total_token_throughput)),
            ("max_output_tokens_per_s", json!(m.max_output_tokens_per_s)),
            ("max_concurrent_requests", json!(m.max_concurrent_requests)),
            ("peak_in_flight", json!(m.peak_in_flight)),
        ] {
            map.insert(k.into(), v);
        }
        put_summary(&mut map, "ttft", &m.ttft);
        put_summary(&mut map, "tpot", &m.tpot);
        put_summary(&mut map, "itl", &m.itl);
        put_summary(&mut map, "e2el", &m.e2el);
        if self.server.spec_decode_num_drafts.is_some_and(|d| d > 0.0) {
            map.insert(
                "spec_decode_acceptance_rate".into(),
                json!(self.server.spec_decode_acceptance_rate.map(|r| r * 100.0)),
            );
            map.insert(
                "spec_decode_acceptance_length".into(),
                json!(self.server.spec_decode_acceptance_length),
            );
            map.insert(
                "spec_decode_per_position_acceptance_rates".into(),
                json!(self.server.spec_decode_per_position_acceptance_rates),
            );
        }
        map.insert(
            "mean_request_output_tokens_per_s".into(),
            json!(m.mean_request_output_tokens_per_s),
        );
        map.insert("usage_cached_fraction".into(), json!(m.usage_cached_fraction));
        map.insert("server".into(), json!(self.server));
        if !self.instances.is_empty() {
            map.insert("instances".into(), json!(self.instances));
        }
        if let Some(probe) = &self.probe {
            map.insert("probe".into(), json!(probe));
        }
        if let Some(agent) = &self.agent {
            map.insert("agent".into(), json!(agent));
        }
        map.insert("errors".into(), json!(self.errors));
        map
    }
}

impl Serialize for Level {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.fields().serialize(serializer)
    }
}

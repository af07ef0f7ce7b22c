//! One measured run of a trial as the journal keeps it ([`Sample`]), and how a run ended
//! ([`Outcome`]): what a bench report of the run says against the objective and the SLO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Objective, Trial};
use crate::bench::report::Report;
use crate::bench::stats::Slo;

/// How one measured run of a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Measured, within the SLO.
    Ok,
    /// The engine ran out of memory at start-up.
    Oom,
    /// Measured, but a p99 latency broke the SLO.
    SloBreach,
    /// The engine did not start or the run failed for another reason.
    Failed,
    /// Not started: `sous plan` says the trial's memory settings cannot hold the
    /// weights and one request of `max_model_len`.
    Unfit,
    /// Not measured: its next-token distributions diverge from the baseline's by more
    /// than the tune's quality gate (`--max-kld`).
    QualityGate,
}

/// What one measured run of a trial recorded (a journal line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The trial's id.
    pub trial: String,
    /// The run's index within the trial (its salt is the tune's salt plus this).
    pub run: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// The objective's value, when measured.
    pub value: Option<f64>,
    /// Why it failed, or which bound the SLO breach broke.
    pub message: Option<String>,
    /// The run's figures and the server's metrics evidence.
    pub figures: BTreeMap<String, f64>,
}

impl Sample {
    /// Run `run` of `trial` as measured by `report`: its objective, figures, the
    /// server's metrics evidence, and whether a p99 broke the SLO.
    pub fn of_run(trial: &Trial, run: usize, report: &Report, objective: Objective, slo: &Slo) -> Sample {
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
}

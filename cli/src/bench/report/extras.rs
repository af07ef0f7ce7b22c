//! The figures a level carries beyond `vllm bench serve`'s: the probe's repetitions and
//! their spread, the agent's steps, and the distinct errors. Each is computed from the
//! level's request records. Not here: the figures every level has
//! ([`crate::bench::stats`]).
//!
//! The fields of each struct are in alphabetical order, the order of the keys sous has
//! always written.

use serde::Serialize;

use crate::bench::stats::RequestRecord;
use crate::stats::percentile;

/// One request of a probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Repetition {
    /// The request's own decode speed, `1 / TPOT`, tokens/s.
    pub decode_tok_s: f64,
    /// Its time to first token, ms.
    pub ttft_ms: f64,
}

/// Median, min, max and population standard deviation of some values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// The largest; none without values.
    pub max: Option<f64>,
    /// numpy's median; 0 without values.
    pub median: f64,
    /// The smallest; none without values.
    pub min: Option<f64>,
    /// Population standard deviation.
    pub std: f64,
}

impl Spread {
    /// The spread of `values`.
    pub fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let mean = sorted.iter().sum::<f64>() / n;
        Spread {
            max: sorted.last().copied(),
            median: percentile(&sorted, 50.0),
            min: sorted.first().copied(),
            std: (sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt(),
        }
    }
}

/// `sous bench probe`: each completed repetition and the spread of TTFT and decode speed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeSummary {
    /// The spread of the decode speeds, tokens/s.
    pub decode_tok_s: Spread,
    /// Each completed request, in order.
    pub repetitions: Vec<Repetition>,
    /// The spread of the TTFTs, ms.
    pub ttft_ms: Spread,
}

impl ProbeSummary {
    /// The probe's figures from its records.
    pub fn of(records: &[RequestRecord]) -> ProbeSummary {
        let repetitions: Vec<Repetition> = records
            .iter()
            .filter(|r| r.success)
            .map(|r| Repetition {
                decode_tok_s: decode_speed(r),
                ttft_ms: r.ttft * 1000.0,
            })
            .collect();
        let ttft: Vec<f64> = repetitions.iter().map(|r| r.ttft_ms).collect();
        let speed: Vec<f64> = repetitions.iter().map(|r| r.decode_tok_s).collect();
        ProbeSummary {
            decode_tok_s: Spread::of(&speed),
            repetitions,
            ttft_ms: Spread::of(&ttft),
        }
    }
}

/// A request's own decode speed, `(tokens - 1) / (E2E - TTFT)`.
fn decode_speed(r: &RequestRecord) -> f64 {
    match r.tpot() {
        Some(t) if t > 0.0 => 1.0 / t,
        _ => 0.0,
    }
}

/// One step of the agent's sessions, over the sessions' completed requests at it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentStep {
    /// Prompt tokens the server found cached, on average.
    pub mean_cached_tokens: f64,
    /// Prompt tokens, on average.
    pub mean_prompt_tokens: f64,
    /// Time to first token, ms, on average.
    pub mean_ttft_ms: f64,
    /// The step, from 1.
    pub step: usize,
}

/// `sous bench agent`: the prompt:generation ratio and each step's means.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentSummary {
    /// Prompt tokens over generated tokens of the completed requests (0 when none
    /// generated).
    pub prompt_to_generation_ratio: f64,
    /// One per step.
    pub steps: Vec<AgentStep>,
}

impl AgentSummary {
    /// The agent's figures from its records, each with its session and step.
    pub fn of(records: &[(usize, usize, RequestRecord)]) -> AgentSummary {
        let steps = records.iter().map(|(_, s, _)| *s).max().map_or(0, |s| s + 1);
        let steps = (0..steps)
            .map(|step| {
                let at: Vec<&RequestRecord> = records
                    .iter()
                    .filter(|(_, s, r)| *s == step && r.success)
                    .map(|(_, _, r)| r)
                    .collect();
                let n = at.len().max(1) as f64;
                AgentStep {
                    mean_cached_tokens: at
                        .iter()
                        .map(|r| r.cached_tokens.unwrap_or(0) as f64)
                        .sum::<f64>()
                        / n,
                    mean_prompt_tokens: at.iter().map(|r| r.prompt_len as f64).sum::<f64>() / n,
                    mean_ttft_ms: at.iter().map(|r| r.ttft * 1000.0).sum::<f64>() / n,
                    step: step + 1,
                }
            })
            .collect();
        let done = || records.iter().filter(|(_, _, r)| r.success).map(|(_, _, r)| r);
        let prompt: u64 = done().map(|r| r.prompt_len as u64).sum();
        let output: u64 = done().map(|r| r.output_tokens).sum();
        AgentSummary {
            prompt_to_generation_ratio: if output > 0 {
                prompt as f64 / output as f64
            } else {
                0.0
            },
            steps,
        }
    }
}

/// A failure and how often it happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorCount {
    /// How many requests failed so.
    pub count: usize,
    /// The error.
    pub message: String,
}

impl ErrorCount {
    /// Each distinct failure of `records` once, in the order first seen.
    pub fn tally(records: &[RequestRecord]) -> Vec<ErrorCount> {
        let mut errors: Vec<ErrorCount> = Vec::new();
        for error in records.iter().filter_map(|r| r.error.as_deref()) {
            match errors.iter_mut().find(|e| e.message == error) {
                Some(slot) => slot.count += 1,
                None => errors.push(ErrorCount {
                    count: 1,
                    message: error.to_owned(),
                }),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(ttft: f64, latency: f64, tokens: u64, step: usize) -> (usize, usize, RequestRecord) {
        (
            0,
            step,
            RequestRecord {
                success: true,
                ttft,
                latency,
                prompt_len: 100 * (step + 1),
                cached_tokens: Some(50 * step as u64),
                output_tokens: tokens,
                ..Default::default()
            },
        )
    }

    #[test]
    fn probe_agent_and_errors_as_written() {
        let failed = RequestRecord {
            error: Some("HTTP 500: boom".into()),
            ..Default::default()
        };
        // TPOT (0.5 - 0.1) / 4 = 0.1 s and (0.3 - 0.1) / 4 = 0.05 s: 10 and 20 tok/s.
        let records = vec![done(0.1, 0.5, 5, 0), done(0.1, 0.3, 5, 1), (0, 2, failed.clone())];
        let flat: Vec<RequestRecord> = records.iter().map(|(_, _, r)| r.clone()).collect();
        let probe = ProbeSummary::of(&flat);
        assert_eq!(probe.repetitions.len(), 2);
        assert_eq!(
            serde_json::to_value(&probe.decode_tok_s).expect("json"),
            serde_json::json!({"max": 20.0, "median": 15.0, "min": 10.0, "std": 5.0})
        );
        assert_eq!(Spread::of(&[]).min, None);
        let agent = AgentSummary::of(&records);
        // 300 prompt tokens over 10 generated; the failed third step counts no request.
        assert_eq!(agent.prompt_to_generation_ratio, 30.0);
        assert_eq!(agent.steps.len(), 3);
        assert_eq!(
            (
                agent.steps[1].mean_cached_tokens,
                agent.steps[2].mean_prompt_tokens
            ),
            (50.0, 0.0)
        );
        let errors = ErrorCount::tally(&[failed.clone(), flat[0].clone(), failed]);
        assert_eq!(
            serde_json::to_value(&errors).expect("json"),
            serde_json::json!([{"count": 2, "message": "HTTP 500: boom"}])
        );
    }
}

//! What an active benchmark runs: the workloads as plain descriptions (what the user
//! asked for, with no command-line types), and their levels: for each concurrency (or,
//! open-loop, each request rate) the sessions of requests to send, built by
//! [`super::prompts`], and when each is sent ([`super::arrivals`]). Not here: sending
//! them ([`super::run`]).

use super::BenchError;
use super::arrivals::{self, Traffic};
use super::client::Job;
use super::prompts::{self, PromptMaker};

/// A workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// One stream, repeated: TTFT and decode speed.
    Probe(Probe),
    /// Concurrency levels with a number of requests each.
    Sweep(Sweep),
    /// Requests sharing long prefixes.
    Prefix(Prefix),
    /// Coding-agent sessions resending a growing context.
    Agent(Agent),
}

/// `sous bench probe`.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Repetitions (at least one is run).
    pub repeat: usize,
    /// Prompt tokens.
    pub input_len: usize,
    /// Output tokens, past the end-of-sequence token.
    pub output_len: usize,
    /// A given prompt text instead of `input_len` random words (a file to edit, for
    /// speculative decoding by prompt lookup); each repetition still starts with a few
    /// salted words, so none is served from the prefix cache.
    pub prompt: Option<String>,
}

/// `sous bench sweep`: closed-loop levels (`concurrency`), or open-loop ones
/// (`request_rates`) when any rate is given.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// Concurrency levels, each at least 1 (closed loop: that many requests in flight,
    /// the next sent as one ends); unused when `request_rates` is not empty.
    pub concurrency: Vec<usize>,
    /// Open-loop levels: requests per second, `f64::INFINITY` for all at once, each
    /// positive.
    pub request_rates: Vec<f64>,
    /// The gamma shape of the open-loop gaps (1: Poisson; `f64::INFINITY`: even).
    pub burstiness: f64,
    /// The most requests in flight in an open-loop level; none: no cap.
    pub max_concurrency: Option<usize>,
    /// Requests per level (default: closed loop, 4 × the level, at least 8; open loop,
    /// see [`Sweep::open_requests`]).
    pub requests: Option<usize>,
    /// Prompt tokens.
    pub input_len: usize,
    /// Output tokens.
    pub output_len: usize,
    /// Draw lengths uniformly within ± this ratio (vLLM's `--random-range-ratio`).
    pub range_ratio: f64,
    /// Stop at the end-of-sequence token instead of generating `output_len` tokens.
    pub eos: bool,
}

impl Sweep {
    /// The prompt and output lengths of its requests.
    fn lengths(&self) -> prompts::Lengths {
        prompts::Lengths {
            input: self.input_len,
            output: self.output_len,
            range_ratio: self.range_ratio,
            ignore_eos: !self.eos,
        }
    }
}

/// `sous bench prefix`.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefix {
    /// Distinct shared prefixes.
    pub prefixes: usize,
    /// Tokens of each prefix.
    pub prefix_len: usize,
    /// Unique tokens after the prefix.
    pub suffix_len: usize,
    /// Requests in all.
    pub requests: usize,
    /// Output tokens.
    pub output_len: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
}

/// `sous bench agent`.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    /// Sessions, all at once.
    pub sessions: usize,
    /// Requests per session.
    pub steps: usize,
    /// Output tokens per step.
    pub output_len: usize,
    /// Prompt tokens per generated token, on average.
    pub ratio: f64,
    /// The longest context to send (default: the server's `max_model_len`, else 8192).
    pub max_context: Option<usize>,
}

/// One level to run: at most `concurrency` sessions in flight, each a list of requests
/// sent one after the other, all at once or each at its arrival time.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Sessions in flight at once (the semaphore's permits).
    pub concurrency: usize,
    /// The sessions.
    pub sessions: Vec<Vec<Job>>,
    /// When each session arrives, seconds from the level's start (open loop); none:
    /// all at once.
    pub arrivals: Option<Vec<f64>>,
    /// The level's traffic keys.
    pub traffic: Traffic,
}

impl Planned {
    /// A closed-loop level: every session at once, `concurrency` at a time.
    fn closed(concurrency: usize, sessions: Vec<Vec<Job>>) -> Planned {
        Planned {
            concurrency,
            sessions,
            arrivals: None,
            traffic: Traffic::closed(concurrency),
        }
    }
}

impl Sweep {
    /// Requests of each open-loop level, in the order of `request_rates`: `requests`
    /// when given; else about ten seconds of arrivals at a finite rate (10 × R, at least
    /// 8) and, at rate `inf`, 4 × `max_concurrency` (at least 8) or, with no cap, as
    /// many as the largest finite level (at least 8).
    pub fn open_requests(&self) -> Vec<usize> {
        let finite = |r: f64| ((10.0 * r).ceil() as usize).max(8);
        let largest = self
            .request_rates
            .iter()
            .filter(|r| r.is_finite())
            .map(|r| finite(*r))
            .max()
            .unwrap_or(8);
        self.request_rates
            .iter()
            .map(|r| match (self.requests, r.is_finite(), self.max_concurrency) {
                (Some(n), _, _) => n,
                (None, true, _) => finite(*r),
                (None, false, Some(c)) => (4 * c).max(8),
                (None, false, None) => largest,
            })
            .collect()
    }
}

impl Workload {
    /// `probe`, `sweep`, `prefix` or `agent`.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Probe(_) => "probe",
            Workload::Sweep(_) => "sweep",
            Workload::Prefix(_) => "prefix",
            Workload::Agent(_) => "agent",
        }
    }

    /// The levels, with prompts from `maker`; `max_len` is the server's `max_model_len`
    /// when it gave one, and no request may be longer.
    pub fn levels(
        &self,
        maker: &PromptMaker,
        seed: u64,
        salt: u64,
        max_len: Option<usize>,
    ) -> Result<Vec<Planned>, BenchError> {
        let levels = match self {
            Workload::Probe(a) => {
                let lengths = prompts::Lengths {
                    input: a.input_len,
                    output: a.output_len,
                    range_ratio: 0.0,
                    ignore_eos: true,
                };
                let sessions = match &a.prompt {
                    Some(text) => prompts::given(maker, salt, a.repeat.max(1), text, &lengths),
                    None => prompts::independent(maker, seed, salt, a.repeat.max(1), &lengths),
                };
                vec![Planned::closed(1, sessions)]
            }
            Workload::Sweep(a) if !a.request_rates.is_empty() => {
                if a.max_concurrency == Some(0) {
                    return Err(BenchError::NoMaxConcurrency);
                }
                let lengths = a.lengths();
                let mut levels = Vec::with_capacity(a.request_rates.len());
                for (i, (rate, n)) in a.request_rates.iter().zip(a.open_requests()).enumerate() {
                    // Every level draws its gaps from the same seed: the same pattern,
                    // scaled to each rate.
                    let times = arrivals::schedule(seed, n, *rate, a.burstiness)?;
                    levels.push(Planned {
                        concurrency: a.max_concurrency.unwrap_or(n).max(1),
                        sessions: prompts::independent(maker, seed, salt.wrapping_add(i as u64), n, &lengths),
                        arrivals: Some(times),
                        traffic: Traffic {
                            request_rate: *rate,
                            burstiness: a.burstiness,
                            max_concurrency: a.max_concurrency,
                        },
                    });
                }
                levels
            }
            Workload::Sweep(a) => {
                if a.concurrency.is_empty() || a.concurrency.contains(&0) {
                    return Err(BenchError::NoConcurrency);
                }
                let lengths = a.lengths();
                a.concurrency
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let n = a.requests.unwrap_or((4 * c).max(8));
                        Planned::closed(
                            *c,
                            prompts::independent(maker, seed, salt.wrapping_add(i as u64), n, &lengths),
                        )
                    })
                    .collect()
            }
            Workload::Prefix(a) => {
                let p = prompts::Prefixes {
                    prefixes: a.prefixes,
                    prefix_len: a.prefix_len,
                    suffix_len: a.suffix_len,
                    requests: a.requests,
                    output: a.output_len,
                };
                vec![Planned::closed(
                    a.concurrency,
                    prompts::shared_prefixes(maker, seed, salt, &p),
                )]
            }
            Workload::Agent(a) => {
                let limit = a.max_context.or(max_len).unwrap_or(8192);
                let spec = prompts::Agent {
                    sessions: a.sessions,
                    steps: a.steps,
                    output: a.output_len,
                    ratio: a.ratio,
                    max_prompt: limit.saturating_sub(a.output_len + 8).max(16),
                };
                vec![Planned::closed(
                    a.sessions,
                    prompts::agent(maker, seed, salt, &spec),
                )]
            }
        };
        if let Some(limit) = max_len {
            let longest = levels
                .iter()
                .flat_map(|l| l.sessions.iter().flatten())
                .map(|j| j.prompt_len + j.max_tokens)
                .max()
                .unwrap_or(0);
            if longest > limit {
                return Err(BenchError::TooLong { longest, limit });
            }
        }
        Ok(levels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(rates: &[f64], max_concurrency: Option<usize>, requests: Option<usize>) -> Sweep {
        Sweep {
            concurrency: vec![1],
            request_rates: rates.to_vec(),
            burstiness: 1.0,
            max_concurrency,
            requests,
            input_len: 8,
            output_len: 8,
            range_ratio: 0.0,
            eos: false,
        }
    }

    #[test]
    fn open_levels_default_to_ten_seconds_of_arrivals() {
        let inf = f64::INFINITY;
        assert_eq!(
            sweep(&[0.1, 2.5, 20.0, inf], None, None).open_requests(),
            [8, 25, 200, 200]
        );
        assert_eq!(sweep(&[inf], Some(4), None).open_requests(), [16]);
        assert_eq!(sweep(&[inf], None, None).open_requests(), [8]);
        assert_eq!(sweep(&[1.0, inf], Some(4), Some(30)).open_requests(), [30, 30]);
    }
}

//! What an active benchmark runs: the workloads as plain descriptions (what the user
//! asked for, with no command-line types), and their levels: for each concurrency the
//! sessions of requests to send, built by [`super::workload`]. Not here: sending them
//! ([`super::run`]).

use super::BenchError;
use super::client::Job;
use super::workload::{self, PromptMaker};

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

/// `sous bench sweep`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// Concurrency levels, each at least 1.
    pub concurrency: Vec<usize>,
    /// Requests per level (default: 4 × the level, at least 8).
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
/// sent one after the other.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Sessions in flight at once.
    pub concurrency: usize,
    /// The sessions.
    pub sessions: Vec<Vec<Job>>,
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
                let lengths = workload::Lengths {
                    input: a.input_len,
                    output: a.output_len,
                    range_ratio: 0.0,
                    ignore_eos: true,
                };
                let sessions = match &a.prompt {
                    Some(text) => workload::given(maker, salt, a.repeat.max(1), text, &lengths),
                    None => workload::independent(maker, seed, salt, a.repeat.max(1), &lengths),
                };
                vec![Planned {
                    concurrency: 1,
                    sessions,
                }]
            }
            Workload::Sweep(a) => {
                if a.concurrency.is_empty() || a.concurrency.contains(&0) {
                    return Err(BenchError::NoConcurrency);
                }
                let lengths = workload::Lengths {
                    input: a.input_len,
                    output: a.output_len,
                    range_ratio: a.range_ratio,
                    ignore_eos: !a.eos,
                };
                a.concurrency
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let n = a.requests.unwrap_or((4 * c).max(8));
                        Planned {
                            concurrency: *c,
                            sessions: workload::independent(
                                maker,
                                seed,
                                salt.wrapping_add(i as u64),
                                n,
                                &lengths,
                            ),
                        }
                    })
                    .collect()
            }
            Workload::Prefix(a) => {
                let p = workload::Prefixes {
                    prefixes: a.prefixes,
                    prefix_len: a.prefix_len,
                    suffix_len: a.suffix_len,
                    requests: a.requests,
                    output: a.output_len,
                };
                vec![Planned {
                    concurrency: a.concurrency,
                    sessions: workload::shared_prefixes(maker, seed, salt, &p),
                }]
            }
            Workload::Agent(a) => {
                let limit = a.max_context.or(max_len).unwrap_or(8192);
                let spec = workload::Agent {
                    sessions: a.sessions,
                    steps: a.steps,
                    output: a.output_len,
                    ratio: a.ratio,
                    max_prompt: limit.saturating_sub(a.output_len + 8).max(16),
                };
                vec![Planned {
                    concurrency: a.sessions,
                    sessions: workload::agent(maker, seed, salt, &spec),
                }]
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

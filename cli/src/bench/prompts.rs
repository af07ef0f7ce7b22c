//! The workloads' requests, built with the served model's tokenizer so that every
//! prompt's length in tokens is known exactly (measured by encoding the final text),
//! and from a seeded generator so that a run can be reproduced.
//!
//! Prompts are made of whole-word vocabulary entries (a space and 2 to 10 lower-case
//! letters), which re-tokenize to themselves when joined; the last adjustment step
//! re-encodes and trims until the count is the target. The first words of every
//! prompt that must be cold come from a salt (recorded in the report), so a repeated
//! run does not hit a prefix cache filled by the previous one.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokenizers::Tokenizer;

use super::client::Job;

/// Builds prompts of exact token lengths.
pub struct PromptMaker {
    tokenizer: Tokenizer,
    words: Vec<u32>,
}

impl PromptMaker {
    /// Finds the whole-word entries of the vocabulary.
    pub fn new(tokenizer: Tokenizer) -> Result<PromptMaker, String> {
        let size = tokenizer.get_vocab_size(true) as u32;
        let words: Vec<u32> = (0..size)
            .filter(|id| {
                tokenizer.decode(&[*id], true).is_ok_and(|s| {
                    s.len() > 2
                        && s.len() <= 11
                        && s.starts_with(' ')
                        && s[1..].bytes().all(|b| b.is_ascii_lowercase())
                })
            })
            .collect();
        if words.len() < 100 {
            return Err(format!(
                "the tokenizer has only {} whole-word entries; sous cannot build prompts from it",
                words.len()
            ));
        }
        Ok(PromptMaker { tokenizer, words })
    }

    /// Tokens in `text`, as the server will count them (no special tokens added).
    pub fn count(&self, text: &str) -> usize {
        self.tokenizer
            .encode(text, false)
            .map_or(0, |e| e.get_ids().len())
    }

    /// Text of about `tokens` tokens of random words (exactly, in practice, and the
    /// callers measure the joined prompt anyway).
    pub fn text(&self, rng: &mut ChaCha8Rng, tokens: usize) -> String {
        if tokens == 0 {
            return String::new();
        }
        let mut ids: Vec<u32> = (0..tokens)
            .map(|_| self.words[rng.random_range(0..self.words.len())])
            .collect();
        let mut text = self.tokenizer.decode(&ids, true).unwrap_or_default();
        // A word boundary can merge two entries into one token; add words until the
        // count is reached, then trim the surplus.
        for _ in 0..8 {
            let count = self.count(&text);
            if count == tokens {
                break;
            }
            if count < tokens {
                ids.extend((0..tokens - count).map(|_| self.words[rng.random_range(0..self.words.len())]));
            } else {
                ids.truncate(ids.len() - (count - tokens).min(ids.len() - 1));
            }
            text = self.tokenizer.decode(&ids, true).unwrap_or_default();
        }
        text
    }
}

/// A generator for one purpose of a workload, from the run's seed.
pub fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A length drawn uniformly from `[len * (1 - ratio), len * (1 + ratio)]` (vLLM's
/// `--random-range-ratio`).
pub fn length(rng: &mut ChaCha8Rng, len: usize, ratio: f64) -> usize {
    if ratio <= 0.0 {
        return len.max(1);
    }
    let low = ((len as f64) * (1.0 - ratio)).round().max(1.0) as usize;
    let high = ((len as f64) * (1.0 + ratio)).round().max(low as f64) as usize;
    rng.random_range(low..=high)
}

fn job(maker: &PromptMaker, prompt: String, max_tokens: usize, ignore_eos: bool) -> Job {
    Job {
        prompt_len: maker.count(&prompt),
        prompt: Arc::from(prompt),
        max_tokens,
        ignore_eos,
    }
}

/// A cold prompt: salted first words, then random text, `tokens` long.
fn cold(maker: &PromptMaker, salt: &mut ChaCha8Rng, body: &mut ChaCha8Rng, tokens: usize) -> String {
    let head = tokens.min(8);
    let mut prompt = maker.text(salt, head);
    prompt.push_str(&maker.text(body, tokens - head));
    prompt
}

/// Settings of the request-per-session workloads.
#[derive(Debug, Clone)]
pub struct Lengths {
    /// Prompt tokens.
    pub input: usize,
    /// Output tokens.
    pub output: usize,
    /// Spread of both, as vLLM's `--random-range-ratio`.
    pub range_ratio: f64,
    /// Generate past the end-of-sequence token.
    pub ignore_eos: bool,
}

/// `count` independent cold requests.
pub fn independent(
    maker: &PromptMaker,
    seed: u64,
    salt: u64,
    count: usize,
    lengths: &Lengths,
) -> Vec<Vec<Job>> {
    let (mut sizes, mut body, mut salt) = (rng(seed, 1), rng(seed, 2), rng(salt, 3));
    (0..count)
        .map(|_| {
            let input = length(&mut sizes, lengths.input, lengths.range_ratio);
            let output = length(&mut sizes, lengths.output, lengths.range_ratio);
            let prompt = cold(maker, &mut salt, &mut body, input);
            vec![job(maker, prompt, output, lengths.ignore_eos)]
        })
        .collect()
}

/// `count` requests of one given prompt `text`, each after its own salted first words
/// (a line of its own) so that no request reuses another's cached prefix.
pub fn given(maker: &PromptMaker, salt: u64, count: usize, text: &str, lengths: &Lengths) -> Vec<Vec<Job>> {
    let mut salt = rng(salt, 3);
    (0..count)
        .map(|_| {
            let mut prompt = maker.text(&mut salt, 8);
            prompt.push('\n');
            prompt.push_str(text);
            vec![job(maker, prompt, lengths.output, lengths.ignore_eos)]
        })
        .collect()
}

/// Settings of the shared-prefix workload (vLLM's `prefix_repetition` dataset).
#[derive(Debug, Clone)]
pub struct Prefixes {
    /// Distinct prefixes.
    pub prefixes: usize,
    /// Tokens of each prefix.
    pub prefix_len: usize,
    /// Tokens after it, unique per request.
    pub suffix_len: usize,
    /// Requests in all, cycling over the prefixes.
    pub requests: usize,
    /// Output tokens.
    pub output: usize,
}

/// Requests sharing long prefixes: request i uses prefix `i % prefixes`.
pub fn shared_prefixes(maker: &PromptMaker, seed: u64, salt: u64, p: &Prefixes) -> Vec<Vec<Job>> {
    let (mut body, mut salt) = (rng(seed, 4), rng(salt, 5));
    let prefixes: Vec<String> = (0..p.prefixes.max(1))
        .map(|_| cold(maker, &mut salt, &mut body, p.prefix_len))
        .collect();
    (0..p.requests)
        .map(|i| {
            let mut prompt = prefixes[i % prefixes.len()].clone();
            prompt.push_str(&maker.text(&mut body, p.suffix_len));
            vec![job(maker, prompt, p.output, true)]
        })
        .collect()
}

/// Settings of the coding-agent workload.
#[derive(Debug, Clone)]
pub struct Agent {
    /// Sessions, all running at once.
    pub sessions: usize,
    /// Requests per session.
    pub steps: usize,
    /// Output tokens per step.
    pub output: usize,
    /// Prompt tokens per generated token, on average (the Titan report's 53).
    pub ratio: f64,
    /// The longest prompt the server takes (its `max_model_len` minus the output).
    pub max_prompt: usize,
}

/// Sessions that resend their whole, growing context at every step: step s of K sends
/// `2T·s/(K+1)` tokens, T = ratio × output (capped so the last step fits), each step's
/// prompt extending the previous one as an agent's transcript does.
pub fn agent(maker: &PromptMaker, seed: u64, salt: u64, a: &Agent) -> Vec<Vec<Job>> {
    let steps = a.steps.max(1);
    let mut mean = a.ratio * a.output as f64;
    let last = 2.0 * mean * steps as f64 / (steps + 1) as f64;
    if last > a.max_prompt as f64 {
        mean *= a.max_prompt as f64 / last;
    }
    let (mut body, mut salt) = (rng(seed, 6), rng(salt, 7));
    (0..a.sessions.max(1))
        .map(|_| {
            let mut context = String::new();
            let mut tokens = 0;
            (1..=steps)
                .map(|s| {
                    let target = (2.0 * mean * s as f64 / (steps + 1) as f64).round().max(1.0) as usize;
                    let grow = target.saturating_sub(tokens).max(1);
                    if context.is_empty() {
                        context = cold(maker, &mut salt, &mut body, grow);
                    } else {
                        context.push_str(&maker.text(&mut body, grow));
                    }
                    let next = job(maker, context.clone(), a.output, true);
                    tokens = next.prompt_len;
                    next
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::print_stderr, reason = "a skipped test says so")]
mod tests {
    use super::*;

    fn maker() -> Option<PromptMaker> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/models/HuggingFaceTB/SmolLM2-135M-Instruct/tokenizer.json"
        );
        let Ok(tokenizer) = Tokenizer::from_file(path) else {
            assert!(
                sous_engine::env::CI.get().as_deref() != Some("true"),
                "the test model is missing in CI: {path}"
            );
            eprintln!("SKIPPED: the SmolLM2 tokenizer is not at {path}; run scripts/fetch-test-model.sh");
            return None;
        };
        Some(PromptMaker::new(tokenizer).expect("words"))
    }

    #[test]
    fn prompts_have_exact_lengths_and_are_reproducible() {
        let Some(m) = maker() else { return };
        let lengths = Lengths {
            input: 500,
            output: 16,
            range_ratio: 0.0,
            ignore_eos: true,
        };
        let a = independent(&m, 7, 1, 5, &lengths);
        let b = independent(&m, 7, 1, 5, &lengths);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x[0].prompt, y[0].prompt, "same seed and salt, same prompt");
            assert_eq!(x[0].prompt_len, 500);
        }
        let other_salt = independent(&m, 7, 2, 1, &lengths);
        assert_ne!(a[0][0].prompt, other_salt[0][0].prompt);
        assert!(a[0][0].prompt.len() > 1000);
    }

    #[test]
    fn shared_prefix_requests_start_alike_and_agent_contexts_grow() {
        let Some(m) = maker() else { return };
        let p = Prefixes {
            prefixes: 2,
            prefix_len: 64,
            suffix_len: 8,
            requests: 4,
            output: 4,
        };
        let jobs = shared_prefixes(&m, 1, 1, &p);
        assert!(jobs[2][0].prompt.starts_with(&jobs[0][0].prompt[..200]));
        assert!(!jobs[1][0].prompt.starts_with(&jobs[0][0].prompt[..200]));
        let sessions = agent(
            &m,
            1,
            1,
            &Agent {
                sessions: 2,
                steps: 4,
                output: 10,
                ratio: 53.0,
                max_prompt: 4096,
            },
        );
        assert_eq!(sessions.len(), 2);
        let lens: Vec<usize> = sessions[0].iter().map(|j| j.prompt_len).collect();
        // 2·530·s/5 = 212, 424, 636, 848: mean 530 = 53 × 10
        for (got, want) in lens.iter().zip([212, 424, 636, 848]) {
            assert!(got.abs_diff(want) <= 2, "{lens:?}");
        }
        assert!(sessions[0][3].prompt.starts_with(&*sessions[0][2].prompt));
        let capped = agent(
            &m,
            1,
            1,
            &Agent {
                sessions: 1,
                steps: 4,
                output: 10,
                ratio: 53.0,
                max_prompt: 424,
            },
        );
        assert!(capped[0][3].prompt_len <= 426, "{}", capped[0][3].prompt_len);
    }
}

//! Picking the next token from a row of logits, with the parameters vLLM takes.
//!
//! The order is vLLM's V1 sampler (`vllm/v1/sample/sampler.py`): penalties on the raw
//! logits (repetition over prompt and output, presence and frequency over the output,
//! `vllm/model_executor/layers/utils.py apply_penalties`), then greedy when the
//! temperature is below 1e-5, else temperature, min-p, top-k and top-p, and a draw.
//! Log-probabilities are those of the raw model output (vLLM's default
//! `logprobs_mode = raw_logprobs`). Every request draws from its own generator seeded
//! by its `seed`, so a seeded request gives the same tokens whatever else is batched
//! with it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPS: f32 = 1e-5;

/// How one request samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass (1 = off).
    pub top_p: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Multiplicative penalty on tokens seen in the prompt or output (1 = off).
    pub repetition_penalty: f32,
    /// Subtracted once from tokens present in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Seed of the request's generator.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Extra token ids that end generation.
    pub stop_token_ids: Vec<u32>,
    /// Return this many most likely tokens with each sampled one (`Some(0)`: just the
    /// sampled token's log-probability).
    pub logprobs: Option<usize>,
    /// The same for every prompt token.
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

/// A token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// Its rank among all tokens (1 = most likely).
    pub rank: usize,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities of `token` and the `top` most likely tokens in raw `logits`.
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
    let own = logits.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let rank = 1 + logits.iter().filter(|&&l| l > own).count();
    let top_ids = top_indices(logits, top);
    TokenLogprobs {
        token,
        logprob: own - lse,
        rank,
        top: top_ids.into_iter().map(|i| (i as u32, logits[i] - lse)).collect(),
    }
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
fn top_indices(values: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..values.len()).collect();
    let cmp = |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

/// One request's sampler state.
#[derive(Debug)]
pub struct Sampler {
    rng: ChaCha8Rng,
    /// Output token counts (for presence/frequency penalties).
    counts: std::collections::HashMap<u32, u32>,
    /// Tokens seen in the prompt (for the repetition penalty).
    prompt_seen: std::collections::HashSet<u32>,
}

impl Sampler {
    /// A sampler for a request with this prompt.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Sampler {
        let rng = match params.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_rng(&mut rand::rng()),
        };
        let prompt_seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Sampler {
            rng,
            counts: Default::default(),
            prompt_seen,
        }
    }

    /// Records a generated token.
    pub fn push(&mut self, token: u32) {
        *self.counts.entry(token).or_default() += 1;
    }

    /// Picks a token from `logits` (modified in place).
    pub fn sample(&mut self, params: &SamplingParams, logits: &mut [f32]) -> u32 {
        self.penalize(params, logits);
        if params.temperature < GREEDY_EPS {
            return argmax(logits);
        }
        let candidates = candidates(params, logits);
        self.draw(&candidates)
    }

    /// Verifies a drafted token against the target model's `logits` (modified in place)
    /// and returns the token this position emits and whether it is the draft.
    ///
    /// Greedy: the draft stands if it is the argmax, else the argmax replaces it, so the
    /// output is the one without speculation. Sampling: rejection sampling as vLLM's
    /// `RejectionSampler` does it for drafts without probabilities (ngram: the draft
    /// distribution is all on the draft token): the draft is accepted with probability
    /// `p(draft)` under the processed target distribution; a rejected position draws
    /// from `p` with the draft removed, renormalized (`max(p − q, 0)`). The emitted
    /// tokens are then distributed exactly as without speculation.
    pub fn verify(&mut self, params: &SamplingParams, logits: &mut [f32], draft: u32) -> (u32, bool) {
        self.penalize(params, logits);
        if params.temperature < GREEDY_EPS {
            let token = argmax(logits);
            return (token, token == draft);
        }
        let mut candidates = candidates(params, logits);
        let total: f32 = candidates.iter().map(|c| c.1).sum();
        let p = candidates
            .iter()
            .find(|c| c.0 == draft)
            .map_or(0.0, |c| c.1 / total);
        if self.rng.random::<f32>() < p {
            return (draft, true);
        }
        candidates.retain(|c| c.0 != draft);
        if candidates.is_empty() {
            // p was 1 and the uniform draw hit exactly 1.0's edge: keep the draft.
            return (draft, true);
        }
        (self.draw(&candidates), false)
    }

    /// Draws one of `candidates` (token, unnormalized probability).
    fn draw(&mut self, candidates: &[(u32, f32)]) -> u32 {
        let total: f32 = candidates.iter().map(|c| c.1).sum();
        let mut draw = self.rng.random::<f32>() * total;
        for &(token, p) in candidates {
            if draw < p {
                return token;
            }
            draw -= p;
        }
        candidates.last().map_or(0, |c| c.0)
    }

    fn penalize(&self, params: &SamplingParams, logits: &mut [f32]) {
        if params.repetition_penalty != 1.0 {
            let seen = self.prompt_seen.iter().chain(self.counts.keys());
            for &t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / params.repetition_penalty
                    } else {
                        *l * params.repetition_penalty
                    };
                }
            }
            // A token in both the prompt and the output was penalized twice above; undo one.
            for &t in self.counts.keys().filter(|t| self.prompt_seen.contains(t)) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l * params.repetition_penalty
                    } else {
                        *l / params.repetition_penalty
                    };
                }
            }
        }
        if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
            for (&t, &n) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= params.frequency_penalty * n as f32 + params.presence_penalty;
                }
            }
        }
    }
}

/// The tokens left after temperature, min-p, top-k and top-p, with their unnormalized
/// probabilities.
fn candidates(params: &SamplingParams, logits: &[f32]) -> Vec<(u32, f32)> {
    let inv_t = 1.0 / params.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, ((l - max) * inv_t).exp()))
        .collect();
    if params.min_p > 0.0 {
        // The most likely token has weight 1 after subtracting the max.
        candidates.retain(|&(_, p)| p >= params.min_p);
    }
    let limited = params.top_k > 0 && params.top_k < candidates.len();
    if limited || params.top_p < 1.0 {
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if limited {
            candidates.truncate(params.top_k);
        }
        if params.top_p < 1.0 {
            let total: f32 = candidates.iter().map(|c| c.1).sum();
            let mut kept = 0.0;
            let mut keep = candidates.len();
            for (i, c) in candidates.iter().enumerate() {
                kept += c.1;
                if kept >= params.top_p * total {
                    keep = i + 1;
                    break;
                }
            }
            candidates.truncate(keep.max(1));
        }
    }
    candidates
}

/// The index of the largest logit (the first one on ties, as `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_takes_the_largest_and_seeds_reproduce() {
        let logits = vec![0.1, 2.0, 1.9, -1.0];
        let mut s = Sampler::new(&params(0.0), &[]);
        assert_eq!(s.sample(&params(0.0), &mut logits.clone()), 1);
        let seeded = SamplingParams {
            seed: Some(7),
            ..params(1.0)
        };
        let draws = |p: &SamplingParams| {
            let mut s = Sampler::new(p, &[]);
            (0..32)
                .map(|_| s.sample(p, &mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(&seeded), draws(&seeded));
        // Not all the same token: it really samples.
        let d = draws(&seeded);
        assert!(d.iter().any(|&t| t != d[0]), "{d:?}");
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = vec![0.1, 2.0, 1.9, -1.0];
        for p in [
            SamplingParams {
                top_k: 1,
                seed: Some(1),
                ..params(1.0)
            },
            SamplingParams {
                top_p: 0.01,
                seed: Some(1),
                ..params(1.0)
            },
            SamplingParams {
                min_p: 0.99,
                seed: Some(1),
                ..params(1.0)
            },
        ] {
            let mut s = Sampler::new(&p, &[]);
            for _ in 0..16 {
                assert_eq!(s.sample(&p, &mut logits.clone()), 1, "{p:?}");
            }
        }
    }

    #[test]
    fn penalties_follow_vllm() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params(0.0)
        };
        let mut s = Sampler::new(&p, &[0]);
        s.push(1);
        s.push(1);
        let mut logits = vec![4.0, 4.0, -1.0];
        s.penalize(&p, &mut logits);
        // Token 0: in the prompt only; token 1: output twice (repetition once, not twice).
        assert_eq!(logits, vec![2.0, 2.0 - 0.5 - 0.5, -1.0]);
    }

    #[test]
    fn logprobs_are_normalized_and_ranked() {
        let lp = logprobs(&[0.0, 1.0, 2.0], 1, 2);
        let z = (1.0f32 + 1.0f32.exp() + 2.0f32.exp()).ln();
        assert!((lp.logprob - (1.0 - z)).abs() < 1e-6);
        assert_eq!(lp.rank, 2);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
    }
}

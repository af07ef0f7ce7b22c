//! The scheduler's choices for one step of the engine loop: which running and waiting
//! sequences compute how many tokens within the token budget, the blocks they need
//! (preempting the most recently admitted sequence when none are free), the drafted
//! tokens of a decoding sequence, and the prefix-cache hits and registrations. Running
//! the step and sampling are the parent's.

use std::time::Instant;

use super::{Core, Seq};
use crate::native::blocks::{BlockHash, BlockPool, block_hash};

impl Core {
    /// Makes `seq` hold blocks for its first `tokens` tokens.
    pub(super) fn grow(pool: &mut BlockPool, seq: &mut Seq, tokens: usize) -> bool {
        let need = tokens.div_ceil(pool.block_size());
        while seq.blocks.len() < need {
            match pool.allocate() {
                Some(b) => seq.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    fn preempt(&mut self, mut seq: Seq) {
        seq.draft.clear();
        self.free_slots.extend(seq.slot.take());
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.hashes.clear();
        seq.computed = 0;
        seq.prompt_logprobs.clear();
        self.metrics.preempted();
        self.waiting.push_front(seq);
    }

    /// How many of `remaining` tokens to compute now with `budget` left.
    fn chunk(&self, remaining: usize, budget: usize, nothing_yet: bool) -> usize {
        if self.limits.chunked_prefill {
            remaining.min(budget)
        } else if remaining <= budget || nothing_yet {
            remaining
        } else {
            0
        }
    }

    /// The tokens to draft for `seq` this step: only for a decoding sequence (its prompt
    /// done, one token to compute), no more than the budget beside that token and the
    /// tokens it may still emit allow.
    fn draft(&self, seq: &Seq, remaining: usize, budget: usize) -> Vec<u32> {
        if remaining != 1 || seq.output_len() == 0 || budget < 2 {
            return Vec::new();
        }
        let left = seq.req.params.max_tokens.saturating_sub(seq.output_len() + 1);
        let mut draft = match (&self.limits.speculative, self.limits.mtp) {
            (Some(ngram), _) => ngram.propose(&seq.tokens, self.limits.max_model_len),
            // Made by the MTP head after the last step (`mtp.rs`).
            (None, Some(_)) => seq.mtp_draft.clone(),
            (None, None) => return Vec::new(),
        };
        // Never past max_model_len.
        draft.truncate(self.limits.max_model_len.saturating_sub(seq.tokens.len()));
        draft.truncate(left.min(budget - 1));
        draft
    }

    /// Picks this step's work: `(index in running, tokens)`.
    pub(super) fn schedule(&mut self) -> Vec<(usize, usize)> {
        let mut budget = self.limits.max_batched_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let remaining = self.running[i].tokens.len() - self.running[i].computed;
            let draft = self.draft(&self.running[i], remaining, budget);
            let n = self.chunk(remaining, budget, plan.is_empty()) + draft.len();
            self.running[i].draft = draft;
            if n == 0 {
                break;
            }
            let upto = self.running[i].computed + n;
            let mut fits = Core::grow(&mut self.pool, &mut self.running[i], upto);
            while !fits && self.running.len() > i + 1 {
                if let Some(victim) = self.running.pop() {
                    self.preempt(victim);
                }
                fits = Core::grow(&mut self.pool, &mut self.running[i], upto);
            }
            if !fits {
                // Nothing left to preempt but itself.
                let seq = self.running.remove(i);
                self.preempt(seq);
                continue;
            }
            plan.push((i, n));
            budget -= n;
            i += 1;
        }
        while budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            if seq.computed == 0 && seq.blocks.is_empty() {
                let bs = self.pool.block_size();
                // Never the whole sequence: its last token must be computed for logits.
                let full = (seq.tokens.len() - 1) / bs;
                let mut parent: Option<BlockHash> = None;
                let hashes: Vec<BlockHash> = (0..full)
                    .map(|b| {
                        let h = block_hash(parent.as_ref(), &seq.tokens[b * bs..(b + 1) * bs]);
                        parent = Some(h);
                        h
                    })
                    .collect();
                let hits = self.pool.lookup(&hashes);
                seq.computed = hits.len() * bs;
                seq.hashes = hashes[..hits.len()].to_vec();
                seq.blocks = hits;
            }
            let remaining = seq.tokens.len() - seq.computed;
            let n = self.chunk(remaining, budget, plan.is_empty());
            let upto = seq.computed + n;
            if n == 0 || !Core::grow(&mut self.pool, &mut seq, upto) {
                // Not now: give back what it took and keep its place in the queue.
                self.pool.release(&seq.blocks);
                seq.blocks.clear();
                seq.hashes.clear();
                seq.computed = 0;
                self.waiting.push_front(seq);
                break;
            }
            if seq.scheduled_at.is_none() {
                seq.scheduled_at = Some(Instant::now());
                seq.cached_tokens = seq.computed;
                self.metrics.admitted(
                    seq.prompt_len,
                    seq.computed.min(seq.prompt_len),
                    self.pool.prefix_caching(),
                );
            }
            plan.push((self.running.len(), n));
            budget -= n;
            seq.slot = self.free_slots.pop();
            self.running.push(seq);
        }
        plan
    }

    /// Registers the full blocks of `seq`'s computed tokens in the prefix cache.
    pub(super) fn register(pool: &mut BlockPool, seq: &mut Seq) {
        let bs = pool.block_size();
        while seq.hashes.len() < seq.computed / bs {
            let b = seq.hashes.len();
            let h = block_hash(seq.hashes.last(), &seq.tokens[b * bs..(b + 1) * bs]);
            pool.register(seq.blocks[b], h);
            seq.hashes.push(h);
        }
    }
}

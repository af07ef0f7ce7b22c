//! Drafting with the model's MTP head (`serving.speculative` method `*_mtp`): after
//! every step, the head runs over each sequence's newly committed positions (each with
//! the token that followed it and the decoder's final hidden state there), which keeps
//! its own keys and values up to date and, for a sequence whose next token was just
//! sampled, drafts the first token after it; further drafts feed the head its own output
//! (vLLM's proposer, `vllm/v1/spec_decode/eagle.py`, as `model/mtp.rs` says). The next
//! step verifies the drafts as it verifies ngram drafts.

use super::{Core, FinishReason};
use crate::native::model::{BatchSeq, Logits};
use crate::native::sampling::argmax;

/// A sequence the head runs on after a step: its index in `running`, the positions it
/// covers (`start..end`), the first of its rows among the step's hidden states, and
/// whether it drafts.
struct Job {
    i: usize,
    start: usize,
    end: usize,
    row: usize,
    drafts: bool,
}

impl Core {
    /// Runs the head after a step that fed `fed` (`(index in running, first position,
    /// tokens)` per sequence, in batch order) and left the decoder's final hidden states
    /// of every fed row in `hidden`; sequences in `done` are left alone.
    pub(super) fn draft_with_mtp(
        &mut self,
        fed: &[(usize, usize, usize)],
        hidden: &[f32],
        done: &[(usize, FinishReason)],
    ) {
        let Some(tokens) = self.limits.mtp else { return };
        let h = self.model.config().hidden_size;
        let mut jobs = Vec::new();
        let mut row = 0;
        for &(i, start, len) in fed {
            let first = row;
            row += len;
            if done.iter().any(|d| d.0 == i) {
                continue;
            }
            let seq = &mut self.running[i];
            seq.mtp_draft.clear();
            // Committed positions whose next token is known.
            let end = seq.computed.min(seq.tokens.len() - 1);
            if end > start {
                let drafts = seq.computed + 1 == seq.tokens.len() && seq.output_len() > 0;
                jobs.push(Job {
                    i,
                    start,
                    end,
                    row: first,
                    drafts,
                });
            }
        }
        if jobs.is_empty() {
            return;
        }
        let rows: Vec<f32> = jobs
            .iter()
            .flat_map(|j| hidden[j.row * h..(j.row + j.end - j.start) * h].iter().copied())
            .collect();
        let batch: Vec<BatchSeq> = jobs
            .iter()
            .map(|j| {
                let s = &self.running[j.i];
                BatchSeq {
                    blocks: &s.blocks,
                    tokens: &s.tokens[j.start + 1..j.end + 1],
                    start: j.start,
                    state: 0,
                    logits: if j.drafts { Logits::Last } else { Logits::None },
                }
            })
            .collect();
        let out = match self.model.forward_mtp(&batch, &rows, &mut self.cache) {
            Ok(out) => out,
            Err(e) => return self.mtp_failed(e),
        };
        drop(batch);
        let vocab = self.model.config().vocab_size;
        // Each drafting sequence: its index, the position of its next draft, and the
        // head's output that feeds it.
        let mut chain: Vec<(usize, usize, Vec<f32>)> = Vec::new();
        let drafting = jobs.iter().filter(|j| j.drafts);
        for ((job, logits), g) in drafting
            .zip(out.logits.chunks_exact(vocab))
            .zip(out.hidden.chunks_exact(h))
        {
            self.running[job.i].mtp_draft.push(argmax(logits));
            chain.push((job.i, job.end, g.to_vec()));
        }
        for _ in 1..tokens {
            // The next position must have a block for the head's keys and values.
            chain.retain(|&(i, at, _)| Core::grow(&mut self.pool, &mut self.running[i], at + 1));
            if chain.is_empty() {
                return;
            }
            let inputs: Vec<[u32; 1]> = chain
                .iter()
                .map(|(i, _, _)| [*self.running[*i].mtp_draft.last().unwrap_or(&0)])
                .collect();
            let rows: Vec<f32> = chain.iter().flat_map(|(_, _, g)| g.iter().copied()).collect();
            let batch: Vec<BatchSeq> = chain
                .iter()
                .zip(&inputs)
                .map(|((i, at, _), input)| BatchSeq {
                    blocks: &self.running[*i].blocks,
                    tokens: input,
                    start: *at,
                    state: 0,
                    logits: Logits::Last,
                })
                .collect();
            let out = match self.model.forward_mtp(&batch, &rows, &mut self.cache) {
                Ok(out) => out,
                Err(e) => return self.mtp_failed(e),
            };
            drop(batch);
            for ((link, logits), g) in chain
                .iter_mut()
                .zip(out.logits.chunks_exact(vocab))
                .zip(out.hidden.chunks_exact(h))
            {
                self.running[link.0].mtp_draft.push(argmax(logits));
                link.1 += 1;
                link.2 = g.to_vec();
            }
        }
    }

    /// A failed head pass drafts nothing this step (the tokens are the model's anyway).
    fn mtp_failed(&mut self, e: crate::native::NativeError) {
        let message = format!("the MTP head's pass failed, drafting nothing: {e}");
        crate::native::log(self.reporter.as_ref(), "ERROR", crate::native::here!(), &message);
        for seq in &mut self.running {
            seq.mtp_draft.clear();
        }
    }
}

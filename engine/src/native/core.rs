//! The engine loop: a scheduler with iteration-level batching over the paged KV cache.
//!
//! One thread owns the model, the cache and every sequence. Each iteration it
//! 1. takes new requests and drops those whose client went away (their blocks are freed
//!    at once),
//! 2. schedules a step within the token budget (`serving.max_batched_tokens`): first the
//!    running sequences (one token each when decoding, the next chunk of the prompt when
//!    prefilling), then waiting ones, first come first served, while fewer than
//!    `serving.max_num_seqs` run and their blocks fit; a waiting request stays queued
//!    until they do. When a running sequence needs a block and none is free, the most
//!    recently admitted sequence is preempted: its blocks are freed and it goes back to
//!    the head of the queue to be recomputed later (vLLM's recompute preemption),
//! 3. runs one forward pass over all scheduled tokens, and
//! 4. samples a token for every sequence whose prompt is complete, sends it to its
//!    client and finishes sequences that hit a stop condition.
//!
//! With speculative decoding (`serving.speculative`, method `ngram`), a decoding
//! sequence also gets up to `tokens` drafted tokens (prompt lookup, `speculative.rs`):
//! its step computes the last token and the drafts together, and the logits of each
//! position decide whether the next draft stands (`Sampler::verify`); the sequence keeps
//! the KV of the tokens that stood and emits them plus one token of the model's own.
//! The kernels give a row the same bits whatever else is in its batch, so greedy output
//! is the same with and without drafts.
//!
//! With prefix caching on, a new request first takes the cached blocks matching its
//! prompt (all but the last token, which must be computed to get logits), and every
//! block a sequence fills is registered for later requests.
//!
//! Step 2, the scheduling, is in `schedule`; this file holds the loop, its messages,
//! and the forward pass and sampling of each step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, error::TryRecvError};

use super::blocks::{BlockHash, BlockPool};
use super::metrics::{FinishReason, FinishedRequest, Metrics};
use super::model::{BatchSeq, KvCache, Logits, Model, Passed};
use super::sampling::{Sampler, SamplingParams, TokenLogprobs, logprobs};
use super::speculative::Ngram;
use crate::reporter::Reporter;

mod mtp;
mod schedule;

/// What a request's client receives.
#[derive(Debug)]
pub enum Event {
    /// Log-probabilities of the prompt tokens (the first is `None`: nothing predicts it).
    PromptLogprobs(Vec<Option<TokenLogprobs>>),
    /// A generated token.
    Token {
        /// Its id.
        id: u32,
        /// Its log-probabilities, if asked for.
        logprobs: Option<TokenLogprobs>,
        /// Prompt tokens found in the prefix cache (sent with every token; the
        /// first one matters).
        cached_tokens: usize,
    },
    /// No more tokens.
    Finished(FinishReason),
    /// The engine failed on this request.
    Failed(String),
}

/// A generation request.
#[derive(Debug)]
pub struct Request {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Where events go. Dropping the receiver cancels the request.
    pub events: UnboundedSender<Event>,
    /// Set by the client before it drops the receiver when it stopped the request itself
    /// on a stop string (so the request counts as `stop`, not `abort`).
    pub stopped: Arc<AtomicBool>,
    /// When the request arrived.
    pub arrival: Instant,
}

/// Messages to the engine loop.
#[derive(Debug)]
pub enum Command {
    /// A new request.
    Submit(Request),
    /// Abort every request (shutdown after the grace period).
    AbortAll,
}

/// Fixed settings of the loop.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens in one step.
    pub max_batched_tokens: usize,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Split long prompts over several steps.
    pub chunked_prefill: bool,
    /// Draft tokens by prompt lookup and verify them in the decode step.
    pub speculative: Option<Ngram>,
    /// Draft this many tokens with the model's MTP head and verify them likewise.
    pub mtp: Option<usize>,
    /// End-of-sequence ids (generation config and tokenizer).
    pub eos: Vec<u32>,
    /// How often the stats line is logged.
    pub log_interval: Duration,
}

struct Seq {
    req: Request,
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    blocks: Vec<u32>,
    hashes: Vec<BlockHash>,
    sampler: Sampler,
    cached_tokens: usize,
    prompt_logprobs: Vec<Option<TokenLogprobs>>,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// Tokens drafted for this step, verified after the forward pass.
    draft: Vec<u32>,
    /// The MTP head's draft for its next step (`serving.speculative` `*_mtp`).
    mtp_draft: Vec<u32>,
    /// Its linear-attention state slot while it runs (a hybrid model's cache keeps a
    /// state per running sequence).
    slot: Option<usize>,
}

impl Seq {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn wants_prompt_logprobs(&self) -> bool {
        self.req.params.prompt_logprobs.is_some() && self.output_len() == 0
    }
}

/// A drafting sequence's index in `running`, its computed tokens and draft length
/// before the step, and its linear-attention state then.
type Saved = (usize, usize, usize, Vec<f32>);

/// The loop's state.
pub struct Core {
    model: Model,
    cache: KvCache,
    pool: BlockPool,
    limits: Limits,
    metrics: Arc<Metrics>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    /// State slots no running sequence holds.
    free_slots: Vec<usize>,
    reporter: Arc<dyn Reporter>,
}

impl Core {
    /// A loop over `model` with its KV cache, `cache`.
    pub fn new(
        model: Model,
        cache: KvCache,
        prefix_caching: bool,
        limits: Limits,
        metrics: Arc<Metrics>,
        reporter: Arc<dyn Reporter>,
    ) -> Core {
        let pool = BlockPool::new(cache.blocks(), cache.block_size(), prefix_caching);
        let max_num_seqs = limits.max_num_seqs;
        let cache = cache.with_state_slots(max_num_seqs);
        Core {
            model,
            cache,
            pool,
            limits,
            metrics,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots: (0..max_num_seqs).rev().collect(),
            reporter,
        }
    }

    /// Runs until every sender of `commands` is gone and no request is left.
    pub fn run(mut self, mut commands: UnboundedReceiver<Command>) {
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            if idle {
                self.publish();
                // The interval of the last tokens is logged when it ends, as vLLM's timer
                // does, unless a request comes first.
                let mut woken = false;
                while let Some(due) = self.metrics.untold(self.limits.log_interval) {
                    match commands.try_recv() {
                        Ok(c) => {
                            self.command(c);
                            woken = true;
                            break;
                        }
                        Err(TryRecvError::Empty) => {
                            std::thread::sleep(due.min(Duration::from_millis(50)));
                            self.publish();
                        }
                        Err(TryRecvError::Disconnected) => return,
                    }
                }
                if !woken {
                    match commands.blocking_recv() {
                        Some(c) => self.command(c),
                        None => return,
                    }
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.reap_cancelled();
            self.step();
            self.publish();
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Submit(req) => {
                let sampler = Sampler::new(&req.params, &req.prompt);
                self.waiting.push_back(Seq {
                    tokens: req.prompt.clone(),
                    prompt_len: req.prompt.len(),
                    req,
                    computed: 0,
                    blocks: Vec::new(),
                    hashes: Vec::new(),
                    sampler,
                    cached_tokens: 0,
                    prompt_logprobs: Vec::new(),
                    scheduled_at: None,
                    first_token_at: None,
                    last_token_at: None,
                    draft: Vec::new(),
                    mtp_draft: Vec::new(),
                    slot: None,
                });
            }
            Command::AbortAll => {
                let all: Vec<Seq> = self.running.drain(..).chain(self.waiting.drain(..)).collect();
                for seq in all {
                    self.finish(seq, FinishReason::Abort);
                }
            }
        }
    }

    fn publish(&mut self) {
        self.metrics
            .gauges(self.running.len(), self.waiting.len(), self.pool.usage());
        for line in self.metrics.stats_lines(self.limits.log_interval, "CPU") {
            super::log(self.reporter.as_ref(), "INFO", super::here!(), &line);
        }
    }

    fn reap_cancelled(&mut self) {
        let closed = |s: &Seq| s.req.events.is_closed();
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if closed(&self.running[i]) {
                gone.push(self.running.remove(i));
            } else {
                i += 1;
            }
        }
        let (keep, cancelled): (VecDeque<Seq>, VecDeque<Seq>) =
            self.waiting.drain(..).partition(|s| !closed(s));
        self.waiting = keep;
        gone.extend(cancelled);
        for seq in gone {
            let reason = if seq.req.stopped.load(Ordering::Relaxed) {
                FinishReason::Stop
            } else {
                FinishReason::Abort
            };
            self.finish(seq, reason);
        }
    }

    /// Frees a sequence's blocks, records it and tells its client.
    fn finish(&mut self, mut seq: Seq, reason: FinishReason) {
        self.free_slots.extend(seq.slot.take());
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        let now = Instant::now();
        self.metrics.finished(&FinishedRequest {
            reason,
            prompt_tokens: seq.prompt_len,
            generation_tokens: seq.output_len(),
            queue: seq.scheduled_at.map(|t| t - seq.req.arrival),
            prefill: seq.scheduled_at.zip(seq.first_token_at).map(|(s, f)| f - s),
            decode: seq.first_token_at.zip(seq.last_token_at).map(|(f, l)| l - f),
            inference: seq.scheduled_at.map(|s| now - s),
            e2e: now - seq.req.arrival,
            max_tokens: seq.req.params.max_tokens,
        });
        let _ = seq.req.events.send(Event::Finished(reason));
    }

    /// Appends a sampled `token` (from logits `row`) to `seq`, sends it and says whether
    /// the sequence is done. `first` is false for the second and later tokens of one
    /// step (accepted drafts), which add no inter-token latency.
    fn emit(
        seq: &mut Seq,
        token: u32,
        row: &[f32],
        now: Instant,
        first: bool,
        limits: &Limits,
        metrics: &Metrics,
    ) -> Option<FinishReason> {
        let params = &seq.req.params;
        // Log-probabilities of the raw output, before penalties and temperature.
        let lp = params.logprobs.map(|top| logprobs(row, token, top));
        seq.sampler.push(token);
        seq.tokens.push(token);
        let ttft = seq.first_token_at.is_none().then(|| now - seq.req.arrival);
        let itl = if first {
            seq.last_token_at.map(|t| now - t)
        } else {
            None
        };
        seq.first_token_at.get_or_insert(now);
        seq.last_token_at = Some(now);
        metrics.token(ttft, itl);
        let sent = seq.req.events.send(Event::Token {
            id: token,
            logprobs: lp,
            cached_tokens: seq.cached_tokens,
        });
        let params = &seq.req.params;
        if sent.is_err() {
            Some(FinishReason::Abort)
        } else if (!params.ignore_eos && limits.eos.contains(&token))
            || params.stop_token_ids.contains(&token)
        {
            Some(FinishReason::Stop)
        } else if seq.output_len() >= params.max_tokens || seq.tokens.len() >= limits.max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Verifies `running[i]`'s `draft` against the logits of its last token and of
    /// every draft token (`rows`), emits what stands, and returns why the sequence is
    /// done, if it is. Every position emits one token: the draft token if it stands,
    /// else the target's own choice (which ends the step); after a fully accepted draft
    /// the last row gives one more token. Positions whose draft stood keep their KV.
    fn verify(&mut self, i: usize, draft: &[u32], rows: &[&[f32]], now: Instant) -> Option<FinishReason> {
        let seq = &mut self.running[i];
        // The last token's KV is now cached.
        seq.computed += 1;
        let mut accepted = 0;
        let mut reason = None;
        for (j, row) in rows.iter().enumerate() {
            let params = &seq.req.params;
            let (token, stood) = match draft.get(j) {
                Some(&d) => seq.sampler.verify(params, &mut row.to_vec(), d),
                None => (seq.sampler.sample(params, &mut row.to_vec()), false),
            };
            reason = Core::emit(seq, token, row, now, j == 0, &self.limits, &self.metrics);
            if stood {
                accepted += 1;
                seq.computed += 1;
            }
            if !stood || reason.is_some() {
                break;
            }
        }
        self.metrics.speculated(draft.len(), accepted);
        Core::register(&mut self.pool, seq);
        reason
    }

    fn step(&mut self) {
        let plan = self.schedule();
        if plan.is_empty() {
            // Everything waits for blocks that running sequences hold; they are gone only
            // when cancelled, so wait a little for that instead of spinning.
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
        // A drafting sequence's input: its last token, then the draft.
        let drafted: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, _)| {
                let s = &self.running[i];
                if s.draft.is_empty() {
                    Vec::new()
                } else {
                    s.tokens[s.computed..].iter().chain(&s.draft).copied().collect()
                }
            })
            .collect();
        let batch: Vec<BatchSeq> = plan
            .iter()
            .zip(&drafted)
            .map(|(&(i, n), input)| {
                let s = &self.running[i];
                if !input.is_empty() {
                    // Logits of every position: each verifies the draft token after it.
                    return BatchSeq {
                        blocks: &s.blocks,
                        tokens: input,
                        start: s.computed,
                        state: s.slot.unwrap_or(0),
                        logits: Logits::All,
                    };
                }
                let ends = s.computed + n == s.tokens.len();
                let logits = if s.wants_prompt_logprobs() {
                    Logits::All
                } else if ends {
                    Logits::Last
                } else {
                    Logits::None
                };
                BatchSeq {
                    blocks: &s.blocks,
                    tokens: &s.tokens[s.computed..s.computed + n],
                    start: s.computed,
                    state: s.slot.unwrap_or(0),
                    logits,
                }
            })
            .collect();
        let kinds: Vec<Logits> = batch.iter().map(|b| b.logits).collect();
        // A hybrid model's drafting sequences: their linear-attention states before the
        // step, to go back to when a draft token is rejected.
        let saved: Vec<Saved> = plan
            .iter()
            .filter_map(|&(i, _)| {
                let s = &self.running[i];
                let slot = s.slot.filter(|_| !s.draft.is_empty())?;
                let state = self.cache.save_state(slot)?;
                Some((i, s.computed, s.draft.len(), state))
            })
            .collect();
        // What each sequence fed (its first position and tokens), for the MTP head.
        let fed: Vec<(usize, usize, usize)> = batch
            .iter()
            .zip(&plan)
            .map(|(b, &(i, _))| (i, b.start, b.tokens.len()))
            .collect();
        // A decode step (one generated token for each sequence, nothing drafted, no
        // prompt): what it has to read, for the roofline.
        let decoding = plan.iter().zip(&drafted).all(|(&(i, n), input)| {
            let s = &self.running[i];
            n == 1 && input.is_empty() && s.computed >= s.prompt_len
        });
        let contexts: Vec<usize> = batch.iter().map(|b| b.start + 1).collect();
        let started = Instant::now();
        let result = if self.limits.mtp.is_some() {
            self.model.forward_hidden(&batch, &mut self.cache)
        } else {
            self.model.forward(&batch, &mut self.cache).map(|logits| Passed {
                logits,
                hidden: Vec::new(),
            })
        };
        drop(batch);
        if decoding && result.is_ok() {
            let bytes = self.model.step_bytes(&contexts, self.cache.dtype()).total();
            self.metrics
                .decode_step(contexts.len(), bytes, started.elapsed().as_secs_f64());
        }
        let Passed { logits, hidden } = match result {
            Ok(l) => l,
            Err(e) => {
                let message = format!("the forward pass failed: {e}");
                super::log(self.reporter.as_ref(), "ERROR", super::here!(), &message);
                let mut failed: Vec<usize> = plan.iter().map(|p| p.0).collect();
                failed.sort_unstable();
                for i in failed.into_iter().rev() {
                    let seq = self.running.remove(i);
                    let _ = seq.req.events.send(Event::Failed(message.clone()));
                    self.finish(seq, FinishReason::Abort);
                }
                return;
            }
        };
        let vocab = self.model.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        let mut done: Vec<(usize, FinishReason)> = Vec::new();
        let now = Instant::now();
        for (&(i, n), kind) in plan.iter().zip(kinds) {
            let seq = &mut self.running[i];
            if !seq.draft.is_empty() {
                let draft = std::mem::take(&mut seq.draft);
                let rows: Vec<&[f32]> = rows.by_ref().take(draft.len() + 1).collect();
                if let Some(reason) = self.verify(i, &draft, &rows, now) {
                    done.push((i, reason));
                }
                continue;
            }
            let start = seq.computed;
            seq.computed += n;
            if start < seq.prompt_len {
                self.metrics.computed_prompt(n.min(seq.prompt_len - start));
            }
            Core::register(&mut self.pool, seq);
            let last = match kind {
                Logits::None => continue,
                Logits::Last => rows.next(),
                Logits::All => {
                    let mut last = None;
                    for p in start..start + n {
                        let row = rows.next();
                        if let Some(top) = seq.req.params.prompt_logprobs
                            && p + 1 < seq.prompt_len
                            && let Some(row) = row
                        {
                            if seq.prompt_logprobs.is_empty() {
                                seq.prompt_logprobs.push(None);
                            }
                            seq.prompt_logprobs
                                .push(Some(logprobs(row, seq.tokens[p + 1], top)));
                        }
                        last = row;
                    }
                    last
                }
            };
            if seq.computed < seq.tokens.len() {
                continue;
            }
            let Some(row) = last else { continue };
            if seq.req.params.prompt_logprobs.is_some() && seq.output_len() == 0 {
                let mut lp = std::mem::take(&mut seq.prompt_logprobs);
                if lp.is_empty() {
                    lp.push(None);
                }
                let _ = seq.req.events.send(Event::PromptLogprobs(lp));
            }
            let params = &seq.req.params;
            if params.max_tokens == 0 {
                done.push((i, FinishReason::Length));
                continue;
            }
            let token = seq.sampler.sample(params, &mut row.to_vec());
            let reason = Core::emit(seq, token, row, now, true, &self.limits, &self.metrics);
            if let Some(reason) = reason {
                done.push((i, reason));
            }
        }
        self.rewind(saved, &done);
        self.draft_with_mtp(&fed, &hidden, &done);
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, reason) in done {
            let seq = self.running.remove(i);
            self.finish(seq, reason);
        }
    }

    /// Takes the drafting sequences of a hybrid model whose drafts were not all accepted
    /// back to the state they had before the step (`saved`), and runs the tokens that
    /// stood again: their keys and values were right, but the linear-attention state
    /// went on through the rejected tokens. Sequences that finished are left alone.
    fn rewind(&mut self, saved: Vec<Saved>, done: &[(usize, FinishReason)]) {
        let mut again = Vec::new();
        for (i, start, drafted, state) in saved {
            let seq = &self.running[i];
            let Some(slot) = seq.slot else { continue };
            if done.iter().any(|d| d.0 == i) || seq.computed == start + drafted + 1 {
                continue;
            }
            self.cache.restore_state(slot, &state);
            again.push((i, start, slot));
        }
        if again.is_empty() {
            return;
        }
        let batch: Vec<BatchSeq> = again
            .iter()
            .map(|&(i, start, slot)| {
                let s = &self.running[i];
                BatchSeq {
                    blocks: &s.blocks,
                    tokens: &s.tokens[start..s.computed],
                    start,
                    state: slot,
                    logits: Logits::None,
                }
            })
            .collect();
        if let Err(e) = self.model.forward(&batch, &mut self.cache) {
            let message = format!("running the accepted draft tokens again failed: {e}");
            super::log(self.reporter.as_ref(), "ERROR", super::here!(), &message);
        }
    }
}

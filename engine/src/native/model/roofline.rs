//! What a decode step has to read from memory ([`Model::step_bytes`]): the weights it
//! touches and the keys and values its attention reads. On a CPU one sequence's decode
//! is bound by reading them (tokens/s ≤ read bandwidth ÷ bytes per step), so the engine
//! divides these bytes by each step's time to say how close it runs to the machine's
//! read bandwidth (the `Decode roofline:` log line and the `sous:decode_*` series).

use super::cache::kv_bytes_per_token;
use super::linear::LinearStates;
use super::{Ffn, KvDtype, Mixer, Model};

/// The bytes one decode step reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepBytes {
    /// Weights: every layer's projections (for a MoE, the router, the shared expert
    /// and the experts the step's tokens are routed to), the output projection, and
    /// one embedding row per sequence (at most the whole table).
    pub weights: u64,
    /// Keys and values of every cached position attention reads, and a hybrid model's
    /// linear-attention states.
    pub kv: u64,
}

impl StepBytes {
    /// Weights and KV together.
    pub fn total(self) -> u64 {
        self.weights + self.kv
    }
}

impl Model {
    /// What a decode step of one token for each of `contexts.len()` sequences reads,
    /// each sequence attending over `contexts[i]` positions (the new token's included),
    /// with the KV cache held as `kv`. A MoE layer counts the experts that many tokens
    /// are expected to be routed to (exact for one sequence: its `top_k`); the norms'
    /// vectors and the MTP head are left out (kilobytes; the head drafts only).
    pub fn step_bytes(&self, contexts: &[usize], kv: KvDtype) -> StepBytes {
        let sequences = contexts.len();
        let vocab = self.config.vocab_size.max(1) as u64;
        let rows = (sequences as u64).min(vocab);
        let mut weights = self.head().bytes() + self.embed.bytes() / vocab * rows;
        for layer in &self.layers {
            weights += match &layer.mixer {
                Mixer::Attention(a) => a.qkv.bytes() + a.o.bytes(),
                Mixer::Linear(l) => l.in_proj.iter().map(|p| p.bytes()).sum::<u64>() + l.out.bytes(),
            };
            weights += match &layer.mlp {
                Ffn::Dense(mlp) => mlp.bytes(),
                Ffn::Experts(experts) => experts.step_bytes(sequences),
            };
        }
        let positions: u64 = contexts.iter().map(|&c| c as u64).sum();
        let states = self
            .config
            .linear
            .as_ref()
            .map_or(0, |c| LinearStates::bytes_per_sequence(c) * sequences as u64);
        StepBytes {
            weights,
            kv: positions * kv_bytes_per_token(&self.config, kv) + states,
        }
    }
}

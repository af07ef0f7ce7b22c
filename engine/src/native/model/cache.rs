//! The paged KV cache the forward pass reads and writes: every layer's keys and values
//! in `blocks × block_size` token slots, held in f32 or bf16 ([`KvDtype`]), its memory
//! committed at start-up; and the bytes a token takes in it, which the engine and
//! `sous plan` size the cache by. Which slots a sequence owns is the scheduler's.
//!
//! A hybrid model's cache holds keys and values for its attention layers only, and
//! beside them every running sequence's linear-attention state ([`LinearStates`]),
//! one slot per sequence that can run at once.

use rayon::prelude::*;
use sous_kernels::pages::{Plain, Zeroed};
use sous_kernels::transformer::KvShape;

use super::{LinearStates, Mixer, Model};
use crate::native::config::ModelConfig;

/// How the KV cache holds keys and values (`memory.kv_cache_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32, the products' own output (`auto`).
    #[default]
    F32,
    /// bf16, each value rounded to nearest when stored (`bfloat16`): half the bytes per
    /// token, so twice the tokens in a budget and half the bytes a decode step's
    /// attention reads.
    Bf16,
}

impl KvDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }

    /// The name vLLM's logs and metrics use (`cache_dtype`).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "float32",
            KvDtype::Bf16 => "bfloat16",
        }
    }
}

/// One layer's keys and values, as the cache holds them.
pub(super) enum Held {
    F32 { k: Zeroed<f32>, v: Zeroed<f32> },
    Bf16 { k: Zeroed<u16>, v: Zeroed<u16> },
}

/// The KV cache of every layer: `blocks × block_size` token slots of keys and values.
pub struct KvCache {
    pub(super) shape: KvShape,
    blocks: usize,
    /// One per attention layer.
    pub(super) layers: Vec<Held>,
    dtype: KvDtype,
    /// A hybrid model's linear-attention states.
    pub(super) linear: Option<LinearStates>,
}

/// `len` values of `T`, every page written once, in parallel (see [`KvCache::new`]),
/// in huge pages where the system gives them ([`Zeroed`]).
fn committed<T: Plain>(len: usize) -> Zeroed<T> {
    let mut v = if crate::native::huge_pages() {
        Zeroed::new(len)
    } else {
        Zeroed::on_heap(len)
    };
    // One write per 4 KiB page. The value is opaque to the compiler, so the store is
    // not dropped as redundant on memory it knows to be zero.
    let zero = std::hint::black_box(T::default());
    let page = 4096 / std::mem::size_of::<T>().max(1);
    v.par_chunks_mut(256 * page).for_each(|chunk| {
        for x in chunk.iter_mut().step_by(page) {
            *x = zero;
        }
    });
    v
}

impl KvCache {
    /// A cache of `blocks` blocks for `model`, held in f32, its memory committed now:
    /// every page is written once, in parallel, as vLLM's CPU backend (`torch.zeros`) and
    /// llama.cpp (`ggml_backend_buffer_clear`) do with theirs. Left to the OS to fault in
    /// page by page, a fresh block's first write zeroed its pages inside the request, in
    /// the kernel's `clear_page_erms`, until the whole budget had been used once, which
    /// with prefix caching (fresh blocks first) is hundreds of requests (benchmarks/native.md,
    /// "Figures that were in code comments"). A budget larger than the machine can hold also fails here, at start-up,
    /// rather than in the middle of serving.
    pub fn new(model: &Model, blocks: usize, block_size: usize) -> KvCache {
        KvCache::with_dtype(model, blocks, block_size, KvDtype::F32)
    }

    /// [`KvCache::new`], holding its values as `dtype`.
    pub fn with_dtype(model: &Model, blocks: usize, block_size: usize, dtype: KvDtype) -> KvCache {
        let shape = KvShape {
            block_size,
            kv_heads: model.config.kv_heads,
            head_dim: model.config.head_dim,
        };
        let len = blocks * block_size * shape.slot_len();
        let attention = model
            .layers
            .iter()
            .filter(|l| matches!(l.mixer, Mixer::Attention(_)))
            .count()
            + usize::from(model.mtp.is_some());
        let layers = (0..attention)
            .map(|_| match dtype {
                KvDtype::F32 => Held::F32 {
                    k: committed(len),
                    v: committed(len),
                },
                KvDtype::Bf16 => Held::Bf16 {
                    k: committed(len),
                    v: committed(len),
                },
            })
            .collect();
        let linear = model.config.linear.as_ref().map(|c| LinearStates::new(c, 1));
        KvCache {
            shape,
            blocks,
            layers,
            dtype,
            linear,
        }
    }

    /// How the cache holds keys and values.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// This cache with linear-attention states for `sequences` running sequences (a
    /// hybrid model's; one otherwise): each [`super::BatchSeq::state`] must be below it.
    pub fn with_state_slots(mut self, sequences: usize) -> KvCache {
        if let Some(states) = &self.linear {
            self.linear = Some(LinearStates::new(states.config(), sequences.max(1)));
        }
        self
    }

    /// A copy of a sequence's linear-attention state (`None` for a model without
    /// linear attention), for [`KvCache::restore_state`]: a step whose drafted tokens
    /// are not all accepted has advanced the state past them and must go back.
    pub fn save_state(&mut self, slot: usize) -> Option<Vec<f32>> {
        self.linear.as_mut().map(|states| states.save(slot))
    }

    /// Puts back a state [`KvCache::save_state`] copied.
    pub fn restore_state(&mut self, slot: usize, saved: &[f32]) {
        if let Some(states) = self.linear.as_mut() {
            states.restore(slot, saved);
        }
    }

    /// Blocks in the cache.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.shape.block_size
    }
}

/// Bytes of KV cache one token takes in every attention layer of the decoder, held as
/// `dtype` (an MTP head's layer adds [`kv_bytes_per_layer`]).
pub fn kv_bytes_per_token(config: &ModelConfig, dtype: KvDtype) -> u64 {
    let attention = config.layers - config.linear.as_ref().map_or(0, |l| l.count());
    attention as u64 * kv_bytes_per_layer(config, dtype)
}

/// Bytes of KV cache one token takes in one attention layer.
pub fn kv_bytes_per_layer(config: &ModelConfig, dtype: KvDtype) -> u64 {
    (2 * config.kv_heads * config.head_dim * dtype.bytes()) as u64
}

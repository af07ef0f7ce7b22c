//! The Llama-family decoder: one forward pass over a batch of tokens from many
//! sequences at once, reading and writing a paged KV cache.
//!
//! A batch is "varlen": the tokens of every scheduled sequence (a prefill chunk, or one
//! decode token) are stacked into one `[tokens, hidden]` matrix, so every linear layer
//! is one matrix product for the whole batch; only attention looks at sequences
//! separately, each token attending to its own sequence's cached positions. This is
//! how iteration-level batching pays off on a CPU: the weights are read once per step,
//! not once per sequence.
//!
//! Matrix products run through `sous_kernels::gemm` on weights packed at load in their
//! held precision (f32, bf16 or NVFP4), accumulating in f32; the rest (norms, rotary,
//! attention, activations) runs in f32 in `sous_kernels::transformer`. A W4A4
//! checkpoint's products get their input quantized to NVFP4 first
//! (`sous_kernels::activation`).
//!
//! Calibration (`Model::observe_inputs`) runs the same pass over one sample and records
//! the largest magnitude at each projection's input; for a bf16 model it rounds to bf16
//! wherever transformers' bf16 model does, with eager attention, so that the ranges are
//! those llm-compressor measures. It can run layer by layer: a model holding some of
//! the layers (`Model::with_layers`) takes the hidden states its first layer reads and
//! gives back those its last one writes, so a calibration holds one layer's weights
//! and every sample's hidden states, not the whole model.
//!
//! A layer mixes its tokens by attention or, in a hybrid model, by a Gated DeltaNet
//! (`linear`), and its MLP is dense or a mixture of experts (`moe`).
//!
//! Loading the weights is in `load`, the paged KV cache in `cache`, the pass in `pass`;
//! this file holds the model and calibration.

use std::sync::{Arc, Mutex};

use sous_kernels::gemm::{Packed, Tuning};
use sous_kernels::pages::Placement;
use sous_kernels::transformer::Rotary;

mod cache;
mod linear;
mod load;
mod moe;
mod mtp;
mod observe;
mod pass;
mod roofline;

pub use cache::{KvCache, KvDtype, kv_bytes_per_layer, kv_bytes_per_token};
pub use linear::LinearStates;
use moe::{Experts, Mlp};
use mtp::Mtp;
pub use observe::LayerInputs;
use observe::Observer;
pub use roofline::StepBytes;

use super::NativeError;
use super::config::ModelConfig;
use super::weights::Precision;

/// Tokens in a pass from which its per-token work between the products (q/k norms, the
/// rotary embedding) is shared out on the thread pool; fewer stay on the calling thread.
const PARALLEL_ROWS: usize = 32;

struct Layer {
    input_norm: Vec<f32>,
    mixer: Mixer,
    post_norm: Vec<f32>,
    mlp: Ffn,
    /// W4A4: the activation global scales of the attention's qkv and o inputs (none
    /// for a linear-attention layer, which W4A4 checkpoints keep in 16 bits); the
    /// MLP's and each expert's are their [`Mlp`]'s.
    input_scales: [Option<f32>; 2],
}

/// What mixes a layer's tokens: softmax attention over the KV cache, or a Gated
/// DeltaNet over each sequence's recurrent state.
enum Mixer {
    Attention(Attention),
    Linear(linear::LinearAttention),
}

/// A layer's attention projections.
struct Attention {
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) head_dim, hidden]`; in a
    /// hybrid model (gated attention), q's rows are each head's query and then its gate.
    qkv: Packed,
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Packed,
}

/// A layer's MLP: dense, or experts.
enum Ffn {
    Dense(Mlp),
    Experts(Experts),
}

/// How the token embedding and a float output projection are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Embeddings {
    /// As the other float weights are ([`Precision`]).
    #[default]
    Stored,
    /// llama.cpp's Q8_0, quantized at load (8.5 bits a value; the products and the
    /// lookups read `code · scale`).
    Q8_0,
}

/// A loaded model.
pub struct Model {
    config: ModelConfig,
    precision: Precision,
    /// Shared with the models [`Model::with_layers`] makes.
    embed: Arc<Packed>,
    /// The layers held: `first_layer..first_layer + layers.len()` of the decoder (all
    /// of them, but in a model made by [`Model::with_layers`]).
    layers: Vec<Layer>,
    first_layer: usize,
    norm: Vec<f32>,
    /// `None`: tied to `embed`.
    lm_head: Option<Arc<Packed>>,
    rotary: Rotary,
    /// The checkpoint's MTP head, when it has one and it is wanted.
    mtp: Option<Mtp>,
    /// The choices the products run with ([`Model::set_tuning`]).
    tuning: Tuning,
    /// The last pass's buffers, for the next.
    scratch: Mutex<Scratch>,
}

/// A pass's buffers (see `Model::pass`).
#[derive(Default)]
struct Scratch {
    normed: Vec<f32>,
    q: Vec<f32>,
    attn: Vec<f32>,
    act: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    gate_up: Vec<f32>,
    down: Vec<f32>,
}

impl Layer {
    /// A matrix of the layer's that load-time kernel choices can be measured on: its
    /// dense MLP's gate and up projections, else its first projection.
    fn matrix(&self) -> &Packed {
        match (&self.mlp, &self.mixer) {
            (Ffn::Dense(mlp), _) => &mlp.gate_up,
            (_, Mixer::Attention(a)) => &a.qkv,
            (_, Mixer::Linear(l)) => l.in_proj.first().unwrap_or(&l.out),
        }
    }

    fn matrices(&mut self) -> Vec<&mut Packed> {
        let mut all: Vec<&mut Packed> = match &mut self.mixer {
            Mixer::Attention(a) => vec![&mut a.qkv, &mut a.o],
            Mixer::Linear(l) => l.in_proj.iter_mut().chain([&mut l.out]).collect(),
        };
        match &mut self.mlp {
            Ffn::Dense(mlp) => all.extend([&mut mlp.gate_up, &mut mlp.down]),
            Ffn::Experts(experts) => all.extend(experts.matrices()),
        }
        all
    }

    fn bytes(&self) -> u64 {
        let mixer = match &self.mixer {
            Mixer::Attention(a) => a.qkv.bytes() + a.o.bytes(),
            Mixer::Linear(l) => l.in_proj.iter().map(Packed::bytes).sum::<u64>() + l.out.bytes(),
        };
        mixer
            + match &self.mlp {
                Ffn::Dense(mlp) => mlp.bytes(),
                Ffn::Experts(experts) => experts.bytes(),
            }
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("architecture", &self.config.architecture)
            .field("precision", &self.precision)
            .finish()
    }
}

/// One scheduled sequence in a batch.
#[derive(Debug, Clone)]
pub struct BatchSeq<'a> {
    /// Its block table (enough blocks for every position in this step).
    pub blocks: &'a [u32],
    /// Its tokens in this step.
    pub tokens: &'a [u32],
    /// Position of the first of them.
    pub start: usize,
    /// Its slot in the cache's linear-attention states (a hybrid model's; any value
    /// for others): the scheduler gives every running sequence its own.
    pub state: usize,
    /// Logits wanted for: the last token only, or every token (prompt logprobs).
    pub logits: Logits,
}

/// Which layers a pass runs.
#[derive(Clone, Copy)]
pub(super) enum Route<'a> {
    /// The decoder; with `hidden`, every row's final hidden state is kept (for an MTP
    /// head) and no row is left out of the last layer.
    Decoder { hidden: bool },
    /// The MTP head, on these hidden states (one row per token of the batch).
    Mtp { hidden: &'a [f32] },
}

/// What a pass gives: the logits asked for and the final (normed) hidden states: of
/// every row for [`Route::Decoder`] with `hidden`, else of the rows asked for.
#[derive(Debug, Default)]
pub struct Passed {
    /// `vocab_size` values per row asked for.
    pub logits: Vec<f32>,
    /// `hidden_size` values per row.
    pub hidden: Vec<f32>,
}

/// Which rows of logits a sequence wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// The last token's.
    Last,
    /// Every token's.
    All,
}

impl Model {
    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The precision float weights are held in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The output projection (the embedding where they are tied): the largest matrix,
    /// the one read last in every decode step.
    pub fn head(&self) -> &Packed {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    /// A matrix of the layers (the first layer's gate and up projections): what the
    /// load-time choice of kernel for prompt-sized products is measured on.
    pub fn layer_matrix(&self) -> Option<&Packed> {
        self.layers.first().map(Layer::matrix)
    }

    /// The matrix the load-time tile choices are measured on: the output projection,
    /// unless it is held as Q8_0 (the layers' choices are for float weights), then the
    /// first layer's gate and up projections.
    pub fn tuning_matrix(&self) -> &Packed {
        match (self.head().format(), self.layers.first()) {
            ("q8_0", Some(layer)) => layer.matrix(),
            _ => self.head(),
        }
    }

    /// Sets the choices the products run with, made at load from the user's switches
    /// and measurements on this model's matrices (`native::tune`).
    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.tuning = tuning;
    }

    /// The format the token embedding is held in (`bf16`, `f32`, `q8_0`).
    pub fn embedding_format(&self) -> &'static str {
        self.embed.format()
    }

    /// Moves the weights into one mapping advised for transparent huge pages
    /// ([`sous_kernels::pages`]): a decode step reads them all, and in 4 KiB pages it
    /// pays a TLB miss every 4 KiB. `Ok(None)` where `SOUS_HUGE_PAGES=off` or nothing
    /// moved; an error leaves them where they were.
    pub fn place_in_huge_pages(&mut self) -> std::io::Result<Option<Placement>> {
        if !super::huge_pages() {
            return Ok(None);
        }
        let mut weights: Vec<&mut Packed> = Vec::with_capacity(4 * self.layers.len() + 2);
        // A model sharing its embedding (a calibration's) leaves it where it is.
        weights.extend(Arc::get_mut(&mut self.embed));
        weights.extend(self.lm_head.as_mut().and_then(Arc::get_mut));
        for l in &mut self.layers {
            weights.extend(l.matrices());
        }
        sous_kernels::gemm::place(&mut weights)
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> u64 {
        let mut total = self.embed.bytes() + self.lm_head.as_deref().map_or(0, Packed::bytes);
        for l in &self.layers {
            total += l.bytes();
        }
        total + self.mtp.as_ref().map_or(0, Mtp::bytes)
    }

    /// Runs the batch: writes its keys and values into `cache` and returns the logits the
    /// sequences asked for, `vocab_size` values per row, in sequence order (for `All`,
    /// one row per token).
    ///
    /// The pass runs on a thread of rayon's pool, so that the hundred-odd parallel
    /// products of a decode step are shared with a worker that is already awake: called
    /// from outside the pool, every product would put the caller to sleep and wake the
    /// workers (a futex round trip each), which measured a sizeable share of a decode
    /// step (benchmarks/native.md, "Figures that were in code comments").
    pub fn forward(&self, batch: &[BatchSeq], cache: &mut KvCache) -> Result<Vec<f32>, NativeError> {
        let route = Route::Decoder { hidden: false };
        rayon::scope(|_| self.pass(batch, cache, None, route)).map(|p| p.logits)
    }

    /// [`Model::forward`], also giving every row's final hidden state (what an MTP
    /// head drafts from).
    pub fn forward_hidden(&self, batch: &[BatchSeq], cache: &mut KvCache) -> Result<Passed, NativeError> {
        rayon::scope(|_| self.pass(batch, cache, None, Route::Decoder { hidden: true }))
    }

    /// Runs the MTP head on `batch` (each token with the decoder's final hidden state at
    /// the position before it, `hidden`, one row per token; the token at position `p`
    /// of a sequence is the one that followed position `p`), writing its keys and values;
    /// gives the logits asked for and the head's normed output for the same rows.
    pub fn forward_mtp(
        &self,
        batch: &[BatchSeq],
        hidden: &[f32],
        cache: &mut KvCache,
    ) -> Result<Passed, NativeError> {
        rayon::scope(|_| self.pass(batch, cache, None, Route::Mtp { hidden }))
    }

    /// Whether the model has an MTP head loaded.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Drops the MTP head (a server that does not draft with it needs neither its
    /// weights nor its keys and values).
    pub fn without_mtp(mut self) -> Model {
        self.mtp = None;
        self
    }

    /// Bytes of KV cache one token takes: every attention layer's, and the MTP head's.
    pub fn kv_bytes_per_token(&self, dtype: KvDtype) -> u64 {
        kv_bytes_per_token(&self.config, dtype)
            + if self.has_mtp() {
                kv_bytes_per_layer(&self.config, dtype)
            } else {
                0
            }
    }

    /// `out = x · wᵀ` in the model's precision (`bfloat16`: inputs rounded to bf16).
    fn product(&self, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
        match self.precision {
            Precision::Bf16 => self.tuning.matmul_bf16(x, rows, w, out),
            Precision::Stored => self.tuning.matmul(x, rows, w, out),
        }
    }

    /// Runs `tokens` as one sequence from position 0 (a calibration sample) and raises
    /// `ranges` (one entry per layer) to the largest input magnitude each projection
    /// saw. A running maximum over samples, as compressed-tensors' `static_minmax`
    /// observer keeps it for NVFP4 activations (llm-compressor 0.14.0.1,
    /// `observers/min_max.py`), fed one sample per forward as `oneshot` does.
    ///
    /// With `bf16`, the pass rounds to bf16 wherever transformers' bf16 model does
    /// (every product's output, the norms, rotary, attention's output, the residual
    /// sums and the gated activation), so that the ranges are those of the model
    /// llm-compressor calibrates; the products still accumulate in f32, as PyTorch's
    /// do, in another order.
    ///
    /// `ranges` has one entry per layer this model holds, and `hidden` the hidden
    /// states entering its first (`tokens.len() × hidden_size`; for a model from the
    /// decoder's first layer, nothing: the tokens are embedded); the pass replaces them
    /// with those leaving its last, for the next layers ([`Model::with_layers`]).
    ///
    /// `layer_done` is called with each layer's index (among those held) as the pass
    /// leaves it (progress).
    ///
    /// A MoE layer sends every token through every expert for the ranges of the
    /// experts' `down` inputs (llm-compressor's `calibrate_all_experts`), while its
    /// output stays routed; in bf16 the experts' and linear attention's arithmetic is
    /// not rounded step by step as the dense path's is.
    pub fn observe_inputs(
        &self,
        tokens: &[u32],
        hidden: &mut Vec<f32>,
        ranges: &mut [LayerInputs],
        bf16: bool,
        layer_done: &(dyn Fn(usize) + Sync),
    ) -> Result<(), NativeError> {
        if ranges.len() != self.layers.len() {
            return Err(NativeError::Internal(format!(
                "{} input ranges for {} layers",
                ranges.len(),
                self.layers.len()
            )));
        }
        const BLOCK: usize = 16;
        let blocks = tokens.len().div_ceil(BLOCK).max(1);
        let mut cache = KvCache::new(self, blocks, BLOCK).with_state_slots(1);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let batch = [BatchSeq {
            blocks: &table,
            tokens,
            start: 0,
            state: 0,
            logits: Logits::None,
        }];
        let observer = Observer {
            ranges,
            hidden,
            bf16,
            layer_done,
        };
        let route = Route::Decoder { hidden: false };
        rayon::scope(|_| self.pass(&batch, &mut cache, Some(observer), route)).map(|_| ())
    }
}

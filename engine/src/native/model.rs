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
//! Loading the weights is in `load`, the paged KV cache in `cache`; this file holds the
//! model, the pass and calibration.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use sous_kernels::activation::quantize_dequantize_nvfp4;
use sous_kernels::gemm::{Packed, Tuning};
use sous_kernels::pages::Placement;
use sous_kernels::transformer::{self as k, Rotary, Span};

mod cache;
mod load;

use cache::Held;
pub use cache::{KvCache, KvDtype, kv_bytes_per_token};

use super::NativeError;
use super::config::ModelConfig;
use super::weights::Precision;

/// Tokens in a pass from which its per-token work between the products (q/k norms, the
/// rotary embedding) is shared out on the thread pool; fewer stay on the calling thread.
const PARALLEL_ROWS: usize = 32;

struct Layer {
    input_norm: Vec<f32>,
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) head_dim, hidden]`.
    qkv: Packed,
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Packed,
    post_norm: Vec<f32>,
    /// gate and up projections stacked: `[2 intermediate, hidden]`.
    gate_up: Packed,
    down: Packed,
    /// W4A4: the activation global scales of the qkv, o, gate_up and down inputs.
    input_scales: Option<[f32; 4]>,
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
    /// Logits wanted for: the last token only, or every token (prompt logprobs).
    pub logits: Logits,
}

/// The largest magnitude that reached the input of each of a layer's linear
/// projections during calibration: what an NVFP4 W4A4 checkpoint's per-tensor
/// activation scale (`input_global_scale`) is computed from. q, k and v read one
/// input, as do gate and up, so a layer has four.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerInputs {
    /// Input of q_proj, k_proj and v_proj (the normed residual).
    pub qkv: f32,
    /// Input of o_proj (attention's output).
    pub o: f32,
    /// Input of gate_proj and up_proj (the normed residual).
    pub gate_up: f32,
    /// Input of down_proj (`silu(gate) * up`).
    pub down: f32,
}

impl LayerInputs {
    /// The layer's quantizable projections (their names under `model.layers.N.`) and
    /// the input range each saw.
    pub fn modules(&self) -> [(&'static str, f32); 7] {
        [
            ("self_attn.q_proj", self.qkv),
            ("self_attn.k_proj", self.qkv),
            ("self_attn.v_proj", self.qkv),
            ("self_attn.o_proj", self.o),
            ("mlp.gate_proj", self.gate_up),
            ("mlp.up_proj", self.gate_up),
            ("mlp.down_proj", self.down),
        ]
    }

    fn raise(slot: &mut f32, values: &[f32]) {
        // NaN never wins a `max`: a NaN activation leaves the range as it was.
        *slot = values.iter().fold(*slot, |m, v| m.max(v.abs()));
    }
}

/// What a calibration pass records, and how it rounds.
struct Observer<'a> {
    ranges: &'a mut [LayerInputs],
    /// The hidden states entering the first layer held (unused, and left empty, when
    /// that is the decoder's first: the tokens are embedded), replaced by those leaving
    /// the last layer held.
    hidden: &'a mut Vec<f32>,
    bf16: bool,
    /// Called with each layer's index once the pass is through it.
    layer_done: &'a (dyn Fn(usize) + Sync),
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
        self.layers.first().map(|layer| &layer.gate_up)
    }

    /// The matrix the load-time tile choices are measured on: the output projection,
    /// unless it is held as Q8_0 (the layers' choices are for float weights), then the
    /// first layer's gate and up projections.
    pub fn tuning_matrix(&self) -> &Packed {
        match (self.head().format(), self.layers.first()) {
            ("q8_0", Some(layer)) => &layer.gate_up,
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
            weights.extend([&mut l.qkv, &mut l.o, &mut l.gate_up, &mut l.down]);
        }
        sous_kernels::gemm::place(&mut weights)
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> u64 {
        let mut total = self.embed.bytes() + self.lm_head.as_deref().map_or(0, Packed::bytes);
        for l in &self.layers {
            total += l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes();
        }
        total
    }

    /// Runs the batch: writes its keys and values into `cache` and returns the logits the
    /// sequences asked for, `vocab_size` values per row, in sequence order (for `All`,
    /// one row per token).
    ///
    /// The pass runs on a thread of rayon's pool, so that the hundred-odd parallel
    /// products of a decode step are shared with a worker that is already awake: called
    /// from outside the pool, every product would put the caller to sleep and wake the
    /// workers (a futex round trip each), which cost a decode step 15–30 % here.
    pub fn forward(&self, batch: &[BatchSeq], cache: &mut KvCache) -> Result<Vec<f32>, NativeError> {
        rayon::scope(|_| self.pass(batch, cache, None))
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
        let mut cache = KvCache::new(self, blocks, BLOCK);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let batch = [BatchSeq {
            blocks: &table,
            tokens,
            start: 0,
            logits: Logits::None,
        }];
        let observer = Observer {
            ranges,
            hidden,
            bf16,
            layer_done,
        };
        rayon::scope(|_| self.pass(&batch, &mut cache, Some(observer))).map(|_| ())
    }

    fn pass(
        &self,
        batch: &[BatchSeq],
        cache: &mut KvCache,
        mut observe: Option<Observer<'_>>,
    ) -> Result<Vec<f32>, NativeError> {
        let bf16 = observe.as_ref().is_some_and(|o| o.bf16);
        let norm = if bf16 { k::rms_norm_bf16 } else { k::rms_norm };
        let c = &self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let tokens: Vec<u32> = batch.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let mut n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Each token's block table and position, and each sequence's span of rows.
        let mut tables = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut spans = Vec::with_capacity(batch.len());
        for s in batch {
            spans.push(Span {
                blocks: s.blocks,
                start: s.start,
                len: s.tokens.len(),
                row: positions.len(),
            });
            for i in 0..s.tokens.len() {
                let position = s.start + i;
                if position >= self.rotary.positions() || position >= s.blocks.len() * cache.block_size() {
                    return Err(NativeError::Internal(format!(
                        "position {position} is beyond the sequence's {} cached blocks or the rotary table",
                        s.blocks.len()
                    )));
                }
                positions.push(position);
                tables.push(s.blocks);
            }
        }
        let mut x = match observe.as_mut() {
            // A calibration pass from a later layer: the hidden states an earlier one left.
            Some(seen) if self.first_layer > 0 => {
                if seen.hidden.len() != n * h {
                    return Err(NativeError::Internal(format!(
                        "{} hidden values enter layer {} for {n} tokens of {h}",
                        seen.hidden.len(),
                        self.first_layer
                    )));
                }
                std::mem::take(seen.hidden)
            }
            _ => {
                let mut x = vec![0.0f32; n * h];
                for (row, &id) in x.chunks_exact_mut(h).zip(&tokens) {
                    if id as usize >= c.vocab_size {
                        return Err(NativeError::Internal(format!(
                            "token id {id} is outside the vocabulary"
                        )));
                    }
                    self.embed.row(id as usize, row);
                }
                x
            }
        };
        // The pass's buffers, those of the last pass if no other pass holds them: fresh
        // ones are fresh pages, faulted in and cleared by the kernel 4 KiB at a time
        // (about 1 % of a 512-token prefill, and a tenth of a calibration that runs one
        // layer per pass). Each is zeroed to its length here, as a fresh one would be.
        let mut scratch = self
            .scratch
            .try_lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default();
        let zeroed = |v: &mut Vec<f32>, len: usize| {
            let mut v = std::mem::take(v);
            v.clear();
            v.resize(len, 0.0);
            v
        };
        let mut normed = zeroed(&mut scratch.normed, n * h);
        let (q_len, kv_len) = (c.heads * hd, c.kv_heads * hd);
        let mut q = zeroed(&mut scratch.q, n * q_len);
        let mut attn = zeroed(&mut scratch.attn, n * q_len);
        let mut act = zeroed(&mut scratch.act, n * c.intermediate_size);
        // `bfloat16`: bf16 arithmetic in the products (inputs rounded to bf16).
        let (precision, tuning) = (self.precision, self.tuning);
        let product = |x: &[f32], rows: usize, w: &Packed, out: &mut [f32]| match precision {
            Precision::Bf16 => tuning.matmul_bf16(x, rows, w, out),
            Precision::Stored => tuning.matmul(x, rows, w, out),
        };
        // The products' outputs, once per pass (fresh pages for every layer's products
        // cost more than the norms between them).
        let row_len = q_len + 2 * kv_len;
        let mut qkv = zeroed(&mut scratch.qkv, n * row_len);
        let mut o = zeroed(&mut scratch.o, n * h);
        let mut gate_up = zeroed(&mut scratch.gate_up, n * 2 * c.intermediate_size);
        let mut down = zeroed(&mut scratch.down, n * h);
        // The rows whose logits are asked for.
        let mut rows = Vec::new();
        let mut offset = 0;
        for s in batch {
            let len = s.tokens.len();
            match s.logits {
                Logits::None => {}
                Logits::Last => rows.push(offset + len - 1),
                Logits::All => rows.extend(offset..offset + len),
            }
            offset += len;
        }
        let mut pruned = false;
        for (li, layer) in self.layers.iter().enumerate() {
            norm(&x, &layer.input_norm, c.rms_norm_eps, &mut normed);
            if let Some(seen) = observe.as_mut() {
                LayerInputs::raise(&mut seen.ranges[li].qkv, &normed);
            }
            if let Some(scales) = layer.input_scales {
                quantize_dequantize_nvfp4(&mut normed, scales[0]);
            }
            product(&normed, n, &layer.qkv, &mut qkv);
            if bf16 {
                k::round_bf16_all(&mut qkv);
            }
            if let Some(bias) = &layer.qkv_bias {
                for row in qkv.chunks_exact_mut(row_len) {
                    k::add_assign(row, bias);
                    if bf16 {
                        k::round_bf16_all(row);
                    }
                }
            }
            // Each token's q/k norms and rotary embedding, and its query copied out for
            // attention while the row is in cache, on the pool for a prompt chunk (every
            // row alone, so the same bits wherever it runs): a quarter of the time of
            // one thread copying them after the rotation (BENCHMARKS.md, "Figures that were in code comments").
            let rotate = |((row, &position), q): ((&mut [f32], &usize), &mut [f32])| {
                let (qr, rest) = row.split_at_mut(q_len);
                let kr = &mut rest[..kv_len];
                if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                    k::rms_norm_heads(qr, qn, c.rms_norm_eps);
                    k::rms_norm_heads(kr, kn, c.rms_norm_eps);
                }
                if bf16 {
                    self.rotary.apply_bf16(qr, position);
                    self.rotary.apply_bf16(kr, position);
                } else {
                    self.rotary.apply(qr, position);
                    self.rotary.apply(kr, position);
                }
                q.copy_from_slice(qr);
            };
            if n >= PARALLEL_ROWS {
                qkv.par_chunks_exact_mut(row_len)
                    .zip(positions.par_iter())
                    .zip(q.par_chunks_exact_mut(q_len))
                    .with_min_len(PARALLEL_ROWS / 2)
                    .for_each(rotate);
            } else {
                qkv.chunks_exact_mut(row_len)
                    .zip(positions.iter())
                    .zip(q.chunks_exact_mut(q_len))
                    .for_each(rotate);
            }
            let shape = cache.shape;
            let held = &mut cache.layers[li];
            for (t, row) in qkv.chunks_exact(row_len).enumerate() {
                let (kr, vr) = row[q_len..].split_at(kv_len);
                match held {
                    Held::F32 { k, v } => shape.store(k, v, tables[t], positions[t], kr, vr),
                    Held::Bf16 { k, v } => shape.store_bf16(k, v, tables[t], positions[t], kr, vr),
                }
            }
            // Past the last layer's keys and values, only the rows whose logits are
            // asked for matter (a prompt chunk's last token, or none): the rest of the
            // layer runs on those rows alone. Every row's arithmetic is its own, so
            // their bits do not change. (Calibration observes every row.)
            if self.first_layer + li + 1 == c.layers && observe.is_none() && rows.len() < n {
                if rows.is_empty() {
                    break;
                }
                let m = rows.len();
                q = rows
                    .iter()
                    .flat_map(|&r| q[r * q_len..(r + 1) * q_len].iter().copied())
                    .collect();
                x = rows
                    .iter()
                    .flat_map(|&r| x[r * h..(r + 1) * h].iter().copied())
                    .collect();
                spans = rows
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| Span {
                        blocks: tables[r],
                        start: positions[r],
                        len: 1,
                        row: i,
                    })
                    .collect();
                for (buffer, width) in [
                    (&mut attn, q_len),
                    (&mut o, h),
                    (&mut normed, h),
                    (&mut gate_up, 2 * c.intermediate_size),
                    (&mut act, c.intermediate_size),
                    (&mut down, h),
                ] {
                    buffer.truncate(m * width);
                }
                (n, pruned) = (m, true);
            }
            match held {
                Held::F32 { k, v } if bf16 => {
                    k::attention_eager_bf16(&q, &spans, c.heads, shape, k, v, &mut attn)
                }
                Held::F32 { k, v } => k::attention(&q, &spans, c.heads, shape, k, v, &mut attn, tuning.isa()),
                Held::Bf16 { .. } if bf16 => {
                    return Err(NativeError::Internal(
                        "calibration's bf16 attention reads an f32 cache".into(),
                    ));
                }
                Held::Bf16 { k, v } => {
                    k::attention_bf16_cache(&q, &spans, c.heads, shape, k, v, &mut attn, tuning.isa())
                }
            }
            if let Some(seen) = observe.as_mut() {
                LayerInputs::raise(&mut seen.ranges[li].o, &attn);
            }
            if let Some(scales) = layer.input_scales {
                quantize_dequantize_nvfp4(&mut attn, scales[1]);
            }
            product(&attn, n, &layer.o, &mut o);
            if bf16 {
                k::round_bf16_all(&mut o);
            }
            k::add_assign(&mut x, &o);
            if bf16 {
                k::round_bf16_all(&mut x);
            }
            norm(&x, &layer.post_norm, c.rms_norm_eps, &mut normed);
            if let Some(seen) = observe.as_mut() {
                LayerInputs::raise(&mut seen.ranges[li].gate_up, &normed);
            }
            if let Some(scales) = layer.input_scales {
                quantize_dequantize_nvfp4(&mut normed, scales[2]);
            }
            product(&normed, n, &layer.gate_up, &mut gate_up);
            if bf16 {
                k::round_bf16_all(&mut gate_up);
                k::silu_mul_bf16(&gate_up, c.intermediate_size, &mut act);
            } else {
                k::silu_mul(&gate_up, c.intermediate_size, &mut act);
            }
            if let Some(seen) = observe.as_mut() {
                LayerInputs::raise(&mut seen.ranges[li].down, &act);
            }
            if let Some(scales) = layer.input_scales {
                quantize_dequantize_nvfp4(&mut act, scales[3]);
            }
            product(&act, n, &layer.down, &mut down);
            if bf16 {
                k::round_bf16_all(&mut down);
            }
            k::add_assign(&mut x, &down);
            if bf16 {
                k::round_bf16_all(&mut x);
            }
            if let Some(seen) = observe.as_ref() {
                (seen.layer_done)(li);
            }
        }
        if let Ok(mut kept) = self.scratch.try_lock() {
            *kept = Scratch {
                normed,
                q,
                attn,
                act,
                qkv,
                o,
                gate_up,
                down,
            };
        }
        // A calibration pass hands its hidden states on, for the layers after these.
        if let Some(seen) = observe {
            *seen.hidden = x;
            return Ok(Vec::new());
        }
        // Final norm and lm_head, only for the rows asked for (after a pruned last
        // layer, the first rows of `x`).
        if pruned {
            rows = (0..rows.len()).collect();
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut hidden = vec![0.0f32; rows.len() * h];
        for (dst, &r) in hidden.chunks_exact_mut(h).zip(&rows) {
            k::rms_norm_row(&x[r * h..(r + 1) * h], &self.norm, c.rms_norm_eps, dst);
        }
        let head = self.head();
        let mut logits = vec![0.0f32; rows.len() * head.n()];
        product(&hidden, rows.len(), head, &mut logits);
        Ok(logits)
    }
}

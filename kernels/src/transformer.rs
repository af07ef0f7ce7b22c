//! The element-wise and attention loops of a Llama-family decoder on the CPU, in f32.
//!
//! The native engine runs its matrix products through [`crate::gemm`]; everything between
//! them lives here, because this crate is built optimized in every profile and these
//! loops run once per token per layer. Each function follows the arithmetic of
//! transformers' `modeling_llama.py` (RMSNorm in f32, rotary embedding by
//! `rotate_half`, SiLU-gated MLP, softmax attention scaled by `1/sqrt(head_dim)`), so
//! that greedy decoding agrees with it token for token.
//!
//! Attention reads a paged KV cache: keys and values of every sequence live in
//! fixed-size blocks, and a sequence is the list of its blocks, as in vLLM's
//! PagedAttention (values `[block, slot, kv_head, head_dim]`; keys transposed within a
//! block, `[block, kv_head, head_dim, slot]`: see [`KvShape`]). Nothing here allocates
//! the cache or decides which blocks a sequence owns; the engine does.

use rayon::prelude::*;

mod scores;

/// Values an element-wise pass writes below which it stays on the calling thread (a
/// decode step's few rows cost less than handing them out), and about how many each
/// task of a larger pass (a prompt chunk's) writes.
const PARALLEL_MIN: usize = 1 << 15;

/// Runs `f` on whole rows of `x` (`x_row` values each) and the matching rows of `out`
/// (`out_row` each): all at once for a few rows, in tasks of about [`PARALLEL_MIN`]
/// output values on the thread pool for many. Every row is computed alone, so where it
/// runs changes no bit. A prompt chunk's norms, residual additions and activations ran
/// on one core while the other waited: a tenth of a 512-token prefill on two cores.
fn by_rows(x: &[f32], x_row: usize, out: &mut [f32], out_row: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    if out.len() < 2 * PARALLEL_MIN || x_row == 0 || out_row == 0 {
        return f(x, out);
    }
    let rows = (PARALLEL_MIN / out_row).max(1);
    x.par_chunks(rows * x_row)
        .zip(out.par_chunks_mut(rows * out_row))
        .for_each(|(x, out)| f(x, out));
}

/// `out = x / sqrt(mean(x²) + eps) * weight`, row by row (`x` is `rows × weight.len()`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    debug_assert_eq!(x.len(), out.len());
    by_rows(x, dim, out, dim, |x, out| {
        by_norm_groups(x, dim, out, |row, sum, dst| {
            let inv = 1.0 / (sum / dim as f32 + eps).sqrt();
            for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
                *d = w * (v * inv);
            }
        });
    });
}

/// [`rms_norm`] of one row.
pub fn rms_norm_row(row: &[f32], weight: &[f32], eps: f32, dst: &mut [f32]) {
    let sum = sum_of_squares(row);
    let inv = 1.0 / (sum / row.len() as f32 + eps).sqrt();
    for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
        *d = w * (v * inv);
    }
}

/// `Σ v²` of a row as an RMSNorm defines it: one chain of additions in order from
/// zero, each square rounded before it is added (no fused multiply-add).
fn sum_of_squares(row: &[f32]) -> f32 {
    row.iter().fold(0.0, |sum, v| sum + v * v)
}

/// Rows of a norm whose sums of squares run side by side (see [`by_norm_groups`]).
const NORM_ROWS: usize = 8;

/// Calls `f(row, Σ row², dst)` for every row of `x` (`dim` values each) and the
/// matching row of `out`, each sum [`sum_of_squares`]'s chain. One row's chain waits
/// on itself at every addition; [`NORM_ROWS`] rows' chains are interleaved here, so the
/// processor overlaps them, and every row keeps its own order, so its bits (nearly
/// twice as fast as the rows one after another: BENCHMARKS.md, "Figures that were in code comments").
#[inline(always)]
fn by_norm_groups(x: &[f32], dim: usize, out: &mut [f32], mut f: impl FnMut(&[f32], f32, &mut [f32])) {
    let group = NORM_ROWS * dim;
    let mut groups = x.chunks_exact(group);
    let mut outs = out.chunks_exact_mut(group);
    for (x, out) in groups.by_ref().zip(outs.by_ref()) {
        let rows: [&[f32]; NORM_ROWS] = std::array::from_fn(|r| &x[r * dim..][..dim]);
        let mut sums = [0.0f32; NORM_ROWS];
        for i in 0..dim {
            for (sum, row) in sums.iter_mut().zip(&rows) {
                *sum += row[i] * row[i];
            }
        }
        for ((row, sum), dst) in rows.iter().zip(sums).zip(out.chunks_exact_mut(dim)) {
            f(row, sum, dst);
        }
    }
    let (x, out) = (groups.remainder(), outs.into_remainder());
    for (row, dst) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        f(row, sum_of_squares(row), dst);
    }
}

/// RMSNorm applied in place to every `head_dim`-sized head of `x` (Qwen3's q/k norms).
pub fn rms_norm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for head in x.chunks_exact_mut(dim) {
        let sum = sum_of_squares(head);
        let inv = 1.0 / (sum / dim as f32 + eps).sqrt();
        for (v, &w) in head.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    by_rows(y, PARALLEL_MIN, x, PARALLEL_MIN, |y, x| {
        for (a, &b) in x.iter_mut().zip(y) {
            *a += b;
        }
    });
}

/// The gated activation of a Llama MLP: `gate_up` rows are `[gate (n), up (n)]`;
/// `out = silu(gate) * up`, `rows × n`.
pub fn silu_mul(gate_up: &[f32], n: usize, out: &mut [f32]) {
    by_rows(gate_up, 2 * n, out, n, |gate_up, out| {
        silu_mul_rows(gate_up, n, out, false)
    });
}

/// [`silu_mul`] (or [`silu_mul_bf16`], with `bf16`) on the calling thread.
// Multiversioned: the default x86-64 build vectorizes these loops (and `exp`) four lanes
// wide; there is no reduction in them and the bf16 rounding is integer arithmetic, so
// every version gives the same bits.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn silu_mul_rows(gate_up: &[f32], n: usize, out: &mut [f32], bf16: bool) {
    use crate::formats::bf16::round_bf16 as r;
    for (row, dst) in gate_up.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
        let (gate, up) = row.split_at(n);
        let values = dst.iter_mut().zip(gate).zip(up);
        if bf16 {
            for ((d, &g), &u) in values {
                *d = r(r(g / (1.0 + exp(-g))) * u);
            }
        } else {
            for ((d, &g), &u) in values {
                *d = g / (1.0 + exp(-g)) * u;
            }
        }
    }
}

/// Rotary position embedding tables: `cos` and `sin` of `position × inv_freq[i]` for
/// every position below `positions`, `half = inv_freq.len()` values per position.
#[derive(Debug, Clone)]
pub struct Rotary {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rotary {
    /// Tables for `positions` positions. `attention_factor` scales cos and sin (YaRN's
    /// `mscale`; 1.0 otherwise).
    pub fn new(inv_freq: &[f32], positions: usize, attention_factor: f32) -> Rotary {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in inv_freq {
                // transformers multiplies in f32 (`inv_freq @ position_ids.float()`).
                let angle = p as f32 * f;
                cos.push(angle.cos() * attention_factor);
                sin.push(angle.sin() * attention_factor);
            }
        }
        Rotary { half, cos, sin }
    }

    /// How many positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates every head of `x` (`heads × 2·half` values) for `position`, in place:
    /// `x·cos + rotate_half(x)·sin`.
    pub fn apply(&self, x: &mut [f32], position: usize) {
        let half = self.half;
        let cos = &self.cos[position * half..(position + 1) * half];
        let sin = &self.sin[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

impl Rotary {
    /// [`Rotary::apply`] as a bf16 model computes it in transformers: cos and sin
    /// rounded to bf16 (`cos.to(dtype)`), and every product and sum of
    /// `q * cos + rotate_half(q) * sin` rounded to bf16. For calibration, which must see
    /// the activations the reference tools see.
    pub fn apply_bf16(&self, x: &mut [f32], position: usize) {
        use crate::formats::bf16::round_bf16 as r;
        let half = self.half;
        let cos = &self.cos[position * half..(position + 1) * half];
        let sin = &self.sin[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                let (c, s) = (r(cos[i]), r(sin[i]));
                a[i] = r(r(x1 * c) - r(x2 * s));
                b[i] = r(r(x2 * c) + r(x1 * s));
            }
        }
    }
}

/// [`rms_norm`] as transformers' `LlamaRMSNorm` computes it for a bf16 model: the
/// variance in f32, `x * rsqrt(var + eps)` rounded to bf16, then times the weight,
/// rounded again. For calibration.
pub fn rms_norm_bf16(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    use crate::formats::bf16::round_bf16 as r;
    let dim = weight.len();
    by_rows(x, dim, out, dim, |x, out| {
        by_norm_groups(x, dim, out, |row, sum, dst| {
            let inv = 1.0 / (sum / dim as f32 + eps).sqrt();
            for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
                *d = r(w * r(v * inv));
            }
        });
    });
}

/// [`silu_mul`] as a bf16 model computes it: `silu(gate)` rounded to bf16, then the
/// product with `up`, rounded. For calibration.
pub fn silu_mul_bf16(gate_up: &[f32], n: usize, out: &mut [f32]) {
    by_rows(gate_up, 2 * n, out, n, |gate_up, out| {
        silu_mul_rows(gate_up, n, out, true)
    });
}

/// Rounds every value to bf16 (to the nearest, ties to even).
pub fn round_bf16_all(x: &mut [f32]) {
    for v in x {
        *v = crate::formats::bf16::round_bf16(*v);
    }
}

/// Causal attention as transformers' eager implementation computes it for a bf16
/// model, which is what llm-compressor's calibration runs: `q @ k^T` rounded to bf16,
/// times the scale, softmax in f32 rounded to bf16, `p @ v` rounded to bf16 (each
/// product accumulating in f32). Calibration only: rows in parallel, plain loops. It
/// lives here, built optimized, rather than in the engine's crate (opt-level 1): with
/// the eight-key sums of `dots_in_order` and the vectorized bf16 SiLU, calibrating
/// 16 samples of 256 tokens went from 9.9–11.6 to 8.0–9.0 s on a 2-core Xeon.
pub fn attention_eager_bf16(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    use crate::formats::bf16::round_bf16 as r;
    let hd = shape.head_dim;
    let group = heads / shape.kv_heads.max(1);
    let scale = r(1.0 / (hd as f32).sqrt());
    let row_len = heads * hd;
    // Each row's span, and each span's slot offsets by position.
    let mut owner = vec![0usize; out.len() / row_len.max(1)];
    let slots: Vec<Vec<usize>> = spans
        .iter()
        .enumerate()
        .map(|(si, span)| {
            for i in 0..span.len {
                owner[span.row + i] = si;
            }
            (0..span.start + span.len)
                .map(|j| shape.slot_offset(span.blocks, j))
                .collect()
        })
        .collect();
    // Where each position's key starts (KV head 0; head `h` is `h · head_dim ·
    // block_size` further on, its values `block_size` apart).
    let key_starts: Vec<Vec<usize>> = spans
        .iter()
        .map(|span| {
            (0..span.start + span.len)
                .map(|j| shape.key_offset(span.blocks, j, 0))
                .collect()
        })
        .collect();
    out.par_chunks_mut(row_len)
        .enumerate()
        .for_each(|(row, out_row)| {
            let span = &spans[owner[row]];
            let position = span.start + row - span.row;
            let slots = &slots[owner[row]][..=position];
            let key_starts = &key_starts[owner[row]][..=position];
            let mut scores = Vec::with_capacity(slots.len());
            for h in 0..heads {
                let qh = &q[(row * heads + h) * hd..(row * heads + h + 1) * hd];
                let kvh = (h / group) * hd;
                scores.clear();
                let keys = Keys {
                    cache: k_cache,
                    starts: key_starts,
                    offset: kvh * shape.block_size,
                    stride: shape.block_size,
                };
                dots_in_order(qh, &keys, &mut scores);
                for v in scores.iter_mut() {
                    *v = r(r(*v) * scale);
                }
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                for v in scores.iter_mut() {
                    *v = exp(*v - max);
                }
                let sum: f32 = scores.iter().sum();
                let o = &mut out_row[h * hd..(h + 1) * hd];
                o.fill(0.0);
                for (&e, &at) in scores.iter().zip(slots) {
                    let p = r(e / sum);
                    for (d, &v) in o.iter_mut().zip(&v_cache[at + kvh..at + kvh + hd]) {
                        *d += p * v;
                    }
                }
                round_bf16_all(o);
            }
        });
}

/// Keys in a transposed cache: key `i`'s value `d` is `cache[starts[i] + offset + d ·
/// stride]`.
struct Keys<'a> {
    cache: &'a [f32],
    starts: &'a [usize],
    offset: usize,
    stride: usize,
}

/// `q · key` summed in order, for each of `keys`, appended to `out`. Eight keys at a
/// time: eight independent chains of additions, each key's still in order (one key at a
/// time waited on every addition: calibration took a quarter longer).
fn dots_in_order(q: &[f32], keys: &Keys, out: &mut Vec<f32>) {
    let Keys {
        cache,
        starts,
        offset,
        stride,
    } = *keys;
    let mut groups = starts.chunks_exact(8);
    for group in &mut groups {
        let at: [usize; 8] = std::array::from_fn(|j| group[j] + offset);
        // `Iterator::sum` starts from -0.0: so does each chain, for the same bits.
        let mut acc = [-0.0f32; 8];
        for (d, &x) in q.iter().enumerate() {
            for (a, &at) in acc.iter_mut().zip(&at) {
                *a += x * cache[at + d * stride];
            }
        }
        out.extend(acc);
    }
    for &at in groups.remainder() {
        out.push(dot_in_order(
            q,
            (0..q.len()).map(|d| cache[at + offset + d * stride]),
        ));
    }
}

/// A dot product summed in order. (Eight interleaved sums vectorize and run faster,
/// but move more of SmolLM2's scales away from llm-compressor's: 135 of 210 equal
/// instead of 150. PyTorch's order is oneDNN's and unknown; in order is closer.)
fn dot_in_order(a: &[f32], b: impl Iterator<Item = f32>) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The shape of one layer's paged KV cache: `blocks × block_size × kv_heads × head_dim`
/// values each for keys and values.
///
/// Values are stored slot by slot (`[block][slot][kv_head][d]`: a token's values are
/// `slot_len` consecutive floats at [`KvShape::slot_offset`]). Keys are stored
/// transposed within each block (`[block][kv_head][d][slot]`): value `d` of one head's
/// keys of a block's slots is one run of `block_size` floats, so that one vector
/// instruction multiplies a query value into sixteen keys' scores at once, each score
/// one chain in order over `d` (the score's definition: `scores`). Both caches have the
/// same size, and a block's keys and values start at the same offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Token slots per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl KvShape {
    /// Values in one token slot (all KV heads).
    pub fn slot_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Offset of `position`'s slot in the value cache, given the sequence's block table.
    pub fn slot_offset(&self, blocks: &[u32], position: usize) -> usize {
        let block = blocks[position / self.block_size] as usize;
        (block * self.block_size + position % self.block_size) * self.slot_len()
    }

    /// Offset in the key cache of value 0 of KV head `kv_head`'s key at `position`; its
    /// value `d` is `d · block_size` further on.
    pub fn key_offset(&self, blocks: &[u32], position: usize, kv_head: usize) -> usize {
        let block = blocks[position / self.block_size] as usize;
        block * self.block_size * self.slot_len()
            + kv_head * self.head_dim * self.block_size
            + position % self.block_size
    }

    /// Stores the keys and values of `position` (`k`, `v`: `slot_len` values each, KV
    /// head after KV head) in the caches.
    pub fn store(
        &self,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
    ) {
        self.store_as(k_cache, v_cache, blocks, position, k, v, |x| x);
    }

    /// [`KvShape::store`] into caches held in bf16: each value rounded to the nearest
    /// bf16 (ties to even), as PyTorch's `.to(torch.bfloat16)` rounds what vLLM writes
    /// into a bf16 cache. Same layout, half the bytes.
    pub fn store_bf16(
        &self,
        k_cache: &mut [u16],
        v_cache: &mut [u16],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
    ) {
        let bits = |x: f32| (crate::formats::bf16::round_bf16(x).to_bits() >> 16) as u16;
        self.store_as(k_cache, v_cache, blocks, position, k, v, bits);
    }

    /// [`KvShape::store`] of the values as `held` turns them into the cache's type.
    #[allow(clippy::too_many_arguments)]
    fn store_as<T>(
        &self,
        k_cache: &mut [T],
        v_cache: &mut [T],
        blocks: &[u32],
        position: usize,
        k: &[f32],
        v: &[f32],
        held: impl Fn(f32) -> T,
    ) {
        let at = self.slot_offset(blocks, position);
        for (dst, &x) in v_cache[at..at + self.slot_len()].iter_mut().zip(v) {
            *dst = held(x);
        }
        for (h, key) in k.chunks_exact(self.head_dim).enumerate() {
            let start = self.key_offset(blocks, position, h);
            for (d, &x) in key.iter().enumerate() {
                k_cache[start + d * self.block_size] = held(x);
            }
        }
    }
}

/// The tokens of one sequence in a batch: consecutive rows of the query matrix at
/// consecutive positions (a prompt chunk, a decode token, or a token and its drafts).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// Position of the first token (it attends to positions `0..=start`).
    pub start: usize,
    /// Tokens in the span.
    pub len: usize,
    /// Row of the first token in `q` and `out`.
    pub row: usize,
}

/// Query tokens per attention tile: with their group of query heads (`heads /
/// kv_heads`) they share every key and value block read.
const QUERY_TILE: usize = 16;

/// Causal attention of every span's tokens against a paged cache.
///
/// `q` is `tokens × heads × head_dim`; `out` has the same shape. Heads share KV heads in
/// groups (`heads / kv_heads`, grouped-query attention). Scores are scaled by
/// `1/sqrt(head_dim)` and soft-maxed in f32.
///
/// The work is tiled as flash attention is: up to 16 tokens of a span with all query
/// heads of one KV head form a tile, whose rows share every cached block of keys and
/// values it reads, with the softmax computed online (running maximum and sum,
/// rescaled block by block). Each row's arithmetic is the same whatever tile it is in:
/// blocks in position order, the same dot products and updates. So a token gets the
/// same bits alone (decode), in a prompt chunk, or among draft tokens being verified.
/// With blocks of 16 slots and heads of 64 or 128 values, a tile of several tokens goes
/// sixteen rows at a time (eight with AVX2) as the lanes of the registers
/// (`scores::lanes`), and with AVX-512 a tile of one token has its query heads side by
/// side through all their blocks with their state in registers (`scores::rows`), all
/// with the same bits; elsewhere a tile goes block by block, its rows' scores side by
/// side, then row by row.
pub fn attention(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    let cache = Cache::F32 {
        k: k_cache,
        v: v_cache,
    };
    attention_with(q, spans, heads, shape, cache, out, Kernels::Fastest);
}

/// [`attention`] over caches held in bf16 ([`KvShape::store_bf16`]). Each tile widens
/// the blocks it reads, for its KV head, into f32 (exactly: a bf16 is the top half of an
/// f32) and runs [`attention`]'s kernels on them, so the results are bit for bit those of
/// [`attention`] over an f32 cache holding the same rounded values, while the cache
/// itself, which a batch of decodes streams from memory once per layer, takes half the
/// bytes.
pub fn attention_bf16_cache(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    k_cache: &[u16],
    v_cache: &[u16],
    out: &mut [f32],
) {
    let cache = Cache::Bf16 {
        k: k_cache,
        v: v_cache,
    };
    attention_with(q, spans, heads, shape, cache, out, Kernels::Fastest);
}

/// A layer's keys and values as the cache holds them.
#[derive(Debug, Clone, Copy)]
enum Cache<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    Bf16 { k: &'a [u16], v: &'a [u16] },
}

/// A tile of one token over a bf16 cache by the AVX-512 decode kernel, which widens the
/// keys and values as it loads them: a decode step's attention streams every sequence's
/// cache once, and reading it in bf16 is what halves its bytes (widened into a buffer
/// first, a step of sixteen 900-token sequences saved nothing). The same operations as
/// `attend_tile`'s for such a tile, so the same bits. False, doing nothing, where that
/// kernel does not run (several tokens, no AVX-512, another head or block size).
fn decode_bf16(
    q: &[f32],
    tile: &Tile,
    heads: usize,
    shape: KvShape,
    k: &[u16],
    v: &[u16],
    o: &mut [f32],
) -> bool {
    let (hd, bs) = (shape.head_dim, shape.block_size);
    if tile.count != 1 || bs != 16 {
        return false;
    }
    let group = heads / shape.kv_heads;
    let head = scores::Head {
        keys: k,
        values: v,
        blocks: tile.span.blocks,
        key_offset: tile.kv_head * hd * bs,
        offset: tile.kv_head * hd,
        slot: shape.slot_len(),
    };
    let token = tile.span.row + tile.first;
    let at = (token * heads + tile.kv_head * group + tile.heads.start) * hd;
    let qs: Vec<&[f32]> = q[at..at + tile.heads.len() * hd].chunks_exact(hd).collect();
    let mut outs: Vec<&mut [f32]> = o.chunks_exact_mut(hd).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    scores::rows(&qs, &head, tile.span.start + tile.first, scale, &mut outs)
}

/// A tile's blocks widened from a bf16 cache ([`Widened::fill`]), kept per thread so
/// that its memory is reused from tile to tile (fresh for every tile, the buffers of a
/// long sequence went back to the OS and faulted in again each time).
#[derive(Default)]
struct Widened {
    table: Vec<u32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

thread_local! {
    static WIDENED: std::cell::RefCell<Widened> = std::cell::RefCell::default();
}

impl Widened {
    /// The blocks `tile` reads from a bf16 cache, for its KV head, widened to f32 and
    /// laid out as a cache of one KV head whose blocks are numbered from 0 in the span's
    /// order: the block table for it, its keys and its values.
    fn fill(&mut self, tile: &Tile, shape: KvShape, k: &[u16], v: &[u16]) {
        let (hd, bs, slot) = (shape.head_dim, shape.block_size, shape.slot_len());
        let widen = |src: &[u16], dst: &mut Vec<f32>| {
            dst.extend(src.iter().map(|&b| crate::formats::bf16::bf16_to_f32(b)))
        };
        let last = tile.span.start + tile.first + tile.count - 1;
        let used = tile.span.blocks.len().min(last / bs + 1);
        self.keys.clear();
        self.values.clear();
        for &block in &tile.span.blocks[..used] {
            let start = block as usize * bs * slot;
            let key_start = start + tile.kv_head * hd * bs;
            widen(&k[key_start..key_start + hd * bs], &mut self.keys);
            for j in 0..bs {
                let at = start + j * slot + tile.kv_head * hd;
                widen(&v[at..at + hd], &mut self.values);
            }
        }
        self.table.clear();
        self.table.extend(0..used as u32);
    }
}

/// Which kernels [`attention_with`]'s tiles may take: tests force the narrower ones to
/// compare their bits with the fastest's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    /// The fastest this CPU has.
    Fastest,
    /// AVX2's lane kernel where AVX-512's would run, the tile loop for tiles of one
    /// token.
    Avx2,
    /// The tile loop alone.
    TileLoop,
}

/// [`attention`] with the tiles' kernels chosen by `kernels`.
#[allow(clippy::too_many_arguments)]
fn attention_with(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    cache: Cache,
    out: &mut [f32],
    kernels: Kernels,
) {
    assert!(
        shape.block_size <= 64,
        "attention tiles hold at most 64 keys per block"
    );
    let hd = shape.head_dim;
    let group = heads / shape.kv_heads;
    let mut tiles = Vec::new();
    for span in spans {
        for kv_head in 0..shape.kv_heads {
            for first in (0..span.len).step_by(QUERY_TILE) {
                let count = QUERY_TILE.min(span.len - first);
                tiles.push(Tile {
                    span: *span,
                    kv_head,
                    first,
                    count,
                    heads: 0..group,
                });
            }
        }
    }
    // Few tiles (a decode step of a few sequences: one per KV head; a speculative step
    // verifying a few tokens) would leave threads idle: then each token is a tile of its
    // own, its query heads still side by side (five tokens as one tile per head took a
    // fifth of a verification step), and if that is still too few, each query head. A
    // row's arithmetic does not depend on its tile, so neither do its bits.
    let enough = 4 * rayon::current_num_threads();
    if tiles.len() < enough {
        tiles = tiles
            .into_iter()
            .flat_map(|t| {
                (t.first..t.first + t.count).map(move |first| Tile {
                    first,
                    count: 1,
                    ..t.clone()
                })
            })
            .collect();
    }
    if tiles.len() < enough && group > 1 {
        tiles = tiles
            .into_iter()
            .flat_map(|t| {
                t.heads.clone().map(move |h| Tile {
                    heads: h..h + 1,
                    ..t.clone()
                })
            })
            .collect();
    }
    let results: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|tile| {
            let mut o = vec![0.0f32; tile.count * tile.heads.len() * hd];
            match cache {
                Cache::F32 { k, v } => {
                    let layout = Layout {
                        shape,
                        kv_head: tile.kv_head,
                    };
                    attend_tile(q, tile, heads, shape, layout, k, v, &mut o, kernels);
                }
                Cache::Bf16 { k, v }
                    if kernels == Kernels::Fastest && decode_bf16(q, tile, heads, shape, k, v, &mut o) => {}
                Cache::Bf16 { k, v } => WIDENED.with_borrow_mut(|widened| {
                    widened.fill(tile, shape, k, v);
                    let local = Tile {
                        span: Span {
                            blocks: &widened.table,
                            ..tile.span
                        },
                        ..tile.clone()
                    };
                    let layout = Layout {
                        shape: KvShape { kv_heads: 1, ..shape },
                        kv_head: 0,
                    };
                    let (keys, values) = (&widened.keys, &widened.values);
                    attend_tile(q, &local, heads, shape, layout, keys, values, &mut o, kernels);
                }),
            }
            o
        })
        .collect();
    for (tile, o) in tiles.iter().zip(&results) {
        let width = tile.heads.len() * hd;
        for (t, rows) in o.chunks_exact(width).enumerate() {
            let token = tile.span.row + tile.first + t;
            let at = (token * heads + tile.kv_head * group + tile.heads.start) * hd;
            out[at..at + width].copy_from_slice(rows);
        }
    }
}

/// A unit of attention work: tokens `first..first + count` of `span`, with the query
/// heads `heads` (numbered within the group) of KV head `kv_head`.
#[derive(Debug, Clone)]
struct Tile<'a> {
    span: Span<'a>,
    kv_head: usize,
    first: usize,
    count: usize,
    heads: std::ops::Range<usize>,
}

/// Where a tile's keys and values are in the cache it reads: the cache's shape and the
/// tile's KV head in it (the model's, or one widened for the tile alone).
#[derive(Debug, Clone, Copy)]
struct Layout {
    shape: KvShape,
    kv_head: usize,
}

/// One tile into `o` (`[token][head of the tile][head_dim]`): its queries are laid out by
/// `shape` and `tile.kv_head`, its keys and values by `layout`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
#[allow(clippy::too_many_arguments)]
fn attend_tile(
    q: &[f32],
    tile: &Tile,
    heads: usize,
    shape: KvShape,
    layout: Layout,
    k: &[f32],
    v: &[f32],
    o: &mut [f32],
    kernels: Kernels,
) {
    // The vector kernels below are x86's (`scores`); asking another architecture's
    // target for x86's `fma` panics in `target-features`, so elsewhere the tile loop runs.
    // On aarch64 it runs in fused multiply-adds, which every ARMv8-A CPU has (`fmla`,
    // what `mul_add` compiles to there): the bits of x86's FMA kernels.
    #[cfg(target_arch = "x86_64")]
    let fma = multiversion::target::selected_target!().supports_feature_str("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let fma = cfg!(target_arch = "aarch64");
    let (hd, bs, slot) = (shape.head_dim, shape.block_size, layout.shape.slot_len());
    let group = heads / shape.kv_heads;
    let (span, first, count, kv_head) = (tile.span, tile.first, tile.count, tile.kv_head);
    let tile_heads = tile.heads.len();
    let rows = count * tile_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // This head's keys in a block (transposed: `hd` runs of `bs`), and its values in a
    // block's first slot, from the block's start.
    let offsets = (layout.kv_head * hd * bs, layout.kv_head * hd);
    let head = scores::Head {
        keys: k,
        values: v,
        blocks: span.blocks,
        key_offset: offsets.0,
        offset: offsets.1,
        slot,
    };
    let q_rows = |t: usize| {
        let at = ((span.row + first + t) * heads + kv_head * group + tile.heads.start) * hd;
        q[at..at + tile_heads * hd].chunks_exact(hd)
    };
    // Blocks of sixteen keys: several tokens go sixteen rows at a time (eight with
    // AVX2), as the lanes of the registers (`scores::lanes`); on AVX-512 one token's
    // query heads go side by side with their state in registers from their first block
    // to their last (`scores::rows`).
    if kernels != Kernels::TileLoop && fma && bs == 16 && count > 1 {
        let qs: Vec<&[f32]> = (0..count).flat_map(q_rows).collect();
        let positions: Vec<usize> = (0..count)
            .flat_map(|t| std::iter::repeat_n(span.start + first + t, tile_heads))
            .collect();
        let lanes = if kernels == Kernels::Avx2 {
            scores::Lanes::Avx2
        } else {
            scores::Lanes::Widest
        };
        if scores::lanes(&qs, &positions, tile_heads, &head, scale, o, lanes) {
            return;
        }
    }
    if kernels == Kernels::Fastest && fma && bs == 16 {
        let (mut done, mut rest) = (true, &mut o[..]);
        for t in 0..count {
            let position = span.start + first + t;
            let qs: Vec<&[f32]> = q_rows(t).collect();
            let (row_out, after) = rest.split_at_mut(tile_heads * hd);
            let mut outs: Vec<&mut [f32]> = row_out.chunks_exact_mut(hd).collect();
            done = scores::rows(&qs, &head, position, scale, &mut outs);
            if !done {
                break;
            }
            rest = after;
        }
        if done {
            return;
        }
    }
    let qs: Vec<&[f32]> = (0..count).flat_map(q_rows).collect();
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0.0f32; rows];
    let mut scores = vec![[0.0f32; 64]; rows];
    // The last position any row of the tile attends to.
    let last = span.start + first + count - 1;
    let used = span.blocks.len().min(last / bs + 1);
    // Blocks of sixteen: every score the tile needs first, block by block, four (row,
    // block) pairs side by side (`scores::pairs16`).
    let mut all = Vec::new();
    if bs == 16 {
        let mut pairs = Vec::with_capacity(used * rows);
        for (b, &block) in span.blocks[..used].iter().enumerate() {
            let start = block as usize * bs * slot + offsets.0;
            for (r, q) in qs.iter().enumerate() {
                if b * bs <= span.start + first + r / tile_heads {
                    pairs.push((*q, &k[start..start + hd * bs]));
                }
            }
        }
        all = vec![[0.0f32; 16]; pairs.len()];
        scores::pairs16(&pairs, scale, &mut all, fma);
    }
    let mut next = 0;
    for (b, &block) in span.blocks[..used].iter().enumerate() {
        let start = block as usize * bs * slot;
        if bs != 16 {
            // Every row's scores of this block's keys, as far as the last row sees.
            let width = bs.min(last + 1 - b * bs);
            scores::block_rows(&qs, &k[start + offsets.0..], bs, width, scale, &mut scores, fma);
        }
        for r in 0..rows {
            let position = span.start + first + r / tile_heads;
            // Keys of this block the row sees (causal).
            if b * bs > position {
                continue;
            }
            let seen = bs.min(position + 1 - b * bs);
            if bs == 16 {
                scores[r][..16].copy_from_slice(&all[next]);
                next += 1;
            }
            let row_scores = &mut scores[r];
            let block_max = row_scores[..seen]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let new_max = max[r].max(block_max);
            // `exp(0)` is exactly 1: most blocks past the first leave the maximum where
            // it was, and skip the call.
            let correction = if new_max == max[r] {
                1.0
            } else {
                exp(max[r] - new_max)
            };
            let or = &mut o[r * hd..(r + 1) * hd];
            if correction != 1.0 {
                for x in or.iter_mut() {
                    *x *= correction;
                }
            }
            // Sixteen at a time (one vector); the lanes past `seen` are never read.
            for chunk in row_scores[..seen.next_multiple_of(16)].as_chunks_mut::<16>().0 {
                for score in chunk {
                    *score = exp(*score - new_max);
                }
            }
            let total = sum[r] * correction + scores::sum(&row_scores[..seen]);
            let (p, values) = (&row_scores[..seen], &v[start + offsets.1..]);
            match (hd, fma) {
                (64, true) => weigh_values::<64, true>(or, p, values, slot),
                (64, false) => weigh_values::<64, false>(or, p, values, slot),
                (128, true) => weigh_values::<128, true>(or, p, values, slot),
                (128, false) => weigh_values::<128, false>(or, p, values, slot),
                _ => weigh_values_any(or, p, values, slot, fma),
            }
            sum[r] = total;
            max[r] = new_max;
        }
    }
    for (r, or) in o.chunks_exact_mut(hd).enumerate() {
        let inv = 1.0 / sum[r];
        for x in or {
            *x *= inv;
        }
    }
}

/// The constants of [`exp`], which its vector forms (`scores::x86::exp512`, `exp256`)
/// use too: they must give its bits.
pub(crate) mod exp_consts {
    /// Below this the result is 0 (where f32 goes subnormal).
    pub const LOW: f32 = -87.3;
    /// Above this the result is infinite.
    pub const HIGH: f32 = 88.3;
    /// 1.5 · 2^23: adding and subtracting it rounds to the nearest integer.
    pub const ROUND: f32 = 12_582_912.0;
    /// `ln 2` in two parts (Cody–Waite).
    pub const LN2_HI: f32 = 0.693_359_4;
    /// The rest of `ln 2`.
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// Cephes's polynomial for `e^r`, highest degree first (Horner's order).
    pub const POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}

/// `e^x` in f32, within two units in the last place of the exact value, written so that
/// loops over it vectorize: glibc's `expf` is a call per value, and a softmax over a
/// block of keys or a SiLU over a row spent more time in those calls than in the dot
/// products around them. No crate offers a vectorizable f32 `exp` on stable Rust, so
/// it is ours: Cody–Waite reduction `x = n·ln 2 + r` (`|r| ≤ ln 2 / 2`, `ln 2` in two
/// parts), Cephes's degree-7 polynomial for `e^r`, and `2^n` built in the exponent
/// bits. Plain multiplies and adds (no fused ones), so every instruction set gives the
/// same bits. Below −87.3 the result is 0 (where f32 goes subnormal), above 88.3 it is
/// infinite; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    use exp_consts::*;
    let clamped = x.clamp(LOW, HIGH);
    // `t`'s low mantissa bits hold the integer `n` (offset by ROUND's own bits).
    let t = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p * r + c;
    }
    let e = p * (r * r) + r + 1.0;
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    // Selects, not branches, so that loops over it vectorize.
    let y = e * scale;
    let y = if x < LOW { 0.0 } else { y };
    let y = if x > HIGH { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// `o += Σ_j p[j] · v_j` over a block's keys, `v_j` the `HD` values at `v[j * slot..]`:
/// the output row stays in registers across the block (written through memory, each
/// key waited on the previous key's store). Each lane's arithmetic is the same as
/// [`weigh_values_any`]'s.
#[inline(always)]
fn weigh_values<const HD: usize, const FMA: bool>(o: &mut [f32], p: &[f32], v: &[f32], slot: usize) {
    let mut acc = [0.0f32; HD];
    acc.copy_from_slice(&o[..HD]);
    for (j, &pj) in p.iter().enumerate() {
        let value = &v[j * slot..][..HD];
        for (a, &x) in acc.iter_mut().zip(value) {
            *a = if FMA { pj.mul_add(x, *a) } else { *a + pj * x };
        }
    }
    o[..HD].copy_from_slice(&acc);
}

/// [`weigh_values`] for any head size.
#[inline(always)]
fn weigh_values_any(o: &mut [f32], p: &[f32], v: &[f32], slot: usize, fma: bool) {
    let hd = o.len();
    for (j, &pj) in p.iter().enumerate() {
        let value = &v[j * slot..][..hd];
        for (a, &x) in o.iter_mut().zip(value) {
            *a = if fma { pj.mul_add(x, *a) } else { *a + pj * x };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eager bf16 attention's scores, eight keys at a time, are each key's dot
    /// product in order, bit for bit (signed zeros included).
    #[test]
    fn dots_eight_at_a_time_equal_dots_in_order() {
        // Three blocks of 16 slots of three KV heads of 64 values; KV head 1's keys.
        let shape = KvShape {
            block_size: 16,
            kv_heads: 3,
            head_dim: 64,
        };
        let hd = shape.head_dim;
        let value = |i: usize| ((i * 7919 % 2003) as f32 - 1001.0) * 1e-3;
        let q: Vec<f32> = (0..hd).map(|d| value(d + 3)).collect();
        let mut cache: Vec<f32> = (0..3 * 16 * shape.slot_len()).map(value).collect();
        // Positions in a paged table whose blocks are out of order.
        let table = [2u32, 0, 1];
        let all: Vec<usize> = (0..48).map(|p| shape.key_offset(&table, p, 0)).collect();
        // A key of zeros times a query: -0.0 sums, whose sign depends on the start.
        let negative: Vec<f32> = q.iter().map(|&x| -x.abs()).collect();
        let zero = shape.key_offset(&table, 5, 1);
        for d in 0..hd {
            cache[zero + d * 16] = 0.0;
        }
        for len in [0, 1, 7, 8, 9, 16, 23, 40] {
            let starts: Vec<usize> = (0..len).map(|j| all[j * 17 % 40]).collect();
            let keys = Keys {
                cache: &cache,
                starts: &starts,
                offset: hd * 16,
                stride: 16,
            };
            for query in [&q, &negative] {
                let mut got = Vec::new();
                dots_in_order(query, &keys, &mut got);
                let want: Vec<f32> = starts
                    .iter()
                    .map(|&at| dot_in_order(query, (0..hd).map(|d| cache[at + hd * 16 + d * 16])))
                    .collect();
                assert_same_bits(&got, &want, &format!("{len} keys"));
            }
        }
    }

    /// A prompt chunk's norms, residual additions and activations run in tasks on the
    /// pool: every row must come out as the one-thread loop makes it, the last, partial
    /// task's rows included.
    #[test]
    fn element_wise_passes_over_many_rows_equal_the_row_by_row_loop() {
        let (rows, dim, n) = (301, 576, 1536);
        let value = |i: usize| ((i * 7919 % 2003) as f32 - 1001.0) * 3e-3;
        let x: Vec<f32> = (0..rows * dim).map(value).collect();
        let weight: Vec<f32> = (0..dim).map(|i| 0.5 + value(i + 17)).collect();
        assert!(x.len() >= 2 * PARALLEL_MIN, "too few values to reach the pool");

        let mut norm = vec![f32::NAN; x.len()];
        rms_norm(&x, &weight, 1e-5, &mut norm);
        let mut norm16 = vec![f32::NAN; x.len()];
        rms_norm_bf16(&x, &weight, 1e-5, &mut norm16);
        for (r, row) in x.chunks_exact(dim).enumerate() {
            let mut want = vec![0.0; dim];
            rms_norm_row(row, &weight, 1e-5, &mut want);
            assert_same_bits(&norm[r * dim..(r + 1) * dim], &want, &format!("rms_norm row {r}"));
            let mut want16 = vec![0.0; dim];
            rms_norm_bf16(row, &weight, 1e-5, &mut want16);
            assert_same_bits(
                &norm16[r * dim..(r + 1) * dim],
                &want16,
                &format!("rms_norm_bf16 row {r}"),
            );
        }

        let gate_up: Vec<f32> = (0..rows * 2 * n).map(value).collect();
        let mut act = vec![f32::NAN; rows * n];
        silu_mul(&gate_up, n, &mut act);
        let mut act16 = vec![f32::NAN; rows * n];
        silu_mul_bf16(&gate_up, n, &mut act16);
        for (r, row) in gate_up.chunks_exact(2 * n).enumerate() {
            let mut want = vec![0.0; n];
            silu_mul_rows(row, n, &mut want, false);
            assert_same_bits(&act[r * n..(r + 1) * n], &want, &format!("silu_mul row {r}"));
            let mut want16 = vec![0.0; n];
            silu_mul_bf16(row, n, &mut want16);
            assert_same_bits(
                &act16[r * n..(r + 1) * n],
                &want16,
                &format!("silu_mul_bf16 row {r}"),
            );
        }

        let mut sum = x.clone();
        add_assign(&mut sum, &norm);
        let want: Vec<f32> = x.iter().zip(&norm).map(|(a, b)| a + b).collect();
        assert_same_bits(&sum, &want, "add_assign");
    }

    /// `got` and `want` hold the same values, bit for bit (NaNs and signed zeros too).
    fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got), bits(want), "{what}");
    }

    #[test]
    fn exp_is_within_two_ulps_everywhere_it_is_finite() {
        let mut worst = 0.0f64;
        let mut x = -87.3f32;
        while x <= 88.3 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.000_37;
        }
        assert!(worst <= 2.0, "{worst} ulps");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    /// Attention over a contiguous (unpaged) history, written the plain way.
    fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>]) -> Vec<f32> {
        let scale = 1.0 / (q.len() as f32).sqrt();
        let scores: Vec<f32> = keys
            .iter()
            .map(|k| q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = exp.iter().sum();
        let mut out = vec![0.0; q.len()];
        for (e, v) in exp.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += e / total * x;
            }
        }
        out
    }

    #[test]
    fn causal_attention_over_a_paged_span_matches_contiguous_attention_row_by_row() {
        let shape = KvShape {
            block_size: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let (heads, tokens) = (4, 21);
        let blocks_total = 9;
        let mut k_cache = vec![0.0f32; blocks_total * 4 * shape.slot_len()];
        let mut v_cache = k_cache.clone();
        // A sequence of 21 tokens scattered over six blocks.
        let table = [5u32, 1, 3, 8, 0, 6];
        let value = |pos: usize, h: usize, d: usize, salt: f32| ((pos * 31 + h * 7 + d) as f32 * salt).sin();
        for pos in 0..tokens {
            let k: Vec<f32> = (0..16).map(|i| value(pos, i / 8, i % 8, 0.37)).collect();
            let v: Vec<f32> = (0..16).map(|i| value(pos, i / 8, i % 8, 0.11)).collect();
            shape.store(&mut k_cache, &mut v_cache, &table, pos, &k, &v);
        }
        let q: Vec<f32> = (0..tokens * heads * 8).map(|i| (i as f32 * 0.3).cos()).collect();
        let run = |spans: &[Span]| {
            let mut out = vec![f32::NAN; tokens * heads * 8];
            attention(&q, spans, heads, shape, &k_cache, &v_cache, &mut out);
            out
        };
        // The whole span at once (two tiles: 16 + 5 tokens)...
        let together = run(&[Span {
            blocks: &table,
            start: 0,
            len: tokens,
            row: 0,
        }]);
        // ...and every token on its own, as decode steps see them.
        let alone: Vec<Span> = (0..tokens)
            .map(|t| Span {
                blocks: &table,
                start: t,
                len: 1,
                row: t,
            })
            .collect();
        let apart = run(&alone);
        assert!(
            together
                .iter()
                .zip(&apart)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        for t in 0..tokens {
            for head in 0..heads {
                let kv = head / 2;
                let keys: Vec<Vec<f32>> = (0..=t)
                    .map(|p| (0..8).map(|d| value(p, kv, d, 0.37)).collect())
                    .collect();
                let values: Vec<Vec<f32>> = (0..=t)
                    .map(|p| (0..8).map(|d| value(p, kv, d, 0.11)).collect())
                    .collect();
                let at = (t * heads + head) * 8;
                let want = naive(&q[at..at + 8], &keys, &values);
                for (a, b) in together[at..at + 8].iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "token {t} head {head}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn the_vector_kernels_give_the_tile_loop_s_bits() {
        // Groups of 3 query heads per KV head (SmolLM2's: three registers of rows per
        // call of the AVX-512 lane kernel), of 4 (48 rows and 16), 2 and 1.
        for (hd, heads, kv_heads) in [(64, 9, 3), (128, 9, 3), (64, 8, 2), (64, 4, 2), (64, 3, 3)] {
            let shape = KvShape {
                block_size: 16,
                kv_heads,
                head_dim: hd,
            };
            let blocks_total = 12;
            let value = |i: usize, salt: f32| ((i as f32 * salt).sin() * 3.0).tan().clamp(-8.0, 8.0);
            let len = blocks_total * 16 * shape.slot_len();
            let mut k_cache: Vec<f32> = (0..len).map(|i| value(i, 0.37)).collect();
            let mut v_cache: Vec<f32> = (0..len).map(|i| value(i, 0.11)).collect();
            // A 70-token prompt chunk after 23 cached tokens (part of its first block
            // and of its last; 16-row lane groups that straddle tokens and blocks), and
            // a decode step of another sequence (one token: the per-token kernel).
            let (table_a, table_b) = ([7u32, 2, 9, 0, 11, 4, 5], [3u32, 8, 1]);
            // The slots past each sequence's last position hold NaN, as a block left by
            // a request that failed could: no kernel may let them into a result.
            let nan = vec![f32::NAN; shape.slot_len()];
            for (table, from, to) in [(&table_a[..], 93, 112), (&table_b[..], 41, 48)] {
                for position in from..to {
                    shape.store(&mut k_cache, &mut v_cache, table, position, &nan, &nan);
                }
            }
            let spans = [
                Span {
                    blocks: &table_a,
                    start: 23,
                    len: 70,
                    row: 0,
                },
                Span {
                    blocks: &table_b,
                    start: 40,
                    len: 1,
                    row: 70,
                },
            ];
            let q: Vec<f32> = (0..71 * heads * hd).map(|i| value(i, 0.29)).collect();
            let run = |kernels| {
                let mut out = vec![f32::NAN; q.len()];
                let cache = Cache::F32 {
                    k: &k_cache,
                    v: &v_cache,
                };
                attention_with(&q, &spans, heads, shape, cache, &mut out, kernels);
                out
            };
            let tiles = run(Kernels::TileLoop);
            // The fastest kernels of this CPU (AVX-512's or AVX2's), and AVX2's.
            for kernels in [Kernels::Fastest, Kernels::Avx2] {
                let got = run(kernels);
                assert!(got.iter().all(|x| x.is_finite()));
                let same = got
                    .iter()
                    .zip(&tiles)
                    .filter(|(a, b)| a.to_bits() == b.to_bits())
                    .count();
                assert_eq!(
                    same,
                    got.len(),
                    "head size {hd}, {heads}/{kv_heads} heads, {kernels:?}"
                );
            }
        }
    }

    #[test]
    fn a_bf16_cache_gives_the_bits_of_an_f32_cache_holding_its_values() {
        for hd in [64, 128] {
            let shape = KvShape {
                block_size: 16,
                kv_heads: 3,
                head_dim: hd,
            };
            let (heads, blocks_total) = (9, 40);
            let value = |i: usize, salt: f32| ((i as f32 * salt).sin() * 3.0).tan().clamp(-8.0, 8.0);
            let len = blocks_total * shape.block_size * shape.slot_len();
            let (mut k16, mut v16) = (vec![0u16; len], vec![0u16; len]);
            let (mut k32, mut v32) = (vec![0.0f32; len], vec![0.0f32; len]);
            // Three sequences: a 70-token chunk after 23 cached tokens, a decode step, and
            // a step verifying three drafted tokens; NaN in every slot past a sequence's
            // last position.
            let tables: [&[u32]; 3] = [&[7, 2, 9, 0, 11, 4, 5], &[3, 8, 1], &[12, 30, 22, 17]];
            let ends = [93, 41, 52];
            let rounded = crate::formats::bf16::round_bf16;
            for (s, table) in tables.iter().enumerate() {
                for position in 0..table.len() * shape.block_size {
                    let (k, v): (Vec<f32>, Vec<f32>) = if position < ends[s] {
                        let at = (s * 1000 + position) * shape.slot_len();
                        (0..shape.slot_len())
                            .map(|i| (value(at + i, 0.37), value(at + i, 0.11)))
                            .unzip()
                    } else {
                        (vec![f32::NAN; shape.slot_len()], vec![f32::NAN; shape.slot_len()])
                    };
                    shape.store_bf16(&mut k16, &mut v16, table, position, &k, &v);
                    let (k, v): (Vec<f32>, Vec<f32>) = (
                        k.into_iter().map(rounded).collect(),
                        v.into_iter().map(rounded).collect(),
                    );
                    shape.store(&mut k32, &mut v32, table, position, &k, &v);
                }
            }
            let spans = [
                Span {
                    blocks: tables[0],
                    start: 23,
                    len: 70,
                    row: 0,
                },
                Span {
                    blocks: tables[1],
                    start: 40,
                    len: 1,
                    row: 70,
                },
                Span {
                    blocks: tables[2],
                    start: 48,
                    len: 4,
                    row: 71,
                },
            ];
            let q: Vec<f32> = (0..75 * heads * hd).map(|i| value(i, 0.29)).collect();
            for kernels in [Kernels::Fastest, Kernels::Avx2, Kernels::TileLoop] {
                let run = |cache| {
                    let mut out = vec![f32::NAN; q.len()];
                    attention_with(&q, &spans, heads, shape, cache, &mut out, kernels);
                    out
                };
                let want = run(Cache::F32 { k: &k32, v: &v32 });
                let got = run(Cache::Bf16 { k: &k16, v: &v16 });
                assert!(want.iter().all(|x| x.is_finite()), "head size {hd}, {kernels:?}");
                assert_same_bits(&got, &want, &format!("head size {hd}, {kernels:?}"));
            }
            // Every row alone too: a decode step of a single sequence splits its tiles by
            // query head, and each widens the blocks for itself.
            let mut one = vec![f32::NAN; heads * hd];
            attention_bf16_cache(
                &q[70 * heads * hd..71 * heads * hd],
                &[Span { row: 0, ..spans[1] }],
                heads,
                shape,
                &k16,
                &v16,
                &mut one,
            );
            let mut want = vec![f32::NAN; heads * hd];
            attention(
                &q[70 * heads * hd..71 * heads * hd],
                &[Span { row: 0, ..spans[1] }],
                heads,
                shape,
                &k32,
                &v32,
                &mut want,
            );
            assert_same_bits(&one, &want, &format!("head size {hd}, one decode"));
        }
    }

    #[test]
    fn rotary_rotates_pairs_half_apart() {
        let rotary = Rotary::new(&[1.0, 0.5], 4, 1.0);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rotary.apply(&mut x, 2);
        let (c0, s0, c1, s1) = (2.0f32.cos(), 2.0f32.sin(), 1.0f32.cos(), 1.0f32.sin());
        let want = [
            1.0 * c0 - 3.0 * s0,
            2.0 * c1 - 4.0 * s1,
            3.0 * c0 + 1.0 * s0,
            4.0 * c1 + 2.0 * s1,
        ];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6);
        }
        assert_eq!(rotary.positions(), 4);
    }

    #[test]
    fn rms_norm_and_silu() {
        let mut out = vec![0.0; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        let inv = 1.0 / 12.5f32.sqrt();
        assert!((out[0] - 3.0 * inv).abs() < 1e-6 && (out[1] - 8.0 * inv).abs() < 1e-6);
        let mut act = vec![0.0; 1];
        silu_mul(&[2.0, 3.0], 1, &mut act);
        assert!((act[0] - 2.0 / (1.0 + (-2.0f32).exp()) * 3.0).abs() < 1e-6);
    }
}

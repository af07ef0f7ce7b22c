//! The decoder's loops as transformers computes them for a bf16 model, rounding to
//! bf16 where PyTorch does: RMSNorm, rotary embeddings, the gated activation and eager
//! attention. For calibration, which must see the activations the reference tools see;
//! the engine's own loops (f32) are in the sibling modules.

use rayon::prelude::*;

use super::elementwise::{by_norm_groups, silu_mul_rows};
use super::{KvShape, Rotary, Span, by_rows, exp};

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
/// the eight-key sums of `dots_in_order` and the vectorized bf16 SiLU, calibration
/// measured faster (benchmarks/quantize.md, "Figures that were in code comments").
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
pub(super) struct Keys<'a> {
    pub(super) cache: &'a [f32],
    pub(super) starts: &'a [usize],
    pub(super) offset: usize,
    pub(super) stride: usize,
}

/// `q · key` summed in order, for each of `keys`, appended to `out`. Eight keys at a
/// time: eight independent chains of additions, each key's still in order (one key at a
/// time waited on every addition, and calibration measured slower: benchmarks/quantize.md,
/// "Figures that were in code comments").
pub(super) fn dots_in_order(q: &[f32], keys: &Keys, out: &mut Vec<f32>) {
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
/// but moved more of SmolLM2's scales away from llm-compressor's: benchmarks/quantize.md,
/// "Figures that were in code comments". PyTorch's order is oneDNN's and unknown; in
/// order is closer.)
pub(super) fn dot_in_order(a: &[f32], b: impl Iterator<Item = f32>) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

//! The element-wise loops between a decoder layer's products, in f32: RMSNorm (of rows
//! and of heads), the residual addition and the SiLU-gated activation of the MLP. Not
//! here: their bf16 forms for calibration (`bf16`) or rotary embeddings (`rotary`).

use super::{PARALLEL_MIN, by_rows, exp};

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
/// twice as fast as the rows one after another: benchmarks/native.md, "Figures that were in code comments").
#[inline(always)]
pub(super) fn by_norm_groups(
    x: &[f32],
    dim: usize,
    out: &mut [f32],
    mut f: impl FnMut(&[f32], f32, &mut [f32]),
) {
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
pub(super) fn silu_mul_rows(gate_up: &[f32], n: usize, out: &mut [f32], bf16: bool) {
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

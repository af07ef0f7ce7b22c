//! The loops of a Gated DeltaNet layer (the linear attention of Qwen3-Next and Qwen3.5),
//! in f32: the causal depthwise convolution over the projected q/k/v channels, the
//! L2 norm of queries and keys, the gated delta rule that carries each head's
//! `key_dim × value_dim` state from token to token, and the gated RMSNorm of its output.
//!
//! The arithmetic follows transformers' reference path for these models
//! (`transformers/models/qwen3_next/modeling_qwen3_next.py`, 5.17:
//! `torch_causal_conv1d_update`, `l2norm`, `torch_recurrent_gated_delta_rule`,
//! `Qwen3NextRMSNormGated`). Prompts run token by token through the same recurrence as
//! decode: transformers' chunked form of the rule is the same sum in another order, and
//! on a CPU the state update costs the same per token either way; what a prompt shares
//! is the projections around it, which run as one product for the whole chunk.

use rayon::prelude::*;

use super::exp;

/// `x / (1 + e^-x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `ln(1 + e^x)`, and `x` itself above 20 (PyTorch's `softplus` threshold).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The causal depthwise convolution of `rows` consecutive tokens of one sequence, then
/// SiLU, in place: `x` is `rows × channels`, `weight` is `kernel × channels` (the
/// checkpoint's `conv1d.weight`, `[channels, 1, kernel]`, transposed so that a tap's
/// weights are contiguous), and `state` holds the sequence's last `kernel - 1` inputs
/// before these rows, oldest first (`(kernel - 1) × channels`, zero for a new
/// sequence). Leaves in `state` the last `kernel - 1` inputs, for the next call.
pub fn causal_conv1d_silu(x: &mut [f32], channels: usize, weight: &[f32], kernel: usize, state: &mut [f32]) {
    let past = kernel - 1;
    debug_assert_eq!(weight.len(), channels * kernel);
    debug_assert_eq!(state.len(), past * channels);
    let rows = x.len() / channels;
    // The inputs as the convolution sees them: the carried state, then these rows.
    let mut window: Vec<f32> = Vec::with_capacity((past + rows) * channels);
    window.extend_from_slice(state);
    window.extend_from_slice(x);
    for (t, out) in x.chunks_exact_mut(channels).enumerate() {
        // Tap by tap over every channel at once (contiguous, so vectorized); each
        // channel's sum still runs over its taps in order.
        out.iter_mut().for_each(|o| *o = 0.0);
        for (j, taps) in weight.chunks_exact(channels).enumerate() {
            let inputs = &window[(t + j) * channels..][..channels];
            for ((o, &w), &v) in out.iter_mut().zip(taps).zip(inputs) {
                *o += w * v;
            }
        }
        out.iter_mut().for_each(|o| *o = silu(*o));
    }
    state.copy_from_slice(&window[rows * channels..]);
}

/// `conv1d.weight` as the checkpoint holds it (`channels × kernel`) transposed to the
/// `kernel × channels` layout [`causal_conv1d_silu`] reads.
pub fn conv_taps(weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    (0..kernel)
        .flat_map(|j| (0..channels).map(move |c| weight[c * kernel + j]))
        .collect()
}

/// Divides every `dim`-sized head of `x` by `sqrt(Σ v² + eps)` (transformers' `l2norm`).
pub fn l2_normalize_heads(x: &mut [f32], dim: usize, eps: f32) {
    for head in x.chunks_exact_mut(dim) {
        let sum = head.iter().fold(0.0f32, |s, v| s + v * v);
        let inv = 1.0 / (sum + eps).sqrt();
        head.iter_mut().for_each(|v| *v *= inv);
    }
}

/// The shape of a Gated DeltaNet layer's heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaShape {
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of `k_heads`; each key head serves `v_heads / k_heads`).
    pub v_heads: usize,
    /// Values per query/key head.
    pub k_dim: usize,
    /// Values per value head.
    pub v_dim: usize,
}

impl DeltaShape {
    /// Values of one sequence's recurrent state: `v_heads × k_dim × v_dim`.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }
}

/// The gated delta rule over `rows` consecutive tokens of one sequence.
///
/// `q` and `k` are `rows × k_heads × k_dim`, already L2-normalized (the query also
/// scaled by `1/sqrt(k_dim)`); `v` is `rows × v_heads × v_dim`; `g` (the log of each
/// head's decay) and `beta` (its write strength) are `rows × v_heads`. `state` is the
/// sequence's `v_heads × k_dim × v_dim` state before these rows and after them. Writes
/// `rows × v_heads × v_dim` into `out`. Per value head `h` (key head `h / (v_heads /
/// k_heads)`) and token: `S ← e^g·S`, `δ = β(v − Sᵀk)`, `S ← S + k δᵀ`, `o = Sᵀq`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    shape: DeltaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let DeltaShape {
        k_heads,
        v_heads,
        k_dim,
        v_dim,
    } = shape;
    let rows = g.len() / v_heads;
    let group = v_heads / k_heads;
    let head_state = k_dim * v_dim;
    // One task per value head, each writing its own columns of `out` afterwards: the
    // heads share nothing.
    let run = |h: usize, s: &mut [f32]| -> Vec<f32> {
        let kh = h / group;
        let mut o = vec![0.0f32; rows * v_dim];
        let mut kv = vec![0.0f32; v_dim];
        for t in 0..rows {
            let qt = &q[(t * k_heads + kh) * k_dim..][..k_dim];
            let kt = &k[(t * k_heads + kh) * k_dim..][..k_dim];
            let vt = &v[(t * v_heads + h) * v_dim..][..v_dim];
            let decay = g[t * v_heads + h].exp();
            let b = beta[t * v_heads + h];
            kv.iter_mut().for_each(|x| *x = 0.0);
            for (srow, &ki) in s.chunks_exact_mut(v_dim).zip(kt) {
                for (x, m) in srow.iter_mut().zip(kv.iter_mut()) {
                    *x *= decay;
                    *m += *x * ki;
                }
            }
            for (m, &vj) in kv.iter_mut().zip(vt) {
                *m = (vj - *m) * b;
            }
            let ot = &mut o[t * v_dim..][..v_dim];
            for ((srow, &ki), &qi) in s.chunks_exact_mut(v_dim).zip(kt).zip(qt) {
                for ((x, &d), y) in srow.iter_mut().zip(kv.iter()).zip(ot.iter_mut()) {
                    *x += ki * d;
                    *y += *x * qi;
                }
            }
        }
        o
    };
    // A decode step's few heads cost less than handing them out.
    let per_head: Vec<Vec<f32>> = if rows * head_state < 1 << 14 {
        state
            .chunks_exact_mut(head_state)
            .enumerate()
            .map(|(h, s)| run(h, s))
            .collect()
    } else {
        state
            .par_chunks_exact_mut(head_state)
            .enumerate()
            .map(|(h, s)| run(h, s))
            .collect()
    };
    for (h, o) in per_head.iter().enumerate() {
        for t in 0..rows {
            out[(t * v_heads + h) * v_dim..][..v_dim].copy_from_slice(&o[t * v_dim..][..v_dim]);
        }
    }
}

/// The gated RMSNorm of a Gated DeltaNet's output, in place: each `weight.len()`-sized
/// head of `x` becomes `weight · x / sqrt(mean(x²) + eps) · silu(z)`, `z` the matching
/// head of the output gate.
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    for (head, gate) in x.chunks_exact_mut(dim).zip(z.chunks_exact(dim)) {
        let sum = head.iter().fold(0.0f32, |s, v| s + v * v);
        let inv = 1.0 / (sum / dim as f32 + eps).sqrt();
        for ((v, &w), &zg) in head.iter_mut().zip(weight).zip(gate) {
            *v = w * (*v * inv) * silu(zg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convolution_state_carries_a_sequence_over_calls() {
        let (channels, kernel, rows) = (3, 4, 7);
        let stored: Vec<f32> = (0..channels * kernel).map(|i| (i as f32 * 0.37).sin()).collect();
        let weight = conv_taps(&stored, channels, kernel);
        let x: Vec<f32> = (0..rows * channels).map(|i| (i as f32 * 0.61).cos()).collect();
        let mut whole = x.clone();
        let mut state = vec![0.0; (kernel - 1) * channels];
        causal_conv1d_silu(&mut whole, channels, &weight, kernel, &mut state);
        // The same rows in calls of 2, 1 and 4 rows.
        let mut parts = x.clone();
        let mut carried = vec![0.0; (kernel - 1) * channels];
        let (a, rest) = parts.split_at_mut(2 * channels);
        let (b, c) = rest.split_at_mut(channels);
        for part in [a, b, c] {
            causal_conv1d_silu(part, channels, &weight, kernel, &mut carried);
        }
        assert_eq!(whole, parts);
        assert_eq!(state, carried);
        // The first row sees only itself: silu(w[c, kernel-1] · x[0, c]).
        for c in 0..channels {
            assert_eq!(whole[c], silu(stored[c * kernel + kernel - 1] * x[c]));
        }
    }

    #[test]
    fn the_delta_rule_over_a_prompt_equals_its_steps() {
        let shape = DeltaShape {
            k_heads: 2,
            v_heads: 4,
            k_dim: 8,
            v_dim: 4,
        };
        let rows = 5;
        let wave = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin()).collect() };
        let mut q = wave(rows * 2 * 8, 0.3);
        let mut k = wave(rows * 2 * 8, 0.7);
        l2_normalize_heads(&mut q, 8, 1e-6);
        l2_normalize_heads(&mut k, 8, 1e-6);
        let v = wave(rows * 4 * 4, 1.1);
        let g: Vec<f32> = wave(rows * 4, 0.9).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = wave(rows * 4, 0.5).iter().map(|&x| sigmoid(x)).collect();
        let mut state = vec![0.0; shape.state_len()];
        let mut out = vec![0.0; rows * 16];
        gated_delta_rule(shape, &q, &k, &v, &g, &beta, &mut state, &mut out);
        let mut stepped = vec![0.0; shape.state_len()];
        for t in 0..rows {
            let mut o = vec![0.0; 16];
            let (qs, ks) = (&q[t * 16..][..16], &k[t * 16..][..16]);
            gated_delta_rule(
                shape,
                qs,
                ks,
                &v[t * 16..][..16],
                &g[t * 4..][..4],
                &beta[t * 4..][..4],
                &mut stepped,
                &mut o,
            );
            assert_eq!(o, out[t * 16..][..16]);
        }
        assert_eq!(state, stepped);
        // With a zero state and no decay, one token writes β·v·kᵀ and reads it back by
        // q: o = β (k·q) v.
        let mut fresh = vec![0.0; shape.state_len()];
        let mut o = vec![0.0; 16];
        let zero = [0.0; 4];
        gated_delta_rule(
            shape,
            &q[..16],
            &k[..16],
            &v[..16],
            &zero,
            &beta[..4],
            &mut fresh,
            &mut o,
        );
        for h in 0..4 {
            let kh = h / 2;
            let dot: f32 = (0..8).map(|i| q[kh * 8 + i] * k[kh * 8 + i]).sum();
            for j in 0..4 {
                let want = beta[h] * v[h * 4 + j] * dot;
                assert!((o[h * 4 + j] - want).abs() < 1e-6, "{} vs {want}", o[h * 4 + j]);
            }
        }
    }
}

//! A Gated DeltaNet layer (the linear attention of Qwen3-Next and Qwen3.5): one
//! product projects every token of the step to queries, keys, values, the output gate
//! and the decay and write-strength inputs; then each sequence runs its own causal
//! convolution and delta-rule recurrence from the state it left in the cache
//! ([`LinearStates`]), and one product projects the gated, normed result back.
//!
//! The projections are those of transformers 5.17 (`Qwen3NextGatedDeltaNet`,
//! `Qwen3_5GatedDeltaNet`): Qwen3-Next packs q, k, v and z head group by head group in
//! `in_proj_qkvz` (and b, a likewise in `in_proj_ba`), Qwen3.5 has `in_proj_qkv`,
//! `in_proj_z`, `in_proj_b` and `in_proj_a`. Both are read into one product whose
//! output columns are put in the plain order `[q | k | v | z | b | a]`.

use sous_kernels::gemm::Packed;
use sous_kernels::transformer::linear::{self as lin, DeltaShape};

use super::moe::Product;
use crate::native::NativeError;
use crate::native::config::{Family, LinearConfig};
use crate::native::weights::{Checkpoint, Precision};

/// One linear-attention layer's weights.
pub(super) struct LinearAttention {
    /// Every projection of the input, stacked into one product, or into one per run of
    /// projections held alike where a checkpoint holds some in NVFP4 and some in 16
    /// bits (ModelOpt quantizes `in_proj_qkv`/`in_proj_z` and keeps `in_proj_b`/`a`).
    pub(super) in_proj: Vec<Packed>,
    /// For each plain column, the product's column it is in (Qwen3-Next's grouped
    /// layout); `None` where they are the same.
    order: Option<Vec<u32>>,
    /// `[kernel, conv_dim]` ([`lin::conv_taps`]).
    conv: Vec<f32>,
    /// `-exp(A_log)` of every value head.
    decay: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight, `[v_dim]`.
    norm: Vec<f32>,
    pub(super) out: Packed,
    shape: DeltaShape,
    kernel: usize,
    eps: f32,
}

/// Every sequence's state in every linear-attention layer: the convolution's last
/// inputs and the recurrent state, one slot per sequence that can run at once.
pub struct LinearStates {
    config: LinearConfig,
    slots: usize,
    /// Per layer: `slots × (kernel - 1) × conv_dim`.
    conv: Vec<Vec<f32>>,
    /// Per layer: `slots × v_heads × k_dim × v_dim`.
    recurrent: Vec<Vec<f32>>,
}

impl LinearStates {
    /// Zeroed states for `slots` sequences.
    pub fn new(config: &LinearConfig, slots: usize) -> LinearStates {
        let layers = config.count();
        let conv_len = (config.conv_kernel - 1) * config.conv_dim();
        let rec_len = config.v_heads * config.k_dim * config.v_dim;
        LinearStates {
            config: config.clone(),
            slots,
            conv: (0..layers).map(|_| vec![0.0; slots * conv_len]).collect(),
            recurrent: (0..layers).map(|_| vec![0.0; slots * rec_len]).collect(),
        }
    }

    /// The layers' shape.
    pub fn config(&self) -> &LinearConfig {
        &self.config
    }

    /// Sequences that can hold a state at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of state one sequence holds in every layer.
    pub fn bytes_per_sequence(config: &LinearConfig) -> u64 {
        (config.count() * config.state_values() * 4) as u64
    }

    /// A copy of sequence slot `slot`'s state in every layer (to take a step back to).
    pub fn save(&mut self, slot: usize) -> Vec<f32> {
        let mut saved = Vec::new();
        for layer in 0..self.conv.len() {
            let (conv, recurrent) = self.slot(layer, slot);
            saved.extend_from_slice(conv);
            saved.extend_from_slice(recurrent);
        }
        saved
    }

    /// Puts back what [`LinearStates::save`] copied from slot `slot`.
    pub fn restore(&mut self, slot: usize, saved: &[f32]) {
        let mut at = 0;
        for layer in 0..self.conv.len() {
            let (conv, recurrent) = self.slot(layer, slot);
            for part in [conv, recurrent] {
                part.copy_from_slice(&saved[at..at + part.len()]);
                at += part.len();
            }
        }
    }

    fn slot(&mut self, layer: usize, slot: usize) -> (&mut [f32], &mut [f32]) {
        let conv_len = (self.config.conv_kernel - 1) * self.config.conv_dim();
        let rec_len = self.config.v_heads * self.config.k_dim * self.config.v_dim;
        (
            &mut self.conv[layer][slot * conv_len..(slot + 1) * conv_len],
            &mut self.recurrent[layer][slot * rec_len..(slot + 1) * rec_len],
        )
    }
}

/// A sequence's rows in a step: its state slot, whether it starts there (position 0:
/// the state is cleared first), and its rows of the step.
pub(super) struct Rows {
    pub(super) slot: usize,
    pub(super) fresh: bool,
    pub(super) first: usize,
    pub(super) len: usize,
}

impl LinearAttention {
    /// Loads layer prefix `p`'s linear attention (`p` is `model.layers.N`).
    pub(super) fn load(
        family: Family,
        config: &LinearConfig,
        hidden: usize,
        eps: f32,
        checkpoint: &Checkpoint,
        precision: Precision,
        p: &str,
    ) -> Result<LinearAttention, NativeError> {
        let c = config;
        let (kd, vd) = (c.k_heads * c.k_dim, c.v_heads * c.v_dim);
        let a = format!("{p}.linear_attn");
        let linear =
            |name: &str, rows: usize| checkpoint.linear(&format!("{a}.{name}"), [rows, hidden], precision);
        let (parts, order) = if family == Family::Qwen3Next {
            let parts = vec![
                linear("in_proj_qkvz", 2 * kd + 2 * vd)?,
                linear("in_proj_ba", 2 * c.v_heads)?,
            ];
            (parts, Some(grouped_order(c)))
        } else {
            // b and a have a row per value head, too few to stack as they are.
            let (b, a_) = (format!("{a}.in_proj_b.weight"), format!("{a}.in_proj_a.weight"));
            let shape = [c.v_heads, hidden];
            let parts = vec![
                linear("in_proj_qkv", 2 * kd + vd)?,
                linear("in_proj_z", vd)?,
                checkpoint.stacked_matrix(&[(&b, shape), (&a_, shape)], precision)?,
            ];
            (parts, None)
        };
        let mut runs: Vec<Vec<Packed>> = Vec::new();
        for part in parts {
            match runs.last_mut() {
                Some(run) if run[0].format() == part.format() => run.push(part),
                _ => runs.push(vec![part]),
            }
        }
        let in_proj = runs
            .into_iter()
            .map(|run| {
                Packed::stack(run).map_err(|e| NativeError::Config {
                    path: a.clone().into(),
                    message: format!("cannot fuse the projections: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sized = |name: &str, len: usize| -> Result<Vec<f32>, NativeError> {
            let v = checkpoint.vector(&format!("{a}.{name}"))?;
            if v.len() != len {
                return Err(NativeError::Config {
                    path: checkpoint.dir().to_owned(),
                    message: format!("`{a}.{name}` has {} values, expected {len}", v.len()),
                });
            }
            Ok(v)
        };
        Ok(LinearAttention {
            in_proj,
            order,
            conv: lin::conv_taps(
                &sized("conv1d.weight", c.conv_dim() * c.conv_kernel)?,
                c.conv_dim(),
                c.conv_kernel,
            ),
            decay: sized("A_log", c.v_heads)?.iter().map(|a| -a.exp()).collect(),
            dt_bias: sized("dt_bias", c.v_heads)?,
            norm: sized("norm.weight", c.v_dim)?,
            out: checkpoint.linear(&format!("{a}.out_proj"), [hidden, vd], precision)?,
            shape: DeltaShape {
                k_heads: c.k_heads,
                v_heads: c.v_heads,
                k_dim: c.k_dim,
                v_dim: c.v_dim,
            },
            kernel: c.conv_kernel,
            eps,
        })
    }

    /// Runs the layer over `x` (`rows × hidden`, normed) for the sequences `seqs`,
    /// reading and updating their states in layer `layer` of `states`; writes the
    /// layer's output, `rows × hidden`, into `out`.
    pub(super) fn forward(
        &self,
        x: &[f32],
        seqs: &[Rows],
        states: &mut LinearStates,
        layer: usize,
        product: &Product,
        out: &mut [f32],
    ) {
        let DeltaShape {
            k_heads,
            v_heads,
            k_dim,
            v_dim,
        } = self.shape;
        let (kd, vd) = (k_heads * k_dim, v_heads * v_dim);
        let conv_dim = 2 * kd + vd;
        let width = 2 * kd + 2 * vd + 2 * v_heads;
        let rows: usize = seqs.iter().map(|s| s.len).sum();
        let mut proj = vec![0.0f32; rows * width];
        if let [one] = self.in_proj.as_slice() {
            product(x, rows, one, &mut proj);
        } else {
            let mut column = 0;
            for part in &self.in_proj {
                let n = part.n();
                let mut out = vec![0.0f32; rows * n];
                product(x, rows, part, &mut out);
                for (row, part_row) in proj.chunks_exact_mut(width).zip(out.chunks_exact(n)) {
                    row[column..column + n].copy_from_slice(part_row);
                }
                column += n;
            }
        }
        if let Some(order) = &self.order {
            let mut stored = vec![0.0f32; width];
            for row in proj.chunks_exact_mut(width) {
                stored.copy_from_slice(row);
                for (plain, &s) in row.iter_mut().zip(order) {
                    *plain = stored[s as usize];
                }
            }
        }
        let scale = 1.0 / (k_dim as f32).sqrt();
        let mut core = vec![0.0f32; rows * vd];
        for s in seqs {
            let (conv_state, recurrent) = states.slot(layer, s.slot);
            if s.fresh {
                conv_state.iter_mut().for_each(|v| *v = 0.0);
                recurrent.iter_mut().for_each(|v| *v = 0.0);
            }
            let mine = &proj[s.first * width..(s.first + s.len) * width];
            let mut qkv: Vec<f32> = mine
                .chunks_exact(width)
                .flat_map(|r| r[..conv_dim].iter().copied())
                .collect();
            lin::causal_conv1d_silu(&mut qkv, conv_dim, &self.conv, self.kernel, conv_state);
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(s.len * kd),
                Vec::with_capacity(s.len * kd),
                Vec::with_capacity(s.len * vd),
            );
            for r in qkv.chunks_exact(conv_dim) {
                q.extend_from_slice(&r[..kd]);
                k.extend_from_slice(&r[kd..2 * kd]);
                v.extend_from_slice(&r[2 * kd..]);
            }
            lin::l2_normalize_heads(&mut q, k_dim, 1e-6);
            lin::l2_normalize_heads(&mut k, k_dim, 1e-6);
            q.iter_mut().for_each(|x| *x *= scale);
            let mut g = Vec::with_capacity(s.len * v_heads);
            let mut beta = Vec::with_capacity(s.len * v_heads);
            for r in mine.chunks_exact(width) {
                let (b, a) = r[conv_dim + vd..].split_at(v_heads);
                for h in 0..v_heads {
                    g.push(self.decay[h] * lin::softplus(a[h] + self.dt_bias[h]));
                    beta.push(lin::sigmoid(b[h]));
                }
            }
            let dst = &mut core[s.first * vd..(s.first + s.len) * vd];
            lin::gated_delta_rule(self.shape, &q, &k, &v, &g, &beta, recurrent, dst);
            for (o, r) in dst.chunks_exact_mut(vd).zip(mine.chunks_exact(width)) {
                lin::gated_rms_norm(o, &r[conv_dim..conv_dim + vd], &self.norm, self.eps);
            }
        }
        product(&core, rows, &self.out, out);
    }
}

/// Where Qwen3-Next's grouped projections put each plain column: `in_proj_qkvz` holds,
/// for each key head `g`, `[q_g, k_g, v_g, z_g]` (`v_g` and `z_g` the value heads that
/// share key head `g`), and `in_proj_ba` `[b_g, a_g]` per group
/// (`fix_query_key_value_ordering` in transformers' `modeling_qwen3_next.py`).
fn grouped_order(c: &LinearConfig) -> Vec<u32> {
    let (kd, vd) = (c.k_heads * c.k_dim, c.v_heads * c.v_dim);
    let r = c.v_heads / c.k_heads;
    let width = 2 * kd + 2 * vd + 2 * c.v_heads;
    let mut order = vec![0u32; width];
    let mut stored = 0u32;
    let mut take = |plain: std::ops::Range<usize>| {
        for i in plain {
            order[i] = stored;
            stored += 1;
        }
    };
    for g in 0..c.k_heads {
        take(g * c.k_dim..(g + 1) * c.k_dim);
        take(kd + g * c.k_dim..kd + (g + 1) * c.k_dim);
        take(2 * kd + g * r * c.v_dim..2 * kd + (g + 1) * r * c.v_dim);
        take(2 * kd + vd + g * r * c.v_dim..2 * kd + vd + (g + 1) * r * c.v_dim);
    }
    let ba = 2 * kd + 2 * vd;
    for g in 0..c.k_heads {
        take(ba + g * r..ba + (g + 1) * r);
        take(ba + c.v_heads + g * r..ba + c.v_heads + (g + 1) * r);
    }
    order
}

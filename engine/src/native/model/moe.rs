//! A mixture-of-experts MLP: a router picks each token's top-k experts, each expert is
//! a SiLU-gated MLP, and a token's output is the weighted sum of its experts' outputs
//! (plus, in the Qwen2-MoE line, a shared expert scaled by a sigmoid gate).
//!
//! A step reads only the experts its tokens route to: the rows of the batch are grouped
//! by expert, so every expert that is used runs one product over all the rows (of every
//! sequence in the step) that chose it, and an expert no row chose is not touched.
//!
//! The arithmetic follows transformers 5.17 (`Qwen3MoeTopKRouter`,
//! `Qwen3MoeExperts`, `Qwen2MoeSparseMoeBlock`, `MixtralTopKRouter` in
//! `transformers/models/*/modeling_*.py`): softmax over every expert in f32, top-k,
//! optionally renormalized; each expert's output scaled by its weight and added in
//! expert order to a zero row; the shared expert's gated output added last.

use sous_kernels::activation::quantize_dequantize_nvfp4;
use sous_kernels::gemm::Packed;
use sous_kernels::transformer::{self as k, linear::sigmoid};

use crate::native::NativeError;
use crate::native::config::{Family, MoeConfig};
use crate::native::weights::{Checkpoint, Precision};

/// A product `out = x · wᵀ` over `rows` rows, in the model's precision.
pub(super) type Product<'a> = dyn Fn(&[f32], usize, &Packed, &mut [f32]) + Sync + 'a;

/// One dense SiLU-gated MLP: gate and up stacked, then down.
pub(super) struct Mlp {
    /// `[2 width, hidden]`: gate rows, then up rows.
    pub(super) gate_up: Packed,
    /// `[hidden, width]`.
    pub(super) down: Packed,
    pub(super) width: usize,
    /// W4A4: the activation global scales of the gate/up and down inputs.
    pub(super) input_scales: Option<[f32; 2]>,
}

impl Mlp {
    /// The largest magnitude reaching `down` over `rows` rows: what calibration
    /// records for it.
    fn down_input_amax(&self, x: &[f32], rows: usize, product: &Product) -> f32 {
        let mut gate_up = vec![0.0f32; rows * 2 * self.width];
        let mut act = vec![0.0f32; rows * self.width];
        product(x, rows, &self.gate_up, &mut gate_up);
        k::silu_mul(&gate_up, self.width, &mut act);
        act.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    }

    /// `out = down(silu(gate(x)) · up(x))` for `rows` rows.
    pub(super) fn forward(&self, x: &[f32], rows: usize, product: &Product, out: &mut [f32]) {
        let mut gate_up = vec![0.0f32; rows * 2 * self.width];
        let mut act = vec![0.0f32; rows * self.width];
        match self.input_scales {
            Some([scale, _]) => {
                let mut quantized = x.to_vec();
                quantize_dequantize_nvfp4(&mut quantized, scale);
                product(&quantized, rows, &self.gate_up, &mut gate_up);
            }
            None => product(x, rows, &self.gate_up, &mut gate_up),
        }
        k::silu_mul(&gate_up, self.width, &mut act);
        if let Some([_, scale]) = self.input_scales {
            quantize_dequantize_nvfp4(&mut act, scale);
        }
        product(&act, rows, &self.down, out);
    }

    pub(super) fn bytes(&self) -> u64 {
        self.gate_up.bytes() + self.down.bytes()
    }
}

/// A layer's experts, router and shared expert.
pub(super) struct Experts {
    /// `[experts, hidden]`.
    router: Packed,
    experts: Vec<Mlp>,
    top_k: usize,
    norm_topk_prob: bool,
    /// The shared expert and its gate's weights (`[hidden]`).
    shared: Option<(Mlp, Vec<f32>)>,
}

impl Experts {
    /// Loads layer prefix `p`'s experts (`p` is `model.layers.N`), in either layout a
    /// checkpoint holds them: one tensor per expert (`mlp.experts.E.gate_proj`, or
    /// Mixtral's `block_sparse_moe.experts.E.w1`), or fused 3-D tensors
    /// (`mlp.experts.gate_up_proj` `[experts, 2 width, hidden]` and
    /// `mlp.experts.down_proj` `[experts, hidden, width]`, transformers 5's own layout).
    pub(super) fn load(
        family: Family,
        moe: &MoeConfig,
        hidden: usize,
        checkpoint: &Checkpoint,
        precision: Precision,
        p: &str,
    ) -> Result<Experts, NativeError> {
        let (n, width) = (moe.experts, moe.intermediate_size);
        let mixtral =
            family == Family::Mixtral && checkpoint.has(&format!("{p}.block_sparse_moe.gate.weight"));
        let block = if mixtral {
            format!("{p}.block_sparse_moe")
        } else {
            format!("{p}.mlp")
        };
        let router = checkpoint.matrix(&format!("{block}.gate.weight"), [n, hidden], precision)?;
        let fused = format!("{block}.experts.gate_up_proj");
        let experts = if checkpoint.has(&fused) {
            let gate_up = checkpoint.expert_matrices(&fused, [n, 2 * width, hidden], precision)?;
            let down = checkpoint.expert_matrices(
                &format!("{block}.experts.down_proj"),
                [n, hidden, width],
                precision,
            )?;
            // An overlay (`Checkpoint::set_overlay`) gives experts one by one.
            let names = ["gate_proj", "up_proj", "down_proj"];
            gate_up
                .into_iter()
                .zip(down)
                .enumerate()
                .map(|(e, (gate_up, down))| {
                    let expert = format!("{block}.experts.{e}");
                    let overlaid = names.map(|n| checkpoint.overlaid(&format!("{expert}.{n}")));
                    match overlaid {
                        [false, false, false] => Ok(Mlp {
                            gate_up,
                            down,
                            width,
                            input_scales: None,
                        }),
                        [true, true, true] => load_mlp(checkpoint, precision, &expert, names, hidden, width),
                        _ => Err(NativeError::Internal(format!(
                            "an overlay must give all three of `{expert}`'s projections or none"
                        ))),
                    }
                })
                .collect::<Result<_, _>>()?
        } else {
            let names = if mixtral {
                ["w1", "w3", "w2"]
            } else {
                ["gate_proj", "up_proj", "down_proj"]
            };
            (0..n)
                .map(|e| {
                    load_mlp(
                        checkpoint,
                        precision,
                        &format!("{block}.experts.{e}"),
                        names,
                        hidden,
                        width,
                    )
                })
                .collect::<Result<_, _>>()?
        };
        let shared = match moe.shared_expert {
            Some(width) => {
                let names = ["gate_proj", "up_proj", "down_proj"];
                let mlp = load_mlp(
                    checkpoint,
                    precision,
                    &format!("{block}.shared_expert"),
                    names,
                    hidden,
                    width,
                )?;
                let gate = checkpoint.vector(&format!("{block}.shared_expert_gate.weight"))?;
                if gate.len() != hidden {
                    return Err(NativeError::Config {
                        path: checkpoint.dir().to_owned(),
                        message: format!(
                            "`{block}.shared_expert_gate.weight` has {} values, expected {hidden}",
                            gate.len()
                        ),
                    });
                }
                Some((mlp, gate))
            }
            None => None,
        };
        Ok(Experts {
            router,
            experts,
            top_k: moe.top_k,
            norm_topk_prob: moe.norm_topk_prob,
            shared,
        })
    }

    /// Bytes of every expert's weights (what the model holds, not what a token reads).
    pub(super) fn bytes(&self) -> u64 {
        self.router.bytes()
            + self.experts.iter().map(Mlp::bytes).sum::<u64>()
            + self.shared.as_ref().map_or(0, |(mlp, _)| mlp.bytes())
    }

    /// Bytes a step of `tokens` tokens reads: the router, the shared expert, and the
    /// experts they are expected to be routed to, `E · (1 − (1 − k/E)^tokens)` of the
    /// `E` experts with `k` per token when the routes are independent and uniform
    /// (exactly `k` for one token).
    pub(super) fn step_bytes(&self, tokens: usize) -> u64 {
        let count = self.experts.len();
        if count == 0 || tokens == 0 {
            return self.router.bytes();
        }
        let e = count as f64;
        let touched = e * (1.0 - (1.0 - self.top_k as f64 / e).powi(tokens.min(i32::MAX as usize) as i32));
        let mean = self.experts.iter().map(Mlp::bytes).sum::<u64>() as f64 / e;
        self.router.bytes()
            + (touched * mean).round() as u64
            + self.shared.as_ref().map_or(0, |(mlp, _)| mlp.bytes())
    }

    /// The matrices, for placing them in huge pages.
    pub(super) fn matrices(&mut self) -> impl Iterator<Item = &mut Packed> {
        let shared = self
            .shared
            .iter_mut()
            .flat_map(|(m, _)| [&mut m.gate_up, &mut m.down]);
        std::iter::once(&mut self.router)
            .chain(
                self.experts
                    .iter_mut()
                    .flat_map(|m| [&mut m.gate_up, &mut m.down]),
            )
            .chain(shared)
    }

    /// Calibration with every expert (llm-compressor's `calibrate_all_experts`): the
    /// largest magnitude reaching each expert's `down` when every one of the `rows`
    /// rows goes through every expert, whatever the router chose, and the shared
    /// expert's. (Their `gate`/`up` read the layer's normed input, which the caller
    /// records.) The forward itself stays routed.
    pub(super) fn observe_down(&self, x: &[f32], rows: usize, product: &Product) -> (Vec<f32>, Option<f32>) {
        let experts = self
            .experts
            .iter()
            .map(|e| e.down_input_amax(x, rows, product))
            .collect();
        let shared = self
            .shared
            .as_ref()
            .map(|(mlp, _)| mlp.down_input_amax(x, rows, product));
        (experts, shared)
    }

    /// Each row's experts and their weights, `top_k` per row, best first.
    pub(super) fn route(&self, x: &[f32], rows: usize, product: &Product) -> Vec<(usize, f32)> {
        let n = self.experts.len();
        let mut logits = vec![0.0f32; rows * n];
        product(x, rows, &self.router, &mut logits);
        let mut chosen = Vec::with_capacity(rows * self.top_k);
        let mut order: Vec<usize> = Vec::with_capacity(n);
        for row in logits.chunks_exact_mut(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for v in row.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            row.iter_mut().for_each(|v| *v /= sum);
            order.clear();
            order.extend(0..n);
            // Highest first; of equal ones, the lower index (as `torch.topk` gives them).
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let top = &order[..self.top_k];
            let total: f32 = top.iter().map(|&e| row[e]).sum();
            for &e in top {
                let w = if self.norm_topk_prob {
                    row[e] / total
                } else {
                    row[e]
                };
                chosen.push((e, w));
            }
        }
        chosen
    }

    /// `out = Σ weight · expert(x)` over each row's routed experts, plus the gated
    /// shared expert: `rows × hidden` in, `rows × hidden` out (overwritten).
    pub(super) fn forward(&self, x: &[f32], rows: usize, product: &Product, out: &mut [f32]) {
        let hidden = x.len() / rows.max(1);
        let routes = self.route(x, rows, product);
        // The rows that chose each expert, with their weights, in row order.
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        for (i, &(e, w)) in routes.iter().enumerate() {
            by_expert[e].push((i / self.top_k, w));
        }
        out.iter_mut().for_each(|v| *v = 0.0);
        let mut gathered = Vec::new();
        let mut y = Vec::new();
        for (expert, chosen) in self.experts.iter().zip(&by_expert) {
            if chosen.is_empty() {
                continue;
            }
            let m = chosen.len();
            gathered.clear();
            for &(r, _) in chosen {
                gathered.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
            }
            y.clear();
            y.resize(m * hidden, 0.0);
            expert.forward(&gathered, m, product, &mut y);
            for (&(r, w), row) in chosen.iter().zip(y.chunks_exact(hidden)) {
                for (o, &v) in out[r * hidden..(r + 1) * hidden].iter_mut().zip(row) {
                    *o += v * w;
                }
            }
        }
        if let Some((mlp, gate)) = &self.shared {
            let mut s = vec![0.0f32; rows * hidden];
            mlp.forward(x, rows, product, &mut s);
            for ((o, s), x) in out
                .chunks_exact_mut(hidden)
                .zip(s.chunks_exact(hidden))
                .zip(x.chunks_exact(hidden))
            {
                let g = sigmoid(x.iter().zip(gate).fold(0.0f32, |acc, (a, b)| acc + a * b));
                for (o, &v) in o.iter_mut().zip(s) {
                    *o += g * v;
                }
            }
        }
    }
}

/// A dense MLP under `prefix` whose three projections are named `names` (gate, up,
/// down), fused into [`Mlp`], with its activation scales in a W4A4 checkpoint.
pub(super) fn load_mlp(
    checkpoint: &Checkpoint,
    precision: Precision,
    prefix: &str,
    names: [&str; 3],
    hidden: usize,
    width: usize,
) -> Result<Mlp, NativeError> {
    let [gate, up, down] = names.map(|n| format!("{prefix}.{n}"));
    let input_scales = match (
        input_scale(checkpoint, &[&gate, &up])?,
        input_scale(checkpoint, &[&down])?,
    ) {
        (Some(a), Some(b)) => Some([a, b]),
        _ => None,
    };
    let gate_up = Packed::stack(vec![
        checkpoint.linear(&gate, [width, hidden], precision)?,
        checkpoint.linear(&up, [width, hidden], precision)?,
    ])
    .map_err(|e| NativeError::Config {
        path: prefix.into(),
        message: format!("cannot fuse the projections: {e}"),
    })?;
    Ok(Mlp {
        gate_up,
        down: checkpoint.linear(&down, [hidden, width], precision)?,
        width,
        input_scales,
    })
}

/// In a W4A4 checkpoint, the activation global scale of the input `modules` (linear
/// layers under their full names) share, as vLLM applies it to their fused layer: the
/// largest compressed-tensors `input_global_scale` (`process_weights_after_loading` of
/// its compressed-tensors W4A4 scheme), or one over the largest ModelOpt `input_scale`
/// (which vLLM inverts). `None` when the checkpoint quantizes no activations or keeps these
/// modules in 16 bits.
pub(super) fn input_scale(checkpoint: &Checkpoint, modules: &[&str]) -> Result<Option<f32>, NativeError> {
    let quantization = checkpoint.quantization();
    if !quantization.activations() {
        return Ok(None);
    }
    let modelopt = quantization == crate::native::weights::Quantization::Nvfp4W4a4ModelOpt;
    let name = if modelopt {
        "input_scale"
    } else {
        "input_global_scale"
    };
    if !modules
        .first()
        .is_some_and(|m| checkpoint.has(&format!("{m}.{name}")))
    {
        return Ok(None);
    }
    let mut best = f32::NEG_INFINITY;
    for m in modules {
        let values = checkpoint.vector(&format!("{m}.{name}"))?;
        best = values.iter().copied().fold(best, f32::max);
    }
    Ok(Some(if modelopt { 1.0 / best } else { best }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(n: usize, k: usize, value: impl Fn(usize) -> f32) -> Packed {
        let w: Vec<f32> = (0..n * k).map(value).collect();
        Packed::from_f32(&w, n, k).expect("a matrix")
    }

    /// Experts of hidden 8 and width 4 whose router sends every token to experts 1
    /// and 2 (of 4): the others' weights are NaN, so touching them would show.
    fn experts(shared: bool) -> Experts {
        let (hidden, width) = (8, 4);
        let router = matrix(4, hidden, |i| match i / hidden {
            1 => 1.0,
            2 => 0.5,
            _ => -1.0,
        });
        let expert = |e: usize| {
            let value = move |i: usize| {
                if e == 1 || e == 2 {
                    ((i * (e + 3)) as f32 * 0.37).sin()
                } else {
                    f32::NAN
                }
            };
            Mlp {
                input_scales: None,
                gate_up: matrix(2 * width, hidden, value),
                down: matrix(hidden, width, value),
                width,
            }
        };
        let shared = shared.then(|| {
            let value = |i: usize| (i as f32 * 0.11).cos();
            let mlp = Mlp {
                input_scales: None,
                gate_up: matrix(2 * width, hidden, value),
                down: matrix(hidden, width, value),
                width,
            };
            (mlp, vec![0.25; hidden])
        });
        Experts {
            router,
            experts: (0..4).map(expert).collect(),
            top_k: 2,
            norm_topk_prob: true,
            shared,
        }
    }

    fn product(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
        sous_kernels::gemm::matmul(x, rows, w, out);
    }

    #[test]
    fn a_step_reads_only_the_experts_its_tokens_route_to() {
        let rows = 3;
        let x: Vec<f32> = (0..rows * 8).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect();
        for shared in [false, true] {
            let moe = experts(shared);
            let routes = moe.route(&x, rows, &product);
            assert!(
                routes.chunks_exact(2).all(|r| r[0].0 == 1 && r[1].0 == 2),
                "{routes:?}"
            );
            let sum: f32 = routes[..2].iter().map(|r| r.1).sum();
            assert!((sum - 1.0).abs() < 1e-6, "renormalized weights sum to {sum}");
            let mut out = vec![f32::NAN; rows * 8];
            moe.forward(&x, rows, &product, &mut out);
            assert!(out.iter().all(|v| v.is_finite()), "{out:?}");
            // Each row alone gives the same bits as in the batch.
            for r in 0..rows {
                let mut alone = vec![0.0; 8];
                moe.forward(&x[r * 8..(r + 1) * 8], 1, &product, &mut alone);
                assert_eq!(alone, out[r * 8..(r + 1) * 8]);
            }
        }
    }
}

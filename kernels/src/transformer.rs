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

mod attention;
mod bf16;
mod elementwise;
mod exponential;
mod kv;
pub mod linear;
mod rotary;
mod scores;

pub use attention::{attention, attention_bf16_cache};
pub use bf16::{attention_eager_bf16, rms_norm_bf16, round_bf16_all, silu_mul_bf16};
pub use elementwise::{add_assign, rms_norm, rms_norm_heads, rms_norm_row, silu_mul};
pub use exponential::exp;
pub use kv::{KvShape, Span};
pub use rotary::Rotary;

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

#[cfg(test)]
mod tests;

//! Matrix products of the native engine: `out = x · wᵀ` for a linear layer's weight `w`
//! (`[n, k]`, `[out, in]` as checkpoints store it), for one row (a decode step) or
//! hundreds (a prompt chunk), with the weight kept in its stored precision.
//!
//! The weight is repacked once, at load, into column panels of [`NR`] output columns:
//! panel `p` holds `w[16p..16p+16][kk]` for every `kk`, sixteen consecutive values per
//! `kk` (the layout of BLIS's packed B). The micro-kernel keeps an `MR × 16·NP` tile of
//! the output in registers and, for every `kk`, loads sixteen weights per panel, widens
//! them to f32 in registers (bf16 by a shift; NVFP4 by a 16-entry table lookup times the
//! block's scale, which comes from a 256-entry table of the tensor's divisors), and does
//! one fused multiply-add per row and panel with `x[m][kk]` broadcast. The input rows
//! are packed too (`[k][MR]` per block of rows), so every load is sequential. In a
//! product of many rows, where every row tile of a pass reads the same slice of
//! weights, NVFP4 and Q8_0 weights (and bf16 ones on AVX2) are widened once per pass
//! into a small f32 buffer instead of once per tile (`widen`).
//!
//! Why our own and not candle's GEMM (the `gemm` crate): for many rows that crate's
//! AVX-512 kernels need a nightly compiler, its stable AVX2 kernel is several times
//! slower than ours, and it multiplies f32 by f32 only, so bf16 weights had to be widened
//! in memory before every product and NVFP4 weights dequantized at load (the memory of
//! bf16). The numbers: `benchmarks/native.md`, issue 16.
//!
//! The arithmetic is the same on every path (AVX-512, AVX2, NEON, portable): each output is
//! one chain of fused multiply-adds over `kk` in order, starting from zero, so a row's
//! result does not depend on which other rows share its batch, on the blocking, or on
//! the CPU's vector width. An NVFP4 weight is `fp4 value × divisor`, one f32 multiply,
//! exactly [`crate::reference::dequantize`]'s value; the product from packed NVFP4
//! equals the product from the dequantized f32 matrix bit for bit (tested).
//!
//! The kernel in use is chosen at run time ([`Isa::best`]): AVX-512 or AVX2 on x86-64,
//! NEON on aarch64 (every ARMv8-A CPU has it). A user's choice (`SOUS_KERNELS_ISA=avx2`
//! or `=portable`, read by the engine: [`Isa::chosen`]) narrows it, for tests and for
//! measuring the paths an older CPU would take. Every choice a product runs with
//! arrives as a value ([`Tuning`]); nothing here reads the environment.

mod bf16;
mod calibrate;
mod drive;
mod isa;
#[cfg(target_arch = "aarch64")]
mod neon;
mod packed;
mod portable;
mod tile;
mod tuning;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use bf16::{Bf16DotCalibration, matmul_bf16, round_bf16};
pub use calibrate::{BatchCalibration, DecodeCalibration};
pub use drive::{matmul, matmul_with};
pub use isa::Isa;
use packed::{E4M3_UNBIAS, Form, bf16_at, fp4_byte, fp4_table};
pub use packed::{Packed, StackError};
use tile::{Panels, Tile};
pub use tuning::{Choices, KernelPath, Tuning, bf16_dot_available};

/// Output columns per packed panel.
pub const NR: usize = 16;

/// Moves every buffer of `weights` into one mapping advised for transparent huge pages
/// ([`crate::pages`] says why and how). Nothing moves, and `Ok(None)` comes back, where
/// there is nothing to move (whether to place them at all is the caller's choice:
/// `SOUS_HUGE_PAGES`, read by the engine); an error (the mapping could
/// not be made) leaves every buffer where it was. The values are the same bytes either
/// way.
pub fn place(weights: &mut [&mut Packed]) -> std::io::Result<Option<crate::pages::Placement>> {
    crate::pages::place(weights)
}

#[cfg(test)]
mod fp4_dot_tests;
#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod tests;

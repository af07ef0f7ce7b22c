//! Products in bf16 arithmetic ([`matmul_bf16`]): the inputs rounded to bf16, and on a
//! CPU with AVX512-BF16 the dot-product kernel, whose use is measured once per process
//! ([`calibrate_bf16_dot`]). Not here: the f32 kernels it falls back to (`drive`).

use std::sync::atomic::Ordering;

#[cfg(target_arch = "x86_64")]
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
use super::NR;
use super::drive::matmul_with;
#[cfg(target_arch = "x86_64")]
use super::drive::{BY_COLUMNS_MAX, by_columns, row_tasks};
#[cfg(target_arch = "x86_64")]
use super::packed::Data;
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{Isa, Packed};

/// [`matmul`] in bf16 arithmetic: the inputs are rounded to bf16 (to nearest, ties to
/// even) and multiplied with bf16 weights, accumulating in f32, as llama.cpp's and
/// PyTorch's bf16 CPU kernels do. On a CPU with AVX512-BF16, products of bf16 weights
/// use its dot-product instruction (`vdpbf16ps`: two products per lane per instruction,
/// twice the f32 rate, and no widening of the weights); elsewhere the f32 kernels run on
/// the rounded inputs. Either way every product of the same weights takes the same
/// kernel, whatever its number of rows, so a row's bits do not depend on what shares
/// its product (a decode step alone, in a batch, or verifying drafted tokens): the
/// instruction adds its two products in its own order, so mixing it with the f32
/// kernels by row count changed greedy tokens when sequences were batched or
/// speculated. Weights that are not bf16 go through [`matmul`] on the rounded inputs.
///
/// Whether the dot-product instruction is used is measured at load
/// ([`calibrate_bf16_dot`]): it is not faster on every CPU that has it.
pub fn matmul_bf16(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    matmul_bf16_with(BF16_DOT.load(Ordering::Relaxed), x, rows, w, out);
}

/// Whether [`matmul_bf16`] uses AVX512-BF16's dot product
/// where the CPU has it; until [`calibrate_bf16_dot`] measures otherwise, it does.
static BF16_DOT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// [`matmul_bf16`] with the dot-product kernel allowed (`dot`) or not.
pub(super) fn matmul_bf16_with(dot: bool, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let isa = Isa::current();
    #[cfg(target_arch = "x86_64")]
    if let Data::Bf16(_) = w.data
        && dot
        && isa == Isa::Avx512
        && x86::avx512_bf16()
        && w.n.is_multiple_of(NR)
    {
        let (n, k) = (w.n, w.k);
        assert_eq!(x.len(), rows * k, "x is not rows × k");
        assert_eq!(out.len(), rows * n, "out is not rows × n");
        // The inputs are rounded as they are packed, by each task for its own rows,
        // not copied whole first on one thread.
        if rows > BY_COLUMNS_MAX {
            // Many rows (past `BY_COLUMNS_MAX`, as in `matmul_with`): tasks own blocks
            // of rows.
            row_tasks(x, rows, k, x86::DP_MR, out, n).for_each(|(xs, o)| {
                let r = xs.len() / k;
                let a = x86::pack_bf16_pairs(xs, r, k, x86::DP_MR);
                x86::dot_bf16(&a, r, (x86::DP_MR, x86::DP_NP), w, 0, n / NR, o, n);
            });
        } else {
            // A batch of decodes: one block of rows (tiles of 8 rows × 3 panels past
            // 16), tasks own panels.
            let (mr, np) = if rows <= x86::DP_MR_MAX {
                (rows, 1)
            } else {
                (x86::DP_MR, x86::DP_NP)
            };
            let a = x86::pack_bf16_pairs(x, rows, k, mr);
            by_columns(rows, w, np, out, |first, count, c| {
                x86::dot_bf16(&a, rows, (mr, np), w, first, count, c, count * NR);
            });
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = dot;
    let rounded: Vec<f32> = x.iter().map(|&v| round_bf16(v)).collect();
    matmul_with(isa, &rounded, rows, w, out);
}

/// What [`calibrate_bf16_dot`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct Bf16DotCalibration {
    /// Whether bf16 products use the dot-product instruction from now on.
    pub dot: bool,
    /// The fastest of a few 64-row products with it and with the f32 kernels, in
    /// seconds (`None` when `SOUS_BF16_DOT` chose).
    pub seconds: Option<(f64, f64)>,
}

impl std::fmt::Display for Bf16DotCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kernel = if self.dot {
            "AVX512-BF16 dot products"
        } else {
            "f32 multiply-adds on the rounded inputs"
        };
        write!(f, "{kernel}")?;
        match self.seconds {
            None => write!(f, " (SOUS_BF16_DOT)"),
            Some((dot, fma)) => write!(
                f,
                " (measured: dot products {:.2} ms, multiply-adds {:.2} ms)",
                dot * 1e3,
                fma * 1e3
            ),
        }
    }
}

/// Measures 64-row bf16-arithmetic products of `w` (a layer's bf16 matrix) with
/// AVX512-BF16's dot product (`vdpbf16ps`) and with the f32 kernels on the rounded
/// inputs, and keeps the faster for every later [`matmul_bf16`] of the process (the first
/// call decides; later ones return its choice), one row or many (one
/// kernel for all, so that batching never changes a row's bits);
/// `SOUS_BF16_DOT` (`on` or `off`) chooses without measuring. `None` where there is
/// nothing to choose: no AVX512-BF16, or `w` not bf16.
///
/// Why measure: the instruction does two products per lane, but not at the same rate
/// on every CPU: on one Sapphire-Rapids-class Xeon it doubled a layer's speed, on
/// another of the same class it was slower than the f32 kernels, issuing one `vdpbf16ps`
/// every two cycles (BENCHMARKS.md, "Figures that were in code comments").
pub fn calibrate_bf16_dot(w: &Packed) -> Option<Bf16DotCalibration> {
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::current() != Isa::Avx512 || !x86::avx512_bf16() || w.bf16_panels().is_none() || w.n == 0 {
            return None;
        }
        // Once per process: a second engine loaded in it (the tests load many) must not
        // switch the kernel under the first, whose tokens would then change.
        static DECIDED: std::sync::OnceLock<Bf16DotCalibration> = std::sync::OnceLock::new();
        Some(DECIDED.get_or_init(|| measure_bf16_dot(w)).clone())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        None
    }
}

/// [`calibrate_bf16_dot`]'s choice, made and stored.
#[cfg(target_arch = "x86_64")]
fn measure_bf16_dot(w: &Packed) -> Bf16DotCalibration {
    if let Some(choice @ ("on" | "off")) = std::env::var("SOUS_BF16_DOT").ok().as_deref().map(str::trim) {
        let dot = choice == "on";
        BF16_DOT.store(dot, Ordering::Relaxed);
        return Bf16DotCalibration { dot, seconds: None };
    }
    let rows = 64;
    let x: Vec<f32> = (0..rows * w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; rows * w.n];
    let mut fastest = |dot: bool| {
        matmul_bf16_with(dot, &x, rows, w, &mut out);
        (0..3)
            .map(|_| {
                let started = Instant::now();
                matmul_bf16_with(dot, &x, rows, w, &mut out);
                started.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (with_dot, with_fma) = (fastest(true), fastest(false));
    let dot = with_dot <= with_fma;
    BF16_DOT.store(dot, Ordering::Relaxed);
    Bf16DotCalibration {
        dot,
        seconds: Some((with_dot, with_fma)),
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as an f32.
pub fn round_bf16(v: f32) -> f32 {
    let bits = v.to_bits();
    if v.is_nan() {
        return v;
    }
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

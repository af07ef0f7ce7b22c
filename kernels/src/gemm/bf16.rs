//! Products in bf16 arithmetic ([`Tuning::matmul_bf16`]): the inputs rounded to bf16,
//! and on a CPU with AVX512-BF16 the dot-product kernel, whose use the user chooses or
//! a measurement made once per process decides ([`Tuning::calibrate_bf16_dot`]). Not
//! here: the f32 kernels it falls back to (`drive`).

#[cfg(target_arch = "x86_64")]
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
use super::Isa;
#[cfg(target_arch = "x86_64")]
use super::NR;
#[cfg(target_arch = "x86_64")]
use super::drive::{BY_COLUMNS_MAX, by_columns, row_tasks};
#[cfg(target_arch = "x86_64")]
use super::packed::Data;
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{Packed, Tuning};

/// [`Tuning::matmul_bf16`] with the default choices ([`Tuning::default`]).
pub fn matmul_bf16(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    Tuning::default().matmul_bf16(x, rows, w, out);
}

impl Tuning {
    /// [`Tuning::matmul`] in bf16 arithmetic: the inputs are rounded to bf16 (to nearest, ties to
    /// even) and multiplied with bf16 weights, accumulating in f32, as llama.cpp's and
    /// PyTorch's bf16 CPU kernels do. On a CPU with AVX512-BF16, products of bf16 weights
    /// use its dot-product instruction (`vdpbf16ps`: two products per lane per instruction,
    /// twice the f32 rate, and no widening of the weights); elsewhere the f32 kernels run on
    /// the rounded inputs. Either way every product of the same weights takes the same
    /// kernel, whatever its number of rows, so a row's bits do not depend on what shares
    /// its product (a decode step alone, in a batch, or verifying drafted tokens): the
    /// instruction adds its two products in its own order, so mixing it with the f32
    /// kernels by row count changed greedy tokens when sequences were batched or
    /// speculated. Weights that are not bf16 go through [`Tuning::matmul`] on the rounded
    /// inputs.
    ///
    /// Whether the dot-product instruction is used is the tuning's choice (`bf16_dot`),
    /// made at load ([`Tuning::calibrate_bf16_dot`]): it is not faster on every CPU that
    /// has it.
    pub fn matmul_bf16(&self, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
        let (isa, dot) = (self.isa, self.bf16_dot);
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
                // A batch of decodes: tasks own panels, read three side by side in tiles
                // of up to `DP_MR` rows. With one panel a tile, one row's output was a
                // single chain of dot products, each waiting on the one before, and a
                // few rows' chains still left the products short of the memory's pace
                // (benchmarks/native.md, "Decode at the memory wall").
                let mr = rows.min(x86::DP_MR);
                let a = x86::pack_bf16_pairs(x, rows, k, mr);
                by_columns(rows, w, x86::DP_NP, out, |first, count, c| {
                    x86::dot_bf16(&a, rows, (mr, x86::DP_NP), w, first, count, c, count * NR);
                });
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Data::Nvfp4(_) = w.data
            && dot
            && isa == Isa::Avx512
            && x86::avx512_bf16()
            && w.n.is_multiple_of(NR)
        {
            nvfp4_dot(x, rows, w, out);
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (isa, dot);
        let rounded: Vec<f32> = x.iter().map(|&v| round_bf16(v)).collect();
        self.matmul(&rounded, rows, w, out);
    }
}

/// [`Tuning::matmul_bf16`] of NVFP4 weights with the dot-product kernel
/// (`x86::dot_fp4`): many rows (past `BY_COLUMNS_MAX`) in tasks of whole row tiles; a
/// batch of decodes in tasks of panels, one or two rows four panels at a time, more in
/// tiles of `FP4_MR` rows × `FP4_NP` panels, as the many rows are.
#[cfg(target_arch = "x86_64")]
fn nvfp4_dot(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), rows * k, "x is not rows × k");
    assert_eq!(out.len(), rows * n, "out is not rows × n");
    if rows > BY_COLUMNS_MAX {
        row_tasks(x, rows, k, x86::FP4_MR, out, n).for_each(|(xs, o)| {
            let r = xs.len() / k;
            let a = x86::pack_fp4_pairs(xs, r, k, x86::FP4_MR);
            x86::dot_fp4(&a, r, (x86::FP4_MR, x86::FP4_NP), w, 0, n / NR, o, n);
        });
    } else {
        let tile = if rows <= x86::FP4_FEW_MR {
            (rows, x86::FP4_FEW_NP)
        } else {
            (x86::FP4_MR, x86::FP4_NP)
        };
        let a = x86::pack_fp4_pairs(x, rows, k, tile.0);
        by_columns(rows, w, tile.1, out, |first, count, c| {
            x86::dot_fp4(&a, rows, tile, w, first, count, c, count * NR);
        });
    }
}

/// What [`Tuning::calibrate_bf16_dot`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct Bf16DotCalibration {
    /// Whether bf16 products use the dot-product instruction from now on.
    pub dot: bool,
    /// The fastest of a few 64-row products with it and with the f32 kernels, in
    /// seconds (`None` when the user chose: `SOUS_BF16_DOT`).
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

impl Tuning {
    /// Sets whether bf16 arithmetic uses AVX512-BF16's dot product (`vdpbf16ps`):
    /// `choice` (the user's), else the faster of 64-row bf16-arithmetic products of `w`
    /// (a layer's bf16 or NVFP4 matrix) with it and with the f32 kernels on the rounded inputs,
    /// measured once per process (later calls return the first measurement). One
    /// kernel for one row or many, so that batching never changes a row's bits. `None`,
    /// changing nothing, where there is nothing to choose: not the AVX-512 kernels, no
    /// AVX512-BF16, or `w` neither bf16 nor NVFP4.
    ///
    /// Why measure: the instruction does two products per lane, but not at the same rate
    /// on every CPU: on one Sapphire-Rapids-class Xeon it doubled a layer's speed, on
    /// another of the same class it was slower than the f32 kernels, issuing one `vdpbf16ps`
    /// every two cycles (benchmarks/native.md, "Figures that were in code comments").
    pub fn calibrate_bf16_dot(&mut self, w: &Packed, choice: Option<bool>) -> Option<Bf16DotCalibration> {
        #[cfg(target_arch = "x86_64")]
        {
            let dotted = w.bf16_panels().is_some() || matches!(w.data, Data::Nvfp4(_));
            if self.isa != Isa::Avx512 || !x86::avx512_bf16() || !dotted || w.n == 0 {
                return None;
            }
            let calibration = match choice {
                Some(dot) => Bf16DotCalibration { dot, seconds: None },
                // Measured once per process: a second engine loaded in it (the tests
                // load many) makes the same choice as the first, so that the same
                // prompt gives the same tokens in both.
                None => {
                    static MEASURED: std::sync::OnceLock<Bf16DotCalibration> = std::sync::OnceLock::new();
                    MEASURED.get_or_init(|| measure_bf16_dot(*self, w)).clone()
                }
            };
            self.bf16_dot = calibration.dot;
            Some(calibration)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (w, choice);
            None
        }
    }
}

/// The faster of the two kernels of [`Tuning::calibrate_bf16_dot`] on `w`, measured
/// with `tuning`'s other choices.
#[cfg(target_arch = "x86_64")]
fn measure_bf16_dot(tuning: Tuning, w: &Packed) -> Bf16DotCalibration {
    let rows = 64;
    let x: Vec<f32> = (0..rows * w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; rows * w.n];
    let mut fastest = |bf16_dot: bool| {
        let tuning = Tuning { bf16_dot, ..tuning };
        tuning.matmul_bf16(&x, rows, w, &mut out);
        (0..3)
            .map(|_| {
                let started = Instant::now();
                tuning.matmul_bf16(&x, rows, w, &mut out);
                started.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (with_dot, with_fma) = (fastest(true), fastest(false));
    Bf16DotCalibration {
        dot: with_dot <= with_fma,
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

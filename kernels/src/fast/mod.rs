//! The fast path: the reference's arithmetic, reorganised for speed and nothing else.
//!
//! Blocks never cross rows (the row length is a multiple of 16), so a matrix is a flat
//! run of blocks; rayon splits it into chunks of [`CHUNK_BLOCKS`] blocks, and a block
//! kernel quantizes each chunk. The kernel is chosen once per process ([`Kernel::detect`]):
//! AVX2 on x86-64 CPUs that have it, otherwise a portable kernel over fixed-size arrays
//! that the compiler vectorizes for the baseline target (SSE2, NEON).
//!
//! Per-block scale arithmetic is the reference's, with two changes that cannot alter a
//! bit: the E4M3 encoder is c10's integer form ([`crate::formats::fp8::encode_fast`],
//! tested equal to the reference's on every rounding boundary), and the block divisor,
//! a function of the scale byte alone, comes from a 256-entry table computed with the
//! reference's own [`TensorScale::divisor`]. The per-element work (widening, the
//! division, the rounding onto the FP4 grid, packing) is re-written per kernel, and the
//! tests hold every kernel to the reference's bytes.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::BLOCK;
use crate::matrix::{Dtype, Matrix};
use crate::reference::Quantized;
use crate::scale::{BlockKind, TensorScale};
use crate::stats::{BlockCounts, ErrorStats};

/// Blocks per parallel task: 32 Ki elements, 64 KiB of bf16, big enough that task
/// overhead vanishes and small enough to balance two to a hundred cores.
pub const CHUNK_BLOCKS: usize = 2048;

/// A block kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust over `[f32; 16]` blocks, vectorized by the compiler for the baseline
    /// target. Runs everywhere; on aarch64 it is the kernel, compiled to NEON (the
    /// widening, the divisions, the comparisons of the FP4 rounding, four lanes at a
    /// time: the generated code is examined in `benchmarks/aarch64.md`, issue 46).
    Portable,
    /// x86-64 AVX2 intrinsics (and F16C for fp16 sources).
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU runs (detected once).
    pub fn detect() -> Kernel {
        static DETECTED: OnceLock<Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            if Kernel::Avx2.is_available() {
                Kernel::Avx2
            } else {
                Kernel::Portable
            }
        })
    }

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => x86::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 => false,
        }
    }

    /// Every kernel this CPU can run.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Portable, Kernel::Avx2]
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// A short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
        }
    }

    fn quantize_blocks<const STATS: bool>(
        self,
        dtype: Dtype,
        src: &[u8],
        scale: &Prepared,
        packed: &mut [u8],
        scales: &mut [u8],
    ) -> (BlockCounts, ErrorStats) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if x86::available() => {
                x86::quantize_blocks::<STATS>(dtype, src, scale, packed, scales)
            }
            _ => portable::quantize_blocks::<STATS>(dtype, src, scale, packed, scales),
        }
    }

    fn max_abs(self, dtype: Dtype, src: &[u8]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if x86::available() => x86::max_abs(dtype, src),
            _ => portable::max_abs(dtype, src),
        }
    }
}

/// A tensor scale with its divisor table.
pub(crate) struct Prepared {
    pub(crate) scale: TensorScale,
    pub(crate) divisors: [f32; 256],
}

impl Prepared {
    fn new(scale: &TensorScale) -> Prepared {
        let mut divisors = [0.0f32; 256];
        for (code, divisor) in (0..=u8::MAX).zip(divisors.iter_mut()) {
            *divisor = scale.divisor(code);
        }
        Prepared {
            scale: *scale,
            divisors,
        }
    }

    /// The block's scale byte, what happened to it, and its divisor.
    #[inline(always)]
    pub(crate) fn block(&self, bmax: f32) -> (u8, BlockKind, f32) {
        let (code, kind) = self.scale.block_code_fast(bmax);
        (code, kind, self.divisors[usize::from(code)])
    }
}

/// The largest magnitude in the matrix; NaN if it holds a NaN. Same as
/// [`crate::reference::amax`].
pub fn amax(matrix: &Matrix) -> f32 {
    amax_with(Kernel::detect(), matrix)
}

/// [`amax`] with a given kernel.
pub fn amax_with(kernel: Kernel, matrix: &Matrix) -> f32 {
    let chunk = CHUNK_BLOCKS * BLOCK * matrix.dtype().size();
    matrix
        .data()
        .par_chunks(chunk)
        .map(|bytes| kernel.max_abs(matrix.dtype(), bytes))
        .reduce(|| 0.0, nan_max)
}

/// The largest magnitude of a fused group.
pub fn group_amax(members: &[Matrix]) -> f32 {
    members.iter().map(amax).fold(0.0, nan_max)
}

/// A max that lets NaN win, as `torch.amax`.
pub(crate) fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Quantizes `matrix` with the per-tensor `scale`. Same bytes as
/// [`crate::reference::quantize`].
pub fn quantize(matrix: &Matrix, scale: &TensorScale) -> Quantized {
    quantize_with(Kernel::detect(), matrix, scale)
}

/// [`quantize`] with a given kernel.
pub fn quantize_with(kernel: Kernel, matrix: &Matrix, scale: &TensorScale) -> Quantized {
    run::<false>(kernel, matrix, scale).0
}

/// [`quantize`], and the error of the dequantized weights against the originals,
/// measured in the same pass. The sums are taken in a different order than
/// [`crate::reference::error_stats`], so they agree to rounding, not to the bit; they
/// are meaningful for finite weights.
pub fn quantize_with_stats(matrix: &Matrix, scale: &TensorScale) -> (Quantized, ErrorStats) {
    run::<true>(Kernel::detect(), matrix, scale)
}

/// [`quantize_with_stats`] with a given kernel.
pub fn quantize_with_stats_on(
    kernel: Kernel,
    matrix: &Matrix,
    scale: &TensorScale,
) -> (Quantized, ErrorStats) {
    run::<true>(kernel, matrix, scale)
}

fn run<const STATS: bool>(kernel: Kernel, matrix: &Matrix, scale: &TensorScale) -> (Quantized, ErrorStats) {
    let n = matrix.rows() * matrix.cols();
    let mut packed = vec![0u8; n / 2];
    let mut scales = vec![0u8; n / BLOCK];
    let src_chunk = CHUNK_BLOCKS * BLOCK * matrix.dtype().size();
    let scale = &Prepared::new(scale);
    let (blocks, errors) = packed
        .par_chunks_mut(CHUNK_BLOCKS * BLOCK / 2)
        .zip(scales.par_chunks_mut(CHUNK_BLOCKS))
        .zip(matrix.data().par_chunks(src_chunk))
        .map(|((packed, scales), src)| {
            kernel.quantize_blocks::<STATS>(matrix.dtype(), src, scale, packed, scales)
        })
        .reduce(
            || (BlockCounts::default(), ErrorStats::default()),
            |a, b| (a.0.merge(b.0), a.1.merge(b.1)),
        );
    (
        Quantized {
            packed,
            scales,
            blocks,
        },
        errors,
    )
}

/// The dequantized values as f32, row-major. Same values as
/// [`crate::reference::dequantize`].
pub fn dequantize(packed: &[u8], scales: &[u8], scale: &TensorScale) -> Vec<f32> {
    let mut out = vec![0.0f32; packed.len() * 2];
    out.par_chunks_mut(CHUNK_BLOCKS * BLOCK)
        .zip(packed.par_chunks(CHUNK_BLOCKS * BLOCK / 2))
        .zip(scales.par_chunks(CHUNK_BLOCKS))
        .for_each(|((out, packed), scales)| portable::dequantize_blocks(packed, scales, scale, out));
    out
}

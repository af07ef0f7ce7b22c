//! The scalar reference: NVFP4 quantization written to be checked line by line against
//! the tools' own code (compressed-tensors 0.19.0 `quantization/utils/helpers.py` and
//! `quantization/lifecycle/forward_helpers.py`; ModelOpt 0.47.0
//! `modelopt/torch/quantization/qtensor/nvfp4_tensor.py`; the formulas are in
//! `docs/nvfp4.md`, "Scales"), with no concern for speed. The fast path
//! ([`crate::fast`]) must produce the same bytes; the tests hold it to that.

use crate::BLOCK;
use crate::formats::fp4;
use crate::matrix::Matrix;
use crate::scale::TensorScale;
use crate::stats::{BlockCounts, ErrorStats};

/// A quantized matrix in checkpoint layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantized {
    /// `rows x cols/2` bytes, two FP4 codes each, the even column in the low nibble.
    pub packed: Vec<u8>,
    /// `rows x cols/16` E4M3 bytes, row-major (not swizzled).
    pub scales: Vec<u8>,
    /// What happened to the block scales.
    pub blocks: BlockCounts,
}

/// The largest magnitude in the matrix; NaN if it holds a NaN (as `torch.amax`).
pub fn amax(matrix: &Matrix) -> f32 {
    let mut max = 0.0f32;
    for i in 0..matrix.rows() * matrix.cols() {
        let a = matrix.get(i).abs();
        if a.is_nan() || max.is_nan() {
            max = f32::NAN;
        } else if a > max {
            max = a;
        }
    }
    max
}

/// The largest magnitude of a fused group: the max of the members' amaxes.
pub fn group_amax(members: &[Matrix]) -> f32 {
    members.iter().map(amax).fold(0.0f32, |max, a| {
        if a.is_nan() || max.is_nan() {
            f32::NAN
        } else {
            max.max(a)
        }
    })
}

/// Quantizes `matrix` with the per-tensor `scale` (from the amax of its fused group).
pub fn quantize(matrix: &Matrix, scale: &TensorScale) -> Quantized {
    let n = matrix.rows() * matrix.cols();
    let mut codes = Vec::with_capacity(n);
    let mut scales = Vec::with_capacity(n / BLOCK);
    let mut blocks = BlockCounts::default();
    for start in (0..n).step_by(BLOCK) {
        let weights: Vec<f32> = (start..start + BLOCK).map(|i| matrix.get(i)).collect();
        // Block amax, NaN-propagating like the tensor amax.
        let mut bmax = 0.0f32;
        for w in &weights {
            bmax = if w.is_nan() || bmax.is_nan() {
                f32::NAN
            } else {
                bmax.max(w.abs())
            };
        }
        let block = scale.block(bmax);
        scales.push(block.code);
        blocks.add(block.kind);
        for w in weights {
            // One IEEE f32 division, then round onto the grid (clamping to ±6 inside).
            codes.push(fp4::encode(w / block.divisor));
        }
    }
    let packed = codes
        .chunks_exact(2)
        .map(|pair| fp4::pack(pair[0], pair[1]))
        .collect();
    Quantized {
        packed,
        scales,
        blocks,
    }
}

/// The f32 values `packed`/`scales` stand for, row-major (`rows * cols` of them):
/// `fp4 value * scale factor`, one f32 multiply, as both tools dequantize before the
/// final cast to the model dtype.
pub fn dequantize(packed: &[u8], scales: &[u8], scale: &TensorScale) -> Vec<f32> {
    let mut out = Vec::with_capacity(packed.len() * 2);
    for (b, &code) in scales.iter().enumerate() {
        let factor = scale.divisor(code);
        for &byte in &packed[b * BLOCK / 2..(b + 1) * BLOCK / 2] {
            for nibble in fp4::unpack(byte) {
                out.push(fp4::decode(nibble) * factor);
            }
        }
    }
    out
}

/// Compares the dequantized values with the original matrix.
pub fn error_stats(matrix: &Matrix, packed: &[u8], scales: &[u8], scale: &TensorScale) -> ErrorStats {
    let mut stats = ErrorStats::default();
    for (i, value) in dequantize(packed, scales, scale).into_iter().enumerate() {
        stats.add(matrix.get(i), value);
    }
    stats
}

//! NVFP4 activations (W4A4): each block of 16 values of a row quantized to FP4 under
//! an FP8 scale computed at run time and a calibrated per-tensor global scale, then
//! dequantized, so the products see exactly the values an FP4 tensor core would.
//!
//! The arithmetic is vLLM's emulation of NVFP4 activation quantization
//! (`ref_nvfp4_quant` in `vllm/model_executor/layers/quantization/utils/
//! nvfp4_emulation_utils.py`, 0.33.0), which its CUDA kernel (`cvt_warp_fp16_to_fp4`)
//! matches: all in f32,
//!
//! ```text
//! scale = e4m3(clamp(gs * (amax(block) * (1/6)), -448, 448))
//! q     = e2m1(clamp(x * (1 / (scale * (1/gs))), -6, 6))      (q = 0 when scale = 0)
//! x'    = q * (scale / gs)
//! ```
//!
//! with `gs` the checkpoint's `input_global_scale` (compressed-tensors stores the
//! multiplier, about 2688 / amax; vLLM uses it as `input_global_scale_inv`).

use crate::formats::{fp4, fp8};

/// Values per block.
pub const BLOCK: usize = 16;

/// Quantizes and dequantizes `x` in place, block by block (`x.len()` a multiple of 16;
/// rows of a matrix whose width is a multiple of 16 may be passed whole). A trailing
/// partial block is quantized as a block of its own.
pub fn quantize_dequantize_nvfp4(x: &mut [f32], global_scale: f32) {
    let inv_gs = 1.0 / global_scale;
    for block in x.chunks_mut(BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = (global_scale * (amax * (1.0 / fp4::MAX))).clamp(-fp8::MAX, fp8::MAX);
        let scale = fp8::decode(fp8::encode(scale));
        let (to_fp4, back) = if scale == 0.0 || !scale.is_finite() {
            (0.0, 0.0)
        } else {
            (1.0 / (scale * inv_gs), scale / global_scale)
        };
        for v in block.iter_mut() {
            *v = fp4::decode(fp4::encode((*v * to_fp4).clamp(-fp4::MAX, fp4::MAX))) * back;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_lands_on_its_fp4_grid() {
        // amax 6 with gs = 448: scale = e4m3(448 * 6 / 6) = 448, x' = code * (448/448).
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.4 - 3.0).collect();
        x[15] = 6.0;
        quantize_dequantize_nvfp4(&mut x, 448.0);
        for (i, v) in x.iter().enumerate() {
            assert!(fp4::GRID.contains(&v.abs()), "{i}: {v}");
        }
        assert_eq!(x[15], 6.0);
        assert_eq!(x[0], -3.0);
        assert_eq!(x[1], -3.0, "-2.6 rounds to -3");
        assert_eq!(x[7], 0.0, "-0.2 rounds to 0");
    }

    #[test]
    fn zeros_stay_zero_and_scales_follow_the_global_scale() {
        let mut zeros = vec![0.0f32; 32];
        quantize_dequantize_nvfp4(&mut zeros, 100.0);
        assert!(zeros.iter().all(|&v| v == 0.0));
        // Values near a block's amax come back within an FP4 step of the block scale.
        let mut x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13).collect();
        let original = x.clone();
        let gs = 2688.0 / 1.5;
        quantize_dequantize_nvfp4(&mut x, gs);
        for (block, (q, o)) in x.chunks(16).zip(original.chunks(16)).enumerate() {
            let amax = o.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b) in q.iter().zip(o) {
                // The largest FP4 step is 2 (4 -> 6) in units of amax / 6, and the FP8 scale is
                // within 6.25 % of exact.
                assert!(
                    (a - b).abs() <= amax / 6.0 * 1.1 + 1e-6,
                    "block {block}: {a} vs {b}"
                );
            }
        }
    }
}

//! The two-level NVFP4 scales: one FP32 value per tensor (or per fused group) and one
//! FP8 E4M3 value per block of 16, computed exactly as each tool computes them
//! (`docs/nvfp4.md`, "Scales"), plus the divisor every element of a block is divided by.
//!
//! compressed-tensors stores a *multiplier* (`weight_global_scale ≈ 2688 / amax`) and
//! divides by it when dequantizing; ModelOpt stores a *divisor*
//! (`weight_scale_2 ≈ amax / 2688`) and multiplies. Their roundings differ, so the same
//! weights give slightly different bytes; each flavour reproduces its own tool.

use crate::formats::bf16::round_bf16;
use crate::formats::{fp4, fp8};
use crate::matrix::Dtype;

/// Which tool's arithmetic and conventions to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// compressed-tensors 0.19 as llm-compressor 0.14 drives it (`weight_global_scale`).
    CompressedTensors,
    /// ModelOpt 0.47 exporting on a GPU, the normal case and what published ModelOpt
    /// checkpoints hold: `weight_scale_2 = amax * f32(1/2688)`, because PyTorch's CUDA
    /// `tensor / python_float` multiplies by the reciprocal (`div_true_kernel_cuda`).
    ModelOptGpu,
    /// ModelOpt 0.47 exporting on a CPU: `weight_scale_2 = amax / 2688` (a true division).
    /// Differs from [`Flavor::ModelOptGpu`] by one ulp for about 21 % of amax values.
    ModelOptCpu,
}

/// What happened to a block's scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// The block's scale is representable in E4M3.
    Normal,
    /// Every weight in the block is zero; the tool's placeholder scale is written.
    Zero,
    /// The scale was above 448 and was clamped: the block's largest weights are clipped.
    Saturated,
    /// The block is not zero but its scale is below what E4M3 represents; the tool's
    /// placeholder scale is written and the block mostly quantizes to zero.
    Underflow,
}

/// One block's FP8 scale and what its elements are divided by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Block {
    /// The E4M3 byte written to `weight_scale`.
    pub code: u8,
    /// Element `w` of the block quantizes to `fp4::encode(w / divisor)` and dequantizes
    /// to `fp4::decode(code) * divisor` (see [`TensorScale::divisor`]).
    pub divisor: f32,
    /// Whether the scale was representable.
    pub kind: BlockKind,
}

/// The precision compressed-tensors' scale arithmetic runs in: the weight's own dtype,
/// because the observer's min/max keep it (llm-compressor 0.14.0.1
/// `observers/min_max.py` returns the weight's dtype; `docs/nvfp4.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arith {
    /// bf16 weights: every intermediate rounded to bf16.
    Bf16,
    /// f32 weights, and f16 weights (see [`TensorScale::from_amax`]).
    F32,
}

impl Arith {
    fn of(dtype: Dtype) -> Arith {
        match dtype {
            Dtype::Bf16 => Arith::Bf16,
            Dtype::F16 | Dtype::F32 => Arith::F32,
        }
    }

    fn round(self, x: f32) -> f32 {
        match self {
            Arith::Bf16 => round_bf16(x),
            Arith::F32 => x,
        }
    }
}

/// `f32(1 / 2688)`, the reciprocal PyTorch's CUDA division multiplies by.
const INV_2688: f32 = f32::from_bits(0x39C3_0C31);

/// 0.125 in E4M3: compressed-tensors' replacement for a zero block scale
/// (`_get_dtype_eps(float8_e4m3fn)`).
const CT_ZERO_SCALE: u8 = 0x20;

/// ModelOpt 0.47's smallest block scale, 2^-9 (the smallest E4M3 subnormal).
const MO_SMALLEST: f32 = 0.001953125;

/// FP8 max times FP4 max: the per-tensor scale maps the tensor's amax to this.
const FP8_TIMES_FP4: f32 = fp8::MAX * fp4::MAX;

/// The per-tensor scale of one tensor or fused group, ready to scale its blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorScale {
    flavor: Flavor,
    arith: Arith,
    value: f32,
}

impl TensorScale {
    /// The scale for weights of type `dtype` whose largest magnitude is `amax` (over the
    /// whole fused group). A NaN `amax` (the tensor holds a NaN) follows the tools:
    /// compressed-tensors' `nan_to_num` makes the scale 1.0; ModelOpt keeps NaN.
    ///
    /// compressed-tensors on fp16 weights computes in fp16, where `2688 / amax`
    /// overflows for amax below about 0.041 and silently becomes 1.0, zeroing most of the
    /// layer (`docs/nvfp4.md`, compressed-tensors' global scale). sous does not
    /// reproduce that bug: fp16 weights are
    /// scaled in f32, as f32 weights are.
    pub fn from_amax(flavor: Flavor, dtype: Dtype, amax: f32) -> TensorScale {
        let arith = Arith::of(dtype);
        let value = match flavor {
            Flavor::CompressedTensors => {
                // compressed-tensors `generate_gparam` (`quantization/utils/helpers.py`):
                // clamp(min=finfo.tiny), then `2688 / amax`, which PyTorch evaluates as
                // `amax.reciprocal() * 2688` (`Tensor.__rtruediv__`), each step rounded
                // to the weight dtype; then `nan_to_num(nan=1, posinf=1, neginf=1)`.
                // `amax < tiny` is false for NaN, so a NaN passes through as torch's
                // clamp lets it.
                let tiny = f32::MIN_POSITIVE;
                let a = if amax < tiny { tiny } else { amax };
                let reciprocal = arith.round(1.0 / a);
                let scale = arith.round(reciprocal * FP8_TIMES_FP4);
                if scale.is_finite() { scale } else { 1.0 }
            }
            // ModelOpt `get_weights_scaling_factor_2_from_quantizer`: `amax / (6 * 448)`.
            Flavor::ModelOptGpu => amax * INV_2688,
            Flavor::ModelOptCpu => amax / FP8_TIMES_FP4,
        };
        TensorScale { flavor, arith, value }
    }

    /// A scale read back from a checkpoint (`weight_global_scale` for
    /// compressed-tensors, `weight_scale_2` for ModelOpt), for dequantizing.
    pub fn from_value(flavor: Flavor, dtype: Dtype, value: f32) -> TensorScale {
        TensorScale {
            flavor,
            arith: Arith::of(dtype),
            value,
        }
    }

    /// Whether [`TensorScale::divisor`] divides the E4M3 value by [`TensorScale::value`]
    /// (compressed-tensors) rather than multiplying it (ModelOpt).
    pub fn divides(&self) -> bool {
        matches!(self.flavor, Flavor::CompressedTensors)
    }

    /// The stored value: `weight_global_scale` or `weight_scale_2`.
    pub fn value(&self) -> f32 {
        self.value
    }

    /// The tool this scale follows.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Whether compressed-tensors' intermediates round to bf16 (bf16 weights).
    pub(crate) fn rounds_to_bf16(&self) -> bool {
        self.arith == Arith::Bf16
    }

    /// The scale of a block whose largest magnitude is `bmax`.
    pub fn block(&self, bmax: f32) -> Block {
        let (code, kind) = self.block_code(bmax, fp8::encode);
        Block {
            code,
            divisor: self.divisor(code),
            kind,
        }
    }

    /// [`TensorScale::block`]'s code and kind, with the branch-light E4M3 encoder of the
    /// fast path (its equality with [`fp8::encode`] is tested on every rounding
    /// boundary). The divisor is then a lookup of [`TensorScale::divisor`].
    pub(crate) fn block_code_fast(&self, bmax: f32) -> (u8, BlockKind) {
        self.block_code(bmax, fp8::encode_fast)
    }

    #[inline(always)]
    fn block_code(&self, bmax: f32, encode: impl Fn(f32) -> u8) -> (u8, BlockKind) {
        match self.flavor {
            Flavor::CompressedTensors => self.ct_block(bmax, encode),
            Flavor::ModelOptGpu | Flavor::ModelOptCpu => self.mo_block(bmax, encode),
        }
    }

    /// What every element of a block with scale byte `code` is divided by:
    /// compressed-tensors `_quantize` divides by `scale / global_scale` (two f32
    /// divisions in this order, never reordered); ModelOpt `NVFP4QTensor.quantize` by
    /// `e4m3 * weight_scale_2`. It is also the dequantization factor.
    pub fn divisor(&self, code: u8) -> f32 {
        match self.flavor {
            Flavor::CompressedTensors => fp8::decode(code) / self.value,
            Flavor::ModelOptGpu | Flavor::ModelOptCpu => fp8::decode(code) * self.value,
        }
    }

    /// compressed-tensors `calculate_qparams` for `TENSOR_GROUP`:
    /// `bmax / 6` in the weight dtype, times the global scale in f32, clamped to ±448,
    /// cast to E4M3, and a zero scale replaced by 0.125 (`_get_dtype_eps`).
    #[inline(always)]
    fn ct_block(&self, bmax: f32, encode: impl Fn(f32) -> u8) -> (u8, BlockKind) {
        let per_block = self.arith.round(bmax / fp4::MAX);
        let scaled = self.value * per_block;
        let code = encode(scaled.clamp(-fp8::MAX, fp8::MAX));
        if code & 0x7F == 0 {
            let kind = if bmax == 0.0 {
                BlockKind::Zero
            } else {
                BlockKind::Underflow
            };
            (CT_ZERO_SCALE, kind)
        } else if scaled > fp8::MAX {
            (code, BlockKind::Saturated)
        } else {
            (code, BlockKind::Normal)
        }
    }

    /// ModelOpt 0.47 `NVFP4QTensor.get_weights_scaling_factor`:
    /// `bmax / (6 * weight_scale_2)` in f32, a zero scale replaced by 1.0, clamped to
    /// `[2^-9, 448]` (added after Model-Optimizer #1633), cast to E4M3.
    ///
    /// One deliberate difference: for an all-zero tensor (`weight_scale_2 = 0`)
    /// ModelOpt computes `0 / 0` and writes NaN block scales, which make engines
    /// output NaN; here every block of it is a zero block with scale 1.0, and the
    /// tensor dequantizes to zeros.
    #[inline(always)]
    fn mo_block(&self, bmax: f32, encode: impl Fn(f32) -> u8) -> (u8, BlockKind) {
        let per_block = if self.value == 0.0 {
            0.0
        } else {
            bmax / (fp4::MAX * self.value)
        };
        if per_block == 0.0 {
            let kind = if bmax == 0.0 {
                BlockKind::Zero
            } else {
                BlockKind::Underflow
            };
            return (encode(1.0), kind);
        }
        let code = encode(per_block.clamp(MO_SMALLEST, fp8::MAX));
        let kind = if per_block < MO_SMALLEST {
            BlockKind::Underflow
        } else if per_block > fp8::MAX {
            BlockKind::Saturated
        } else {
            BlockKind::Normal
        };
        (code, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_global_scale_is_bf16_rounded_twice() {
        // The real checkpoint's values are bf16-representable.
        let scale = TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, 1.8515625);
        assert_eq!(scale.value(), round_bf16(scale.value()));
        // amax = 0 is clamped to tiny; 2688 / tiny overflows, and nan_to_num gives 1.
        assert_eq!(
            TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, 0.0).value(),
            1.0
        );
        assert_eq!(
            TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, f32::NAN).value(),
            1.0
        );
        // f32 weights: no rounding, 1/0.03 * 2688 in f32 (reference: 89600.0078125).
        let f32_scale = TensorScale::from_amax(Flavor::CompressedTensors, Dtype::F32, 0.03);
        assert_eq!(f32_scale.value(), (1.0f32 / 0.03) * 2688.0);
        assert_eq!(f32_scale.value(), f32::from_bits(0x47AF_0001)); // 89600.0078125
    }

    #[test]
    fn modelopt_devices_differ_by_the_division() {
        let amax = 0.007625;
        assert_eq!(
            TensorScale::from_amax(Flavor::ModelOptCpu, Dtype::Bf16, amax).value(),
            amax / 2688.0
        );
        assert_eq!(
            TensorScale::from_amax(Flavor::ModelOptGpu, Dtype::Bf16, amax).value(),
            amax * (1.0f32 / 2688.0)
        );
    }

    #[test]
    fn constants() {
        assert_eq!(fp8::decode(CT_ZERO_SCALE), 0.125);
        assert_eq!(MO_SMALLEST, 2f32.powi(-9));
        assert_eq!(INV_2688, 1.0f32 / 2688.0);
    }

    #[test]
    fn placeholder_scales() {
        let ct = TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, 1.0);
        let zero = ct.block(0.0);
        assert_eq!((zero.code, zero.kind), (0x20, BlockKind::Zero));
        let tiny = ct.block(1e-30);
        assert_eq!((tiny.code, tiny.kind), (0x20, BlockKind::Underflow));
        let mo = TensorScale::from_amax(Flavor::ModelOptGpu, Dtype::Bf16, 1.0);
        let zero = mo.block(0.0);
        assert_eq!((fp8::decode(zero.code), zero.kind), (1.0, BlockKind::Zero));
        let tiny = mo.block(1e-30);
        assert_eq!(
            (fp8::decode(tiny.code), tiny.kind),
            (2f32.powi(-9), BlockKind::Underflow)
        );
    }

    #[test]
    fn scales_never_encode_nan_for_finite_weights() {
        for flavor in [
            Flavor::CompressedTensors,
            Flavor::ModelOptGpu,
            Flavor::ModelOptCpu,
        ] {
            for amax in [1e-30f32, 1e-3, 1.0, 3e38] {
                let scale = TensorScale::from_amax(flavor, Dtype::Bf16, amax);
                for bmax in [0.0, amax * 1e-9, amax * 0.5, amax] {
                    let block = scale.block(bmax);
                    assert_ne!(block.code & 0x7F, fp8::NAN, "{flavor:?} amax {amax} bmax {bmax}");
                }
            }
        }
    }
}

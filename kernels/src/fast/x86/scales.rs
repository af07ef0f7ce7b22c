//! Eight block scales at once: the reference's per-block arithmetic
//! ([`crate::scale::TensorScale::block`]) in AVX2 lanes, for both flavours: the same
//! f32 operations in the same order, bf16 rounding and the E4M3 encoder as integer
//! operations on the bits (c10's `fp8e4m3fn_from_fp32_value`, as
//! [`crate::formats::fp8::encode_fast`]), and NaN kept where the scalar code keeps it.
//! Divisors come from the same table the scalar path reads.

use std::arch::x86_64::*;

use crate::fast::Prepared;
use crate::formats::{fp4, fp8};
use crate::scale::Flavor;
use crate::stats::BlockCounts;

/// Eight blocks' scale bytes (one per 32-bit lane) and divisors.
pub(super) struct Scales8 {
    pub codes: __m256i,
    pub divisors: __m256,
}

/// The scales of eight blocks whose maxima are `bmax`; counts their kinds.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn scales8(prepared: &Prepared, bmax: __m256, counts: &mut BlockCounts) -> Scales8 {
    let scale = &prepared.scale;
    let value = scale.value();
    let bmax_zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(bmax, _mm256_setzero_ps());
    let (codes, zero, underflow, saturated) = match scale.flavor() {
        Flavor::CompressedTensors => {
            let quotient = _mm256_div_ps(bmax, _mm256_set1_ps(fp4::MAX));
            let per_block = if scale.rounds_to_bf16() {
                round_bf16(quotient)
            } else {
                quotient
            };
            let scaled = _mm256_mul_ps(_mm256_set1_ps(value), per_block);
            let codes = encode_e4m3(clamp(scaled, -fp8::MAX, fp8::MAX));
            let placeholder = _mm256_cmpeq_epi32(
                _mm256_and_si256(codes, _mm256_set1_epi32(0x7F)),
                _mm256_setzero_si256(),
            );
            let placeholder = _mm256_castsi256_ps(placeholder);
            let codes = blend(codes, _mm256_set1_epi32(0x20), placeholder);
            let over = _mm256_cmp_ps::<_CMP_GT_OQ>(scaled, _mm256_set1_ps(fp8::MAX));
            (
                codes,
                _mm256_and_ps(placeholder, bmax_zero),
                _mm256_andnot_ps(bmax_zero, placeholder),
                _mm256_andnot_ps(placeholder, over),
            )
        }
        Flavor::ModelOptGpu | Flavor::ModelOptCpu => {
            // The scalar code divides by `6 * value` computed in f32, and treats an
            // all-zero tensor (value 0) as all zero blocks.
            let per_block = if value == 0.0 {
                _mm256_setzero_ps()
            } else {
                _mm256_div_ps(bmax, _mm256_set1_ps(fp4::MAX * value))
            };
            let smallest = 0.001_953_125; // 2^-9
            let replaced = _mm256_cmp_ps::<_CMP_EQ_OQ>(per_block, _mm256_setzero_ps());
            let codes = encode_e4m3(clamp(per_block, smallest, fp8::MAX));
            let codes = blend(codes, _mm256_set1_epi32(0x38), replaced); // 1.0
            let small = _mm256_cmp_ps::<_CMP_LT_OQ>(per_block, _mm256_set1_ps(smallest));
            let over = _mm256_cmp_ps::<_CMP_GT_OQ>(per_block, _mm256_set1_ps(fp8::MAX));
            (
                codes,
                _mm256_and_ps(replaced, bmax_zero),
                _mm256_or_ps(
                    _mm256_andnot_ps(bmax_zero, replaced),
                    _mm256_andnot_ps(replaced, small),
                ),
                _mm256_andnot_ps(replaced, over),
            )
        }
    };
    let count = |mask: __m256| u64::from(_mm256_movemask_ps(mask).count_ones());
    counts.total += 8;
    counts.zero += count(zero);
    counts.underflow += count(underflow);
    counts.saturated += count(saturated);
    // SAFETY: every code is a byte (0..=255), a valid index into the 256-entry table.
    let divisors = unsafe { _mm256_i32gather_ps::<4>(prepared.divisors.as_ptr(), codes) };
    Scales8 { codes, divisors }
}

/// Lanes of `b` where `mask` is set, of `a` elsewhere.
#[inline]
#[target_feature(enable = "avx2")]
fn blend(a: __m256i, b: __m256i, mask: __m256) -> __m256i {
    _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(a),
        _mm256_castsi256_ps(b),
        mask,
    ))
}

/// `x.clamp(lo, hi)` as Rust computes it: a NaN stays a NaN (`maxps`/`minps` return
/// their second operand when either is NaN).
#[inline]
#[target_feature(enable = "avx2")]
fn clamp(x: __m256, lo: f32, hi: f32) -> __m256 {
    _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x))
}

/// [`crate::formats::bf16::round_bf16`] in every lane.
#[inline]
#[target_feature(enable = "avx2")]
fn round_bf16(x: __m256) -> __m256 {
    let bits = _mm256_castps_si256(x);
    let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let biased = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
    let rounded = _mm256_and_si256(biased, _mm256_set1_epi32(0xFFFF_0000_u32 as i32));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_set1_ps(f32::NAN), nan)
}

/// [`crate::formats::fp8::encode_fast`] in every lane: E4M3 codes in 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn encode_e4m3(v: __m256) -> __m256i {
    let bits = _mm256_castps_si256(v);
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
    let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F80_0000));
    let overflow = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x43F0_0000 - 1));
    let subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(121 << 23), magnitude);
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
    // Subnormal: one float addition of 2^14 rounds onto E4M3's 2^-9 grid.
    let magic = _mm256_set1_epi32(141 << 23);
    let sum = _mm256_add_ps(_mm256_castsi256_ps(magnitude), _mm256_castsi256_ps(magic));
    let sub_code = _mm256_sub_epi32(_mm256_castps_si256(sum), magic);
    // Normal: rebias the exponent, round the 20 dropped bits half to even.
    let odd = _mm256_and_si256(_mm256_srli_epi32::<20>(magnitude), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(
        _mm256_sub_epi32(magnitude, _mm256_set1_epi32(120 << 23)),
        _mm256_add_epi32(_mm256_set1_epi32(0x7_FFFF), odd),
    );
    let normal_code = _mm256_srli_epi32::<20>(rounded);
    let code = blend(normal_code, sub_code, _mm256_castsi256_ps(subnormal));
    let nan_code = _mm256_set1_epi32(i32::from(fp8::NAN));
    let code = blend(code, nan_code, _mm256_castsi256_ps(overflow));
    let code = _mm256_or_si256(code, sign);
    blend(code, nan_code, _mm256_castsi256_ps(nan))
}

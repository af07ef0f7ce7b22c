//! FP4 codes in AVX2 registers: eight scaled values to codes (the reference's
//! thresholds as ordered compares), codes back to values, and sixteen codes per block
//! packed two to a byte.

use std::arch::x86_64::*;

/// FP4 codes (0..=15 in each 32-bit lane) of eight scaled values.
///
/// The clamp to ±6 the reference applies first is left out: it changes neither the
/// sign nor any comparison (everything above 5 is code 7 either way, and a NaN stays a
/// NaN, for which every ordered compare is false, as Rust's `>` and `>=` are).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn encode(y: __m256) -> __m256i {
    let a = _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
    // Each true comparison is all ones (-1): subtracting it counts it.
    let mut magnitude = _mm256_setzero_si256();
    let gt = |t: f32| _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(a, _mm256_set1_ps(t)));
    let ge = |t: f32| _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(t)));
    magnitude = _mm256_sub_epi32(magnitude, gt(0.25));
    magnitude = _mm256_sub_epi32(magnitude, ge(0.75));
    magnitude = _mm256_sub_epi32(magnitude, gt(1.25));
    magnitude = _mm256_sub_epi32(magnitude, ge(1.75));
    magnitude = _mm256_sub_epi32(magnitude, gt(2.5));
    magnitude = _mm256_sub_epi32(magnitude, ge(3.5));
    magnitude = _mm256_sub_epi32(magnitude, gt(5.0));
    let negative = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(y, _mm256_setzero_ps()));
    _mm256_or_si256(magnitude, _mm256_and_si256(negative, _mm256_set1_epi32(8)))
}

/// The values eight FP4 codes stand for in a block scaled by `factor`: the grid
/// value, its sign, one f32 multiply (the reference's dequantization).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn decode(codes: __m256i, factor: __m256) -> __m256 {
    let grid = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    // The permutation uses the low three bits of each index: the magnitude code.
    let magnitude = _mm256_permutevar8x32_ps(grid, codes);
    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(codes, _mm256_set1_epi32(8)));
    _mm256_mul_ps(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign)), factor)
}

/// Codes of one block (elements 0..8 in `lo`, 8..16 in `hi`) as 32-bit lanes
/// `[B0 B1 B4 B5 | B2 B3 B6 B7]`, where byte `Bj = code(2j) | code(2j+1) << 4`.
#[inline]
#[target_feature(enable = "avx2")]
fn pair_up(lo: __m256i, hi: __m256i) -> __m256i {
    // 16-bit lanes [lo0..lo3 hi0..hi3 | lo4..lo7 hi4..hi7]; then each adjacent pair
    // (even, odd) becomes even + 16 * odd = even | odd << 4.
    let words = _mm256_packus_epi32(lo, hi);
    _mm256_madd_epi16(words, _mm256_set1_epi32(0x0010_0001))
}

/// Two blocks' codes (`a` and `b`, each as (elements 0..8, elements 8..16)) as the
/// sixteen packed bytes of those blocks, element `2j` in the low nibble of byte `j`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pack2(a: (__m256i, __m256i), b: (__m256i, __m256i)) -> __m128i {
    let (pa, pb) = (pair_up(a.0, a.1), pair_up(b.0, b.1));
    // 16-bit lanes [aB0 aB1 aB4 aB5 bB0 bB1 bB4 bB5 | aB2 aB3 aB6 aB7 bB2 bB3 bB6 bB7].
    let words = _mm256_packus_epi32(pa, pb);
    // The same as bytes, in the low half of each 128-bit lane.
    let bytes = _mm256_packus_epi16(words, words);
    // Interleave 16-bit pairs of the two lanes: aB0..aB7 bB0..bB7.
    _mm_unpacklo_epi16(
        _mm256_castsi256_si128(bytes),
        _mm256_extracti128_si256::<1>(bytes),
    )
}

/// One block's codes as its eight packed bytes (the low half of [`pack2`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pack1(a: (__m256i, __m256i)) -> u64 {
    _mm_cvtsi128_si64(pack2(a, a)) as u64
}

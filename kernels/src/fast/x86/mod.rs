//! The AVX2 kernels for x86-64. A group of 64 blocks goes through three passes:
//! each block's amax (vector max of the magnitude bits), the scales of eight blocks
//! at a time (`scales.rs`), then the elements, two blocks at a time: sixteen elements
//! as two 8-lane vectors, two `vdivps`, seven ordered compares for the grid
//! (`codes.rs`), one 16-byte store of packed codes.
//!
//! Same arithmetic as the reference, step for step: the weight is widened exactly
//! (bf16 by a shift, fp16 by F16C), divided once by the block's divisor with IEEE
//! single precision, and compared with the same thresholds.

// The one place in the workspace that needs `unsafe` (this module and its two
// submodules): loads and stores through raw pointers, gathers, and calling
// `#[target_feature]` functions once the CPU has been checked for the feature.
#![allow(unsafe_code)]

mod codes;
mod scales;

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::Prepared;
use super::portable::{f32_bits_to_f32, half_bits_to_f32};
use crate::BLOCK;
use crate::matrix::Dtype;
use crate::stats::{BlockCounts, ErrorStats};

/// Whether the CPU has AVX2 and F16C (every AVX2 CPU shipped has both).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
}

pub(super) fn quantize_blocks<const STATS: bool>(
    dtype: Dtype,
    src: &[u8],
    scale: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
) -> (BlockCounts, ErrorStats) {
    assert!(available(), "the AVX2 kernel needs AVX2 and F16C");
    // SAFETY: the CPU supports AVX2 and F16C, checked just above.
    unsafe {
        match dtype {
            Dtype::Bf16 => quantize_bf16::<STATS>(src, scale, packed, scales),
            Dtype::F16 => quantize_f16::<STATS>(src, scale, packed, scales),
            Dtype::F32 => quantize_f32::<STATS>(src, scale, packed, scales),
        }
    }
}

pub(super) fn max_abs(dtype: Dtype, src: &[u8]) -> f32 {
    assert!(available(), "the AVX2 kernel needs AVX2 and F16C");
    // SAFETY: the CPU supports AVX2 and F16C, checked just above.
    unsafe {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => half_bits_to_f32(dtype, max_abs_bits16(src)),
            Dtype::F32 => f32_bits_to_f32(max_abs_bits32(src)),
        }
    }
}

#[target_feature(enable = "avx2,f16c")]
fn quantize_bf16<const STATS: bool>(
    src: &[u8],
    scale: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
) -> (BlockCounts, ErrorStats) {
    quantize_with::<STATS>(
        src,
        32,
        scale,
        packed,
        scales,
        |bytes| {
            let raw = load256(bytes);
            let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256::<1>(raw));
            half_bits_to_f32(Dtype::Bf16, hmax16(lo, hi))
        },
        |bytes| {
            let raw = load256(bytes);
            let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256::<1>(raw));
            let w0 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(lo)));
            let w1 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(hi)));
            (w0, w1)
        },
    )
}

#[target_feature(enable = "avx2,f16c")]
fn quantize_f16<const STATS: bool>(
    src: &[u8],
    scale: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
) -> (BlockCounts, ErrorStats) {
    quantize_with::<STATS>(
        src,
        32,
        scale,
        packed,
        scales,
        |bytes| {
            let raw = load256(bytes);
            let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256::<1>(raw));
            half_bits_to_f32(Dtype::F16, hmax16(lo, hi))
        },
        |bytes| {
            let raw = load256(bytes);
            let (lo, hi) = (_mm256_castsi256_si128(raw), _mm256_extracti128_si256::<1>(raw));
            (_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi))
        },
    )
}

#[target_feature(enable = "avx2,f16c")]
fn quantize_f32<const STATS: bool>(
    src: &[u8],
    scale: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
) -> (BlockCounts, ErrorStats) {
    quantize_with::<STATS>(
        src,
        64,
        scale,
        packed,
        scales,
        |bytes| {
            let magnitude = _mm256_set1_epi32(0x7FFF_FFFF);
            let a = _mm256_and_si256(load256(&bytes[..32]), magnitude);
            let b = _mm256_and_si256(load256(&bytes[32..]), magnitude);
            f32_bits_to_f32(hmax32(_mm256_max_epu32(a, b)))
        },
        |bytes| {
            let a = _mm256_castsi256_ps(load256(&bytes[..32]));
            let b = _mm256_castsi256_ps(load256(&bytes[32..]));
            (a, b)
        },
    )
}

/// Blocks per group: their maxima, then their scales, then their codes. 64 blocks of
/// bf16 are 2 KiB, so the second read of the group comes from L1.
const GROUP: usize = 64;

/// The loop shared by the three source types. `block_max` gives one block's amax,
/// `widen` its elements as two f32 vectors. With `STATS`, each block is also
/// dequantized in registers and compared with its source (f32 sums per group of
/// blocks, f64 across groups).
///
/// Doing the passes per group rather than per block keeps the vector registers
/// live across the element loop and lets the scale arithmetic run eight blocks wide.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn quantize_with<const STATS: bool>(
    src: &[u8],
    width: usize,
    prepared: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
    block_max: impl Fn(&[u8]) -> f32,
    widen: impl Fn(&[u8]) -> (__m256, __m256),
) -> (BlockCounts, ErrorStats) {
    let mut counts = BlockCounts::default();
    let mut stats = ErrorStats::default();
    let mut max_error = _mm256_setzero_ps();
    let mut maxima = [0.0f32; GROUP];
    let mut divisors = [0.0f32; GROUP];
    let mut codes = [0i32; 8];
    for ((src, scales), packed) in src
        .chunks(width * GROUP)
        .zip(scales.chunks_mut(GROUP))
        .zip(packed.chunks_mut(BLOCK / 2 * GROUP))
    {
        let blocks = scales.len();
        for (max, bytes) in maxima.iter_mut().zip(src.chunks_exact(width)) {
            *max = block_max(bytes);
        }
        let full = blocks / 8 * 8;
        for ((max, out), divisor) in maxima[..full]
            .chunks_exact(8)
            .zip(scales[..full].chunks_exact_mut(8))
            .zip(divisors[..full].chunks_exact_mut(8))
        {
            // SAFETY: 8 f32 in each slice (chunks_exact); unaligned access.
            let eight = scales::scales8(prepared, unsafe { _mm256_loadu_ps(max.as_ptr()) }, &mut counts);
            unsafe {
                _mm256_storeu_ps(divisor.as_mut_ptr(), eight.divisors);
                _mm256_storeu_si256(codes.as_mut_ptr().cast(), eight.codes);
            }
            for (byte, &code) in out.iter_mut().zip(&codes) {
                *byte = code as u8;
            }
        }
        for ((&max, code), divisor) in maxima[full..blocks]
            .iter()
            .zip(&mut scales[full..])
            .zip(&mut divisors[full..blocks])
        {
            let (scale_code, kind, block_divisor) = prepared.block(max);
            *code = scale_code;
            *divisor = block_divisor;
            counts.add(kind);
        }
        let mut sum_sq_error = _mm256_setzero_ps();
        let mut sum_sq_weight = _mm256_setzero_ps();
        let mut block = |bytes: &[u8], divisor: f32| {
            let (w0, w1) = widen(bytes);
            let divisor = _mm256_set1_ps(divisor);
            let c0 = codes::encode(_mm256_div_ps(w0, divisor));
            let c1 = codes::encode(_mm256_div_ps(w1, divisor));
            if STATS {
                for (w, c) in [(w0, c0), (w1, c1)] {
                    let error = _mm256_sub_ps(codes::decode(c, divisor), w);
                    sum_sq_error = _mm256_add_ps(sum_sq_error, _mm256_mul_ps(error, error));
                    sum_sq_weight = _mm256_add_ps(sum_sq_weight, _mm256_mul_ps(w, w));
                    let magnitude = _mm256_and_ps(error, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
                    // `max(new, old)` returns `old` when `new` is NaN: keep a NaN error.
                    max_error = _mm256_max_ps(max_error, magnitude);
                }
            }
            (c0, c1)
        };
        let mut pairs = src
            .chunks_exact(2 * width)
            .zip(packed.chunks_exact_mut(BLOCK))
            .zip(divisors.chunks_exact(2));
        for ((bytes, out), divisor) in &mut pairs {
            let a = block(&bytes[..width], divisor[0]);
            let b = block(&bytes[width..], divisor[1]);
            // SAFETY: `out` is 16 bytes (chunks_exact); unaligned store.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), codes::pack2(a, b)) };
        }
        if blocks % 2 == 1 {
            let last = blocks - 1;
            let a = block(&src[last * width..], divisors[last]);
            packed[last * BLOCK / 2..].copy_from_slice(&codes::pack1(a).to_le_bytes());
        }
        if STATS {
            stats.count += (blocks * BLOCK) as u64;
            stats.sum_sq_error += f64::from(hsum(sum_sq_error));
            stats.sum_sq_weight += f64::from(hsum(sum_sq_weight));
        }
    }
    if STATS {
        stats.max_abs_error = f64::from(hmax_ps(max_error));
    }
    (counts, stats)
}

/// The sum of eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The largest of eight non-negative lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// 32 bytes from a slice of at least that many, unaligned.
#[inline(always)]
fn load256(bytes: &[u8]) -> __m256i {
    assert!(bytes.len() >= 32);
    // SAFETY: 32 readable bytes (asserted); `loadu` has no alignment requirement; AVX
    // is enabled in every caller.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// The largest of the sixteen 16-bit magnitudes in `lo` and `hi` (sign bits cleared).
#[inline]
#[target_feature(enable = "avx2")]
fn hmax16(lo: __m128i, hi: __m128i) -> u16 {
    let magnitude = _mm_set1_epi16(0x7FFF);
    let m = _mm_max_epu16(_mm_and_si128(lo, magnitude), _mm_and_si128(hi, magnitude));
    // `phminposuw` finds a minimum; the maximum is the minimum of the complements.
    let inverted = _mm_xor_si128(m, _mm_set1_epi32(-1));
    !(_mm_extract_epi16::<0>(_mm_minpos_epu16(inverted)) as u16)
}

/// The largest of eight 32-bit lanes, unsigned.
#[inline]
#[target_feature(enable = "avx2")]
fn hmax32(v: __m256i) -> u32 {
    let m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
    let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
    _mm_cvtsi128_si32(m) as u32
}

/// The largest 16-bit magnitude in `src` (an even number of bytes).
#[target_feature(enable = "avx2")]
fn max_abs_bits16(src: &[u8]) -> u16 {
    let magnitude = _mm256_set1_epi16(0x7FFF);
    let mut acc = _mm256_setzero_si256();
    let mut chunks = src.chunks_exact(32);
    for chunk in &mut chunks {
        acc = _mm256_max_epu16(acc, _mm256_and_si256(load256(chunk), magnitude));
    }
    let mut max = hmax16(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
    for pair in chunks.remainder().chunks_exact(2) {
        max = max.max(u16::from_le_bytes([pair[0], pair[1]]) & 0x7FFF);
    }
    max
}

/// The largest f32 magnitude bits in `src` (a multiple of 4 bytes).
#[target_feature(enable = "avx2")]
fn max_abs_bits32(src: &[u8]) -> u32 {
    let magnitude = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut acc = _mm256_setzero_si256();
    let mut chunks = src.chunks_exact(32);
    for chunk in &mut chunks {
        acc = _mm256_max_epu32(acc, _mm256_and_si256(load256(chunk), magnitude));
    }
    let mut max = hmax32(acc);
    for quad in chunks.remainder().chunks_exact(4) {
        max = max.max(u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]) & 0x7FFF_FFFF);
    }
    max
}

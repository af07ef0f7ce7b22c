//! One row of a weight panel, sixteen f32 lanes, as each x86 vector width holds it:
//! one AVX-512 register ([`Avx512`]) or two AVX2 registers, columns 0-7 and 8-15
//! ([`Avx2`]). The widening, the block factors and the tile kernel in `super` are
//! written once over [`Lanes`] and instantiated inside each width's `#[target_feature]`
//! entry point. Every method is `#[inline(always)]`: once inlined there, its intrinsics
//! sit in a function that has their features, and inline in turn.
//!
//! The widths differ in instructions, not only in the number of registers, in two
//! places: the FP4 lookup (all sixteen values in one AVX-512 register; on AVX2 the
//! eight magnitudes and the sign bit) and the f16 scales, codes and bytes, which AVX2
//! widens eight at a time from half as wide loads. [`Avx2`]'s eight-lane steps are the
//! AVX2 tile kernel's own (`super::avx2`).

use std::arch::x86_64::*;

use super::avx2;

/// Sixteen lanes of f32 (`F`) or of 32-bit integers (`I`) at one vector width, with
/// the operations the kernels apply to them.
///
/// # Safety
///
/// Every method needs its width's features ([`Avx512`]: AVX-512F; [`Avx2`]: AVX2, FMA
/// and F16C) and is called only from functions that enable them; pointers are valid
/// for the bytes each method reads or writes.
pub(super) trait Lanes {
    /// Sixteen f32.
    type F: Copy;
    /// Sixteen 32-bit integers.
    type I: Copy;
    /// The FP4 values, as [`Lanes::fp4`] looks them up.
    type Table: Copy;

    /// Zero in every lane.
    unsafe fn zero() -> Self::F;
    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self::F;
    /// Sixteen f32 at `p`.
    unsafe fn load(p: *const f32) -> Self::F;
    /// Stores sixteen f32 at `p`.
    unsafe fn store(p: *mut f32, v: Self::F);
    /// `a · b + c`, fused, lane by lane.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `a · b`.
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a / b`.
    unsafe fn div(a: Self::F, b: Self::F) -> Self::F;
    /// Sixteen pairs of bf16 values at `p` (`[16][2]`, see `pack_pairs`), widened: the
    /// first of each pair (a shift) and the second (a mask); no lane crossing.
    unsafe fn bf16_pairs(p: *const u16) -> (Self::F, Self::F);
    /// Sixteen f16 values at `p`, widened.
    unsafe fn f16(p: *const u16) -> Self::F;
    /// Sixteen Q8_0 codes at `p`, times the scales `d`.
    unsafe fn q8(p: *const i8, d: Self::F) -> Self::F;
    /// Sixteen bytes at `p`, one per lane.
    unsafe fn bytes(p: *const u8) -> Self::I;
    /// 64 bytes at `p`, four per lane (an NVFP4 panel's eight codes of each column).
    unsafe fn codes(p: *const u8) -> Self::I;
    /// Each lane shifted right by four bits (the next FP4 code).
    unsafe fn shr4(v: Self::I) -> Self::I;
    /// Each lane's low byte as the bits of an E4M3 value placed in an f32's exponent
    /// and mantissa (shifted left by 20), not yet rebiased.
    unsafe fn e4m3(v: Self::I) -> Self::F;
    /// `d[v]` lane by lane.
    unsafe fn gather(d: *const f32, v: Self::I) -> Self::F;
    /// The table [`Lanes::fp4`] reads, loaded once per kernel call.
    unsafe fn table() -> Self::Table;
    /// The FP4 values of the codes in the low four bits of each lane, times `factor`.
    unsafe fn fp4(codes: Self::I, table: Self::Table, factor: Self::F) -> Self::F;
}

/// AVX-512F: one register per row of a panel.
pub(super) struct Avx512;

/// AVX2: two registers per row of a panel, columns 0-7 and 8-15.
pub(super) struct Avx2;

// SAFETY (every method of both implementations): the trait's contract, that the
// caller has the width's features and valid pointers.
impl Lanes for Avx512 {
    type F = __m512;
    type I = __m512i;
    type Table = __m512;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bf16_pairs(p: *const u16) -> (__m512, __m512) {
        unsafe {
            let v = _mm512_loadu_si512(p.cast());
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF_0000_u32 as i32))),
            )
        }
    }
    #[inline(always)]
    unsafe fn f16(p: *const u16) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn q8(p: *const i8, d: __m512) -> __m512 {
        unsafe {
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))),
                d,
            )
        }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn codes(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn shr4(v: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi32::<4>(v) }
    }
    #[inline(always)]
    unsafe fn e4m3(v: __m512i) -> __m512 {
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<20>(v)) }
    }
    #[inline(always)]
    unsafe fn gather(d: *const f32, v: __m512i) -> __m512 {
        unsafe { _mm512_i32gather_ps::<4>(v, d) }
    }
    #[inline(always)]
    unsafe fn table() -> __m512 {
        unsafe { _mm512_loadu_ps(crate::gemm::fp4_table().as_ptr()) }
    }
    /// `vpermps` over sixteen entries reads the low four bits of each lane: the code.
    #[inline(always)]
    unsafe fn fp4(codes: __m512i, table: __m512, factor: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(_mm512_permutexvar_ps(codes, table), factor) }
    }
}

impl Lanes for Avx2 {
    type F = [__m256; 2];
    type I = [__m256i; 2];
    type Table = __m256;

    #[inline(always)]
    unsafe fn zero() -> [__m256; 2] {
        unsafe { [_mm256_setzero_ps(); 2] }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [__m256; 2] {
        unsafe { [_mm256_set1_ps(x); 2] }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [__m256; 2] {
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [__m256; 2]) {
        unsafe {
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: [__m256; 2], b: [__m256; 2], c: [__m256; 2]) -> [__m256; 2] {
        unsafe {
            [
                _mm256_fmadd_ps(a[0], b[0], c[0]),
                _mm256_fmadd_ps(a[1], b[1], c[1]),
            ]
        }
    }
    #[inline(always)]
    unsafe fn mul(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        unsafe { [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn div(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        unsafe { [_mm256_div_ps(a[0], b[0]), _mm256_div_ps(a[1], b[1])] }
    }
    /// The pairs of columns 0-7, then of 8-15 (sixteen `u16` further).
    #[inline(always)]
    unsafe fn bf16_pairs(p: *const u16) -> ([__m256; 2], [__m256; 2]) {
        let (lo0, lo1) = unsafe { avx2::bf16_pairs8(p) };
        let (hi0, hi1) = unsafe { avx2::bf16_pairs8(p.add(16)) };
        ([lo0, hi0], [lo1, hi1])
    }
    #[inline(always)]
    unsafe fn f16(p: *const u16) -> [__m256; 2] {
        unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
            ]
        }
    }
    #[inline(always)]
    unsafe fn q8(p: *const i8, d: [__m256; 2]) -> [__m256; 2] {
        unsafe { [avx2::q8x8(p, d[0]), avx2::q8x8(p.add(8), d[1])] }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> [__m256i; 2] {
        unsafe { [avx2::bytes8(p), avx2::bytes8(p.add(8))] }
    }
    #[inline(always)]
    unsafe fn codes(p: *const u8) -> [__m256i; 2] {
        unsafe { [_mm256_loadu_si256(p.cast()), _mm256_loadu_si256(p.add(32).cast())] }
    }
    #[inline(always)]
    unsafe fn shr4(v: [__m256i; 2]) -> [__m256i; 2] {
        unsafe { [_mm256_srli_epi32::<4>(v[0]), _mm256_srli_epi32::<4>(v[1])] }
    }
    #[inline(always)]
    unsafe fn e4m3(v: [__m256i; 2]) -> [__m256; 2] {
        unsafe {
            [
                _mm256_castsi256_ps(_mm256_slli_epi32::<20>(v[0])),
                _mm256_castsi256_ps(_mm256_slli_epi32::<20>(v[1])),
            ]
        }
    }
    #[inline(always)]
    unsafe fn gather(d: *const f32, v: [__m256i; 2]) -> [__m256; 2] {
        unsafe {
            [
                _mm256_i32gather_ps::<4>(d, v[0]),
                _mm256_i32gather_ps::<4>(d, v[1]),
            ]
        }
    }
    /// The eight magnitudes: eight lanes cannot hold the sixteen values.
    #[inline(always)]
    unsafe fn table() -> __m256 {
        unsafe { _mm256_loadu_ps(crate::formats::fp4::GRID.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn fp4(codes: [__m256i; 2], grid: __m256, factor: [__m256; 2]) -> [__m256; 2] {
        unsafe {
            [
                avx2::fp4x8(codes[0], grid, factor[0]),
                avx2::fp4x8(codes[1], grid, factor[1]),
            ]
        }
    }
}

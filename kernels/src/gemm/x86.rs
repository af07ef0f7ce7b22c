//! The micro-kernels for x86-64: AVX-512F (12 rows × 2 panels, 24 accumulators of 16
//! lanes; up to 16 rows × 1 panel, 6 rows × 3 or 4 rows × 4 panels for decode batches
//! and speculative verification) and AVX2 (6 rows × 1 panel as two 8-lane halves, 12
//! accumulators), both with FMA.
//! Weights are widened in registers: bf16 by zero-extension and a 16-bit shift;
//! NVFP4 by a table lookup of each code's FP4 value (`vpermps`: 16 entries in one
//! AVX-512 register; on AVX2 the 8 magnitudes and the sign bit, as
//! `crate::fast::x86::codes::decode` does), times the block's divisor, computed from the
//! scale byte where the weight's [`Form`] allows and otherwise gathered from the
//! tensor's 256-entry table; Q8_0 by sign-extending each code to 32 bits, converting
//! it to f32 and multiplying by the block's f16 scale, widened once per 32 values.

// `unsafe` here: SIMD loads and stores through raw pointers into slices whose bounds
// `Tile::check` has asserted, and calls of `#[target_feature]` functions after the CPU
// has been checked for the features.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{E4M3_UNBIAS, Form, NR, Panels, Tile, fp4_table};

/// Whether AVX-512F (with AVX2 and FMA) is there.
pub(super) fn avx512() -> bool {
    is_x86_feature_detected!("avx512f") && avx2()
}

/// Whether AVX512-BF16 is there too (the bf16 dot product).
pub(super) fn avx512_bf16() -> bool {
    avx512() && is_x86_feature_detected!("avx512bf16")
}

/// Whether AVX2, FMA and F16C are there (every AVX2 CPU from Intel and AMD has F16C;
/// the Q8_0 kernel widens its f16 scales with it).
pub(super) fn avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Runs `tile` with the AVX-512 kernel of its shape.
pub(super) fn tile_avx512(t: &mut Tile) {
    assert!(avx512(), "the AVX-512 kernel needs AVX-512F, AVX2 and FMA");
    macro_rules! rows {
        ($np:literal, [$($m:literal),*]) => {
            match t.mr {
                // SAFETY: the features are present (asserted above) and the tile's
                // bounds were checked by `Tile::check`.
                $($m => unsafe { k512::<$m, $np>(t) },)*
                _ => unreachable!("at most 16 rows per AVX-512 tile"),
            }
        };
    }
    match t.np {
        1 => rows!(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]),
        2 => rows!(2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
        3 => rows!(3, [1, 2, 3, 4, 5, 6]),
        4 => rows!(4, [1, 2, 3, 4, 5]),
        _ => unreachable!("at most 4 panels per AVX-512 tile (2 past 6 rows)"),
    }
}

/// Runs `tile` with the AVX2 kernel of its shape.
pub(super) fn tile_avx2(t: &mut Tile) {
    assert!(avx2(), "the AVX2 kernel needs AVX2 and FMA");
    assert_eq!(t.np, 1, "one panel per AVX2 tile");
    match t.mr {
        // SAFETY: as in `tile_avx512`.
        1 => unsafe { k256::<1>(t) },
        2 => unsafe { k256::<2>(t) },
        3 => unsafe { k256::<3>(t) },
        4 => unsafe { k256::<4>(t) },
        5 => unsafe { k256::<5>(t) },
        6 => unsafe { k256::<6>(t) },
        _ => unreachable!("at most 6 rows per AVX2 tile"),
    }
}

/// Sixteen pairs of bf16 values at `p` (`[16][2]`, see `pack_pairs`), widened: the first
/// of each pair (a shift) and the second (a mask); no lane crossing.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn bf16_pairs16(p: *const u16) -> (__m512, __m512) {
    let v = unsafe { _mm512_loadu_si512(p.cast()) };
    (
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
        _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF_0000_u32 as i32))),
    )
}

// The accumulator arrays are indexed by constants after unrolling, so they live in
// registers; explicit index loops say which lane goes with which row and panel.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn k512<const MR: usize, const NP: usize>(t: &mut Tile) {
    let (a, c, ldc, kc) = (t.a.as_ptr(), t.c.as_mut_ptr(), t.ldc, t.kc);
    let mut acc = [[_mm512_setzero_ps(); NP]; MR];
    unsafe {
        if t.accumulate {
            for m in 0..MR {
                for p in 0..NP {
                    acc[m][p] = _mm512_loadu_ps(c.add(m * ldc + p * NR));
                }
            }
        }
        match t.panels {
            Panels::F32 { data, stride } => {
                pairs512::<MR, NP, false>(&mut acc, a, kc, data.as_ptr().cast(), stride * 4);
            }
            Panels::Bf16 { data, stride } => {
                pairs512::<MR, NP, true>(&mut acc, a, kc, data.as_ptr().cast(), stride * 2);
            }
            Panels::Nvfp4 {
                codes,
                code_stride,
                scales,
                scale_stride,
                divisors,
                form,
            } => {
                let table = fp4_table();
                let lut = _mm512_loadu_ps(table.as_ptr());
                let (q, s, d) = (codes.as_ptr(), scales.as_ptr(), divisors.as_ptr());
                for kb in 0..kc / crate::BLOCK {
                    let mut f = [_mm512_setzero_ps(); NP];
                    for p in 0..NP {
                        let idx =
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(s.add(p * scale_stride + kb * NR).cast()));
                        f[p] = factors16(idx, d, form);
                    }
                    // Two rows of lanes per block, eight codes per lane each.
                    for half in 0..2 {
                        let k8 = kb * crate::BLOCK + 8 * half;
                        let mut v = [_mm512_setzero_si512(); NP];
                        for p in 0..NP {
                            v[p] = _mm512_loadu_si512(q.add(p * code_stride + k8 / 2 * NR).cast());
                        }
                        for pair in 0..4 {
                            let kk = k8 + 2 * pair;
                            let mut w0 = [_mm512_setzero_ps(); NP];
                            let mut w1 = [_mm512_setzero_ps(); NP];
                            for p in 0..NP {
                                // `vpermps` reads the low four bits of each lane: the
                                // code of `kk`; the next one is four bits up.
                                w0[p] = _mm512_mul_ps(_mm512_permutexvar_ps(v[p], lut), f[p]);
                                v[p] = _mm512_srli_epi32::<4>(v[p]);
                                w1[p] = _mm512_mul_ps(_mm512_permutexvar_ps(v[p], lut), f[p]);
                                v[p] = _mm512_srli_epi32::<4>(v[p]);
                            }
                            fma_pair(&mut acc, a, kk, &w0, &w1);
                        }
                    }
                }
            }
            Panels::Q8 {
                codes,
                code_stride,
                scales,
                scale_stride,
            } => {
                use crate::formats::q8::BLOCK;
                let (q, s) = (codes.as_ptr(), scales.as_ptr());
                for kb in 0..kc / BLOCK {
                    let mut d = [_mm512_setzero_ps(); NP];
                    for p in 0..NP {
                        d[p] = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(p * scale_stride + kb * NR).cast()));
                    }
                    for pair in 0..BLOCK / 2 {
                        let kk = kb * BLOCK + 2 * pair;
                        let mut w0 = [_mm512_setzero_ps(); NP];
                        let mut w1 = [_mm512_setzero_ps(); NP];
                        for p in 0..NP {
                            let at = q.add(p * code_stride + kk * NR);
                            w0[p] = q8x16(at, d[p]);
                            w1[p] = q8x16(at.add(NR), d[p]);
                        }
                        fma_pair(&mut acc, a, kk, &w0, &w1);
                    }
                }
            }
        }
        for m in 0..MR {
            for p in 0..NP {
                _mm512_storeu_ps(c.add(m * ldc + p * NR), acc[m][p]);
            }
        }
    }
}

/// One step of two values of `kk` for every row and panel: `acc[m][p] += x[kk][m] ·
/// w0[p] + x[kk + 1][m] · w1[p]`, as two fused multiply-adds in that order (`a` packed
/// `[kk][MR]`).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fma_pair<const MR: usize, const NP: usize>(
    acc: &mut [[__m512; NP]; MR],
    a: *const f32,
    kk: usize,
    w0: &[__m512; NP],
    w1: &[__m512; NP],
) {
    for m in 0..MR {
        // SAFETY: the caller's tile holds `[kc][MR]` inputs and `kk + 1 < kc`.
        let (x0, x1) = unsafe { (*a.add(kk * MR + m), *a.add((kk + 1) * MR + m)) };
        let (x0, x1) = (_mm512_set1_ps(x0), _mm512_set1_ps(x1));
        for p in 0..NP {
            acc[m][p] = _mm512_fmadd_ps(x0, w0[p], acc[m][p]);
            acc[m][p] = _mm512_fmadd_ps(x1, w1[p], acc[m][p]);
        }
    }
}

/// Sixteen Q8_0 codes at `p`, times the scales `d` (a function, not a closure: a
/// closure has no `target_feature`, so its `__m512` result would go through the stack).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn q8x16(p: *const i8, d: __m512) -> __m512 {
    let codes = unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) };
    _mm512_mul_ps(_mm512_cvtepi32_ps(codes), d)
}

/// The float formats' loop, two values of `kk` per iteration (the shape of the NVFP4
/// loop, which keeps more loads in flight). `b` is panel 0's first weight, panels
/// `stride` bytes apart; `BF16` says whether weights are bf16 (else f32).
///
/// The loads are written out here rather than passed in as a closure: a closure has no
/// `target_feature`, so its `__m512` results would travel through the stack.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn pairs512<const MR: usize, const NP: usize, const BF16: bool>(
    acc: &mut [[__m512; NP]; MR],
    a: *const f32,
    kc: usize,
    b: *const u8,
    stride: usize,
) {
    let size = if BF16 { 2 } else { 4 };
    // f32: `kk` rows of 16 values; bf16: pairs of `kk` in 32 values, so the pair that
    // starts at an even `kk` is at the same offset as `kk`'s row would be.
    let at = |kk: usize, p: usize| -> *const u8 { unsafe { b.add(p * stride + kk * NR * size) } };
    let mut kk = 0;
    unsafe {
        while kk + 2 <= kc {
            let mut w0 = [_mm512_setzero_ps(); NP];
            let mut w1 = [_mm512_setzero_ps(); NP];
            for p in 0..NP {
                if BF16 {
                    (w0[p], w1[p]) = bf16_pairs16(at(kk, p).cast());
                } else {
                    w0[p] = _mm512_loadu_ps(at(kk, p).cast());
                    w1[p] = _mm512_loadu_ps(at(kk + 1, p).cast());
                }
            }
            fma_pair(acc, a, kk, &w0, &w1);
            kk += 2;
        }
        if kk < kc {
            for p in 0..NP {
                let w = if BF16 {
                    bf16_pairs16(at(kk, p).cast()).0
                } else {
                    _mm512_loadu_ps(at(kk, p).cast())
                };
                for m in 0..MR {
                    acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(kk * MR + m)), w, acc[m][p]);
                }
            }
        }
    }
}

/// Writes the f32 values of panels `0..np` over `kc` values of `kk` into `out`
/// (`[p][kk][16]`) with AVX-512: the values [`k512`] widens in registers, by the same
/// instructions (see `super::widen`).
pub(super) fn widen_avx512(panels: Panels, np: usize, kc: usize, out: &mut [f32]) {
    assert!(avx512(), "the AVX-512 widening needs AVX-512F, AVX2 and FMA");
    panels.check(np, kc);
    assert!(out.len() >= np * kc * NR, "the widened panels do not fit");
    // SAFETY: the features are present and every read and write is inside the slices
    // (asserted above).
    unsafe { widen512(panels, np, kc, out.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn widen512(panels: Panels, np: usize, kc: usize, out: *mut f32) {
    let lut = fp4_table();
    for p in 0..np {
        // SAFETY: as `widen_avx512` asserted; offsets as in `k512`.
        unsafe {
            let o = out.add(p * kc * NR);
            match panels {
                Panels::F32 { data, stride } => {
                    std::ptr::copy_nonoverlapping(data.as_ptr().add(p * stride), o, kc * NR);
                }
                Panels::Bf16 { data, stride } => {
                    let b = data.as_ptr().add(p * stride);
                    for kk in (0..kc).step_by(2) {
                        let (w0, w1) = bf16_pairs16(b.add(kk * NR));
                        _mm512_storeu_ps(o.add(kk * NR), w0);
                        if kk + 1 < kc {
                            _mm512_storeu_ps(o.add((kk + 1) * NR), w1);
                        }
                    }
                }
                Panels::Nvfp4 {
                    codes,
                    code_stride,
                    scales,
                    scale_stride,
                    divisors,
                    form,
                } => {
                    let lut = _mm512_loadu_ps(lut.as_ptr());
                    let q = codes.as_ptr().add(p * code_stride);
                    let s = scales.as_ptr().add(p * scale_stride);
                    for kb in 0..kc / crate::BLOCK {
                        let idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(s.add(kb * NR).cast()));
                        let f = factors16(idx, divisors.as_ptr(), form);
                        for half in 0..2 {
                            let k8 = kb * crate::BLOCK + 8 * half;
                            let mut v = _mm512_loadu_si512(q.add(k8 / 2 * NR).cast());
                            for i in 0..8 {
                                _mm512_storeu_ps(
                                    o.add((k8 + i) * NR),
                                    _mm512_mul_ps(_mm512_permutexvar_ps(v, lut), f),
                                );
                                v = _mm512_srli_epi32::<4>(v);
                            }
                        }
                    }
                }
                Panels::Q8 {
                    codes,
                    code_stride,
                    scales,
                    scale_stride,
                } => {
                    use crate::formats::q8::BLOCK;
                    let q = codes.as_ptr().add(p * code_stride);
                    let s = scales.as_ptr().add(p * scale_stride);
                    for kb in 0..kc / BLOCK {
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(kb * NR).cast()));
                        for kk in kb * BLOCK..(kb + 1) * BLOCK {
                            _mm512_storeu_ps(o.add(kk * NR), q8x16(q.add(kk * NR), d));
                        }
                    }
                }
            }
        }
    }
}

/// [`widen_avx512`] with AVX2: the values [`k256`] widens in registers.
pub(super) fn widen_avx2(panels: Panels, np: usize, kc: usize, out: &mut [f32]) {
    assert!(avx2(), "the AVX2 widening needs AVX2, FMA and F16C");
    panels.check(np, kc);
    assert!(out.len() >= np * kc * NR, "the widened panels do not fit");
    // SAFETY: as in `widen_avx512`.
    unsafe { widen256(panels, np, kc, out.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen256(panels: Panels, np: usize, kc: usize, out: *mut f32) {
    for p in 0..np {
        // SAFETY: as `widen_avx2` asserted; offsets as in `k256`.
        unsafe {
            let o = out.add(p * kc * NR);
            // Columns 0-7 and 8-15 of `kk`'s row.
            let store = |kk: usize, w: [__m256; 2]| {
                _mm256_storeu_ps(o.add(kk * NR), w[0]);
                _mm256_storeu_ps(o.add(kk * NR + 8), w[1]);
            };
            match panels {
                Panels::F32 { data, stride } => {
                    std::ptr::copy_nonoverlapping(data.as_ptr().add(p * stride), o, kc * NR);
                }
                Panels::Bf16 { data, stride } => {
                    let b = data.as_ptr().add(p * stride);
                    for kk in (0..kc).step_by(2) {
                        let (lo0, lo1) = bf16_pairs8(b.add(kk * NR));
                        let (hi0, hi1) = bf16_pairs8(b.add(kk * NR + NR));
                        store(kk, [lo0, hi0]);
                        if kk + 1 < kc {
                            store(kk + 1, [lo1, hi1]);
                        }
                    }
                }
                Panels::Nvfp4 {
                    codes,
                    code_stride,
                    scales,
                    scale_stride,
                    divisors,
                    form,
                } => {
                    let grid = _mm256_loadu_ps(crate::formats::fp4::GRID.as_ptr());
                    let (q, s, d) = (
                        codes.as_ptr().add(p * code_stride),
                        scales.as_ptr().add(p * scale_stride),
                        divisors.as_ptr(),
                    );
                    for kb in 0..kc / crate::BLOCK {
                        let f = fp4_divisors16(s, d, kb, form);
                        for half in 0..2 {
                            let k8 = kb * crate::BLOCK + 8 * half;
                            let mut v = fp4_codes16(q, k8);
                            for i in 0..8 {
                                store(k8 + i, [fp4x8(v[0], grid, f[0]), fp4x8(v[1], grid, f[1])]);
                                v = [_mm256_srli_epi32::<4>(v[0]), _mm256_srli_epi32::<4>(v[1])];
                            }
                        }
                    }
                }
                Panels::Q8 {
                    codes,
                    code_stride,
                    scales,
                    scale_stride,
                } => {
                    use crate::formats::q8::BLOCK;
                    let (q, s) = (
                        codes.as_ptr().add(p * code_stride),
                        scales.as_ptr().add(p * scale_stride),
                    );
                    for kb in 0..kc / BLOCK {
                        let d = [
                            _mm256_cvtph_ps(_mm_loadu_si128(s.add(kb * NR).cast())),
                            _mm256_cvtph_ps(_mm_loadu_si128(s.add(kb * NR + 8).cast())),
                        ];
                        for kk in kb * BLOCK..(kb + 1) * BLOCK {
                            store(kk, [q8x8(q.add(kk * NR), d[0]), q8x8(q.add(kk * NR + 8), d[1])]);
                        }
                    }
                }
            }
        }
    }
}

/// Eight pairs of bf16 values at `p` (`[8][2]`), widened: the first of each pair and
/// the second.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_pairs8(p: *const u16) -> (__m256, __m256) {
    let v = unsafe { _mm256_loadu_si256(p.cast()) };
    (
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
        _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000_u32 as i32))),
    )
}

/// Eight bytes at `p`, one per 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bytes8(p: *const u8) -> __m256i {
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
}

/// Eight Q8_0 codes at `p`, times the scales `d`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8x8(p: *const i8, d: __m256) -> __m256 {
    let codes = unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())) };
    _mm256_mul_ps(_mm256_cvtepi32_ps(codes), d)
}

/// The divisors of NVFP4 block `kb`'s sixteen columns (0-7, then 8-15) with the
/// panel's scale bytes `s`: computed by `form`, or gathered from the tensor's table `d`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fp4_divisors16(s: *const u8, d: *const f32, kb: usize, form: Option<Form>) -> [__m256; 2] {
    // SAFETY: the caller's panel holds the block's sixteen scale bytes, and every byte
    // indexes the 256-entry table.
    unsafe {
        [
            factors8(bytes8(s.add(kb * NR)), d, form),
            factors8(bytes8(s.add(kb * NR + 8)), d, form),
        ]
    }
}

/// [`factors16`] for eight blocks, on AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn factors8(idx: __m256i, d: *const f32, form: Option<Form>) -> __m256 {
    match form {
        Some(form) => {
            let e4m3 = _mm256_mul_ps(
                _mm256_castsi256_ps(_mm256_slli_epi32::<20>(idx)),
                _mm256_set1_ps(E4M3_UNBIAS),
            );
            let v = _mm256_set1_ps(form.value);
            if form.divide {
                _mm256_div_ps(e4m3, v)
            } else {
                _mm256_mul_ps(e4m3, v)
            }
        }
        // SAFETY: every lane of `idx` is a byte, an index into the 256-entry table.
        None => unsafe { _mm256_i32gather_ps::<4>(d, idx) },
    }
}

/// The divisors of sixteen NVFP4 blocks, one per lane, with scale bytes `idx`: computed
/// by `form` ([`Form::apply`]'s arithmetic), or gathered from the tensor's table `d`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn factors16(idx: __m512i, d: *const f32, form: Option<Form>) -> __m512 {
    match form {
        Some(form) => {
            let e4m3 = _mm512_mul_ps(
                _mm512_castsi512_ps(_mm512_slli_epi32::<20>(idx)),
                _mm512_set1_ps(E4M3_UNBIAS),
            );
            let v = _mm512_set1_ps(form.value);
            if form.divide {
                _mm512_div_ps(e4m3, v)
            } else {
                _mm512_mul_ps(e4m3, v)
            }
        }
        // SAFETY: every lane of `idx` is a byte, an index into the 256-entry table.
        None => unsafe { _mm512_i32gather_ps::<4>(idx, d) },
    }
}

/// The codes of values `k8..k8 + 8` of a panel's sixteen columns (0-7, then 8-15),
/// eight per lane, the code of `k8` in the low four bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fp4_codes16(q: *const u8, k8: usize) -> [__m256i; 2] {
    // SAFETY: the caller's panel holds the 64 code bytes from `k8 / 2 · 16`.
    unsafe {
        let at = q.add(k8 / 2 * NR);
        [
            _mm256_loadu_si256(at.cast()),
            _mm256_loadu_si256(at.add(32).cast()),
        ]
    }
}

/// The FP4 values of the codes in the low four bits of each lane, times `factor`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fp4x8(codes: __m256i, grid: __m256, factor: __m256) -> __m256 {
    // `vpermps` reads the low three bits: the magnitude; bit 3 is the sign.
    let magnitude = _mm256_permutevar8x32_ps(grid, codes);
    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(codes, _mm256_set1_epi32(8)));
    _mm256_mul_ps(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign)), factor)
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k256<const MR: usize>(t: &mut Tile) {
    let (a, c, ldc, kc) = (t.a.as_ptr(), t.c.as_mut_ptr(), t.ldc, t.kc);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    unsafe {
        if t.accumulate {
            for m in 0..MR {
                for h in 0..2 {
                    acc[m][h] = _mm256_loadu_ps(c.add(m * ldc + h * 8));
                }
            }
        }
        macro_rules! step {
            ($m:expr, $kk:expr, $w:expr) => {
                let x = _mm256_set1_ps(*a.add($kk * MR + $m));
                for h in 0..2 {
                    acc[$m][h] = _mm256_fmadd_ps(x, $w[h], acc[$m][h]);
                }
            };
        }
        match t.panels {
            Panels::F32 { data, .. } => {
                let b = data.as_ptr();
                let load = |kk: usize| {
                    [
                        _mm256_loadu_ps(b.add(kk * NR)),
                        _mm256_loadu_ps(b.add(kk * NR + 8)),
                    ]
                };
                let mut kk = 0;
                while kk + 2 <= kc {
                    let (w0, w1) = (load(kk), load(kk + 1));
                    for m in 0..MR {
                        step!(m, kk, w0);
                        step!(m, kk + 1, w1);
                    }
                    kk += 2;
                }
                if kk < kc {
                    let w = load(kk);
                    for m in 0..MR {
                        step!(m, kk, w);
                    }
                }
            }
            Panels::Bf16 { data, .. } => {
                let b = data.as_ptr();
                // The pair starting at even `kk`: columns 0-7, then 8-15.
                let load = |kk: usize| {
                    let (lo0, lo1) = bf16_pairs8(b.add(kk * NR));
                    let (hi0, hi1) = bf16_pairs8(b.add(kk * NR + NR));
                    ([lo0, hi0], [lo1, hi1])
                };
                let mut kk = 0;
                while kk + 2 <= kc {
                    let (w0, w1) = load(kk);
                    for m in 0..MR {
                        step!(m, kk, w0);
                        step!(m, kk + 1, w1);
                    }
                    kk += 2;
                }
                if kk < kc {
                    let (w, _) = load(kk);
                    for m in 0..MR {
                        step!(m, kk, w);
                    }
                }
            }
            Panels::Nvfp4 {
                codes,
                scales,
                divisors,
                form,
                ..
            } => {
                let grid = _mm256_loadu_ps(crate::formats::fp4::GRID.as_ptr());
                let (q, s, d) = (codes.as_ptr(), scales.as_ptr(), divisors.as_ptr());
                for kb in 0..kc / crate::BLOCK {
                    let f = fp4_divisors16(s, d, kb, form);
                    // Two rows of lanes per block, eight codes per lane each.
                    for half in 0..2 {
                        let k8 = kb * crate::BLOCK + 8 * half;
                        let mut v = fp4_codes16(q, k8);
                        for pair in 0..4 {
                            let kk = k8 + 2 * pair;
                            let w0 = [fp4x8(v[0], grid, f[0]), fp4x8(v[1], grid, f[1])];
                            v = [_mm256_srli_epi32::<4>(v[0]), _mm256_srli_epi32::<4>(v[1])];
                            let w1 = [fp4x8(v[0], grid, f[0]), fp4x8(v[1], grid, f[1])];
                            v = [_mm256_srli_epi32::<4>(v[0]), _mm256_srli_epi32::<4>(v[1])];
                            for m in 0..MR {
                                step!(m, kk, w0);
                                step!(m, kk + 1, w1);
                            }
                        }
                    }
                }
            }
            Panels::Q8 { codes, scales, .. } => {
                use crate::formats::q8::BLOCK;
                let (q, s) = (codes.as_ptr(), scales.as_ptr());
                for kb in 0..kc / BLOCK {
                    let d = [
                        _mm256_cvtph_ps(_mm_loadu_si128(s.add(kb * NR).cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(s.add(kb * NR + 8).cast())),
                    ];
                    let load = |kk: usize| [q8x8(q.add(kk * NR), d[0]), q8x8(q.add(kk * NR + 8), d[1])];
                    for pair in 0..BLOCK / 2 {
                        let kk = kb * BLOCK + 2 * pair;
                        let (w0, w1) = (load(kk), load(kk + 1));
                        for m in 0..MR {
                            step!(m, kk, w0);
                            step!(m, kk + 1, w1);
                        }
                    }
                }
            }
        }
        for m in 0..MR {
            for h in 0..2 {
                _mm256_storeu_ps(c.add(m * ldc + h * 8), acc[m][h]);
            }
        }
    }
}

/// Rows per tile of the bf16 dot-product kernel for many rows, with [`DP_NP`] panels
/// side by side (24 accumulators); a batch of up to [`DP_MR_MAX`] rows takes one tile
/// of one panel, so that each panel is read once.
pub(super) const DP_MR: usize = 8;

/// Panels side by side in a tile of the bf16 dot-product kernel for many rows: each
/// broadcast pair of inputs feeds three dot products, and the rows' packed inputs
/// stream past the weights a third as often as with one panel. 8 × 3 measured fastest
/// of the shapes tried, for 512 rows and for 64 (BENCHMARKS.md, "Figures that were in
/// code comments").
pub(super) const DP_NP: usize = 3;

// `dot_bf16` dispatches tiles of `DP_MR` rows × `DP_NP` panels by literals.
const _: () = assert!(DP_MR == 8 && DP_NP == 3);

/// The most rows one tile of the bf16 dot-product kernel holds (16 accumulators).
pub(super) const DP_MR_MAX: usize = 16;

/// `x` (`rows × k`) rounded to bf16 (`super::round_bf16`) and packed for [`dot_bf16`]:
/// blocks of `mr` rows, each `[pair][width]` of bf16 pairs (`kk`, `kk + 1`).
pub(super) fn pack_bf16_pairs(x: &[f32], rows: usize, k: usize, mr: usize) -> Vec<u32> {
    assert!(avx512(), "the bf16 packing needs AVX-512F");
    assert!(x.len() >= rows * k, "x is not rows × k");
    let pairs = k.div_ceil(2);
    let mut a = vec![0u32; rows * pairs];
    for (b, block) in a.chunks_mut(mr * pairs).enumerate() {
        let width = block.len() / pairs;
        for m in 0..width {
            let row = &x[(b * mr + m) * k..(b * mr + m + 1) * k];
            // SAFETY: AVX-512F is present (asserted above).
            unsafe { pack_row(row, block, m, width) };
        }
    }
    a
}

/// One row of [`pack_bf16_pairs`]: `row`'s values rounded to bf16 (`super::round_bf16`)
/// in pairs, pair `t` into `block[t * width + m]`. Sixteen values at a time with
/// AVX-512F, the rounding's integer steps lane by lane (a NaN kept as it is), then
/// the top halves narrowed to sixteen bf16, which are eight pairs in order; the
/// values past the last sixteen one by one. The same bits as the scalar steps, which a
/// test holds it to.
///
/// Why vectorized: done one value at a time, the packing took a tenth of a bf16 prefill
/// of SmolLM2 (11 % of the samples of a 512-token prefill on a Zen 5, against 57 % in
/// the dot products themselves).
#[target_feature(enable = "avx512f,avx2,fma")]
fn pack_row(row: &[f32], block: &mut [u32], m: usize, width: usize) {
    let pairs = row.len().div_ceil(2);
    assert!(block.len() >= pairs * width && m < width.max(1));
    let groups = row.len() / 16;
    let mut eight = [0u32; 8];
    for g in 0..groups {
        // SAFETY: `16 g + 16 ≤ row.len()`; `eight` holds eight u32.
        unsafe {
            let v = _mm512_loadu_si512(row.as_ptr().add(16 * g).cast());
            let f = _mm512_castsi512_ps(v);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(v), _mm512_set1_epi32(1));
            let rounded = _mm512_add_epi32(v, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
            let kept = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(f, f), rounded, v);
            let halves = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(kept));
            _mm256_storeu_si256(eight.as_mut_ptr().cast(), halves);
        }
        for (i, &pair) in eight.iter().enumerate() {
            block[(8 * g + i) * width + m] = pair;
        }
    }
    for t in 8 * groups..pairs {
        let lo = super::round_bf16(row[2 * t]).to_bits() >> 16;
        let hi = row
            .get(2 * t + 1)
            .map_or(0, |&v| super::round_bf16(v).to_bits() >> 16);
        block[t * width + m] = lo | (hi << 16);
    }
}

/// `c = x · wᵀ` for panels `first..first + count` of bf16 weights, with `vdpbf16ps`:
/// `a` is `rows` rows packed by [`pack_bf16_pairs`] in blocks of `mr` (at most
/// [`DP_MR_MAX`] for one panel per tile, [`DP_MR`] for [`DP_NP`]); row `m`'s sixteen
/// values of panel `first + p` go to `c[m * ldc + 16 p..]`. Each pair of inputs is
/// broadcast and dotted with the pairs of sixteen lanes of `np` panels side by side
/// (1 or [`DP_NP`]; the last panels of a run that does not fill a tile go one at a
/// time). Every output is the same chain of dot products over the pairs in order,
/// whatever panels share its tile.
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_bf16(
    a: &[u32],
    rows: usize,
    (mr, np): (usize, usize),
    w: &super::Packed,
    first: usize,
    count: usize,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(avx512_bf16(), "the bf16 dot-product kernel needs AVX512-BF16");
    assert!(
        (np == 1 && (1..=DP_MR_MAX).contains(&mr)) || (np == DP_NP && (1..=DP_MR).contains(&mr)),
        "a tile of {mr} rows × {np} panels"
    );
    let Some((panels, stride)) = w.bf16_panels() else {
        unreachable!("bf16 weights checked by the caller");
    };
    let pairs = w.k().div_ceil(2);
    assert!(a.len() == rows * pairs && (first + count) * NR <= w.n().next_multiple_of(NR));
    assert!(panels.len() >= (first + count) * stride && stride >= pairs * 2 * NR);
    assert!(rows == 0 || c.len() >= (rows - 1) * ldc + count * NR);
    // `np` panels at a time, every block of rows: the panels (`k` pairs of 16 lanes
    // each) stay in L1/L2 while the rows' packed inputs stream past them.
    let mut p = 0;
    while p < count {
        let np = if count - p >= np { np } else { 1 };
        let b = &panels[(first + p) * stride..(first + p + np - 1) * stride + pairs * 2 * NR];
        let mut m = 0;
        while m < rows {
            let width = mr.min(rows - m);
            let block = &a[m * pairs..m * pairs + width * pairs];
            let c = &mut c[m * ldc + p * NR..];
            macro_rules! rows {
                ($np:literal, [$($r:literal),*]) => {
                    match width {
                        // SAFETY: AVX512-BF16 is present (asserted above), `block` holds
                        // `pairs × width` values, `b` `np` panels `stride` apart of
                        // `pairs` pairs of 16 lanes, and `c` `width` rows `ldc` apart of
                        // `16 · np` values (asserted above).
                        $($r => unsafe {
                            dp512::<$r, $np>(block.as_ptr(), b.as_ptr(), stride, pairs, c.as_mut_ptr(), ldc)
                        },)*
                        _ => unreachable!("a tile of {width} rows × {np} panels"),
                    }
                };
            }
            // The literals are `DP_NP` and `DP_MR` (checked at compile time beside them).
            if np == 1 {
                rows!(1, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
            } else {
                rows!(3, [1, 2, 3, 4, 5, 6, 7, 8]);
            }
            m += width;
        }
        p += np;
    }
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
unsafe fn dp512<const MR: usize, const NP: usize>(
    a: *const u32,
    b: *const u16,
    stride: usize,
    pairs: usize,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NP]; MR];
    unsafe {
        for t in 0..pairs {
            // A loop, not `array::from_fn`: a closure has no `target_feature`.
            let mut w = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NP];
            for p in 0..NP {
                w[p] = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    b.add(p * stride + t * 2 * NR).cast(),
                ));
            }
            for m in 0..MR {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(t * MR + m) as i32));
                for p in 0..NP {
                    acc[m][p] = _mm512_dpbf16_ps(acc[m][p], x, w[p]);
                }
            }
        }
        for m in 0..MR {
            for p in 0..NP {
                _mm512_storeu_ps(c.add(m * ldc + p * NR), acc[m][p]);
            }
        }
    }
}

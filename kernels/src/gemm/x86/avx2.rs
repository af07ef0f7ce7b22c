//! The AVX2 tile kernel (6 rows × 1 panel as two 8-lane halves, 12 accumulators) and
//! the eight-lane steps it widens weights with, which `super::lanes::Avx2` reuses for
//! the widening.
//!
//! Why a loop of its own: `super::tile` instantiated at AVX2, and this loop written over
//! `super::lanes::Avx2`'s methods, compute the same values in the same order, but both
//! compiled to code that keeps fewer of the twelve accumulators in registers around the
//! NVFP4 lookups, and ran slower with NVFP4 weights (benchmarks/native.md, "One SIMD body
//! per width (issue 49)"). This is the loop and the steps as they were measured.

use std::arch::x86_64::*;

use crate::gemm::{E4M3_UNBIAS, Form, NR, Panels, Tile};

/// Eight pairs of bf16 values at `p` (`[8][2]`), widened: the first of each pair and
/// the second.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn bf16_pairs8(p: *const u16) -> (__m256, __m256) {
    let v = unsafe { _mm256_loadu_si256(p.cast()) };
    (
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
        _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000_u32 as i32))),
    )
}

/// Eight bytes at `p`, one per 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn bytes8(p: *const u8) -> __m256i {
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
}

/// Eight Q8_0 codes at `p`, times the scales `d`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q8x8(p: *const i8, d: __m256) -> __m256 {
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

/// `super::factors` for eight blocks in one register. Not that function at `Avx2`:
/// built on it, this kernel kept fewer accumulators in registers (the reason for this
/// file).
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
pub(super) fn fp4x8(codes: __m256i, grid: __m256, factor: __m256) -> __m256 {
    // `vpermps` reads the low three bits: the magnitude; bit 3 is the sign.
    let magnitude = _mm256_permutevar8x32_ps(grid, codes);
    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(codes, _mm256_set1_epi32(8)));
    _mm256_mul_ps(_mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign)), factor)
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k256<const MR: usize>(t: &mut Tile) {
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

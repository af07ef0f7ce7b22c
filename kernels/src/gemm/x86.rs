//! The micro-kernels for x86-64: AVX-512F (12 rows × 2 panels, 24 accumulators of 16
//! lanes; up to 16 rows × 1 panel, 6 rows × 3 or 4 rows × 4 panels for decode batches
//! and speculative verification) and AVX2 (6 rows × 1 panel as two 8-lane halves, 12
//! accumulators, in `avx2.rs`), both with FMA; the bf16 dot-product kernel of
//! AVX512-BF16 is in `dot.rs`.
//!
//! The widening of stored weights to f32 and the block factors are written once, over
//! the row of sixteen lanes each width holds ([`lanes::Lanes`]), and instantiated in
//! one `#[target_feature]` function per width. So is the tile kernel ([`tile`]), but
//! only AVX-512 runs it: AVX2 keeps its own loop (`avx2.rs` says why).
//!
//! Weights are widened in registers: bf16 by zero-extension and a 16-bit shift;
//! NVFP4 by a table lookup of each code's FP4 value (`vpermps`: 16 entries in one
//! AVX-512 register; on AVX2 the 8 magnitudes and the sign bit, as
//! `crate::fast::x86::codes::decode` does), times the block's divisor, computed from the
//! scale byte where the weight's [`Form`] allows and otherwise gathered from the
//! tensor's 256-entry table; Q8_0 by sign-extending each code to 32 bits, converting
//! it to f32 and multiplying by the block's f16 scale, widened once per 32 values.

// `unsafe` here and in the submodules: SIMD loads and stores through raw pointers into slices
// whose bounds `Tile::check` has asserted, and calls of `#[target_feature]` functions
// after the CPU has been checked for the features.
#![allow(unsafe_code)]

mod avx2;
mod dot;
mod dot_fp4;
mod lanes;

use self::avx2::k256;
pub(super) use self::dot::{DP_MR, DP_NP, dot_bf16, pack_bf16_pairs};
pub(super) use self::dot_fp4::{FP4_FEW_MR, FP4_FEW_NP, FP4_MR, FP4_NP, dot_fp4, pack_fp4_pairs};
use self::lanes::{Avx2, Avx512, Lanes};
use super::{E4M3_UNBIAS, Form, NR, Panels, Tile};

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

/// [`tile`] with AVX-512: one register per row of a panel.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn k512<const MR: usize, const NP: usize>(t: &mut Tile) {
    // SAFETY: the caller's, and the features `Avx512` needs are enabled here.
    unsafe { tile::<Avx512, MR, NP>(t) }
}

/// The tile kernel at width `V`: `MR` rows × `NP` panels, every weight format. AVX-512
/// runs it; AVX2 runs `avx2::k256`, the same arithmetic in a loop of its own.
// The accumulator arrays are indexed by constants after unrolling, so they live in
// registers; explicit index loops say which lane goes with which row and panel.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<V: Lanes, const MR: usize, const NP: usize>(t: &mut Tile) {
    let (a, c, ldc, kc) = (t.a.as_ptr(), t.c.as_mut_ptr(), t.ldc, t.kc);
    unsafe {
        let mut acc = [[V::zero(); NP]; MR];
        if t.accumulate {
            for m in 0..MR {
                for p in 0..NP {
                    acc[m][p] = V::load(c.add(m * ldc + p * NR));
                }
            }
        }
        match t.panels {
            Panels::F32 { data, stride } => {
                pairs::<V, MR, NP, false>(&mut acc, a, kc, data.as_ptr().cast(), stride * 4);
            }
            Panels::Bf16 { data, stride } => {
                pairs::<V, MR, NP, true>(&mut acc, a, kc, data.as_ptr().cast(), stride * 2);
            }
            Panels::Nvfp4 {
                codes,
                code_stride,
                scales,
                scale_stride,
                divisors,
                form,
            } => {
                let table = V::table();
                let (q, s, d) = (codes.as_ptr(), scales.as_ptr(), divisors.as_ptr());
                for kb in 0..kc / crate::BLOCK {
                    let mut f = [V::zero(); NP];
                    for p in 0..NP {
                        f[p] = factors::<V>(V::bytes(s.add(p * scale_stride + kb * NR)), d, form);
                    }
                    // Two rows of lanes per block, eight codes per lane each.
                    for half in 0..2 {
                        let k8 = kb * crate::BLOCK + 8 * half;
                        let mut v = [V::codes(q.add(k8 / 2 * NR)); NP];
                        for p in 1..NP {
                            v[p] = V::codes(q.add(p * code_stride + k8 / 2 * NR));
                        }
                        for pair in 0..4 {
                            let kk = k8 + 2 * pair;
                            let mut w0 = [V::zero(); NP];
                            let mut w1 = [V::zero(); NP];
                            for p in 0..NP {
                                // The code of `kk` is in the low four bits of each
                                // lane; the next one is four bits up.
                                w0[p] = V::fp4(v[p], table, f[p]);
                                v[p] = V::shr4(v[p]);
                                w1[p] = V::fp4(v[p], table, f[p]);
                                v[p] = V::shr4(v[p]);
                            }
                            fma_pair::<V, MR, NP>(&mut acc, a, kk, &w0, &w1);
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
                    let mut d = [V::zero(); NP];
                    for p in 0..NP {
                        d[p] = V::f16(s.add(p * scale_stride + kb * NR));
                    }
                    for pair in 0..BLOCK / 2 {
                        let kk = kb * BLOCK + 2 * pair;
                        let mut w0 = [V::zero(); NP];
                        let mut w1 = [V::zero(); NP];
                        for p in 0..NP {
                            let at = q.add(p * code_stride + kk * NR);
                            w0[p] = V::q8(at, d[p]);
                            w1[p] = V::q8(at.add(NR), d[p]);
                        }
                        fma_pair::<V, MR, NP>(&mut acc, a, kk, &w0, &w1);
                    }
                }
            }
        }
        for m in 0..MR {
            for p in 0..NP {
                V::store(c.add(m * ldc + p * NR), acc[m][p]);
            }
        }
    }
}

/// One step of two values of `kk` for every row and panel: `acc[m][p] += x[kk][m] ·
/// w0[p] + x[kk + 1][m] · w1[p]`, as two fused multiply-adds in that order (`a` packed
/// `[kk][MR]`).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn fma_pair<V: Lanes, const MR: usize, const NP: usize>(
    acc: &mut [[V::F; NP]; MR],
    a: *const f32,
    kk: usize,
    w0: &[V::F; NP],
    w1: &[V::F; NP],
) {
    for m in 0..MR {
        // SAFETY: the caller's tile holds `[kc][MR]` inputs and `kk + 1 < kc`; the
        // caller has `V`'s features.
        unsafe {
            let (x0, x1) = (V::splat(*a.add(kk * MR + m)), V::splat(*a.add((kk + 1) * MR + m)));
            for p in 0..NP {
                acc[m][p] = V::fmadd(x0, w0[p], acc[m][p]);
                acc[m][p] = V::fmadd(x1, w1[p], acc[m][p]);
            }
        }
    }
}

/// The float formats' loop, two values of `kk` per iteration (the shape of the NVFP4
/// loop, which keeps more loads in flight). `b` is panel 0's first weight, panels
/// `stride` bytes apart; `BF16` says whether weights are bf16 (else f32).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pairs<V: Lanes, const MR: usize, const NP: usize, const BF16: bool>(
    acc: &mut [[V::F; NP]; MR],
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
    // SAFETY: the caller's tile holds `kc` values of `kk` in each of `NP` panels and
    // `[kc][MR]` inputs; the caller has `V`'s features.
    unsafe {
        while kk + 2 <= kc {
            let mut w0 = [V::zero(); NP];
            let mut w1 = [V::zero(); NP];
            for p in 0..NP {
                if BF16 {
                    (w0[p], w1[p]) = V::bf16_pairs(at(kk, p).cast());
                } else {
                    w0[p] = V::load(at(kk, p).cast());
                    w1[p] = V::load(at(kk + 1, p).cast());
                }
            }
            fma_pair::<V, MR, NP>(acc, a, kk, &w0, &w1);
            kk += 2;
        }
        if kk < kc {
            for p in 0..NP {
                let w = if BF16 {
                    V::bf16_pairs(at(kk, p).cast()).0
                } else {
                    V::load(at(kk, p).cast())
                };
                for m in 0..MR {
                    acc[m][p] = V::fmadd(V::splat(*a.add(kk * MR + m)), w, acc[m][p]);
                }
            }
        }
    }
}

/// The divisors of sixteen NVFP4 blocks, one per lane, with scale bytes `idx`: computed
/// by `form` ([`Form::apply`]'s arithmetic), or gathered from the tensor's table `d`.
#[inline(always)]
unsafe fn factors<V: Lanes>(idx: V::I, d: *const f32, form: Option<Form>) -> V::F {
    // SAFETY: the caller has `V`'s features; every lane of `idx` is a byte, an index
    // into the 256-entry table.
    unsafe {
        match form {
            Some(form) => {
                let e4m3 = V::mul(V::e4m3(idx), V::splat(E4M3_UNBIAS));
                let v = V::splat(form.value);
                if form.divide {
                    V::div(e4m3, v)
                } else {
                    V::mul(e4m3, v)
                }
            }
            None => V::gather(d, idx),
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

/// [`widen_avx512`] with AVX2: the values [`k256`] widens in registers.
pub(super) fn widen_avx2(panels: Panels, np: usize, kc: usize, out: &mut [f32]) {
    assert!(avx2(), "the AVX2 widening needs AVX2, FMA and F16C");
    panels.check(np, kc);
    assert!(out.len() >= np * kc * NR, "the widened panels do not fit");
    // SAFETY: as in `widen_avx512`.
    unsafe { widen256(panels, np, kc, out.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn widen512(panels: Panels, np: usize, kc: usize, out: *mut f32) {
    // SAFETY: the caller's, and the features `Avx512` needs are enabled here.
    unsafe { widen::<Avx512>(panels, np, kc, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen256(panels: Panels, np: usize, kc: usize, out: *mut f32) {
    // SAFETY: the caller's, and the features `Avx2` needs are enabled here.
    unsafe { widen::<Avx2>(panels, np, kc, out) }
}

/// The widening at width `V`, offsets as in [`tile`].
#[inline(always)]
unsafe fn widen<V: Lanes>(panels: Panels, np: usize, kc: usize, out: *mut f32) {
    for p in 0..np {
        // SAFETY: as the public entry points asserted; the caller has `V`'s features.
        unsafe {
            let o = out.add(p * kc * NR);
            match panels {
                Panels::F32 { data, stride } => {
                    std::ptr::copy_nonoverlapping(data.as_ptr().add(p * stride), o, kc * NR);
                }
                Panels::Bf16 { data, stride } => {
                    let b = data.as_ptr().add(p * stride);
                    for kk in (0..kc).step_by(2) {
                        let (w0, w1) = V::bf16_pairs(b.add(kk * NR));
                        V::store(o.add(kk * NR), w0);
                        if kk + 1 < kc {
                            V::store(o.add((kk + 1) * NR), w1);
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
                    let table = V::table();
                    let q = codes.as_ptr().add(p * code_stride);
                    let s = scales.as_ptr().add(p * scale_stride);
                    for kb in 0..kc / crate::BLOCK {
                        let f = factors::<V>(V::bytes(s.add(kb * NR)), divisors.as_ptr(), form);
                        for half in 0..2 {
                            let k8 = kb * crate::BLOCK + 8 * half;
                            let mut v = V::codes(q.add(k8 / 2 * NR));
                            for i in 0..8 {
                                V::store(o.add((k8 + i) * NR), V::fp4(v, table, f));
                                v = V::shr4(v);
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
                        let d = V::f16(s.add(kb * NR));
                        for kk in kb * BLOCK..(kb + 1) * BLOCK {
                            V::store(o.add(kk * NR), V::q8(q.add(kk * NR), d));
                        }
                    }
                }
            }
        }
    }
}

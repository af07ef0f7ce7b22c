//! The micro-kernel for aarch64: Advanced SIMD (NEON), which every ARMv8-A CPU has, so
//! it needs no run-time check. A panel's sixteen columns are four 4-lane vectors; a
//! tile keeps up to 24 accumulators of the 32 vector registers (6 rows × 1 panel,
//! 3 × 2, 2 × 3, or 1 row × 4 panels for a decode step).
//!
//! The arithmetic is the portable kernel's: every output is one chain of fused
//! multiply-adds (`fmla`) over `kk` in order, from zero or from the values in `c`.
//! Weights are widened in registers, to the values the portable kernel looks up:
//! - bf16: a 16-bit shift (the first of a pair) or a mask (the second);
//! - NVFP4: a byte lookup (`tbl`) of the high half of each code's f32 value (every FP4
//!   value has a zero low half), times the block's divisor, computed from the scale
//!   byte where the weight's [`Form`] allows and otherwise read from the tensor's
//!   256-entry table;
//! - Q8_0: each code widened to 32 bits, converted, times the block's f16 scale.

// `unsafe` here: NEON loads and stores through raw pointers into slices whose bounds
// `Tile::check` (or `widen`'s asserts) have checked. The intrinsics themselves need no
// feature check: NEON is part of the aarch64 baseline.
#![allow(unsafe_code)]

use std::arch::aarch64::*;

use super::{E4M3_UNBIAS, Form, NR, Panels, Tile, fp4_table};
use crate::formats::bf16::f16_to_f32;

/// Runs `tile` with the NEON kernel of its shape.
pub(super) fn tile(t: &mut Tile) {
    macro_rules! rows {
        ($np:literal, [$($m:literal),*]) => {
            match t.mr {
                // SAFETY: the tile's bounds were checked by `Tile::check`.
                $($m => unsafe { kernel::<$m, $np>(t) },)*
                _ => unreachable!("too many rows for a NEON tile of {} panel(s)", $np),
            }
        };
    }
    match t.np {
        1 => rows!(1, [1, 2, 3, 4, 5, 6]),
        2 => rows!(2, [1, 2, 3]),
        3 => rows!(3, [1, 2]),
        4 => rows!(4, [1]),
        _ => unreachable!("at most 4 panels per NEON tile"),
    }
}

/// Sixteen f32 as four vectors.
type X16 = [float32x4_t; 4];

/// Sixteen f32 at `p`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load16(p: *const f32) -> X16 {
    // SAFETY: the caller's promise: sixteen values readable at `p`.
    unsafe {
        [
            vld1q_f32(p),
            vld1q_f32(p.add(4)),
            vld1q_f32(p.add(8)),
            vld1q_f32(p.add(12)),
        ]
    }
}

/// Sixteen f32 to `p`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store16(p: *mut f32, v: X16) {
    // SAFETY: the caller's promise: sixteen values writable at `p`.
    unsafe {
        for (i, v) in v.into_iter().enumerate() {
            vst1q_f32(p.add(4 * i), v);
        }
    }
}

/// Sixteen pairs of bf16 values at `p` (`[16][2]`, see `pack_pairs`), widened: the
/// first of each pair (a shift) and the second (a mask).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn bf16_pairs16(p: *const u16) -> (X16, X16) {
    let mask = vdupq_n_u32(0xFFFF_0000);
    let mut first = [vdupq_n_f32(0.0); 4];
    let mut second = [vdupq_n_f32(0.0); 4];
    for i in 0..4 {
        // SAFETY: the caller's promise: 32 values readable at `p`.
        let v = unsafe { vld1q_u32(p.add(8 * i).cast()) };
        first[i] = vreinterpretq_f32_u32(vshlq_n_u32::<16>(v));
        second[i] = vreinterpretq_f32_u32(vandq_u32(v, mask));
    }
    (first, second)
}

/// The high halves of the sixteen FP4 values' f32 bits, as a 32-byte lookup table
/// (`table[2c]`, `table[2c + 1]`: code `c`'s bits 16-23 and 24-31).
#[inline]
#[target_feature(enable = "neon")]
fn fp4_high_halves() -> uint8x16x2_t {
    let values = fp4_table();
    let mut bytes = [0u8; 32];
    for (c, v) in values.iter().enumerate() {
        let bits = v.to_bits();
        // Every FP4 value is exact in 16 bits: the lookup of the high half is the value.
        debug_assert_eq!(bits & 0xFFFF, 0, "FP4 code {c}");
        bytes[2 * c] = (bits >> 16) as u8;
        bytes[2 * c + 1] = (bits >> 24) as u8;
    }
    // SAFETY: 32 bytes readable.
    unsafe { vld1q_u8_x2(bytes.as_ptr()) }
}

/// The FP4 values of the codes in the low four bits of each lane of `codes`: the
/// lookup's indices put `2c` and `2c + 1` in a lane's two high bytes and 0xFF (out of
/// the table, so zero) in its two low ones.
#[inline]
#[target_feature(enable = "neon")]
fn fp4x4(codes: uint32x4_t, table: uint8x16x2_t) -> float32x4_t {
    let code = vandq_u32(codes, vdupq_n_u32(0xF));
    let idx = vmlaq_u32(vdupq_n_u32(0x0100_FFFF), code, vdupq_n_u32(0x0202_0000));
    vreinterpretq_f32_u8(vqtbl2q_u8(table, vreinterpretq_u8_u32(idx)))
}

/// The FP4 values of the sixteen codes in the low four bits of `codes`' lanes, times
/// their factors `f`; then the next codes are shifted down into those bits.
#[inline]
#[target_feature(enable = "neon")]
fn fp4x16(codes: &mut [uint32x4_t; 4], table: uint8x16x2_t, f: &X16) -> X16 {
    let mut w = [vdupq_n_f32(0.0); 4];
    for l in 0..4 {
        w[l] = vmulq_f32(fp4x4(codes[l], table), f[l]);
        codes[l] = vshrq_n_u32::<4>(codes[l]);
    }
    w
}

/// The divisors of sixteen NVFP4 blocks (one per column) with the scale bytes at `s`:
/// computed by `form` ([`Form::apply`]'s arithmetic), or read from the tensor's table `d`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn factors16(s: *const u8, d: &[f32; 256], form: Option<Form>) -> X16 {
    match form {
        Some(form) => {
            // SAFETY: the caller's promise: sixteen scale bytes readable at `s`.
            let bytes = unsafe { vld1q_u8(s) };
            let (lo, hi) = (vmovl_u8(vget_low_u8(bytes)), vmovl_high_u8(bytes));
            let lanes = [
                vmovl_u16(vget_low_u16(lo)),
                vmovl_high_u16(lo),
                vmovl_u16(vget_low_u16(hi)),
                vmovl_high_u16(hi),
            ];
            let (unbias, value) = (vdupq_n_f32(E4M3_UNBIAS), vdupq_n_f32(form.value));
            let mut f = [vdupq_n_f32(0.0); 4];
            for (f, l) in f.iter_mut().zip(lanes) {
                let e4m3 = vmulq_f32(vreinterpretq_f32_u32(vshlq_n_u32::<20>(l)), unbias);
                *f = if form.divide {
                    vdivq_f32(e4m3, value)
                } else {
                    vmulq_f32(e4m3, value)
                };
            }
            f
        }
        None => {
            // No gather instruction: sixteen loads, once per block of sixteen `kk`.
            // SAFETY: as above.
            let f: [f32; NR] = std::array::from_fn(|j| d[usize::from(unsafe { *s.add(j) })]);
            // SAFETY: sixteen values readable.
            unsafe { load16(f.as_ptr()) }
        }
    }
}

/// The codes of values `k8..k8 + 8` of a panel's sixteen columns, eight per lane, the
/// code of `k8` in the low four bits.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fp4_codes16(q: *const u8, k8: usize) -> [uint32x4_t; 4] {
    // SAFETY: the caller's panel holds the 64 code bytes from `k8 / 2 · 16`.
    unsafe {
        let at = q.add(k8 / 2 * NR).cast::<u32>();
        [
            vld1q_u32(at),
            vld1q_u32(at.add(4)),
            vld1q_u32(at.add(8)),
            vld1q_u32(at.add(12)),
        ]
    }
}

/// The f16 scales of a Q8_0 block's sixteen columns at `s`, as f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q8_scales16(s: *const u16) -> X16 {
    // Stable Rust has no f16 vector type; sixteen conversions per 32 values of `kk`.
    // SAFETY: the caller's promise: sixteen scales readable at `s`.
    let d: [f32; NR] = std::array::from_fn(|j| f16_to_f32(unsafe { *s.add(j) }));
    // SAFETY: sixteen values readable.
    unsafe { load16(d.as_ptr()) }
}

/// Sixteen Q8_0 codes at `p`, times the scales `d`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q8x16(p: *const i8, d: X16) -> X16 {
    // SAFETY: the caller's promise: sixteen codes readable at `p`.
    let codes = unsafe { vld1q_s8(p) };
    let (lo, hi) = (vmovl_s8(vget_low_s8(codes)), vmovl_high_s8(codes));
    let lanes = [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_high_s16(lo),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_high_s16(hi),
    ];
    let mut w = [vdupq_n_f32(0.0); 4];
    for i in 0..4 {
        w[i] = vmulq_f32(vcvtq_f32_s32(lanes[i]), d[i]);
    }
    w
}

/// `acc[m][p] += x[kk][m] · w` for every row of panel `p` (`a` packed `[kk][MR]`).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fma<const MR: usize, const NP: usize>(
    acc: &mut [[X16; NP]; MR],
    a: *const f32,
    kk: usize,
    p: usize,
    w: &X16,
) {
    for m in 0..MR {
        // SAFETY: the caller's tile holds `[kc][MR]` inputs and `kk < kc`.
        let x = unsafe { *a.add(kk * MR + m) };
        for i in 0..4 {
            acc[m][p][i] = vfmaq_n_f32(acc[m][p][i], w[i], x);
        }
    }
}

// The accumulator arrays are indexed by constants after unrolling, so they live in
// registers; explicit index loops say which lane goes with which row and panel.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "neon")]
unsafe fn kernel<const MR: usize, const NP: usize>(t: &mut Tile) {
    let (a, c, ldc, kc) = (t.a.as_ptr(), t.c.as_mut_ptr(), t.ldc, t.kc);
    let mut acc = [[[vdupq_n_f32(0.0); 4]; NP]; MR];
    // SAFETY (of every access below): `Tile::check` asserted that the inputs, the
    // weights of `NP` panels over `kc` values of `kk` and the output tile are inside
    // their slices; the offsets are those of the portable kernel.
    unsafe {
        if t.accumulate {
            for m in 0..MR {
                for p in 0..NP {
                    acc[m][p] = load16(c.add(m * ldc + p * NR));
                }
            }
        }
        match t.panels {
            Panels::F32 { data, stride } => {
                let b = data.as_ptr();
                for kk in 0..kc {
                    for p in 0..NP {
                        let w = load16(b.add(p * stride + kk * NR));
                        fma(&mut acc, a, kk, p, &w);
                    }
                }
            }
            Panels::Bf16 { data, stride } => {
                // Pairs of `kk` in 32 values: the pair from an even `kk` sits where
                // `kk`'s row of sixteen would.
                let b = data.as_ptr();
                for kk in (0..kc).step_by(2) {
                    for p in 0..NP {
                        let (w0, w1) = bf16_pairs16(b.add(p * stride + kk * NR));
                        fma(&mut acc, a, kk, p, &w0);
                        if kk + 1 < kc {
                            fma(&mut acc, a, kk + 1, p, &w1);
                        }
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
                let table = fp4_high_halves();
                let (q, s) = (codes.as_ptr(), scales.as_ptr());
                for kb in 0..kc / crate::BLOCK {
                    let mut f = [[vdupq_n_f32(0.0); 4]; NP];
                    for p in 0..NP {
                        f[p] = factors16(s.add(p * scale_stride + kb * NR), divisors, form);
                    }
                    for half in 0..2 {
                        let k8 = kb * crate::BLOCK + 8 * half;
                        for p in 0..NP {
                            let mut v = fp4_codes16(q.add(p * code_stride), k8);
                            for i in 0..8 {
                                let w = fp4x16(&mut v, table, &f[p]);
                                fma(&mut acc, a, k8 + i, p, &w);
                            }
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
                    for p in 0..NP {
                        let d = q8_scales16(s.add(p * scale_stride + kb * NR));
                        for kk in kb * BLOCK..(kb + 1) * BLOCK {
                            let w = q8x16(q.add(p * code_stride + kk * NR), d);
                            fma(&mut acc, a, kk, p, &w);
                        }
                    }
                }
            }
        }
        for m in 0..MR {
            for p in 0..NP {
                store16(c.add(m * ldc + p * NR), acc[m][p]);
            }
        }
    }
}

/// Writes the f32 values of panels `0..np` over `kc` values of `kk` into `out`
/// (`[p][kk][16]`): the values [`kernel`] widens in registers, by the same
/// instructions (see `super::widen`).
pub(super) fn widen(panels: Panels, np: usize, kc: usize, out: &mut [f32]) {
    panels.check(np, kc);
    assert!(out.len() >= np * kc * NR, "the widened panels do not fit");
    let o = out.as_mut_ptr();
    // SAFETY: every read is inside the panels (checked above), every write inside `out`
    // (asserted above); the offsets are `kernel`'s.
    unsafe {
        for p in 0..np {
            let o = o.add(p * kc * NR);
            match panels {
                Panels::F32 { data, stride } => {
                    std::ptr::copy_nonoverlapping(data.as_ptr().add(p * stride), o, kc * NR);
                }
                Panels::Bf16 { data, stride } => {
                    let b = data.as_ptr().add(p * stride);
                    for kk in (0..kc).step_by(2) {
                        let (w0, w1) = bf16_pairs16(b.add(kk * NR));
                        store16(o.add(kk * NR), w0);
                        if kk + 1 < kc {
                            store16(o.add((kk + 1) * NR), w1);
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
                    let table = fp4_high_halves();
                    let (q, s) = (
                        codes.as_ptr().add(p * code_stride),
                        scales.as_ptr().add(p * scale_stride),
                    );
                    for kb in 0..kc / crate::BLOCK {
                        let f = factors16(s.add(kb * NR), divisors, form);
                        for half in 0..2 {
                            let k8 = kb * crate::BLOCK + 8 * half;
                            let mut v = fp4_codes16(q, k8);
                            for i in 0..8 {
                                store16(o.add((k8 + i) * NR), fp4x16(&mut v, table, &f));
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
                        let d = q8_scales16(s.add(kb * NR));
                        for kk in kb * BLOCK..(kb + 1) * BLOCK {
                            store16(o.add(kk * NR), q8x16(q.add(kk * NR), d));
                        }
                    }
                }
            }
        }
    }
}

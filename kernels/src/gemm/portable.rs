//! The micro-kernel in plain Rust, for CPUs without AVX2 and as the statement of what
//! the SIMD kernels compute: for every output, one chain of `f32::mul_add` over `kk` in
//! order (the SIMD kernels' fused multiply-adds round the same way, so the three paths
//! agree bit for bit).

use super::{NR, Panels, Tile, fp4_table};

/// Runs one tile (already bounds-checked by the caller).
pub(super) fn tile(t: &mut Tile) {
    let (mr, kc) = (t.mr, t.kc);
    let table = fp4_table();
    for p in 0..t.np {
        let mut acc = vec![[0.0f32; NR]; mr];
        if t.accumulate {
            for (m, a) in acc.iter_mut().enumerate() {
                a.copy_from_slice(&t.c[m * t.ldc + p * NR..m * t.ldc + (p + 1) * NR]);
            }
        }
        for kk in 0..kc {
            let w: [f32; NR] = std::array::from_fn(|j| weight(&t.panels, p, kk, j, &table));
            for (m, a) in acc.iter_mut().enumerate() {
                let x = t.a[kk * mr + m];
                for (a, &w) in a.iter_mut().zip(&w) {
                    *a = x.mul_add(w, *a);
                }
            }
        }
        for (m, a) in acc.iter().enumerate() {
            t.c[m * t.ldc + p * NR..m * t.ldc + (p + 1) * NR].copy_from_slice(a);
        }
    }
}

/// The f32 value of column `j` of panel `p` at `kk` (relative to the tile's start).
#[inline(always)]
fn weight(panels: &Panels, p: usize, kk: usize, j: usize, table: &[f32; 16]) -> f32 {
    match *panels {
        Panels::F32 { data, stride } => data[p * stride + kk * NR + j],
        Panels::Bf16 { data, stride } => {
            f32::from_bits(u32::from(data[p * stride + super::bf16_at(kk, j)]) << 16)
        }
        Panels::Nvfp4 {
            codes,
            code_stride,
            scales,
            scale_stride,
            divisors,
            // The table: the form, where there is one, gives the same bits.
            ..
        } => {
            let byte = codes[p * code_stride + super::fp4_byte(kk, j)];
            let code = if kk.is_multiple_of(2) {
                byte & 0xF
            } else {
                byte >> 4
            };
            let scale = scales[p * scale_stride + kk / crate::BLOCK * NR + j];
            table[usize::from(code)] * divisors[usize::from(scale)]
        }
        Panels::Q8 {
            codes,
            code_stride,
            scales,
            scale_stride,
        } => {
            use crate::formats::q8::{BLOCK, value};
            value(
                codes[p * code_stride + kk * NR + j],
                scales[p * scale_stride + kk / BLOCK * NR + j],
            )
        }
    }
}

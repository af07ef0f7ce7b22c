//! NVFP4 weights in bf16 arithmetic with AVX512-BF16 (`vdpbf16ps`): every FP4 value is
//! a bf16 value exactly, so the codes are looked up as bf16 words (`vpermw`, 32 per
//! instruction) and dotted with the inputs' bf16 pairs, a block of sixteen values of
//! `kk` at a time; each block's sum is then multiplied by its factor and added to the
//! output (one fused multiply-add per block). Where the factors are computed from the
//! scale bytes ([`crate::gemm::packed::Form`]), the block's factor is its E4M3 scale
//! alone and the output is divided by (or multiplied by) the global scale once at the
//! end: a division per block was a large part of the kernel's time (benchmarks/native.md,
//! "Decode at the memory wall").
//!
//! Why: the f32 kernels widen every weight to f32 before multiplying (a lookup, a
//! multiply by the block's factor and a shift per sixteen weights, beside the
//! multiply-add), which made a decode step's NVFP4 products compute-bound, well short of
//! the read bandwidth (benchmarks/native.md, "Decode at the memory wall"). Here thirty-two
//! weights take a lookup, a dot product and most of a shift, and the factor is applied
//! once per block instead of once per weight.
//!
//! The sums differ from those of the dequantized weights (the factor multiplies a
//! block's sum, not each value, and the instruction adds its two products per lane in
//! its own order), so this is one more dot-product path of bf16 arithmetic, chosen with
//! the bf16 one ([`crate::gemm::Tuning::calibrate_bf16_dot`]), and every product of the
//! same NVFP4 weights takes it whatever its number of rows: each output is the same
//! chain (per block, eight dot products over the pairs in order, then one multiply-add)
//! in every tile shape.
//!
//! The codes' layout is the f32 kernels' (`crate::gemm::packed`): lane `j` of a row of
//! sixteen u32 holds column `j`'s eight codes of `kk = 8t..8t + 8`. Read as 32 words,
//! the low word of lane `j` starts with the code of `8t + i` and the high word with that
//! of `8t + 4 + i` once the lane is shifted right by `4i`: one `vpermw` over a table of
//! the sixteen values (repeated, since it reads five bits) gives the pairs
//! (`8t + i`, `8t + 4 + i`) of all sixteen columns, and the inputs are packed in that
//! order ([`pack_fp4_pairs`]).

use std::arch::x86_64::*;

use super::lanes::{Avx512, Lanes};
use super::{E4M3_UNBIAS, NR, avx512_bf16};
use crate::gemm::Packed;
use crate::gemm::tile::{Panels, panel_slice, run_length};

/// Rows per tile of more than two rows (a batch of decodes, a prefill), with
/// [`FP4_NP`] panels side by side: twelve chains of block sums and twelve outputs. Four
/// rows of three panels measured faster than twelve rows of one (each lookup feeds
/// four dot products instead of one row's, and each broadcast input three), and as fast
/// as six rows (benchmarks/native.md, "Decode at the memory wall").
pub(in crate::gemm) const FP4_MR: usize = 4;

/// Panels side by side in a tile of [`FP4_MR`] rows.
pub(in crate::gemm) const FP4_NP: usize = 3;

/// The most rows of a tile of [`FP4_FEW_NP`] panels: one or two rows (a decode step).
pub(in crate::gemm) const FP4_FEW_MR: usize = 2;

/// Panels side by side in a tile of one or two rows: four chains of dot products in
/// flight per row.
pub(in crate::gemm) const FP4_FEW_NP: usize = 4;

/// `x` (`rows × k`, `k` a multiple of 16) rounded to bf16 and packed for
/// [`dot_fp4`]: as `super::pack_bf16_pairs`, with each group of eight values of `kk`
/// taken in the order of the code lookups: `(8t, 8t + 4)`, `(8t + 1, 8t + 5)`, ...
pub(in crate::gemm) fn pack_fp4_pairs(x: &[f32], rows: usize, k: usize, mr: usize) -> Vec<u32> {
    assert!(k.is_multiple_of(crate::BLOCK) && x.len() >= rows * k);
    let mut order = vec![0.0f32; rows * k];
    for (dst, src) in order.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        for i in 0..4 {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[4 + i];
        }
    }
    super::pack_bf16_pairs(&order, rows, k, mr)
}

/// The sixteen FP4 values as bf16 bits, twice (`vpermw` reads five bits of an index).
fn bf16_table() -> [u16; 32] {
    std::array::from_fn(|i| (crate::formats::fp4::decode((i % 16) as u8).to_bits() >> 16) as u16)
}

/// `c = x · wᵀ` for panels `first..first + count` of NVFP4 weights `w`: `a` is `rows`
/// rows packed by [`pack_fp4_pairs`] in blocks of `mr` rows (at most [`FP4_MR`] with
/// `np` = [`FP4_NP`], [`FP4_FEW_MR`] with [`FP4_FEW_NP`]); row `m`'s sixteen values of panel `first + p`
/// go to `c[m * ldc + 16 p..]`. Panels go `np` at a time where that many share a divisor
/// table, else one at a time.
#[allow(clippy::too_many_arguments)]
pub(in crate::gemm) fn dot_fp4(
    a: &[u32],
    rows: usize,
    (mr, np): (usize, usize),
    w: &Packed,
    first: usize,
    count: usize,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(avx512_bf16(), "the NVFP4 dot-product kernel needs AVX512-BF16");
    assert!(
        ((np == FP4_NP || np == 1) && (1..=FP4_MR).contains(&mr))
            || (np == FP4_FEW_NP && (1..=FP4_FEW_MR).contains(&mr)),
        "a tile of {mr} rows × {np} panels"
    );
    let k = w.k();
    let pairs = k / 2;
    assert!(a.len() == rows * pairs && (first + count) * NR <= w.n().next_multiple_of(NR));
    assert!(rows == 0 || c.len() >= (rows - 1) * ldc + count * NR);
    let table = bf16_table();
    let mut p = 0;
    while p < count {
        let np = if count - p >= np && run_length(w, first + p) >= np {
            np
        } else {
            1
        };
        let panels = panel_slice(w, first + p, 0);
        panels.check(np, k);
        let Panels::Nvfp4 {
            codes,
            code_stride,
            scales,
            scale_stride,
            divisors,
            form,
        } = panels
        else {
            unreachable!("NVFP4 weights checked by the caller");
        };
        let mut m = 0;
        while m < rows {
            let width = mr.min(rows - m);
            let block = &a[m * pairs..m * pairs + width * pairs];
            let c = &mut c[m * ldc + p * NR..];
            let weights = Weights {
                codes: codes.as_ptr(),
                code_stride,
                scales: scales.as_ptr(),
                scale_stride,
                divisors: divisors.as_ptr(),
                form,
                table: table.as_ptr(),
                k,
            };
            macro_rules! rows {
                ($np:literal, [$($r:literal),*]) => {
                    match width {
                        // SAFETY: AVX512-BF16 is present (asserted above); `block` holds
                        // `pairs × width` values, the panels `np` panels of `k` values
                        // (checked above), and `c` `width` rows `ldc` apart of `16 · np`
                        // values (asserted above).
                        $($r => unsafe { dp_fp4::<$r, $np>(block.as_ptr(), &weights, c.as_mut_ptr(), ldc) },)*
                        _ => unreachable!("a tile of {width} rows × {np} panels"),
                    }
                };
            }
            // The literals are `FP4_MR`, `FP4_NP`, `FP4_FEW_MR` and `FP4_FEW_NP`
            // (checked beside them).
            match np {
                1 => rows!(1, [1, 2, 3, 4]),
                3 => rows!(3, [1, 2, 3, 4]),
                _ => rows!(4, [1, 2]),
            }
            m += width;
        }
        p += np;
    }
}

const _: () = assert!(FP4_MR == 4 && FP4_NP == 3 && FP4_FEW_MR == 2 && FP4_FEW_NP == 4);

/// One tile's panels: pointers into [`Panels::Nvfp4`] and the lookup table.
struct Weights {
    codes: *const u8,
    code_stride: usize,
    scales: *const u8,
    scale_stride: usize,
    divisors: *const f32,
    form: Option<crate::gemm::packed::Form>,
    table: *const u16,
    k: usize,
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma")]
unsafe fn dp_fp4<const MR: usize, const NP: usize>(a: *const u32, w: &Weights, c: *mut f32, ldc: usize) {
    let zero = _mm512_setzero_ps();
    let mut acc = [[zero; NP]; MR];
    unsafe {
        let table = _mm512_loadu_si512(w.table.cast());
        for kb in 0..w.k / crate::BLOCK {
            let mut sum = [[zero; NP]; MR];
            for half in 0..2 {
                let t = 2 * kb + half;
                let mut v = [_mm512_setzero_si512(); NP];
                for p in 0..NP {
                    v[p] = _mm512_loadu_si512(w.codes.add(p * w.code_stride + t * 4 * NR).cast());
                }
                for i in 0..4 {
                    let mut b = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NP];
                    for p in 0..NP {
                        let idx = match i {
                            0 => v[p],
                            1 => _mm512_srli_epi32::<4>(v[p]),
                            2 => _mm512_srli_epi32::<8>(v[p]),
                            _ => _mm512_srli_epi32::<12>(v[p]),
                        };
                        b[p] = std::mem::transmute::<__m512i, __m512bh>(_mm512_permutexvar_epi16(idx, table));
                    }
                    let pair = 4 * t + i;
                    for m in 0..MR {
                        let x: __m512bh =
                            std::mem::transmute(_mm512_set1_epi32(*a.add(pair * MR + m) as i32));
                        for p in 0..NP {
                            sum[m][p] = _mm512_dpbf16_ps(sum[m][p], x, b[p]);
                        }
                    }
                }
            }
            for p in 0..NP {
                let bytes = Avx512::bytes(w.scales.add(p * w.scale_stride + kb * NR));
                let f = match w.form {
                    Some(_) => _mm512_mul_ps(Avx512::e4m3(bytes), _mm512_set1_ps(E4M3_UNBIAS)),
                    None => Avx512::gather(w.divisors, bytes),
                };
                for m in 0..MR {
                    acc[m][p] = _mm512_fmadd_ps(sum[m][p], f, acc[m][p]);
                }
            }
        }
        for m in 0..MR {
            for p in 0..NP {
                let out = match w.form {
                    Some(form) if form.divide => _mm512_div_ps(acc[m][p], _mm512_set1_ps(form.value)),
                    Some(form) => _mm512_mul_ps(acc[m][p], _mm512_set1_ps(form.value)),
                    None => acc[m][p],
                };
                _mm512_storeu_ps(c.add(m * ldc + p * NR), out);
            }
        }
    }
}

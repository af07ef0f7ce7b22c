//! The bf16 dot-product kernel of AVX512-BF16 (`vdpbf16ps`): the inputs rounded to
//! bf16 and packed in pairs ([`pack_bf16_pairs`]), then dotted with the bf16 weights'
//! pairs of sixteen lanes, up to [`DP_MR`] rows × [`DP_NP`] panels per tile. AVX-512 alone: AVX2 has no bf16 dot product.

use std::arch::x86_64::*;

use super::{NR, avx512, avx512_bf16};

/// Rows per tile of the bf16 dot-product kernel, with [`DP_NP`] panels side by side
/// (24 accumulators); a batch of up to `DP_MR` rows takes one tile of its panels, so
/// that each panel is read once.
pub(in crate::gemm) const DP_MR: usize = 8;

/// Panels side by side in a tile of the bf16 dot-product kernel for many rows: each
/// broadcast pair of inputs feeds three dot products, and the rows' packed inputs
/// stream past the weights a third as often as with one panel. 8 × 3 measured fastest
/// of the shapes tried, for 512 rows and for 64 (benchmarks/native.md, "Figures that
/// were in code comments").
pub(in crate::gemm) const DP_NP: usize = 3;

// `dot_bf16` dispatches tiles of `DP_MR` rows × `DP_NP` panels by literals.
const _: () = assert!(DP_MR == 8 && DP_NP == 3);

/// `x` (`rows × k`) rounded to bf16 (`crate::gemm::round_bf16`) and packed for [`dot_bf16`]:
/// blocks of `mr` rows, each `[pair][width]` of bf16 pairs (`kk`, `kk + 1`).
pub(in crate::gemm) fn pack_bf16_pairs(x: &[f32], rows: usize, k: usize, mr: usize) -> Vec<u32> {
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

/// One row of [`pack_bf16_pairs`]: `row`'s values rounded to bf16 (`crate::gemm::round_bf16`)
/// in pairs, pair `t` into `block[t * width + m]`. Sixteen values at a time with
/// AVX-512F, the rounding's integer steps lane by lane (a NaN kept as it is), then
/// the top halves narrowed to sixteen bf16, which are eight pairs in order; the
/// values past the last sixteen one by one. The same bits as the scalar steps, which a
/// test holds it to.
///
/// Why vectorized: done one value at a time, the packing was a measurable share of a
/// bf16 prefill of SmolLM2 beside the dot products themselves (benchmarks/native.md,
/// "Figures that were in code comments").
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
        let lo = crate::gemm::round_bf16(row[2 * t]).to_bits() >> 16;
        let hi = row
            .get(2 * t + 1)
            .map_or(0, |&v| crate::gemm::round_bf16(v).to_bits() >> 16);
        block[t * width + m] = lo | (hi << 16);
    }
}

/// `c = x · wᵀ` for panels `first..first + count` of bf16 weights, with `vdpbf16ps`:
/// `a` is `rows` rows packed by [`pack_bf16_pairs`] in blocks of `mr` (at most
/// [`DP_MR`]); row `m`'s sixteen
/// values of panel `first + p` go to `c[m * ldc + 16 p..]`. Each pair of inputs is
/// broadcast and dotted with the pairs of sixteen lanes of `np` panels side by side
/// (1 or [`DP_NP`]; the last panels of a run that does not fill a tile go one at a
/// time). Every output is the same chain of dot products over the pairs in order,
/// whatever panels share its tile.
#[allow(clippy::too_many_arguments)]
pub(in crate::gemm) fn dot_bf16(
    a: &[u32],
    rows: usize,
    (mr, np): (usize, usize),
    w: &crate::gemm::Packed,
    first: usize,
    count: usize,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(avx512_bf16(), "the bf16 dot-product kernel needs AVX512-BF16");
    assert!(
        (np == 1 || np == DP_NP) && (1..=DP_MR).contains(&mr),
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
                rows!(1, [1, 2, 3, 4, 5, 6, 7, 8]);
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

//! Attention scores (the dot products of one query row with a block of cached keys) and
//! the sum of a block's probabilities.
//!
//! Every score is the same sum whichever code computes it, so that a token gets the same
//! bits alone, in a prompt chunk or among drafts being verified, on AVX-512 as on AVX2.
//! The sum is defined as sixteen lanes of partial sums, lane `l` a chain of multiply-adds
//! over `d = l, l + 16, l + 32, …` in order from zero (fused where the CPU has FMA), then
//! a fixed tree over the lanes: `l + (l + 8)`, then `+ 4`, `+ 2`, `+ 1`.
//!
//! That order is what a vector unit does cheaply for sixteen keys at once: each key's
//! lanes are one register of multiply-adds, and the tree is a butterfly that folds the
//! sixteen registers into one register of sixteen scores (30 shuffles and 15 additions),
//! where a per-key horizontal sum took a chain of fifteen dependent additions per key.
//! [`dot`] is the definition, in scalar code; the SIMD paths are tested against it bit for
//! bit. A block's probabilities are summed in the same shape ([`sum`]).

// `unsafe` here: SIMD loads through raw pointers into slices whose bounds are asserted
// first, and calls of `#[target_feature]` functions once the CPU has been checked.
#![allow(unsafe_code)]

/// Lanes of partial sums.
const LANES: usize = 16;

/// The score sum of `a · b` (equal lengths), as the module defines it: lane `l` sums
/// `a[d] · b[d]` for `d ≡ l (mod 16)` in order, then the lanes fold pairwise.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32], fma: bool) -> f32 {
    let mut lanes = [0.0f32; LANES];
    for (ac, bc) in a.chunks(LANES).zip(b.chunks(LANES)) {
        for ((acc, &x), &y) in lanes.iter_mut().zip(ac).zip(bc) {
            *acc = if fma { x.mul_add(y, *acc) } else { *acc + x * y };
        }
    }
    fold(lanes)
}

/// The sum of a block's probabilities `p` (at most 64), in the same shape as [`dot`]:
/// lane `l` adds `p[j]` for `j ≡ l (mod 16)` in order, then the lanes fold. A sum in
/// order would be a chain of dependent additions per row and block.
#[inline(always)]
pub(super) fn sum(p: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    for chunk in p.chunks(LANES) {
        for (acc, &x) in lanes.iter_mut().zip(chunk) {
            *acc += x;
        }
    }
    fold(lanes)
}

/// The tree over the lanes: `l + (l + 8)`, `+ 4`, `+ 2`, `+ 1`.
#[inline(always)]
fn fold(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// `out[j] = dot(q, keys[j·slot..][..q.len()]) · scale` for `j < out.len()` (at most 64
/// keys); returns the largest (NaN scores are passed over, as `f32::max` does, on the
/// scalar path; a NaN score makes the row's output NaN on every path).
#[inline(always)]
pub(super) fn block(q: &[f32], keys: &[f32], slot: usize, scale: f32, out: &mut [f32], fma: bool) -> f32 {
    let hd = q.len();
    let seen = out.len();
    assert!(seen <= 64 && (seen == 0 || keys.len() >= (seen - 1) * slot + hd));
    #[cfg(target_arch = "x86_64")]
    if fma && hd.is_multiple_of(LANES) {
        if x86::avx512() {
            let mut max = f32::NEG_INFINITY;
            for (g, chunk) in out.chunks_mut(LANES).enumerate() {
                // SAFETY: AVX-512F is present; the keys of this group are in `keys`
                // (asserted above) and `chunk` holds one score per key.
                max = max.max(unsafe { x86::group512(q, &keys[g * LANES * slot..], slot, scale, chunk) });
            }
            return max;
        }
        if x86::avx2() {
            let mut max = f32::NEG_INFINITY;
            for (g, chunk) in out.chunks_mut(8).enumerate() {
                // SAFETY: as above, with AVX2 and FMA.
                max = max.max(unsafe { x86::group256(q, &keys[g * 8 * slot..], slot, scale, chunk) });
            }
            return max;
        }
    }
    let mut max = f32::NEG_INFINITY;
    for (j, score) in out.iter_mut().enumerate() {
        *score = dot(q, &keys[j * slot..][..hd], fma) * scale;
        max = max.max(*score);
    }
    max
}

/// Attention of query rows `qs` at one position (query heads of one token that share a
/// KV head) over every block of sixteen keys they see (positions `0..=position`,
/// `blocks` the sequence's table; each block `16 · slot` values of keys and of values,
/// this KV head's at `offset` in each slot), into `outs`, with each row's output,
/// maximum and sum in registers throughout. The same bits as `attend_tile`'s loop over
/// blocks. Returns false, doing nothing, where there is no such kernel: it needs AVX-512
/// and a head size of 64 or 128.
#[allow(clippy::too_many_arguments)]
pub(super) fn rows(
    qs: &[&[f32]],
    keys: &[f32],
    values: &[f32],
    blocks: &[u32],
    offset: usize,
    slot: usize,
    position: usize,
    scale: f32,
    outs: &mut [&mut [f32]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        let hd = qs.first().map_or(0, |q| q.len());
        let used = (position / LANES + 1).min(blocks.len());
        assert!(qs.len() == outs.len() && offset + hd <= slot && keys.len() == values.len());
        assert!(qs.iter().all(|q| q.len() == hd) && outs.iter().all(|o| o.len() == hd));
        assert!(
            blocks[..used]
                .iter()
                .all(|&b| (b as usize + 1) * LANES * slot <= keys.len())
        );
        // Rows side by side: as many as leave registers for the scores (`R · C` ≤ 12).
        let per = if hd == 64 { 3 } else { 1 };
        if hd != 64 && hd != 128 {
            return false;
        }
        for (q, out) in qs.chunks(per).zip(outs.chunks_mut(per)) {
            macro_rules! go {
                ($c:literal, $r:literal) => {
                    // SAFETY: the features are present and every block's slots are in
                    // the caches, the rows and outputs `hd` long (asserted above).
                    unsafe {
                        x86::rows512::<$c, $r>(
                            std::array::from_fn(|i| q[i]),
                            keys,
                            values,
                            blocks,
                            offset,
                            slot,
                            position,
                            scale,
                            out,
                        )
                    }
                };
            }
            match (hd, q.len()) {
                (64, 3) => go!(4, 3),
                (64, 2) => go!(4, 2),
                (64, _) => go!(4, 1),
                _ => go!(8, 1),
            }
        }
        return true;
    }
    let _ = (qs, keys, values, blocks, offset, slot, position, scale, outs);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The butterflies. Register `v[j]` holds key `j`'s sixteen lane sums (two halves
    //! on AVX2); each level adds lanes `width` apart and packs two keys' halves into one
    //! register, so that after the last level one register holds one sum per key, in a
    //! known order that a final permutation undoes.

    use std::arch::x86_64::*;

    use super::LANES;

    use crate::gemm::Isa;

    /// Whether the AVX-512 kernels may run: the CPU has them and `SOUS_KERNELS_ISA`
    /// does not ask for a narrower set (as for the products).
    pub(super) fn avx512() -> bool {
        Isa::current() == Isa::Avx512 && is_x86_feature_detected!("avx512f") && avx2()
    }

    /// Whether the AVX2 kernels may run (with FMA), likewise.
    pub(super) fn avx2() -> bool {
        Isa::current() != Isa::Portable && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Scores of up to sixteen keys (`out.len()`), `slot` values apart from `keys`,
    /// times `scale`; returns their largest. `q.len()` is a multiple of 16.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn group512(q: &[f32], keys: &[f32], slot: usize, scale: f32, out: &mut [f32]) -> f32 {
        let (hd, n) = (q.len(), out.len());
        debug_assert!((1..=LANES).contains(&n) && hd.is_multiple_of(LANES));
        let (q, keys) = (q.as_ptr(), keys.as_ptr());
        // SAFETY (all three): `q` holds `hd` values and `keys` `n` keys of `hd`.
        let v = match hd {
            64 => unsafe { sums512::<4>(q, keys, slot, n, 4) },
            128 => unsafe { sums512::<8>(q, keys, slot, n, 8) },
            _ => unsafe { sums512::<0>(q, keys, slot, n, hd / LANES) },
        };
        unsafe {
            let scores = butterfly512(v);
            let scores = _mm512_mul_ps(scores, _mm512_set1_ps(scale));
            let valid: __mmask16 = ((1u32 << n) - 1) as u16;
            _mm512_mask_storeu_ps(out.as_mut_ptr(), valid, scores);
            _mm512_mask_reduce_max_ps(valid, scores)
        }
    }

    /// One register of sixteen sums, one per key, from sixteen registers of lane sums
    /// (`v[j]`: key `j`'s), folded in the module's tree.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    fn butterfly512(v: [__m512; LANES]) -> __m512 {
        // Level 8: key j (lanes 0-7) and key j + 8 (lanes 8-15) per register.
        let mut r = [_mm512_setzero_ps(); 8];
        for i in 0..8 {
            let low = _mm512_shuffle_f32x4::<0b01_00_01_00>(v[i], v[i + 8]);
            let high = _mm512_shuffle_f32x4::<0b11_10_11_10>(v[i], v[i + 8]);
            r[i] = _mm512_add_ps(low, high);
        }
        // Level 4: four lanes each of keys i, i + 8, i + 4, i + 12 per register.
        let mut s = [_mm512_setzero_ps(); 4];
        for i in 0..4 {
            let even = _mm512_shuffle_f32x4::<0b10_00_10_00>(r[i], r[i + 4]);
            let odd = _mm512_shuffle_f32x4::<0b11_01_11_01>(r[i], r[i + 4]);
            s[i] = _mm512_add_ps(even, odd);
        }
        // Level 2: per 128-bit chunk, two lanes each of two keys.
        let mut t = [_mm512_setzero_ps(); 2];
        for i in 0..2 {
            let low = _mm512_shuffle_ps::<0b01_00_01_00>(s[i], s[i + 2]);
            let high = _mm512_shuffle_ps::<0b11_10_11_10>(s[i], s[i + 2]);
            t[i] = _mm512_add_ps(low, high);
        }
        // Level 1: per 128-bit chunk, one lane each of four keys.
        let even = _mm512_shuffle_ps::<0b10_00_10_00>(t[0], t[1]);
        let odd = _mm512_shuffle_ps::<0b11_01_11_01>(t[0], t[1]);
        let u = _mm512_add_ps(even, odd);
        // SAFETY: ORDER512 holds sixteen indices.
        let order = unsafe { _mm512_loadu_si512(ORDER512.as_ptr().cast()) };
        _mm512_permutexvar_ps(order, u)
    }

    /// The sum of the sixteen lanes of `x` in the module's tree (`super::fold`).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn fold512(x: __m512) -> f32 {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        let x = _mm256_add_ps(_mm512_castps512_ps256(x), high);
        let x = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps::<0b01>(x, x)))
    }

    /// `super::super::exp` on sixteen lanes, the same operations in the same order (no
    /// fused multiply-adds), so the same bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn exp512(x: __m512) -> __m512 {
        let splat = _mm512_set1_ps;
        let clamped = _mm512_min_ps(_mm512_max_ps(x, splat(-87.3)), splat(88.3));
        let round = splat(12_582_912.0);
        let t = _mm512_add_ps(_mm512_mul_ps(clamped, splat(std::f32::consts::LOG2_E)), round);
        let n = _mm512_sub_ps(t, round);
        let r = _mm512_sub_ps(
            _mm512_sub_ps(clamped, _mm512_mul_ps(n, splat(0.693_359_4))),
            _mm512_mul_ps(n, splat(-2.121_944_4e-4)),
        );
        let mut p = splat(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), splat(c));
        }
        let e = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
            splat(1.0),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(
                _mm512_castps_si512(t),
                _mm512_set1_epi32(12_582_912.0f32.to_bits() as i32),
            ),
            _mm512_set1_epi32(127),
        ));
        let y = _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
        let y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(-87.3)), y, splat(0.0));
        let y = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, splat(88.3)),
            y,
            splat(f32::INFINITY),
        );
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), y, x)
    }

    /// Attention of `R` query rows at one position (query heads of one token, sharing a
    /// KV head) over their blocks of sixteen keys, with each row's output (`C`
    /// registers: `head_dim / 16`), running maximum and sum kept in registers from the
    /// first block to the last. The operations per row and block are the tile loop's in
    /// `attend_tile`, in its order (scores, maximum, correction, probabilities, their
    /// sum, then the values key by key), so the bits are the same. Rows side by side
    /// give the processor independent chains to overlap: one row's block is a chain of
    /// dependent steps, from the scores to the last value.
    ///
    /// # Safety
    /// AVX-512F and FMA present; each `qs[i]` and `outs[i]` holds `16·C` values; for every
    /// block `b` with `16·b ≤ position`, keys and values `blocks[b]·16·slot + offset ..`
    /// hold the block's 16 slots of `slot` values (checked by the caller).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn rows512<const C: usize, const R: usize>(
        qs: [&[f32]; R],
        keys: &[f32],
        values: &[f32],
        blocks: &[u32],
        offset: usize,
        slot: usize,
        position: usize,
        scale: f32,
        outs: &mut [&mut [f32]],
    ) {
        let mut o = [[_mm512_setzero_ps(); C]; R];
        let (mut max, mut sum) = ([f32::NEG_INFINITY; R], [0.0f32; R]);
        let mut p = [[0.0f32; LANES]; R];
        for (b, &block) in blocks
            .iter()
            .enumerate()
            .take_while(|(b, _)| b * LANES <= position)
        {
            let base = block as usize * LANES * slot + offset;
            let seen = LANES.min(position + 1 - b * LANES);
            let valid: __mmask16 = ((1u32 << seen) - 1) as u16;
            unsafe {
                let (k, v) = (keys.as_ptr().add(base), values.as_ptr().add(base));
                let mut scores = [_mm512_setzero_ps(); R];
                let (mut old, mut new) = ([0.0f32; LANES], [0.0f32; LANES]);
                for i in 0..R {
                    scores[i] = _mm512_mul_ps(
                        butterfly512(sums512::<C>(qs[i].as_ptr(), k, slot, seen, C)),
                        _mm512_set1_ps(scale),
                    );
                    let new_max =
                        max[i].max(f32::NEG_INFINITY.max(_mm512_mask_reduce_max_ps(valid, scores[i])));
                    (old[i], new[i]) = (max[i], new_max);
                    max[i] = new_max;
                }
                // The rows' corrections in one vector and without branches: `exp(0)`
                // is 1 where the maximum stayed, and a product by 1 changes nothing,
                // so this is the tile loop's "1 if unchanged, else exp", bit for bit.
                let (old_v, new_v) = (_mm512_loadu_ps(old.as_ptr()), _mm512_loadu_ps(new.as_ptr()));
                let stayed = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(old_v, new_v);
                let corrections =
                    _mm512_mask_blend_ps(stayed, exp512(_mm512_sub_ps(old_v, new_v)), _mm512_set1_ps(1.0));
                let mut correction = [0.0f32; LANES];
                _mm512_storeu_ps(correction.as_mut_ptr(), corrections);
                for i in 0..R {
                    let factor = _mm512_set1_ps(correction[i]);
                    for acc in &mut o[i] {
                        *acc = _mm512_mul_ps(*acc, factor);
                    }
                    let probs =
                        _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(scores[i], _mm512_set1_ps(max[i]))));
                    sum[i] = sum[i] * correction[i] + fold512(probs);
                    _mm512_storeu_ps(p[i].as_mut_ptr(), probs);
                }
                for j in 0..seen {
                    for c in 0..C {
                        let value = _mm512_loadu_ps(v.add(j * slot + c * LANES));
                        for i in 0..R {
                            o[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[i][j]), value, o[i][c]);
                        }
                    }
                }
            }
        }
        for i in 0..R {
            let inv = _mm512_set1_ps(1.0 / sum[i]);
            for (c, acc) in o[i].iter().enumerate() {
                // SAFETY: `outs[i]` holds `16·C` values (asserted by the caller).
                unsafe { _mm512_storeu_ps(outs[i].as_mut_ptr().add(c * LANES), _mm512_mul_ps(*acc, inv)) };
            }
        }
    }

    /// The sixteen lane sums of each of up to sixteen keys, one register per key: `C`
    /// chunks of sixteen values per key (`chunks` when `C` is 0), key by key so that
    /// the query's chunks stay in registers. Past the `n` keys there are, key 0 again,
    /// whose sums are dropped: every register is written, so all stay in registers.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn sums512<const C: usize>(
        q: *const f32,
        keys: *const f32,
        slot: usize,
        n: usize,
        chunks: usize,
    ) -> [__m512; LANES] {
        let chunks = if C > 0 { C } else { chunks };
        let mut v = [_mm512_setzero_ps(); LANES];
        for (j, acc) in v.iter_mut().enumerate() {
            let key = if j < n {
                unsafe { keys.add(j * slot) }
            } else {
                keys
            };
            for c in 0..chunks {
                unsafe {
                    let (qc, kc) = (
                        _mm512_loadu_ps(q.add(c * LANES)),
                        _mm512_loadu_ps(key.add(c * LANES)),
                    );
                    *acc = _mm512_fmadd_ps(qc, kc, *acc);
                }
            }
        }
        v
    }

    /// Where key `j`'s score lands in [`group512`]'s last register.
    const ORDER512: [i32; 16] = order512();

    const fn order512() -> [i32; 16] {
        // Follow each key through the levels: which register and lane its sum ends in.
        // After level 8, key j < 8 is register j lanes 0-7 ("half" 0), key j + 8
        // register j lanes 8-15 (half 1).
        // Level 4 combines registers i and i + 4: result chunks are
        // [r_i chunk 0, r_i chunk 2, r_{i+4} chunk 0, r_{i+4} chunk 2] (+ the odd
        // chunks), so key (i, half h) goes to chunk h, key (i + 4, half h) to chunk 2 + h.
        // Level 2 combines s_i and s_{i+2} within each chunk: lanes [s_i 0, s_i 1,
        // s_{i+2} 0, s_{i+2} 1] (+ lanes 2, 3), so s_i's key takes lanes 0-1, s_{i+2}'s
        // lanes 2-3. Level 1 combines t_0 and t_1: lanes [t_0 0, t_0 2, t_1 0, t_1 2]
        // (+ odd), so t_0's lane pair (0-1) goes to lane 0, pair (2-3) to lane 1, t_1's
        // to lanes 2 and 3.
        let mut order = [0i32; 16];
        let mut key = 0;
        while key < 16 {
            let (low, half) = (key % 8, key / 8);
            let (i4, chunk_hi) = (low % 4, low / 4); // s index, +2 chunks if from r_{i+4}
            let chunk = half + 2 * chunk_hi;
            let (i2, pair) = (i4 % 2, i4 / 2); // t index, lane pair within the chunk
            let lane = 2 * i2 + pair;
            order[key] = (4 * chunk + lane) as i32;
            key += 1;
        }
        order
    }

    /// Scores of up to eight keys (`out.len()`), as [`group512`] with two 8-lane
    /// halves per key (lanes 0-7 and 8-15, added first: level 8).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn group256(q: &[f32], keys: &[f32], slot: usize, scale: f32, out: &mut [f32]) -> f32 {
        let (hd, n) = (q.len(), out.len());
        debug_assert!((1..=8).contains(&n) && hd.is_multiple_of(LANES));
        let (q, keys) = (q.as_ptr(), keys.as_ptr());
        // SAFETY (all three): as in `group512`.
        let (lo, hi) = match hd {
            64 => unsafe { sums256::<4>(q, keys, slot, n, 4) },
            128 => unsafe { sums256::<8>(q, keys, slot, n, 8) },
            _ => unsafe { sums256::<0>(q, keys, slot, n, hd / LANES) },
        };
        unsafe {
            let mut r = [_mm256_setzero_ps(); 8];
            for j in 0..8 {
                r[j] = _mm256_add_ps(lo[j], hi[j]);
            }
            // Level 4: keys i (low 128 bits) and i + 4 (high), four lanes each.
            let mut s = [_mm256_setzero_ps(); 4];
            for i in 0..4 {
                let low = _mm256_permute2f128_ps::<0x20>(r[i], r[i + 4]);
                let high = _mm256_permute2f128_ps::<0x31>(r[i], r[i + 4]);
                s[i] = _mm256_add_ps(low, high);
            }
            let mut t = [_mm256_setzero_ps(); 2];
            for i in 0..2 {
                let low = _mm256_shuffle_ps::<0b01_00_01_00>(s[i], s[i + 2]);
                let high = _mm256_shuffle_ps::<0b11_10_11_10>(s[i], s[i + 2]);
                t[i] = _mm256_add_ps(low, high);
            }
            let even = _mm256_shuffle_ps::<0b10_00_10_00>(t[0], t[1]);
            let odd = _mm256_shuffle_ps::<0b11_01_11_01>(t[0], t[1]);
            let u = _mm256_add_ps(even, odd);
            let scores = _mm256_permutevar8x32_ps(u, _mm256_loadu_si256(ORDER256.as_ptr().cast()));
            let scores = _mm256_mul_ps(scores, _mm256_set1_ps(scale));
            let mut all = [0.0f32; 8];
            _mm256_storeu_ps(all.as_mut_ptr(), scores);
            out.copy_from_slice(&all[..n]);
            out.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s))
        }
    }

    /// [`sums512`] for [`group256`]: up to eight keys, lanes 0-7 and 8-15 of each.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums256<const C: usize>(
        q: *const f32,
        keys: *const f32,
        slot: usize,
        n: usize,
        chunks: usize,
    ) -> ([__m256; 8], [__m256; 8]) {
        let chunks = if C > 0 { C } else { chunks };
        let mut lo = [_mm256_setzero_ps(); 8];
        let mut hi = [_mm256_setzero_ps(); 8];
        for j in 0..8 {
            let key = if j < n {
                unsafe { keys.add(j * slot) }
            } else {
                keys
            };
            for c in 0..chunks {
                unsafe {
                    let (q, key) = (q.add(c * LANES), key.add(c * LANES));
                    lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(key), lo[j]);
                    hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(8)), _mm256_loadu_ps(key.add(8)), hi[j]);
                }
            }
        }
        (lo, hi)
    }

    /// [`ORDER512`] for [`group256`]: key `i < 4` in chunk 0, `i + 4` in chunk 1; within
    /// a chunk, lane `2·(i % 2) + i / 2`.
    const ORDER256: [i32; 8] = {
        let mut order = [0i32; 8];
        let mut key = 0;
        while key < 8 {
            let (i4, chunk) = (key % 4, key / 4);
            order[key] = (4 * chunk + 2 * (i4 % 2) + i4 / 2) as i32;
            key += 1;
        }
        order
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, salt: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i ^ salt).wrapping_mul(2_654_435_761).rotate_left(7) ^ salt;
                (h % 20_011) as f32 / 997.0 - 10.0
            })
            .collect()
    }

    #[test]
    fn every_path_gives_the_defined_sum_bit_for_bit() {
        for hd in [16, 64, 128, 80, 8, 72] {
            for seen in [1, 3, 8, 15, 16, 17, 40, 64] {
                let slot = hd * 3 + 16;
                let q = values(hd, 1 + hd as u32);
                let keys = values((seen - 1) * slot + hd, 7 * seen as u32);
                let mut got = vec![f32::NAN; seen];
                let max = block(&q, &keys, slot, 0.125, &mut got, true);
                assert_eq!(max, got.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s)));
                for (j, &score) in got.iter().enumerate() {
                    let key = &keys[j * slot..][..hd];
                    let want = dot(&q, key, true) * 0.125;
                    assert_eq!(score.to_bits(), want.to_bits(), "hd {hd} seen {seen} key {j}");
                    let exact: f64 = q
                        .iter()
                        .zip(key)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let size: f64 = q.iter().zip(key).map(|(a, b)| f64::from((a * b).abs())).sum();
                    assert!(
                        (f64::from(score) * 8.0 - exact).abs() <= size * 1e-6,
                        "{score} vs {exact}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_butterfly_matches_the_avx512_one() {
        if !x86::avx2() {
            return;
        }
        let (hd, slot) = (64, 200);
        let q = values(hd, 3);
        let keys = values(15 * slot + hd, 5);
        let mut narrow = [0.0f32; 16];
        for (g, chunk) in narrow.chunks_mut(8).enumerate() {
            // SAFETY: AVX2 and FMA are present; 16 keys are in `keys`.
            unsafe { x86::group256(&q, &keys[g * 8 * slot..], slot, 1.0, chunk) };
        }
        let want: Vec<u32> = (0..16)
            .map(|j| dot(&q, &keys[j * slot..][..hd], true).to_bits())
            .collect();
        assert_eq!(narrow.iter().map(|s| s.to_bits()).collect::<Vec<_>>(), want);
        if x86::avx512() {
            let mut wide = [0.0f32; 16];
            // SAFETY: AVX-512F is present.
            unsafe { x86::group512(&q, &keys, slot, 1.0, &mut wide) };
            assert_eq!(wide.iter().map(|s| s.to_bits()).collect::<Vec<_>>(), want);
        }
    }
}

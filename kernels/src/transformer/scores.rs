//! Attention scores (the dot products of query rows with a block of cached keys) and
//! the sum of a block's probabilities.
//!
//! Every score is the same sum whichever code computes it, so that a token gets the same
//! bits alone, in a prompt chunk or among drafts being verified, on AVX-512 as on AVX2
//! or without either. The sum is defined as one chain of multiply-adds over the head's
//! values in order, from zero (fused where the CPU has FMA), then times the scale.
//!
//! The key cache is laid out for that chain: within a block, a KV head's keys are
//! stored transposed (`[d][slot]`, see [`super::KvShape`]), so value `d` of sixteen
//! consecutive keys is one vector. For one query row, a block's sixteen scores are
//! sixteen lanes of one register, one multiply-add per `d` with `q[d]` broadcast; for
//! the rows of a prompt chunk, sixteen rows are the lanes instead, one register per key
//! with the key's value `d` broadcast, and the block's maximum and sum are lane-wise
//! (no horizontal reductions). Either way no lane ever sums across another, so both
//! give the definition's bits, as [`dot`] states it in scalar code.
//!
//! A block's probabilities are summed in a fixed tree over sixteen lanes ([`sum`]),
//! the shape a vector unit folds cheaply.

// `unsafe` here: SIMD loads through raw pointers into slices whose bounds are asserted
// first, and calls of `#[target_feature]` functions once the CPU has been checked.
#![allow(unsafe_code)]

/// Lanes of a block sum; keys per block for the AVX-512 kernels.
const LANES: usize = 16;

/// The score sum of `q · key`, as the module defines it: one chain over `d` in order
/// from zero, `key[d]` at `keys[d · stride]` (`stride`: the block size, as the cache
/// stores keys transposed). The kernels are tested against it.
#[cfg(test)]
pub(super) fn dot(q: &[f32], keys: &[f32], stride: usize, fma: bool) -> f32 {
    let mut acc = 0.0f32;
    for (d, &x) in q.iter().enumerate() {
        let y = keys[d * stride];
        acc = if fma { x.mul_add(y, acc) } else { acc + x * y };
    }
    acc
}

/// The sum of a block's probabilities `p` (at most 64), in a fixed tree: lane `l` adds
/// `p[j]` for `j ≡ l (mod 16)` in order, then the lanes fold pairwise (`l + (l + 8)`,
/// then `+ 4`, `+ 2`, `+ 1`). A sum in order would be a chain of dependent additions
/// per row and block.
#[inline(always)]
pub(super) fn sum(p: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    for chunk in p.chunks(LANES) {
        for (acc, &x) in lanes.iter_mut().zip(chunk) {
            *acc += x;
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// Rows scored together by [`block_rows`]: each adds its own chains, so the processor
/// has independent multiply-adds to overlap (one row's chain over `d` waits on itself
/// at every step).
pub(super) const ROWS: usize = 4;

/// `out[r][j] = dot(qs[r], keys[j..], block_size) · scale` for every row and every
/// `j < width` (`keys`: one KV head's transposed block, `head_dim × block_size`), for
/// blocks of any size (blocks of sixteen, the engine's, go through [`pairs16`] or the
/// AVX-512 kernels). Each key's chain in order, so the bits are [`dot`]'s. Keys past a
/// row's position are scored too (their scores are never read).
#[inline(always)]
pub(super) fn block_rows(
    qs: &[&[f32]],
    keys: &[f32],
    block_size: usize,
    width: usize,
    scale: f32,
    out: &mut [[f32; 64]],
    fma: bool,
) {
    let hd = qs.first().map_or(0, |q| q.len());
    assert!(width <= 64 && width <= block_size && qs.len() <= out.len());
    assert!(hd == 0 || keys.len() >= (hd - 1) * block_size + width);
    for (qs, out) in qs.chunks(ROWS).zip(out.chunks_mut(ROWS)) {
        for row in out.iter_mut() {
            row[..width].fill(0.0);
        }
        for d in 0..hd {
            let k = &keys[d * block_size..d * block_size + width];
            for (q, row) in qs.iter().zip(out.iter_mut()) {
                let x = q[d];
                for (a, &y) in row[..width].iter_mut().zip(k) {
                    *a = if fma { x.mul_add(y, *a) } else { *a + x * y };
                }
            }
        }
        for row in out.iter_mut().take(qs.len()) {
            for a in &mut row[..width] {
                *a *= scale;
            }
        }
    }
}

/// `out[i] = ` the sixteen scores of pair `i`'s query row against its block (one KV
/// head's transposed keys of a block of sixteen, `head_dim × 16`), times `scale`, each
/// score's chain in order over `d`, so the bits are [`dot`]'s. With AVX2, four pairs go
/// side by side with their accumulators in registers (two vectors per pair): eight
/// chains keep the FMA units busy where one pair's would wait on themselves.
#[inline(always)]
pub(super) fn pairs16(pairs: &[(&[f32], &[f32])], scale: f32, out: &mut [[f32; LANES]], fma: bool) {
    assert_eq!(pairs.len(), out.len());
    let hd = pairs.first().map_or(0, |(q, _)| q.len());
    assert!(pairs.iter().all(|(q, k)| q.len() == hd && k.len() == hd * LANES));
    #[cfg(target_arch = "x86_64")]
    if fma && x86::avx2() {
        // SAFETY: AVX2 and FMA are present; every pair's row holds `hd` values and its
        // keys `hd · 16` (asserted above).
        unsafe { x86::pairs256(pairs, hd, scale, out) };
        return;
    }
    // Elsewhere, pair by pair: sixteen lanes of one chain each, which compilers
    // vectorize (four pairs side by side were compiled to scalar code).
    for ((q, keys), out) in pairs.iter().zip(out.iter_mut()) {
        let mut acc = [0.0f32; LANES];
        for (&x, k) in q.iter().zip(keys.chunks_exact(LANES)) {
            for (a, &y) in acc.iter_mut().zip(k) {
                *a = if fma { x.mul_add(y, *a) } else { *a + x * y };
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a * scale;
        }
    }
}

/// One KV head's cached keys and values of one sequence: `blocks`, the sequence's table,
/// numbers blocks of `16 · slot` values in `keys` and in `values`; in each block this
/// head's keys start at `key_offset` (transposed: `[d][slot]`), its values at `offset` in
/// every slot.
///
/// The cache holds `T`: f32, or bf16 bits (`u16`) that [`rows`] widens as it loads them;
/// the other kernels read f32 alone.
#[derive(Clone, Copy)]
// Read by the x86 kernels; elsewhere `rows` and `lanes` decline and the tile loop runs.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Head<'a, T = f32> {
    pub keys: &'a [T],
    pub values: &'a [T],
    pub blocks: &'a [u32],
    pub key_offset: usize,
    pub offset: usize,
    pub slot: usize,
}

/// A value of a KV cache as the AVX-512 decode kernel loads it: sixteen at a time,
/// widened to f32 (exactly).
pub(super) trait Held: Copy {
    /// Sixteen values from `p` as f32.
    ///
    /// # Safety
    /// AVX-512F present; sixteen values readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Held for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's promise.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

/// bf16 bits: the top half of an f32.
impl Held for u16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise (AVX-512F, 32 bytes readable).
        unsafe {
            let half = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half)))
        }
    }
}

impl<T> Head<'_, T> {
    /// Panics unless every block up to `last`'s holds a whole block of keys (this head's
    /// `hd × 16` from `key_offset`) and of values: the kernels read them unchecked.
    #[cfg(target_arch = "x86_64")]
    fn check(&self, hd: usize, last: usize) {
        let used = (last / LANES + 1).min(self.blocks.len());
        assert!(self.offset + hd <= self.slot && self.key_offset + hd * LANES <= LANES * self.slot);
        assert!(self.keys.len() == self.values.len());
        assert!(
            self.blocks[..used]
                .iter()
                .all(|&b| (b as usize + 1) * LANES * self.slot <= self.keys.len())
        );
    }
}

/// Attention of query rows `qs` at one position (query heads of one token that share a
/// KV head) over every block of sixteen keys of `head` they see (positions
/// `0..=position`), into `outs`, with each row's output, maximum and sum in registers
/// throughout. The same bits as `attend_tile`'s loop over blocks. Returns
/// false, doing nothing, where there is no such kernel: it needs AVX-512 and a head size
/// of 64 or 128.
#[allow(clippy::too_many_arguments)]
pub(super) fn rows<T: Held>(
    qs: &[&[f32]],
    head: &Head<T>,
    position: usize,
    scale: f32,
    outs: &mut [&mut [f32]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        let hd = qs.first().map_or(0, |q| q.len());
        if hd != 64 && hd != 128 {
            return false;
        }
        head.check(hd, position);
        assert!(qs.len() == outs.len() && qs.iter().all(|q| q.len() == hd));
        assert!(outs.iter().all(|o| o.len() == hd));
        // Rows side by side: as many as leave registers for the outputs.
        let per = if hd == 64 { 3 } else { 1 };
        for (q, out) in qs.chunks(per).zip(outs.chunks_mut(per)) {
            macro_rules! go {
                ($c:literal, $r:literal, $g:literal) => {
                    // SAFETY: the features are present and every block's keys and values
                    // are in the caches, the rows and outputs `hd` long (checked above).
                    unsafe {
                        x86::rows512::<$c, $r, $g, T>(
                            std::array::from_fn(|i| q[i]),
                            head,
                            position,
                            scale,
                            out,
                        )
                    }
                };
            }
            match (hd, q.len()) {
                (64, 3) => go!(4, 3, 4),
                (64, 2) => go!(4, 2, 6),
                (64, _) => go!(4, 1, 8),
                _ => go!(8, 1, 8),
            }
        }
        return true;
    }
    let _ = (qs, head, position, scale, outs);
    false
}

/// Which lane kernel [`lanes`] runs: the widest this CPU has (and `SOUS_KERNELS_ISA`
/// allows), or AVX2's where AVX-512's would run (for tests that compare the two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lanes {
    Widest,
    Avx2,
}

/// Attention of a tile's query rows (`qs[r]` at position `positions[r]`: the query heads
/// sharing a KV head of several consecutive tokens, `per_token` rows per token, token
/// after token) over their blocks of sixteen keys, sixteen rows at a time as the lanes
/// of a register (eight with AVX2), into `outs` (`qs.len() × head_dim`, row after row).
/// With AVX-512 the rows go head by head, so that a register's lanes are one head's
/// consecutive tokens, and up to three registers of rows share every key and value
/// they load (`by_vectors`). Per row and block the operations are
/// the tile loop's, in its order (scores, maximum, correction, probabilities, their sum,
/// then the values key by key), so the bits are the same. Returns false, doing nothing,
/// where there is no such kernel: it needs AVX-512, or AVX2 with FMA, and a head size
/// of 64 or 128.
pub(super) fn lanes(
    qs: &[&[f32]],
    positions: &[usize],
    per_token: usize,
    head: &Head,
    scale: f32,
    outs: &mut [f32],
    kernel: Lanes,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let hd = qs.first().map_or(0, |q| q.len());
        if hd != 64 && hd != 128 {
            return false;
        }
        let wide = kernel == Lanes::Widest && x86::avx512();
        if !wide && !x86::avx2() {
            return false;
        }
        let last = positions.iter().copied().max().unwrap_or(0);
        head.check(hd, last);
        assert!(qs.len() == positions.len() && outs.len() == qs.len() * hd);
        assert!(qs.iter().all(|q| q.len() == hd));
        // SAFETY (of every kernel call): the features are present; every block a row
        // sees is in the caches and `qt`, `ot` hold `hd` values per lane (checked above).
        match (wide, hd) {
            (true, 64) => unsafe { by_vectors::<64>(qs, positions, per_token, head, scale, outs) },
            (true, _) => unsafe { by_vectors::<128>(qs, positions, per_token, head, scale, outs) },
            (false, 64) => by_groups::<8>(qs, positions, hd, outs, |qt, pos, ot| unsafe {
                x86::lanes256::<64>(qt, pos, head, scale, ot)
            }),
            (false, _) => by_groups::<8>(qs, positions, hd, outs, |qt, pos, ot| unsafe {
                x86::lanes256::<128>(qt, pos, head, scale, ot)
            }),
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (qs, positions, per_token, head, scale, outs, kernel);
        false
    }
}

/// Registers of rows that [`by_vectors`] hands the AVX-512 lane kernel at once: 48
/// rows, a 16-token tile of a KV head shared by three query heads (SmolLM2's groups).
#[cfg(target_arch = "x86_64")]
const VECTORS: usize = 3;

/// [`lanes`] on AVX-512: the rows in the order head by head (`qs` has `per_token` rows
/// per token, token after token), sixteen at a time into the lanes of a register,
/// transposed (`[d][lane]`), up to [`VECTORS`] registers per call of the kernel, whose
/// outputs are transposed back into each row's place in `outs`. A last register of
/// fewer rows repeats its last row in the spare lanes, whose results are dropped.
/// Head by head, the registers of a full tile's call hold the same tokens, so they see
/// the same blocks (token by token, a register's tokens would reach a block later than
/// another's).
///
/// # Safety
/// AVX-512F and FMA present; every block a row sees is in the caches (`Head::check`);
/// every row holds `HD` values and `outs` `HD` per row.
#[cfg(target_arch = "x86_64")]
unsafe fn by_vectors<const HD: usize>(
    qs: &[&[f32]],
    positions: &[usize],
    per_token: usize,
    head: &Head,
    scale: f32,
    outs: &mut [f32],
) {
    let n = qs.len();
    let order: Vec<usize> = if per_token > 1 && n.is_multiple_of(per_token) {
        let tokens = n / per_token;
        (0..per_token)
            .flat_map(|h| (0..tokens).map(move |t| t * per_token + h))
            .collect()
    } else {
        (0..n).collect()
    };
    let mut qt = vec![0.0f32; VECTORS * HD * LANES];
    let mut ot = vec![0.0f32; VECTORS * HD * LANES];
    for call in order.chunks(VECTORS * LANES) {
        let mut lane_pos = [[0i32; LANES]; VECTORS];
        for (v, rows) in call.chunks(LANES).enumerate() {
            let row = |lane: usize| rows[lane.min(rows.len() - 1)];
            let src: [&[f32]; LANES] = std::array::from_fn(|lane| &qs[row(lane)][..HD]);
            for (lane, pos) in lane_pos[v].iter_mut().enumerate() {
                *pos = i32::try_from(positions[row(lane)]).unwrap_or(i32::MAX);
            }
            // Value by value, so that the writes are whole runs of sixteen.
            for (d, lanes) in qt[v * HD * LANES..(v + 1) * HD * LANES]
                .chunks_exact_mut(LANES)
                .enumerate()
            {
                for (x, src) in lanes.iter_mut().zip(&src) {
                    *x = src[d];
                }
            }
        }
        // SAFETY: the caller's promise; `qt` and `ot` hold `VECTORS · HD · 16` values.
        match call.len().div_ceil(LANES) {
            1 => unsafe { x86::lanes512::<HD, 1>(&qt, &[lane_pos[0]], head, scale, &mut ot) },
            2 => unsafe { x86::lanes512::<HD, 2>(&qt, &[lane_pos[0], lane_pos[1]], head, scale, &mut ot) },
            _ => unsafe { x86::lanes512::<HD, VECTORS>(&qt, &lane_pos, head, scale, &mut ot) },
        }
        for (v, rows) in call.chunks(LANES).enumerate() {
            for (lane, &r) in rows.iter().enumerate() {
                for (d, o) in outs[r * HD..(r + 1) * HD].iter_mut().enumerate() {
                    *o = ot[(v * HD + d) * LANES + lane];
                }
            }
        }
    }
}

/// `W` rows at a time, transposed (`[d][lane]`) into the `kernel`'s inputs, its outputs
/// transposed back into `outs`; a last group of fewer rows repeats its last row in the
/// spare lanes, whose results are dropped.
#[cfg(target_arch = "x86_64")]
fn by_groups<const W: usize>(
    qs: &[&[f32]],
    positions: &[usize],
    hd: usize,
    outs: &mut [f32],
    mut kernel: impl FnMut(&[f32], &[i32; LANES], &mut [f32]),
) {
    let mut qt = vec![0.0f32; hd * W];
    let mut ot = vec![0.0f32; hd * W];
    for (g, (qs, pos)) in qs.chunks(W).zip(positions.chunks(W)).enumerate() {
        let mut lane_pos = [0i32; LANES];
        for lane in 0..W {
            let r = lane.min(qs.len() - 1);
            lane_pos[lane] = i32::try_from(pos[r]).unwrap_or(i32::MAX);
            for (d, &x) in qs[r].iter().enumerate() {
                qt[d * W + lane] = x;
            }
        }
        kernel(&qt, &lane_pos, &mut ot);
        for (lane, out) in outs[g * W * hd..].chunks_exact_mut(hd).take(qs.len()).enumerate() {
            for (d, o) in out.iter_mut().enumerate() {
                *o = ot[d * W + lane];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 kernels: one row's sixteen scores in one register (`rows512`), or
    //! sixteen rows' scores of one key in one register (`lanes512`); and the AVX2 ones:
    //! eight rows' scores of one key in one register (`lanes256`), and the scores of a
    //! block for the tile loop (`pairs256`).

    use std::arch::x86_64::*;

    use super::{Head, LANES};

    use crate::gemm::Isa;

    /// Whether the AVX2 kernel may run (with FMA): the CPU has them and
    /// `SOUS_KERNELS_ISA` does not ask for the portable code.
    pub(super) fn avx2() -> bool {
        Isa::current() != Isa::Portable && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// [`super::pairs16`] with AVX2: each pair's sixteen scores in two registers, four
    /// pairs side by side.
    ///
    /// # Safety
    /// AVX2 and FMA present; every pair's row holds `hd` values and its keys `hd · 16`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn pairs256(
        pairs: &[(&[f32], &[f32])],
        hd: usize,
        scale: f32,
        out: &mut [[f32; LANES]],
    ) {
        for (chunk, out) in pairs.chunks(4).zip(out.chunks_mut(4)) {
            let q: [*const f32; 4] = std::array::from_fn(|i| chunk[i.min(chunk.len() - 1)].0.as_ptr());
            let k: [*const f32; 4] = std::array::from_fn(|i| chunk[i.min(chunk.len() - 1)].1.as_ptr());
            let (mut low, mut high) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
            for d in 0..hd {
                for p in 0..4 {
                    // SAFETY: `d < hd`, within the row and its keys (the caller's promise).
                    unsafe {
                        let x = _mm256_set1_ps(*q[p].add(d));
                        let keys = k[p].add(d * LANES);
                        low[p] = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys), low[p]);
                        high[p] = _mm256_fmadd_ps(x, _mm256_loadu_ps(keys.add(8)), high[p]);
                    }
                }
            }
            let scale = _mm256_set1_ps(scale);
            for (p, o) in out.iter_mut().enumerate() {
                // SAFETY: `o` holds sixteen values.
                unsafe {
                    _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(low[p], scale));
                    _mm256_storeu_ps(o.as_mut_ptr().add(8), _mm256_mul_ps(high[p], scale));
                }
            }
        }
    }

    /// Whether the AVX-512 kernels may run: the CPU has them and `SOUS_KERNELS_ISA`
    /// does not ask for a narrower set (as for the products).
    pub(super) fn avx512() -> bool {
        Isa::current() == Isa::Avx512
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("fma")
    }

    /// `super::super::exp` on sixteen lanes, the same operations in the same order (no
    /// fused multiply-adds), so the same bits.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn exp512(x: __m512) -> __m512 {
        use super::super::exp_consts::*;
        let splat = _mm512_set1_ps;
        let clamped = _mm512_min_ps(_mm512_max_ps(x, splat(LOW)), splat(HIGH));
        let round = splat(ROUND);
        let t = _mm512_add_ps(_mm512_mul_ps(clamped, splat(std::f32::consts::LOG2_E)), round);
        let n = _mm512_sub_ps(t, round);
        let r = _mm512_sub_ps(
            _mm512_sub_ps(clamped, _mm512_mul_ps(n, splat(LN2_HI))),
            _mm512_mul_ps(n, splat(LN2_LO)),
        );
        let mut p = splat(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), splat(c));
        }
        let e = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
            splat(1.0),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(ROUND.to_bits() as i32)),
            _mm512_set1_epi32(127),
        ));
        let y = _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
        let y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(LOW)), y, splat(0.0));
        let y = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, splat(HIGH)),
            y,
            splat(f32::INFINITY),
        );
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), y, x)
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

    /// This head's first key value (of the transposed block) and first value in
    /// `block`.
    ///
    /// # Safety
    /// The block is in the caches (`Head::check`).
    #[inline(always)]
    unsafe fn block_start<T>(head: &Head<T>, block: u32) -> (*const T, *const T) {
        let start = block as usize * LANES * head.slot;
        // SAFETY: the block's `16 · slot` values are in both caches (the caller's
        // promise), and the offsets are within a block.
        unsafe {
            (
                head.keys.as_ptr().add(start + head.key_offset),
                head.values.as_ptr().add(start + head.offset),
            )
        }
    }

    /// Attention of `R` query rows at one position (query heads of one token, sharing a
    /// KV head) over their blocks of sixteen keys, with each row's output (`C`
    /// registers: `head_dim / 16`), running maximum and sum kept in registers from the
    /// first block to the last. The operations per row and block are the tile loop's in
    /// `attend_tile`, in its order (scores, maximum, correction, probabilities, their
    /// sum, then the values key by key), so the bits are the same.
    ///
    /// # Safety
    /// AVX-512F and FMA present; each `qs[i]` and `outs[i]` holds `16·C` values; for every
    /// block `b` with `16·b ≤ position`, the block's keys and values are in the caches
    /// (checked by the caller: `Head::check`).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn rows512<const C: usize, const R: usize, const G: usize, T: super::Held>(
        qs: [&[f32]; R],
        head: &Head<T>,
        position: usize,
        scale: f32,
        outs: &mut [&mut [f32]],
    ) {
        let (blocks, slot) = (head.blocks, head.slot);
        let hd = C * LANES;
        let used = (position / LANES + 1).min(blocks.len());
        // The scores of `G` blocks at a time, side by side, then those blocks one by one:
        // each score is one chain of `hd` dependent multiply-adds, and `R · G` of them
        // keep the FMA units busy where one block's `R` would wait on themselves.
        let mut o = [[_mm512_setzero_ps(); C]; R];
        let (mut max, mut sum) = ([f32::NEG_INFINITY; R], [0.0f32; R]);
        let mut p = [[0.0f32; LANES]; R];
        let mut first = 0;
        while first < used {
            let count = G.min(used - first);
            let mut group = [[_mm512_setzero_ps(); R]; G];
            unsafe {
                let k: [*const T; G] =
                    std::array::from_fn(|g| block_start(head, blocks[first + g.min(count - 1)]).0);
                for d in 0..hd {
                    let kd: [__m512; G] = std::array::from_fn(|g| T::load16(k[g].add(d * LANES)));
                    for i in 0..R {
                        let x = _mm512_set1_ps(*qs[i].get_unchecked(d));
                        for g in 0..G {
                            group[g][i] = _mm512_fmadd_ps(x, kd[g], group[g][i]);
                        }
                    }
                }
            }
            for (g, scores) in group.iter().enumerate().take(count) {
                let b = first + g;
                let seen = LANES.min(position + 1 - b * LANES);
                let valid: __mmask16 = ((1u32 << seen) - 1) as u16;
                unsafe {
                    let (_, v) = block_start(head, blocks[b]);
                    let scores: [__m512; R] =
                        std::array::from_fn(|i| _mm512_mul_ps(scores[i], _mm512_set1_ps(scale)));
                    let mut correction = [1.0f32; R];
                    for i in 0..R {
                        let new_max =
                            max[i].max(f32::NEG_INFINITY.max(_mm512_mask_reduce_max_ps(valid, scores[i])));
                        // "1 if unchanged, else exp", as the tile loop (the scalar `exp`
                        // gives `exp512`'s bits).
                        if new_max != max[i] {
                            correction[i] = super::super::exp(max[i] - new_max);
                        }
                        max[i] = new_max;
                    }
                    for i in 0..R {
                        let factor = _mm512_set1_ps(correction[i]);
                        for acc in &mut o[i] {
                            *acc = _mm512_mul_ps(*acc, factor);
                        }
                        let probs = _mm512_maskz_mov_ps(
                            valid,
                            exp512(_mm512_sub_ps(scores[i], _mm512_set1_ps(max[i]))),
                        );
                        sum[i] = sum[i] * correction[i] + fold512(probs);
                        _mm512_storeu_ps(p[i].as_mut_ptr(), probs);
                    }
                    for j in 0..seen {
                        for c in 0..C {
                            let value = T::load16(v.add(j * slot + c * LANES));
                            for i in 0..R {
                                o[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[i][j]), value, o[i][c]);
                            }
                        }
                    }
                }
            }
            first += count;
        }
        for i in 0..R {
            let inv = _mm512_set1_ps(1.0 / sum[i]);
            for (c, acc) in o[i].iter().enumerate() {
                // SAFETY: `outs[i]` holds `16·C` values (asserted by the caller).
                unsafe { _mm512_storeu_ps(outs[i].as_mut_ptr().add(c * LANES), _mm512_mul_ps(*acc, inv)) };
            }
        }
    }

    /// `V` vectors of sixteen query rows, the rows as the lanes of each register (`qt`:
    /// `[v][d][lane]`, lane `l` of vector `v` at position `positions[v][l]`), over their
    /// blocks of sixteen keys, into `ot` (`[v][d][lane]`). Per block: one register of
    /// scores per vector and key (the key's value `d` broadcast against the rows' `q[d]`,
    /// in order over `d`), the lanes' maxima and corrections, the probabilities, their
    /// sum in `super::sum`'s tree (register by register), then the outputs, key by key.
    /// Keys past a lane's position are masked out of all of it, as the tile loop never
    /// reads them; blocks past all of a vector's lanes change none of its bits (their
    /// probabilities are zeros and their corrections ones).
    ///
    /// Every broadcast key value and value feeds one multiply-add per vector, where with
    /// one vector each multiply-add had a load of its own, which measured slower
    /// (BENCHMARKS.md, "Figures that were in code comments"). Per lane the
    /// operations and their order do not depend on `V`, so neither do the bits.
    ///
    /// # Safety
    /// AVX-512F and FMA present; `qt` and `ot` hold `V·HD·16` values; for every block `b`
    /// with `16·b ≤` the largest position, the block's keys and values are in the
    /// caches (checked by the caller: `Head::check`).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn lanes512<const HD: usize, const V: usize>(
        qt: &[f32],
        positions: &[[i32; LANES]; V],
        head: &Head,
        scale: f32,
        ot: &mut [f32],
    ) {
        // Keys per pass of the scores, and values of `d` per pass of the outputs: `V ·
        // KB` accumulators in registers (16 of the 32 for one vector, 24 for three).
        let kb = if V == 1 { LANES } else { LANES / 2 };
        let (blocks, slot) = (head.blocks, head.slot);
        let mut last = 0usize;
        let mut first = [usize::MAX; V];
        for v in 0..V {
            for &p in &positions[v] {
                let p = p.max(0) as usize;
                last = last.max(p);
                first[v] = first[v].min(p);
            }
        }
        assert!(qt.len() >= V * HD * LANES && ot.len() >= V * HD * LANES);
        let (q, o) = (qt.as_ptr(), ot.as_mut_ptr());
        ot[..V * HD * LANES].fill(0.0);
        unsafe {
            let mut pos = [_mm512_setzero_si512(); V];
            for v in 0..V {
                pos[v] = _mm512_loadu_si512(positions[v].as_ptr().cast());
            }
            let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); V];
            let mut sum = [_mm512_setzero_ps(); V];
            let mut correction = [_mm512_set1_ps(1.0); V];
            // A block's scores, then its probabilities, per vector and key.
            let mut s = [[_mm512_setzero_ps(); LANES]; V];
            let mut seen = [[0xFFFFu16; LANES]; V];
            for (b, &block) in blocks.iter().enumerate().take_while(|(b, _)| b * LANES <= last) {
                let (k, val) = block_start(head, block);
                for k0 in (0..LANES).step_by(kb) {
                    let mut acc = [[_mm512_setzero_ps(); LANES]; V];
                    for d in 0..HD {
                        let mut qd = [_mm512_setzero_ps(); V];
                        for v in 0..V {
                            qd[v] = _mm512_loadu_ps(q.add((v * HD + d) * LANES));
                        }
                        for j in 0..kb {
                            let key = _mm512_set1_ps(*k.add(d * LANES + k0 + j));
                            for v in 0..V {
                                acc[v][j] = _mm512_fmadd_ps(key, qd[v], acc[v][j]);
                            }
                        }
                    }
                    for v in 0..V {
                        for j in 0..kb {
                            s[v][k0 + j] = acc[v][j];
                        }
                    }
                }
                for v in 0..V {
                    // Which lanes see key `j`: all of them below the first lane's block.
                    seen[v] = [0xFFFF; LANES];
                    if (b + 1) * LANES > first[v] + 1 {
                        for j in 0..LANES {
                            seen[v][j] = _mm512_cmp_epi32_mask::<_MM_CMPINT_NLT>(
                                pos[v],
                                _mm512_set1_epi32((b * LANES + j) as i32),
                            );
                        }
                    }
                    let mut block_max = _mm512_set1_ps(f32::NEG_INFINITY);
                    for j in 0..LANES {
                        s[v][j] = _mm512_mul_ps(s[v][j], _mm512_set1_ps(scale));
                        block_max = _mm512_mask_max_ps(block_max, seen[v][j], block_max, s[v][j]);
                    }
                    let new = _mm512_max_ps(max[v], block_max);
                    // "1 where the maximum stayed, else exp", lane by lane.
                    let stayed = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(max[v], new);
                    correction[v] =
                        _mm512_mask_blend_ps(stayed, exp512(_mm512_sub_ps(max[v], new)), _mm512_set1_ps(1.0));
                    max[v] = new;
                    for j in 0..LANES {
                        s[v][j] = _mm512_maskz_mov_ps(seen[v][j], exp512(_mm512_sub_ps(s[v][j], new)));
                    }
                    // `super::sum`'s tree: keys j and j + 8, then + 4, + 2, + 1.
                    let mut t = [_mm512_setzero_ps(); 8];
                    for l in 0..8 {
                        t[l] = _mm512_add_ps(s[v][l], s[v][l + 8]);
                    }
                    for width in [4, 2, 1] {
                        for l in 0..width {
                            t[l] = _mm512_add_ps(t[l], t[l + width]);
                        }
                    }
                    sum[v] = _mm512_add_ps(_mm512_mul_ps(sum[v], correction[v]), t[0]);
                }
                // The outputs, `kb` values of `d` (one register per `d` and vector) at a
                // time.
                for c in 0..HD / kb {
                    let mut acc = [[_mm512_setzero_ps(); LANES]; V];
                    for v in 0..V {
                        for dd in 0..kb {
                            let at = o.add((v * HD + c * kb + dd) * LANES);
                            acc[v][dd] = _mm512_mul_ps(_mm512_loadu_ps(at), correction[v]);
                        }
                    }
                    for j in 0..LANES {
                        for dd in 0..kb {
                            let value = _mm512_set1_ps(*val.add(j * slot + c * kb + dd));
                            for v in 0..V {
                                acc[v][dd] = _mm512_mask3_fmadd_ps(s[v][j], value, acc[v][dd], seen[v][j]);
                            }
                        }
                    }
                    for v in 0..V {
                        for dd in 0..kb {
                            _mm512_storeu_ps(o.add((v * HD + c * kb + dd) * LANES), acc[v][dd]);
                        }
                    }
                }
            }
            for v in 0..V {
                let inv = _mm512_div_ps(_mm512_set1_ps(1.0), sum[v]);
                for d in 0..HD {
                    let at = o.add((v * HD + d) * LANES);
                    _mm512_storeu_ps(at, _mm512_mul_ps(_mm512_loadu_ps(at), inv));
                }
            }
        }
    }

    /// `super::super::exp` on eight lanes, the same operations in the same order (no
    /// fused multiply-adds), so the same bits (as `exp512`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp256(x: __m256) -> __m256 {
        use super::super::exp_consts::*;
        let splat = _mm256_set1_ps;
        let clamped = _mm256_min_ps(_mm256_max_ps(x, splat(LOW)), splat(HIGH));
        let round = splat(ROUND);
        let t = _mm256_add_ps(_mm256_mul_ps(clamped, splat(std::f32::consts::LOG2_E)), round);
        let n = _mm256_sub_ps(t, round);
        let r = _mm256_sub_ps(
            _mm256_sub_ps(clamped, _mm256_mul_ps(n, splat(LN2_HI))),
            _mm256_mul_ps(n, splat(LN2_LO)),
        );
        let mut p = splat(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), splat(c));
        }
        let e = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
            splat(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND.to_bits() as i32)),
            _mm256_set1_epi32(127),
        ));
        let y = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
        let y = _mm256_blendv_ps(y, splat(0.0), _mm256_cmp_ps::<_CMP_LT_OQ>(x, splat(LOW)));
        let y = _mm256_blendv_ps(
            y,
            splat(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, splat(HIGH)),
        );
        _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// [`lanes512`] with AVX2: eight query rows as the lanes of each register (`qt`:
    /// `[d][lane]`, lane `l` at position `positions[l]`, `l < 8`) over their blocks of
    /// sixteen keys, into `ot` (`[d][lane]`). The same operations per row and block in
    /// the same order, so the same bits: the scores eight keys at a time (sixteen
    /// accumulators would take every register), the masks as vectors, and the weighted
    /// values of a block every lane sees without any.
    ///
    /// # Safety
    /// AVX2 and FMA present; `qt` and `ot` hold `HD·8` values; for every block `b` with
    /// `16·b ≤ max(positions[..8])`, the block's keys and values are in the caches
    /// (checked by the caller: `Head::check`).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn lanes256<const HD: usize>(
        qt: &[f32],
        positions: &[i32; LANES],
        head: &Head,
        scale: f32,
        ot: &mut [f32],
    ) {
        const W: usize = 8;
        let (blocks, slot) = (head.blocks, head.slot);
        let positions = &positions[..W];
        let last = positions.iter().copied().max().unwrap_or(0).max(0) as usize;
        let first = positions.iter().copied().min().unwrap_or(0).max(0) as usize;
        assert!(qt.len() >= HD * W && ot.len() >= HD * W);
        let (q, o) = (qt.as_ptr(), ot.as_mut_ptr());
        ot[..HD * W].fill(0.0);
        unsafe {
            let pos = _mm256_loadu_si256(positions.as_ptr().cast());
            let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut sum = _mm256_setzero_ps();
            // A block's scores, then its probabilities: `[key][lane]`.
            let mut p = [0.0f32; LANES * W];
            for (b, &block) in blocks.iter().enumerate().take_while(|(b, _)| b * LANES <= last) {
                let (k, v) = block_start(head, block);
                for half in 0..2 {
                    let mut s = [_mm256_setzero_ps(); W];
                    for d in 0..HD {
                        let qd = _mm256_loadu_ps(q.add(d * W));
                        for j in 0..W {
                            let key = _mm256_broadcast_ss(&*k.add(d * LANES + half * W + j));
                            s[j] = _mm256_fmadd_ps(key, qd, s[j]);
                        }
                    }
                    for j in 0..W {
                        _mm256_storeu_ps(
                            p.as_mut_ptr().add((half * W + j) * W),
                            _mm256_mul_ps(s[j], _mm256_set1_ps(scale)),
                        );
                    }
                }
                // Which lanes see key `j` (all bits set where they do): all of them below
                // the first lane's block.
                let all = (b + 1) * LANES <= first + 1;
                let seen = |j: usize| -> __m256 {
                    if all {
                        _mm256_castsi256_ps(_mm256_set1_epi32(-1))
                    } else {
                        // `pos > b·16 + j - 1`, i.e. `pos ≥ b·16 + j`.
                        _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                            pos,
                            _mm256_set1_epi32((b * LANES + j) as i32 - 1),
                        ))
                    }
                };
                let mut block_max = _mm256_set1_ps(f32::NEG_INFINITY);
                for j in 0..LANES {
                    let s = _mm256_loadu_ps(p.as_ptr().add(j * W));
                    block_max = _mm256_blendv_ps(block_max, _mm256_max_ps(block_max, s), seen(j));
                }
                let new = _mm256_max_ps(max, block_max);
                // "1 where the maximum stayed, else exp", lane by lane.
                let stayed = _mm256_cmp_ps::<_CMP_EQ_OQ>(max, new);
                let correction =
                    _mm256_blendv_ps(exp256(_mm256_sub_ps(max, new)), _mm256_set1_ps(1.0), stayed);
                max = new;
                let mut probs = [_mm256_setzero_ps(); LANES];
                for j in 0..LANES {
                    let s = _mm256_loadu_ps(p.as_ptr().add(j * W));
                    probs[j] = _mm256_and_ps(exp256(_mm256_sub_ps(s, new)), seen(j));
                    _mm256_storeu_ps(p.as_mut_ptr().add(j * W), probs[j]);
                }
                // `super::sum`'s tree: keys j and j + 8, then + 4, + 2, + 1.
                let mut t = [_mm256_setzero_ps(); 8];
                for l in 0..8 {
                    t[l] = _mm256_add_ps(probs[l], probs[l + 8]);
                }
                for width in [4, 2, 1] {
                    for l in 0..width {
                        t[l] = _mm256_add_ps(t[l], t[l + width]);
                    }
                }
                sum = _mm256_add_ps(_mm256_mul_ps(sum, correction), t[0]);
                // The outputs, eight values of `d` (one register per `d`) at a time.
                for c in 0..HD / W {
                    let mut acc = [_mm256_setzero_ps(); W];
                    for dd in 0..W {
                        acc[dd] = _mm256_mul_ps(_mm256_loadu_ps(o.add((c * W + dd) * W)), correction);
                    }
                    for j in 0..LANES {
                        let pj = _mm256_loadu_ps(p.as_ptr().add(j * W));
                        let values = v.add(j * slot + c * W);
                        if all {
                            for dd in 0..W {
                                acc[dd] = _mm256_fmadd_ps(pj, _mm256_broadcast_ss(&*values.add(dd)), acc[dd]);
                            }
                        } else {
                            // Keys a lane does not see leave it as it was (their values
                            // may be anything, NaN included).
                            let seen = seen(j);
                            for dd in 0..W {
                                let sum = _mm256_fmadd_ps(pj, _mm256_broadcast_ss(&*values.add(dd)), acc[dd]);
                                acc[dd] = _mm256_blendv_ps(acc[dd], sum, seen);
                            }
                        }
                    }
                    for dd in 0..W {
                        _mm256_storeu_ps(o.add((c * W + dd) * W), acc[dd]);
                    }
                }
            }
            let inv = _mm256_div_ps(_mm256_set1_ps(1.0), sum);
            for d in 0..HD {
                _mm256_storeu_ps(o.add(d * W), _mm256_mul_ps(_mm256_loadu_ps(o.add(d * W)), inv));
            }
        }
    }
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

    /// The rows' scores of a block, four rows side by side and vectorized over the keys,
    /// are each key's chain in order over `d`, bit for bit, with and without fused
    /// multiply-adds, and close to the exact sum.
    #[test]
    fn block_scores_are_the_defined_sum_bit_for_bit() {
        for hd in [16, 64, 128, 80, 8, 72] {
            for (bs, width) in [(16, 16), (16, 5), (4, 4), (64, 40), (32, 1)] {
                let keys = values(hd * bs, 7 * width as u32 + hd as u32);
                for rows in [1, 3, 4, 6] {
                    let qs: Vec<Vec<f32>> = (0..rows).map(|r| values(hd, 1 + hd as u32 + r as u32)).collect();
                    let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                    for fma in [true, false] {
                        let mut got = vec![[f32::NAN; 64]; rows];
                        block_rows(&refs, &keys, bs, width, 0.125, &mut got, fma);
                        for (r, q) in qs.iter().enumerate() {
                            for j in 0..width {
                                let want = dot(q, &keys[j..], bs, fma) * 0.125;
                                let score = got[r][j];
                                let what = format!("hd {hd} bs {bs} row {r} key {j} fma {fma}");
                                assert_eq!(score.to_bits(), want.to_bits(), "{what}");
                                let exact: f64 = (0..hd)
                                    .map(|d| f64::from(q[d]) * f64::from(keys[d * bs + j]))
                                    .sum();
                                let size: f64 =
                                    (0..hd).map(|d| f64::from((q[d] * keys[d * bs + j]).abs())).sum();
                                assert!(
                                    (f64::from(score) * 8.0 - exact).abs() <= size * 1e-5,
                                    "{what}: {score} vs {exact}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The tile loop's scores of (row, block) pairs, four side by side (AVX2 where the
    /// CPU has it), are each key's chain in order, bit for bit, including a last chunk
    /// of fewer than four pairs.
    #[test]
    fn paired_block_scores_are_the_defined_sum_bit_for_bit() {
        for hd in [64, 128, 8] {
            let qs: Vec<Vec<f32>> = (0..7).map(|r| values(hd, 3 + r)).collect();
            let blocks: Vec<Vec<f32>> = (0..5).map(|b| values(hd * 16, 40 + b)).collect();
            for count in [1, 3, 4, 5, 9, 35] {
                let pairs: Vec<(&[f32], &[f32])> = (0..count)
                    .map(|i| (qs[i % 7].as_slice(), blocks[i % 5].as_slice()))
                    .collect();
                for fma in [true, false] {
                    let mut got = vec![[f32::NAN; 16]; count];
                    pairs16(&pairs, 0.125, &mut got, fma);
                    for (i, (q, keys)) in pairs.iter().enumerate() {
                        for j in 0..16 {
                            let want = dot(q, &keys[j..], 16, fma) * 0.125;
                            assert_eq!(
                                got[i][j].to_bits(),
                                want.to_bits(),
                                "hd {hd} pair {i} key {j} fma {fma}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The block sum's tree, against the same sum written out.
    #[test]
    fn block_sums_fold_sixteen_lanes_in_a_fixed_tree() {
        let p = values(40, 3);
        let lane = |l: usize| p.iter().skip(l).step_by(16).fold(0.0f32, |a, &x| a + x);
        let l: Vec<f32> = (0..16).map(lane).collect();
        let eight: Vec<f32> = (0..8).map(|i| l[i] + l[i + 8]).collect();
        let four: Vec<f32> = (0..4).map(|i| eight[i] + eight[i + 4]).collect();
        let want = (four[0] + four[2]) + (four[1] + four[3]);
        assert_eq!(sum(&p).to_bits(), want.to_bits());
    }

    /// A row's attention has the same bits whatever rows share its call of the lane
    /// kernel: alone, or with up to 47 others of any positions, whose blocks reach past
    /// all of its own (blocks a register's lanes do not see must change none of them).
    #[test]
    #[allow(clippy::print_stderr)]
    fn rows_sharing_a_lane_kernel_call_keep_their_bits() {
        let (hd, slot, blocks) = (64, 2 * 64, 10);
        let keys = values(blocks * LANES * slot, 3);
        let vals = values(blocks * LANES * slot, 5);
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let head = Head {
            keys: &keys,
            values: &vals,
            blocks: &table,
            key_offset: hd * LANES,
            offset: hd,
            slot,
        };
        // 40 rows, one per "token": three registers of a call whose positions run from
        // 0 to 150, the first register's lanes all in the first blocks.
        let rows = 40;
        let qs: Vec<Vec<f32>> = (0..rows).map(|r| values(hd, 100 + r as u32)).collect();
        let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let positions: Vec<usize> = (0..rows).map(|r| (r * r * 3 + r) % 151).collect();
        for kernel in [Lanes::Widest, Lanes::Avx2] {
            let mut together = vec![f32::NAN; rows * hd];
            if !lanes(&refs, &positions, 1, &head, 0.125, &mut together, kernel) {
                eprintln!("no lane kernel on this CPU ({kernel:?}): nothing to compare");
                continue;
            }
            for r in 0..rows {
                let mut alone = vec![f32::NAN; hd];
                assert!(lanes(
                    &refs[r..=r],
                    &positions[r..=r],
                    1,
                    &head,
                    0.125,
                    &mut alone,
                    kernel
                ));
                let got = &together[r * hd..(r + 1) * hd];
                assert!(alone.iter().all(|x| x.is_finite()), "row {r} alone");
                for (d, (a, b)) in got.iter().zip(&alone).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{kernel:?}: row {r} (position {}), value {d}",
                        positions[r]
                    );
                }
            }
        }
    }
}

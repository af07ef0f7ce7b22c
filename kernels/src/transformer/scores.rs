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

use crate::gemm::Isa;

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
pub(super) fn pairs16(pairs: &[(&[f32], &[f32])], scale: f32, out: &mut [[f32; LANES]], fma: bool, isa: Isa) {
    assert_eq!(pairs.len(), out.len());
    let hd = pairs.first().map_or(0, |(q, _)| q.len());
    assert!(pairs.iter().all(|(q, k)| q.len() == hd && k.len() == hd * LANES));
    #[cfg(target_arch = "x86_64")]
    if fma && x86::avx2(isa) {
        // SAFETY: AVX2 and FMA are present; every pair's row holds `hd` values and its
        // keys `hd · 16` (asserted above).
        unsafe { x86::pairs256(pairs, hd, scale, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
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
    isa: Isa,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if x86::avx512(isa) {
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
    let _ = (qs, head, position, scale, outs, isa);
    false
}

/// Which lane kernel [`lanes`] runs: the widest this CPU has (and the `isa` it is given
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
#[allow(clippy::too_many_arguments)]
pub(super) fn lanes(
    qs: &[&[f32]],
    positions: &[usize],
    per_token: usize,
    head: &Head,
    scale: f32,
    outs: &mut [f32],
    kernel: Lanes,
    isa: Isa,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let hd = qs.first().map_or(0, |q| q.len());
        if hd != 64 && hd != 128 {
            return false;
        }
        let wide = kernel == Lanes::Widest && x86::avx512(isa);
        if !wide && !x86::avx2(isa) {
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
        let _ = (qs, positions, per_token, head, scale, outs, kernel, isa);
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
mod x86;

#[cfg(test)]
mod tests;

//! The AVX-512 kernels: one row's sixteen scores in one register (`rows512`), or
//! sixteen rows' scores of one key in one register (`lanes512`); and the AVX2 ones:
//! eight rows' scores of one key in one register (`lanes256`), and the scores of a
//! block for the tile loop (`pairs256`).
//!
//! The lane kernels are one body (`lanes`) over `vector::Vector`, a register of either
//! width, instantiated inside each width's `#[target_feature]` entry point; the steps
//! it shares with nothing else (the vector `exp`, the sum of a block's probabilities
//! in `super::sum`'s tree, the correction of a new maximum, the division by the sums)
//! are in `vector` beside the trait. `rows512` and `pairs256` exist at one width each.

use std::arch::x86_64::*;

use self::vector::{Vector, correction, exp, normalize, tree};
use super::{Head, LANES};

use crate::gemm::Isa;

mod vector;

/// Whether the AVX2 kernel may run (with FMA): the CPU has them and `isa` (the user's
/// choice, as for the products) is not the portable code.
pub(super) fn avx2(isa: Isa) -> bool {
    isa != Isa::Portable && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// [`super::pairs16`] with AVX2: each pair's sixteen scores in two registers, four
/// pairs side by side.
///
/// # Safety
/// AVX2 and FMA present; every pair's row holds `hd` values and its keys `hd · 16`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn pairs256(pairs: &[(&[f32], &[f32])], hd: usize, scale: f32, out: &mut [[f32; LANES]]) {
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

/// Whether the AVX-512 kernels may run: the CPU has them and `isa` (the user's
/// choice, as for the products) is not a narrower set.
pub(super) fn avx512(isa: Isa) -> bool {
    isa == Isa::Avx512 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
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
                    // gives the vector one's bits).
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
                    let probs =
                        _mm512_maskz_mov_ps(valid, exp(_mm512_sub_ps(scores[i], _mm512_set1_ps(max[i]))));
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
/// (benchmarks/native.md, "Figures that were in code comments"). Per lane the
/// operations and their order do not depend on `V`, so neither do the bits.
///
/// # Safety
/// AVX-512F and FMA present; `qt` and `ot` hold `V·HD·16` values; for every block `b`
/// with `16·b ≤` the largest position, the block's keys and values are in the
/// caches (checked by the caller: `Head::check`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn lanes512<const HD: usize, const V: usize>(
    qt: &[f32],
    positions: &[[i32; LANES]; V],
    head: &Head,
    scale: f32,
    ot: &mut [f32],
) {
    // SAFETY: the caller's promise, AVX-512F and FMA enabled here.
    unsafe { lanes::<__m512, HD, V>(qt, positions, head, scale, ot) }
}

/// [`lanes512`] and [`lanes256`], one body over the register width `W` (`W::WIDTH`
/// rows per register, `[v][d][lane]`; AVX2 with one vector of rows). The scores
/// stay in an array of registers, which AVX2's sixteen registers spill to the stack
/// where AVX-512 keeps them.
///
/// # Safety
/// `W`'s features present; as [`lanes512`] otherwise.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn lanes<W: Vector, const HD: usize, const V: usize>(
    qt: &[f32],
    positions: &[[i32; LANES]; V],
    head: &Head,
    scale: f32,
    ot: &mut [f32],
) {
    let w = W::WIDTH;
    // Keys per pass of the scores, and values of `d` per pass of the outputs: `V ·
    // KB` accumulators in registers (16 of AVX-512's 32 for one vector, 24 for three;
    // 8 of AVX2's 16).
    let kb = if V == 1 && W::FREE_MASKS { LANES } else { LANES / 2 };
    let (blocks, slot) = (head.blocks, head.slot);
    let mut last = 0usize;
    let mut first = [usize::MAX; V];
    for v in 0..V {
        for &p in &positions[v][..w] {
            let p = p.max(0) as usize;
            last = last.max(p);
            first[v] = first[v].min(p);
        }
    }
    assert!(qt.len() >= V * HD * w && ot.len() >= V * HD * w);
    let (q, o) = (qt.as_ptr(), ot.as_mut_ptr());
    ot[..V * HD * w].fill(0.0);
    unsafe {
        let pos: [W::Int; V] = std::array::from_fn(|v| W::ints(positions[v].as_ptr()));
        let mut max = [W::splat(f32::NEG_INFINITY); V];
        let mut sum = [W::zero(); V];
        let mut correction = [W::splat(1.0); V];
        // A block's scores, then its probabilities, per vector and key.
        let mut s = [[W::zero(); LANES]; V];
        let mut seen = [[W::all(); LANES]; V];
        let mut all = [true; V];
        for (b, &block) in blocks.iter().enumerate().take_while(|(b, _)| b * LANES <= last) {
            let (k, val) = block_start(head, block);
            for k0 in (0..LANES).step_by(kb) {
                let mut acc = [[W::zero(); LANES]; V];
                for d in 0..HD {
                    let qd: [W; V] = std::array::from_fn(|v| W::load(q.add((v * HD + d) * w)));
                    for j in 0..kb {
                        let key = W::broadcast(k.add(d * LANES + k0 + j));
                        for v in 0..V {
                            acc[v][j] = key.fmadd(qd[v], acc[v][j]);
                        }
                    }
                }
                for v in 0..V {
                    for j in 0..kb {
                        s[v][k0 + j] = acc[v][j];
                    }
                }
            }
            // Which lanes see key `j`: all of them below the first lane's block. Mask
            // registers keep the masks of the block; without them, vector masks would
            // take registers the loops need, so each is made again where it is used.
            for v in 0..V {
                all[v] = (b + 1) * LANES <= first[v] + 1;
                if W::FREE_MASKS {
                    for j in 0..LANES {
                        seen[v][j] = if all[v] {
                            W::all()
                        } else {
                            W::at_least(pos[v], (b * LANES + j) as i32)
                        };
                    }
                }
            }
            let seen = |v: usize, j: usize| {
                if W::FREE_MASKS {
                    seen[v][j]
                } else if all[v] {
                    W::all()
                } else {
                    W::at_least(pos[v], (b * LANES + j) as i32)
                }
            };
            for v in 0..V {
                let mut block_max = W::splat(f32::NEG_INFINITY);
                for j in 0..LANES {
                    s[v][j] = s[v][j].mul(W::splat(scale));
                    block_max = W::mask_max(seen(v, j), block_max, s[v][j]);
                }
                let new = max[v].max(block_max);
                correction[v] = self::correction(max[v], new);
                max[v] = new;
                for j in 0..LANES {
                    s[v][j] = W::maskz(seen(v, j), exp(s[v][j].sub(new)));
                }
                sum[v] = sum[v].mul(correction[v]).add(tree(&s[v]));
            }
            // Without mask registers, a block every lane sees takes plain multiply-adds:
            // keys a lane does not see must leave it as it was (their values may be
            // anything, NaN included).
            let masked = W::FREE_MASKS || !all.iter().all(|&a| a);
            // The outputs, `kb` values of `d` (one register per `d` and vector) at a
            // time.
            for c in 0..HD / kb {
                let mut acc = [[W::zero(); LANES]; V];
                for v in 0..V {
                    for dd in 0..kb {
                        let at = o.add((v * HD + c * kb + dd) * w);
                        acc[v][dd] = W::load(at).mul(correction[v]);
                    }
                }
                for j in 0..LANES {
                    for dd in 0..kb {
                        let value = W::broadcast(val.add(j * slot + c * kb + dd));
                        for v in 0..V {
                            acc[v][dd] = if masked {
                                W::mask_fmadd(seen(v, j), s[v][j], value, acc[v][dd])
                            } else {
                                s[v][j].fmadd(value, acc[v][dd])
                            };
                        }
                    }
                }
                for v in 0..V {
                    for dd in 0..kb {
                        acc[v][dd].store(o.add((v * HD + c * kb + dd) * w));
                    }
                }
            }
        }
        for v in 0..V {
            normalize(o.add(v * HD * w), HD, sum[v]);
        }
    }
}

/// [`lanes512`] with AVX2: eight query rows as the lanes of each register (`qt`:
/// `[d][lane]`, lane `l` at position `positions[l]`, `l < 8`) over their blocks of
/// sixteen keys, into `ot` (`[d][lane]`). The same operations per row and block in
/// the same order, so the same bits: the scores eight keys at a time (sixteen
/// accumulators would take every register), the masks as vectors, and the weighted
/// values of a block every lane sees without any.
///
/// The body is [`lanes512`]'s (`lanes`): where AVX-512 keeps a block's masks in mask
/// registers, AVX2 makes each again where it is used, and a block every lane sees
/// takes plain multiply-adds rather than blends.
///
/// # Safety
/// AVX2 and FMA present; `qt` and `ot` hold `HD·8` values; for every block `b` with
/// `16·b ≤ max(positions[..8])`, the block's keys and values are in the caches
/// (checked by the caller: `Head::check`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lanes256<const HD: usize>(
    qt: &[f32],
    positions: &[i32; LANES],
    head: &Head,
    scale: f32,
    ot: &mut [f32],
) {
    // SAFETY: the caller's promise, AVX2 and FMA enabled here.
    unsafe { lanes::<__m256, HD, 1>(qt, std::array::from_ref(positions), head, scale, ot) }
}

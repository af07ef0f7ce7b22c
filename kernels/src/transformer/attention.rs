//! Causal attention over the paged cache ([`attention`], [`attention_bf16_cache`]): the
//! split into tiles of tokens and query heads, the widening of a bf16 cache, and the
//! tile loop with its online softmax. The vector kernels the tiles call are in `scores`.

use rayon::prelude::*;

use super::{KvShape, Span, exp, scores};
use crate::gemm::Isa;

/// Query tokens per attention tile: with their group of query heads (`heads /
/// kv_heads`) they share every key and value block read.
const QUERY_TILE: usize = 16;

/// Causal attention of every span's tokens against a paged cache.
///
/// `q` is `tokens × heads × head_dim`; `out` has the same shape. Heads share KV heads in
/// groups (`heads / kv_heads`, grouped-query attention). Scores are scaled by
/// `1/sqrt(head_dim)` and soft-maxed in f32.
///
/// The work is tiled as flash attention is: up to 16 tokens of a span with all query
/// heads of one KV head form a tile, whose rows share every cached block of keys and
/// values it reads, with the softmax computed online (running maximum and sum,
/// rescaled block by block). Each row's arithmetic is the same whatever tile it is in:
/// blocks in position order, the same dot products and updates. So a token gets the
/// same bits alone (decode), in a prompt chunk, or among draft tokens being verified.
/// With blocks of 16 slots and heads of 64 or 128 values, a tile of several tokens goes
/// sixteen rows at a time (eight with AVX2) as the lanes of the registers
/// (`scores::lanes`), and with AVX-512 a tile of one token has its query heads side by
/// side through all their blocks with their state in registers (`scores::rows`), all
/// with the same bits; elsewhere a tile goes block by block, its rows' scores side by
/// side, then row by row.
///
/// The vector kernels run as far as `isa` allows (the products' choice,
/// [`crate::gemm::Tuning::isa`]): AVX-512's under [`Isa::Avx512`], AVX2's under
/// [`Isa::Avx2`], and none under [`Isa::Portable`]. The bits are the same on each.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    isa: Isa,
) {
    let cache = Cache::F32 {
        k: k_cache,
        v: v_cache,
    };
    attention_with(q, spans, heads, shape, cache, out, Kernels::Fastest, isa);
}

/// [`attention`] over caches held in bf16 ([`KvShape::store_bf16`]). Each tile widens
/// the blocks it reads, for its KV head, into f32 (exactly: a bf16 is the top half of an
/// f32) and runs [`attention`]'s kernels on them, so the results are bit for bit those of
/// [`attention`] over an f32 cache holding the same rounded values, while the cache
/// itself, which a batch of decodes streams from memory once per layer, takes half the
/// bytes.
#[allow(clippy::too_many_arguments)]
pub fn attention_bf16_cache(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    k_cache: &[u16],
    v_cache: &[u16],
    out: &mut [f32],
    isa: Isa,
) {
    let cache = Cache::Bf16 {
        k: k_cache,
        v: v_cache,
    };
    attention_with(q, spans, heads, shape, cache, out, Kernels::Fastest, isa);
}

/// A layer's keys and values as the cache holds them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cache<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    Bf16 { k: &'a [u16], v: &'a [u16] },
}

/// A tile of one token over a bf16 cache by the AVX-512 decode kernel, which widens the
/// keys and values as it loads them: a decode step's attention streams every sequence's
/// cache once, and reading it in bf16 is what halves its bytes (widened into a buffer
/// first, a step of sixteen 900-token sequences saved nothing). The same operations as
/// `attend_tile`'s for such a tile, so the same bits. False, doing nothing, where that
/// kernel does not run (several tokens, no AVX-512 or `isa` narrower, another head or
/// block size).
#[allow(clippy::too_many_arguments)]
fn decode_bf16(
    q: &[f32],
    tile: &Tile,
    heads: usize,
    shape: KvShape,
    k: &[u16],
    v: &[u16],
    o: &mut [f32],
    isa: Isa,
) -> bool {
    let (hd, bs) = (shape.head_dim, shape.block_size);
    if tile.count != 1 || bs != 16 {
        return false;
    }
    let group = heads / shape.kv_heads;
    let head = scores::Head {
        keys: k,
        values: v,
        blocks: tile.span.blocks,
        key_offset: tile.kv_head * hd * bs,
        offset: tile.kv_head * hd,
        slot: shape.slot_len(),
    };
    let token = tile.span.row + tile.first;
    let at = (token * heads + tile.kv_head * group + tile.heads.start) * hd;
    let qs: Vec<&[f32]> = q[at..at + tile.heads.len() * hd].chunks_exact(hd).collect();
    let mut outs: Vec<&mut [f32]> = o.chunks_exact_mut(hd).collect();
    let scale = 1.0 / (hd as f32).sqrt();
    scores::rows(&qs, &head, tile.span.start + tile.first, scale, &mut outs, isa)
}

/// A tile's blocks widened from a bf16 cache ([`Widened::fill`]), kept per thread so
/// that its memory is reused from tile to tile (fresh for every tile, the buffers of a
/// long sequence went back to the OS and faulted in again each time).
#[derive(Default)]
struct Widened {
    table: Vec<u32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

thread_local! {
    static WIDENED: std::cell::RefCell<Widened> = std::cell::RefCell::default();
}

impl Widened {
    /// The blocks `tile` reads from a bf16 cache, for its KV head, widened to f32 and
    /// laid out as a cache of one KV head whose blocks are numbered from 0 in the span's
    /// order: the block table for it, its keys and its values.
    fn fill(&mut self, tile: &Tile, shape: KvShape, k: &[u16], v: &[u16]) {
        let (hd, bs, slot) = (shape.head_dim, shape.block_size, shape.slot_len());
        let widen = |src: &[u16], dst: &mut Vec<f32>| {
            dst.extend(src.iter().map(|&b| crate::formats::bf16::bf16_to_f32(b)))
        };
        let last = tile.span.start + tile.first + tile.count - 1;
        let used = tile.span.blocks.len().min(last / bs + 1);
        self.keys.clear();
        self.values.clear();
        for &block in &tile.span.blocks[..used] {
            let start = block as usize * bs * slot;
            let key_start = start + tile.kv_head * hd * bs;
            widen(&k[key_start..key_start + hd * bs], &mut self.keys);
            for j in 0..bs {
                let at = start + j * slot + tile.kv_head * hd;
                widen(&v[at..at + hd], &mut self.values);
            }
        }
        self.table.clear();
        self.table.extend(0..used as u32);
    }
}

/// Which kernels [`attention_with`]'s tiles may take: tests force the narrower ones to
/// compare their bits with the fastest's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernels {
    /// The fastest this CPU has.
    Fastest,
    /// AVX2's lane kernel where AVX-512's would run, the tile loop for tiles of one
    /// token.
    Avx2,
    /// The tile loop alone.
    TileLoop,
}

/// [`attention`] with the tiles' kernels chosen by `kernels`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_with(
    q: &[f32],
    spans: &[Span],
    heads: usize,
    shape: KvShape,
    cache: Cache,
    out: &mut [f32],
    kernels: Kernels,
    isa: Isa,
) {
    assert!(
        shape.block_size <= 64,
        "attention tiles hold at most 64 keys per block"
    );
    let hd = shape.head_dim;
    let group = heads / shape.kv_heads;
    let mut tiles = Vec::new();
    for span in spans {
        for kv_head in 0..shape.kv_heads {
            for first in (0..span.len).step_by(QUERY_TILE) {
                let count = QUERY_TILE.min(span.len - first);
                tiles.push(Tile {
                    span: *span,
                    kv_head,
                    first,
                    count,
                    heads: 0..group,
                });
            }
        }
    }
    // Few tiles (a decode step of a few sequences: one per KV head; a speculative step
    // verifying a few tokens) would leave threads idle: then each token is a tile of its
    // own, its query heads still side by side (five tokens as one tile per head took a
    // fifth of a verification step), and if that is still too few, each query head. A
    // row's arithmetic does not depend on its tile, so neither do its bits.
    let enough = 4 * rayon::current_num_threads();
    if tiles.len() < enough {
        tiles = tiles
            .into_iter()
            .flat_map(|t| {
                (t.first..t.first + t.count).map(move |first| Tile {
                    first,
                    count: 1,
                    ..t.clone()
                })
            })
            .collect();
    }
    if tiles.len() < enough && group > 1 {
        tiles = tiles
            .into_iter()
            .flat_map(|t| {
                t.heads.clone().map(move |h| Tile {
                    heads: h..h + 1,
                    ..t.clone()
                })
            })
            .collect();
    }
    let results: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|tile| {
            let mut o = vec![0.0f32; tile.count * tile.heads.len() * hd];
            match cache {
                Cache::F32 { k, v } => {
                    let layout = Layout {
                        shape,
                        kv_head: tile.kv_head,
                    };
                    attend_tile(q, tile, heads, shape, layout, k, v, &mut o, kernels, isa);
                }
                Cache::Bf16 { k, v }
                    if kernels == Kernels::Fastest
                        && decode_bf16(q, tile, heads, shape, k, v, &mut o, isa) => {}
                Cache::Bf16 { k, v } => WIDENED.with_borrow_mut(|widened| {
                    widened.fill(tile, shape, k, v);
                    let local = Tile {
                        span: Span {
                            blocks: &widened.table,
                            ..tile.span
                        },
                        ..tile.clone()
                    };
                    let layout = Layout {
                        shape: KvShape { kv_heads: 1, ..shape },
                        kv_head: 0,
                    };
                    let (keys, values) = (&widened.keys, &widened.values);
                    attend_tile(
                        q, &local, heads, shape, layout, keys, values, &mut o, kernels, isa,
                    );
                }),
            }
            o
        })
        .collect();
    for (tile, o) in tiles.iter().zip(&results) {
        let width = tile.heads.len() * hd;
        for (t, rows) in o.chunks_exact(width).enumerate() {
            let token = tile.span.row + tile.first + t;
            let at = (token * heads + tile.kv_head * group + tile.heads.start) * hd;
            out[at..at + width].copy_from_slice(rows);
        }
    }
}

/// A unit of attention work: tokens `first..first + count` of `span`, with the query
/// heads `heads` (numbered within the group) of KV head `kv_head`.
#[derive(Debug, Clone)]
struct Tile<'a> {
    span: Span<'a>,
    kv_head: usize,
    first: usize,
    count: usize,
    heads: std::ops::Range<usize>,
}

/// Where a tile's keys and values are in the cache it reads: the cache's shape and the
/// tile's KV head in it (the model's, or one widened for the tile alone).
#[derive(Debug, Clone, Copy)]
struct Layout {
    shape: KvShape,
    kv_head: usize,
}

/// One tile into `o` (`[token][head of the tile][head_dim]`): its queries are laid out by
/// `shape` and `tile.kv_head`, its keys and values by `layout`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
#[allow(clippy::too_many_arguments)]
fn attend_tile(
    q: &[f32],
    tile: &Tile,
    heads: usize,
    shape: KvShape,
    layout: Layout,
    k: &[f32],
    v: &[f32],
    o: &mut [f32],
    kernels: Kernels,
    isa: Isa,
) {
    // The vector kernels below are x86's (`scores`); asking another architecture's
    // target for x86's `fma` panics in `target-features`, so elsewhere the tile loop runs.
    // On aarch64 it runs in fused multiply-adds, which every ARMv8-A CPU has (`fmla`,
    // what `mul_add` compiles to there): the bits of x86's FMA kernels.
    #[cfg(target_arch = "x86_64")]
    let fma = multiversion::target::selected_target!().supports_feature_str("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let fma = cfg!(target_arch = "aarch64");
    let (hd, bs, slot) = (shape.head_dim, shape.block_size, layout.shape.slot_len());
    let group = heads / shape.kv_heads;
    let (span, first, count, kv_head) = (tile.span, tile.first, tile.count, tile.kv_head);
    let tile_heads = tile.heads.len();
    let rows = count * tile_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // This head's keys in a block (transposed: `hd` runs of `bs`), and its values in a
    // block's first slot, from the block's start.
    let offsets = (layout.kv_head * hd * bs, layout.kv_head * hd);
    let head = scores::Head {
        keys: k,
        values: v,
        blocks: span.blocks,
        key_offset: offsets.0,
        offset: offsets.1,
        slot,
    };
    let q_rows = |t: usize| {
        let at = ((span.row + first + t) * heads + kv_head * group + tile.heads.start) * hd;
        q[at..at + tile_heads * hd].chunks_exact(hd)
    };
    // Blocks of sixteen keys: several tokens go sixteen rows at a time (eight with
    // AVX2), as the lanes of the registers (`scores::lanes`); on AVX-512 one token's
    // query heads go side by side with their state in registers from their first block
    // to their last (`scores::rows`).
    if kernels != Kernels::TileLoop && fma && bs == 16 && count > 1 {
        let qs: Vec<&[f32]> = (0..count).flat_map(q_rows).collect();
        let positions: Vec<usize> = (0..count)
            .flat_map(|t| std::iter::repeat_n(span.start + first + t, tile_heads))
            .collect();
        let lanes = if kernels == Kernels::Avx2 {
            scores::Lanes::Avx2
        } else {
            scores::Lanes::Widest
        };
        if scores::lanes(&qs, &positions, tile_heads, &head, scale, o, lanes, isa) {
            return;
        }
    }
    if kernels == Kernels::Fastest && fma && bs == 16 {
        let (mut done, mut rest) = (true, &mut o[..]);
        for t in 0..count {
            let position = span.start + first + t;
            let qs: Vec<&[f32]> = q_rows(t).collect();
            let (row_out, after) = rest.split_at_mut(tile_heads * hd);
            let mut outs: Vec<&mut [f32]> = row_out.chunks_exact_mut(hd).collect();
            done = scores::rows(&qs, &head, position, scale, &mut outs, isa);
            if !done {
                break;
            }
            rest = after;
        }
        if done {
            return;
        }
    }
    let qs: Vec<&[f32]> = (0..count).flat_map(q_rows).collect();
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0.0f32; rows];
    let mut scores = vec![[0.0f32; 64]; rows];
    // The last position any row of the tile attends to.
    let last = span.start + first + count - 1;
    let used = span.blocks.len().min(last / bs + 1);
    // Blocks of sixteen: every score the tile needs first, block by block, four (row,
    // block) pairs side by side (`scores::pairs16`).
    let mut all = Vec::new();
    if bs == 16 {
        let mut pairs = Vec::with_capacity(used * rows);
        for (b, &block) in span.blocks[..used].iter().enumerate() {
            let start = block as usize * bs * slot + offsets.0;
            for (r, q) in qs.iter().enumerate() {
                if b * bs <= span.start + first + r / tile_heads {
                    pairs.push((*q, &k[start..start + hd * bs]));
                }
            }
        }
        all = vec![[0.0f32; 16]; pairs.len()];
        scores::pairs16(&pairs, scale, &mut all, fma, isa);
    }
    let mut next = 0;
    for (b, &block) in span.blocks[..used].iter().enumerate() {
        let start = block as usize * bs * slot;
        if bs != 16 {
            // Every row's scores of this block's keys, as far as the last row sees.
            let width = bs.min(last + 1 - b * bs);
            scores::block_rows(&qs, &k[start + offsets.0..], bs, width, scale, &mut scores, fma);
        }
        for r in 0..rows {
            let position = span.start + first + r / tile_heads;
            // Keys of this block the row sees (causal).
            if b * bs > position {
                continue;
            }
            let seen = bs.min(position + 1 - b * bs);
            if bs == 16 {
                scores[r][..16].copy_from_slice(&all[next]);
                next += 1;
            }
            let row_scores = &mut scores[r];
            let block_max = row_scores[..seen]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let new_max = max[r].max(block_max);
            // `exp(0)` is exactly 1: most blocks past the first leave the maximum where
            // it was, and skip the call.
            let correction = if new_max == max[r] {
                1.0
            } else {
                exp(max[r] - new_max)
            };
            let or = &mut o[r * hd..(r + 1) * hd];
            if correction != 1.0 {
                for x in or.iter_mut() {
                    *x *= correction;
                }
            }
            // Sixteen at a time (one vector); the lanes past `seen` are never read.
            for chunk in row_scores[..seen.next_multiple_of(16)].as_chunks_mut::<16>().0 {
                for score in chunk {
                    *score = exp(*score - new_max);
                }
            }
            let total = sum[r] * correction + scores::sum(&row_scores[..seen]);
            let (p, values) = (&row_scores[..seen], &v[start + offsets.1..]);
            match (hd, fma) {
                (64, true) => weigh_values::<64, true>(or, p, values, slot),
                (64, false) => weigh_values::<64, false>(or, p, values, slot),
                (128, true) => weigh_values::<128, true>(or, p, values, slot),
                (128, false) => weigh_values::<128, false>(or, p, values, slot),
                _ => weigh_values_any(or, p, values, slot, fma),
            }
            sum[r] = total;
            max[r] = new_max;
        }
    }
    for (r, or) in o.chunks_exact_mut(hd).enumerate() {
        let inv = 1.0 / sum[r];
        for x in or {
            *x *= inv;
        }
    }
}

/// `o += Σ_j p[j] · v_j` over a block's keys, `v_j` the `HD` values at `v[j * slot..]`:
/// the output row stays in registers across the block (written through memory, each
/// key waited on the previous key's store). Each lane's arithmetic is the same as
/// [`weigh_values_any`]'s.
#[inline(always)]
fn weigh_values<const HD: usize, const FMA: bool>(o: &mut [f32], p: &[f32], v: &[f32], slot: usize) {
    let mut acc = [0.0f32; HD];
    acc.copy_from_slice(&o[..HD]);
    for (j, &pj) in p.iter().enumerate() {
        let value = &v[j * slot..][..HD];
        for (a, &x) in acc.iter_mut().zip(value) {
            *a = if FMA { pj.mul_add(x, *a) } else { *a + pj * x };
        }
    }
    o[..HD].copy_from_slice(&acc);
}

/// [`weigh_values`] for any head size.
#[inline(always)]
fn weigh_values_any(o: &mut [f32], p: &[f32], v: &[f32], slot: usize, fma: bool) {
    let hd = o.len();
    for (j, &pj) in p.iter().enumerate() {
        let value = &v[j * slot..][..hd];
        for (a, &x) in o.iter_mut().zip(value) {
            *a = if fma { pj.mul_add(x, *a) } else { *a + pj * x };
        }
    }
}

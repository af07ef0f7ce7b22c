//! The decoder's loops against plain definitions: norms, activations, rotary
//! embeddings, the bf16 forms for calibration, and attention on every kernel and cache
//! type, bit for bit where the kernels promise it.

use super::attention::{Cache, Kernels, attention_with};
use super::bf16::{Keys, dot_in_order, dots_in_order};
use super::elementwise::silu_mul_rows;
use super::*;
use crate::gemm::Isa;

/// The eager bf16 attention's scores, eight keys at a time, are each key's dot
/// product in order, bit for bit (signed zeros included).
#[test]
fn dots_eight_at_a_time_equal_dots_in_order() {
    // Three blocks of 16 slots of three KV heads of 64 values; KV head 1's keys.
    let shape = KvShape {
        block_size: 16,
        kv_heads: 3,
        head_dim: 64,
    };
    let hd = shape.head_dim;
    let value = |i: usize| ((i * 7919 % 2003) as f32 - 1001.0) * 1e-3;
    let q: Vec<f32> = (0..hd).map(|d| value(d + 3)).collect();
    let mut cache: Vec<f32> = (0..3 * 16 * shape.slot_len()).map(value).collect();
    // Positions in a paged table whose blocks are out of order.
    let table = [2u32, 0, 1];
    let all: Vec<usize> = (0..48).map(|p| shape.key_offset(&table, p, 0)).collect();
    // A key of zeros times a query: -0.0 sums, whose sign depends on the start.
    let negative: Vec<f32> = q.iter().map(|&x| -x.abs()).collect();
    let zero = shape.key_offset(&table, 5, 1);
    for d in 0..hd {
        cache[zero + d * 16] = 0.0;
    }
    for len in [0, 1, 7, 8, 9, 16, 23, 40] {
        let starts: Vec<usize> = (0..len).map(|j| all[j * 17 % 40]).collect();
        let keys = Keys {
            cache: &cache,
            starts: &starts,
            offset: hd * 16,
            stride: 16,
        };
        for query in [&q, &negative] {
            let mut got = Vec::new();
            dots_in_order(query, &keys, &mut got);
            let want: Vec<f32> = starts
                .iter()
                .map(|&at| dot_in_order(query, (0..hd).map(|d| cache[at + hd * 16 + d * 16])))
                .collect();
            assert_same_bits(&got, &want, &format!("{len} keys"));
        }
    }
}

/// A prompt chunk's norms, residual additions and activations run in tasks on the
/// pool: every row must come out as the one-thread loop makes it, the last, partial
/// task's rows included.
#[test]
fn element_wise_passes_over_many_rows_equal_the_row_by_row_loop() {
    let (rows, dim, n) = (301, 576, 1536);
    let value = |i: usize| ((i * 7919 % 2003) as f32 - 1001.0) * 3e-3;
    let x: Vec<f32> = (0..rows * dim).map(value).collect();
    let weight: Vec<f32> = (0..dim).map(|i| 0.5 + value(i + 17)).collect();
    assert!(x.len() >= 2 * PARALLEL_MIN, "too few values to reach the pool");

    let mut norm = vec![f32::NAN; x.len()];
    rms_norm(&x, &weight, 1e-5, &mut norm);
    let mut norm16 = vec![f32::NAN; x.len()];
    rms_norm_bf16(&x, &weight, 1e-5, &mut norm16);
    for (r, row) in x.chunks_exact(dim).enumerate() {
        let mut want = vec![0.0; dim];
        rms_norm_row(row, &weight, 1e-5, &mut want);
        assert_same_bits(&norm[r * dim..(r + 1) * dim], &want, &format!("rms_norm row {r}"));
        let mut want16 = vec![0.0; dim];
        rms_norm_bf16(row, &weight, 1e-5, &mut want16);
        assert_same_bits(
            &norm16[r * dim..(r + 1) * dim],
            &want16,
            &format!("rms_norm_bf16 row {r}"),
        );
    }

    let gate_up: Vec<f32> = (0..rows * 2 * n).map(value).collect();
    let mut act = vec![f32::NAN; rows * n];
    silu_mul(&gate_up, n, &mut act);
    let mut act16 = vec![f32::NAN; rows * n];
    silu_mul_bf16(&gate_up, n, &mut act16);
    for (r, row) in gate_up.chunks_exact(2 * n).enumerate() {
        let mut want = vec![0.0; n];
        silu_mul_rows(row, n, &mut want, false);
        assert_same_bits(&act[r * n..(r + 1) * n], &want, &format!("silu_mul row {r}"));
        let mut want16 = vec![0.0; n];
        silu_mul_bf16(row, n, &mut want16);
        assert_same_bits(
            &act16[r * n..(r + 1) * n],
            &want16,
            &format!("silu_mul_bf16 row {r}"),
        );
    }

    let mut sum = x.clone();
    add_assign(&mut sum, &norm);
    let want: Vec<f32> = x.iter().zip(&norm).map(|(a, b)| a + b).collect();
    assert_same_bits(&sum, &want, "add_assign");
}

/// `got` and `want` hold the same values, bit for bit (NaNs and signed zeros too).
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(want), "{what}");
}

#[test]
fn exp_is_within_two_ulps_everywhere_it_is_finite() {
    let mut worst = 0.0f64;
    let mut x = -87.3f32;
    while x <= 88.3 {
        let want = f64::from(x).exp();
        let got = f64::from(exp(x));
        let ulp = f64::from(f32::EPSILON) * want;
        worst = worst.max((got - want).abs() / ulp);
        x += 0.000_37;
    }
    assert!(worst <= 2.0, "{worst} ulps");
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-88.0), 0.0);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp(89.0), f32::INFINITY);
    assert!(exp(f32::NAN).is_nan());
}

/// Attention over a contiguous (unpaged) history, written the plain way.
fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>]) -> Vec<f32> {
    let scale = 1.0 / (q.len() as f32).sqrt();
    let scores: Vec<f32> = keys
        .iter()
        .map(|k| q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale)
        .collect();
    let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f32 = exp.iter().sum();
    let mut out = vec![0.0; q.len()];
    for (e, v) in exp.iter().zip(values) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += e / total * x;
        }
    }
    out
}

#[test]
fn causal_attention_over_a_paged_span_matches_contiguous_attention_row_by_row() {
    let shape = KvShape {
        block_size: 4,
        kv_heads: 2,
        head_dim: 8,
    };
    let (heads, tokens) = (4, 21);
    let blocks_total = 9;
    let mut k_cache = vec![0.0f32; blocks_total * 4 * shape.slot_len()];
    let mut v_cache = k_cache.clone();
    // A sequence of 21 tokens scattered over six blocks.
    let table = [5u32, 1, 3, 8, 0, 6];
    let value = |pos: usize, h: usize, d: usize, salt: f32| ((pos * 31 + h * 7 + d) as f32 * salt).sin();
    for pos in 0..tokens {
        let k: Vec<f32> = (0..16).map(|i| value(pos, i / 8, i % 8, 0.37)).collect();
        let v: Vec<f32> = (0..16).map(|i| value(pos, i / 8, i % 8, 0.11)).collect();
        shape.store(&mut k_cache, &mut v_cache, &table, pos, &k, &v);
    }
    let q: Vec<f32> = (0..tokens * heads * 8).map(|i| (i as f32 * 0.3).cos()).collect();
    let run = |spans: &[Span]| {
        let mut out = vec![f32::NAN; tokens * heads * 8];
        attention(&q, spans, heads, shape, &k_cache, &v_cache, &mut out, Isa::best());
        out
    };
    // The whole span at once (two tiles: 16 + 5 tokens)...
    let together = run(&[Span {
        blocks: &table,
        start: 0,
        len: tokens,
        row: 0,
    }]);
    // ...and every token on its own, as decode steps see them.
    let alone: Vec<Span> = (0..tokens)
        .map(|t| Span {
            blocks: &table,
            start: t,
            len: 1,
            row: t,
        })
        .collect();
    let apart = run(&alone);
    assert!(
        together
            .iter()
            .zip(&apart)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    for t in 0..tokens {
        for head in 0..heads {
            let kv = head / 2;
            let keys: Vec<Vec<f32>> = (0..=t)
                .map(|p| (0..8).map(|d| value(p, kv, d, 0.37)).collect())
                .collect();
            let values: Vec<Vec<f32>> = (0..=t)
                .map(|p| (0..8).map(|d| value(p, kv, d, 0.11)).collect())
                .collect();
            let at = (t * heads + head) * 8;
            let want = naive(&q[at..at + 8], &keys, &values);
            for (a, b) in together[at..at + 8].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "token {t} head {head}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn the_vector_kernels_give_the_tile_loop_s_bits() {
    // Groups of 3 query heads per KV head (SmolLM2's: three registers of rows per
    // call of the AVX-512 lane kernel), of 4 (48 rows and 16), 2 and 1.
    for (hd, heads, kv_heads) in [(64, 9, 3), (128, 9, 3), (64, 8, 2), (64, 4, 2), (64, 3, 3)] {
        let shape = KvShape {
            block_size: 16,
            kv_heads,
            head_dim: hd,
        };
        let blocks_total = 12;
        let value = |i: usize, salt: f32| ((i as f32 * salt).sin() * 3.0).tan().clamp(-8.0, 8.0);
        let len = blocks_total * 16 * shape.slot_len();
        let mut k_cache: Vec<f32> = (0..len).map(|i| value(i, 0.37)).collect();
        let mut v_cache: Vec<f32> = (0..len).map(|i| value(i, 0.11)).collect();
        // A 70-token prompt chunk after 23 cached tokens (part of its first block
        // and of its last; 16-row lane groups that straddle tokens and blocks), and
        // a decode step of another sequence (one token: the per-token kernel).
        let (table_a, table_b) = ([7u32, 2, 9, 0, 11, 4, 5], [3u32, 8, 1]);
        // The slots past each sequence's last position hold NaN, as a block left by
        // a request that failed could: no kernel may let them into a result.
        let nan = vec![f32::NAN; shape.slot_len()];
        for (table, from, to) in [(&table_a[..], 93, 112), (&table_b[..], 41, 48)] {
            for position in from..to {
                shape.store(&mut k_cache, &mut v_cache, table, position, &nan, &nan);
            }
        }
        let spans = [
            Span {
                blocks: &table_a,
                start: 23,
                len: 70,
                row: 0,
            },
            Span {
                blocks: &table_b,
                start: 40,
                len: 1,
                row: 70,
            },
        ];
        let q: Vec<f32> = (0..71 * heads * hd).map(|i| value(i, 0.29)).collect();
        let run = |kernels, isa| {
            let mut out = vec![f32::NAN; q.len()];
            let cache = Cache::F32 {
                k: &k_cache,
                v: &v_cache,
            };
            attention_with(&q, &spans, heads, shape, cache, &mut out, kernels, isa);
            out
        };
        let tiles = run(Kernels::TileLoop, Isa::best());
        // The fastest kernels of this CPU (AVX-512's or AVX2's), and AVX2's; and the
        // fastest each narrower instruction set allows (a user's choice).
        let narrower = Isa::available().into_iter().map(|isa| (Kernels::Fastest, isa));
        for (kernels, isa) in [(Kernels::Fastest, Isa::best()), (Kernels::Avx2, Isa::best())]
            .into_iter()
            .chain(narrower)
        {
            let got = run(kernels, isa);
            assert!(got.iter().all(|x| x.is_finite()));
            let same = got
                .iter()
                .zip(&tiles)
                .filter(|(a, b)| a.to_bits() == b.to_bits())
                .count();
            assert_eq!(
                same,
                got.len(),
                "head size {hd}, {heads}/{kv_heads} heads, {kernels:?} on {isa:?}"
            );
        }
    }
}

#[test]
fn a_bf16_cache_gives_the_bits_of_an_f32_cache_holding_its_values() {
    for hd in [64, 128] {
        let shape = KvShape {
            block_size: 16,
            kv_heads: 3,
            head_dim: hd,
        };
        let (heads, blocks_total) = (9, 40);
        let value = |i: usize, salt: f32| ((i as f32 * salt).sin() * 3.0).tan().clamp(-8.0, 8.0);
        let len = blocks_total * shape.block_size * shape.slot_len();
        let (mut k16, mut v16) = (vec![0u16; len], vec![0u16; len]);
        let (mut k32, mut v32) = (vec![0.0f32; len], vec![0.0f32; len]);
        // Three sequences: a 70-token chunk after 23 cached tokens, a decode step, and
        // a step verifying three drafted tokens; NaN in every slot past a sequence's
        // last position.
        let tables: [&[u32]; 3] = [&[7, 2, 9, 0, 11, 4, 5], &[3, 8, 1], &[12, 30, 22, 17]];
        let ends = [93, 41, 52];
        let rounded = crate::formats::bf16::round_bf16;
        for (s, table) in tables.iter().enumerate() {
            for position in 0..table.len() * shape.block_size {
                let (k, v): (Vec<f32>, Vec<f32>) = if position < ends[s] {
                    let at = (s * 1000 + position) * shape.slot_len();
                    (0..shape.slot_len())
                        .map(|i| (value(at + i, 0.37), value(at + i, 0.11)))
                        .unzip()
                } else {
                    (vec![f32::NAN; shape.slot_len()], vec![f32::NAN; shape.slot_len()])
                };
                shape.store_bf16(&mut k16, &mut v16, table, position, &k, &v);
                let (k, v): (Vec<f32>, Vec<f32>) = (
                    k.into_iter().map(rounded).collect(),
                    v.into_iter().map(rounded).collect(),
                );
                shape.store(&mut k32, &mut v32, table, position, &k, &v);
            }
        }
        let spans = [
            Span {
                blocks: tables[0],
                start: 23,
                len: 70,
                row: 0,
            },
            Span {
                blocks: tables[1],
                start: 40,
                len: 1,
                row: 70,
            },
            Span {
                blocks: tables[2],
                start: 48,
                len: 4,
                row: 71,
            },
        ];
        let q: Vec<f32> = (0..75 * heads * hd).map(|i| value(i, 0.29)).collect();
        for kernels in [Kernels::Fastest, Kernels::Avx2, Kernels::TileLoop] {
            let run = |cache| {
                let mut out = vec![f32::NAN; q.len()];
                attention_with(&q, &spans, heads, shape, cache, &mut out, kernels, Isa::best());
                out
            };
            let want = run(Cache::F32 { k: &k32, v: &v32 });
            let got = run(Cache::Bf16 { k: &k16, v: &v16 });
            assert!(want.iter().all(|x| x.is_finite()), "head size {hd}, {kernels:?}");
            assert_same_bits(&got, &want, &format!("head size {hd}, {kernels:?}"));
        }
        // Every row alone too: a decode step of a single sequence splits its tiles by
        // query head, and each widens the blocks for itself.
        let mut one = vec![f32::NAN; heads * hd];
        attention_bf16_cache(
            &q[70 * heads * hd..71 * heads * hd],
            &[Span { row: 0, ..spans[1] }],
            heads,
            shape,
            &k16,
            &v16,
            &mut one,
            Isa::best(),
        );
        let mut want = vec![f32::NAN; heads * hd];
        attention(
            &q[70 * heads * hd..71 * heads * hd],
            &[Span { row: 0, ..spans[1] }],
            heads,
            shape,
            &k32,
            &v32,
            &mut want,
            Isa::best(),
        );
        assert_same_bits(&one, &want, &format!("head size {hd}, one decode"));
    }
}

#[test]
fn rotary_rotates_pairs_half_apart() {
    let rotary = Rotary::new(&[1.0, 0.5], 4, 1.0);
    let mut x = vec![1.0, 2.0, 3.0, 4.0];
    rotary.apply(&mut x, 2);
    let (c0, s0, c1, s1) = (2.0f32.cos(), 2.0f32.sin(), 1.0f32.cos(), 1.0f32.sin());
    let want = [
        1.0 * c0 - 3.0 * s0,
        2.0 * c1 - 4.0 * s1,
        3.0 * c0 + 1.0 * s0,
        4.0 * c1 + 2.0 * s1,
    ];
    for (a, b) in x.iter().zip(want) {
        assert!((a - b).abs() < 1e-6);
    }
    assert_eq!(rotary.positions(), 4);
}

#[test]
fn rms_norm_and_silu() {
    let mut out = vec![0.0; 2];
    rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
    let inv = 1.0 / 12.5f32.sqrt();
    assert!((out[0] - 3.0 * inv).abs() < 1e-6 && (out[1] - 8.0 * inv).abs() < 1e-6);
    let mut act = vec![0.0; 1];
    silu_mul(&[2.0, 3.0], 1, &mut act);
    assert!((act[0] - 2.0 / (1.0 + (-2.0f32).exp()) * 3.0).abs() < 1e-6);
}

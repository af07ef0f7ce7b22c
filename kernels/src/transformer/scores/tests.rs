//! The score kernels against plain dot products and sums, bit for bit, on every
//! instruction set this CPU has.

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
                            let size: f64 = (0..hd).map(|d| f64::from((q[d] * keys[d * bs + j]).abs())).sum();
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
                pairs16(&pairs, 0.125, &mut got, fma, Isa::best());
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
        if !lanes(
            &refs,
            &positions,
            1,
            &head,
            0.125,
            &mut together,
            kernel,
            Isa::best(),
        ) {
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
                kernel,
                Isa::best()
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

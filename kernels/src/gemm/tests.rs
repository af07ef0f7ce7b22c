//! The products against a plain triple loop, and the instruction sets against each other
//! bit for bit.

use super::drive::{KC, matmul_tiled, pass_depth};
use super::packed::panels;
use super::*;
use crate::KernelError;
use crate::reference;
use crate::{Dtype, Flavor, Matrix, TensorScale};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

/// Deterministic values in about [-1, 1), with some exact zeros and a few large ones.
pub(super) fn values(len: usize, salt: u64) -> Vec<f32> {
    let mut state = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match i % 29 {
                0 => 0.0,
                7 => v * 40.0,
                _ => v,
            }
        })
        .collect()
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

fn naive(x: &[f32], rows: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * n];
    for m in 0..rows {
        for j in 0..n {
            out[m * n + j] = (0..k)
                .map(|i| f64::from(x[m * k + i]) * f64::from(w[j * k + i]))
                .sum::<f64>() as f32;
        }
    }
    out
}

fn product(isa: Isa, x: &[f32], rows: usize, w: &Packed) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * w.n()];
    matmul_with(isa, x, rows, w, &mut out);
    out
}

/// Shapes with every edge: one row, rows not a multiple of any tile height, columns
/// not a multiple of a panel or of a tile, depth past one pass and not a multiple of it.
const SHAPES: [(usize, usize, usize); 11] = [
    (1, 16, 16),
    (1, 37, 64),
    (3, 5, 19),
    (7, 300, 576),
    (13, 40, 1536),
    (29, 64, 272),
    (400, 48, 96),
    // Rows of several tiles split by columns (up to `BY_COLUMNS_MAX` rows), over passes
    // that widen the weights once.
    (100, 80, 320),
    // Tasks of several row tiles, whose passes widen the weights once (`widen`), over
    // a depth whose last pass is odd.
    (300, 40, 301),
    // Deeper than one pass (`KC`): two passes, the second adding to the first's sums
    // and odd; by columns, then split by rows.
    (20, 40, 4097),
    (140, 24, 4130),
];

#[test]
fn float_products_match_the_plain_product_on_every_instruction_set() -> Result {
    for (rows, n, k) in SHAPES {
        let x = values(rows * k, 1);
        let w = values(n * k, 2);
        let wide: Vec<f32> = bf16_bits(&w)
            .iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect();
        let packed32 = Packed::from_f32(&w, n, k)?;
        let packed16 = Packed::from_bf16(&bf16_bits(&w), n, k)?;
        let (want32, want16) = (naive(&x, rows, &w, n, k), naive(&x, rows, &wide, n, k));
        // An f32 chain of `k` multiply-adds is within `k · ε · Σ|x·w|` of the exact sum
        // (computed once per output, for every instruction set).
        let bound: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (m, j) = (i / n, i % n);
                let magnitude: f32 = (0..k).map(|t| (x[m * k + t] * w[j * k + t]).abs()).sum();
                (k as f32 * f32::EPSILON * magnitude).max(1e-4)
            })
            .collect();
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for isa in Isa::available() {
            let (got32, got16) = (
                product(isa, &x, rows, &packed32),
                product(isa, &x, rows, &packed16),
            );
            for (got, want) in [(&got32, &want32), (&got16, &want16)] {
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (g - w).abs() <= bound[i] * (1.0 + w.abs()),
                        "{isa:?} {rows}x{n}x{k} [{i}]: {g} vs {w}"
                    );
                }
            }
            // The same bits on every instruction set.
            match &first {
                None => first = Some((got32, got16)),
                Some((a, b)) => {
                    assert!(
                        bits_eq(a, &got32) && bits_eq(b, &got16),
                        "{isa:?} {rows}x{n}x{k} differs"
                    );
                }
            }
        }
    }
    Ok(())
}

pub(super) fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn nvfp4_products_equal_products_of_the_dequantized_weights_bit_for_bit() -> Result {
    for flavor in [Flavor::CompressedTensors, Flavor::ModelOptGpu] {
        for (rows, n, k) in [
            (1, 37, 64),
            (4, 1040, 256),
            (5, 300, 576),
            (13, 40, 1536),
            (30, 33, 272),
            // Tasks of several row tiles (the weights widened once per pass).
            (200, 40, 544),
            // Two passes (past `KC`), each widened apart.
            (140, 20, 4112),
        ] {
            let mut w = values(n * k, 3);
            // A block of zeros and blocks of tiny values (E4M3 subnormal scale bytes,
            // which the computed factors take through an f32 subnormal).
            w[..16].fill(0.0);
            for (i, v) in w[16..64].iter_mut().enumerate() {
                *v *= [1e-3, 1e-4, 1e-5][i / 16];
            }
            let bytes: Vec<u8> = bf16_bits(&w).iter().flat_map(|b| b.to_le_bytes()).collect();
            let matrix = Matrix::new(Dtype::Bf16, n, k, &bytes)?;
            let scale = TensorScale::from_amax(flavor, Dtype::Bf16, reference::amax(&matrix));
            let q = reference::quantize(&matrix, &scale);
            let dequantized = reference::dequantize(&q.packed, &q.scales, &scale);
            if k >= 64 {
                let subnormal = |b: &u8| b & 0x78 == 0 && b & 7 != 0;
                assert!(
                    q.scales.iter().any(subnormal),
                    "{flavor:?}: no subnormal scale byte"
                );
            }
            // The factors computed from the scale bytes, and looked up in the table.
            let fp4 = Packed::from_nvfp4_scale(&q.packed, &q.scales, &scale, n, k)?;
            assert!(fp4.computes_factors(), "{flavor:?} {rows}x{n}x{k}");
            let table = Packed::from_nvfp4(&q.packed, &q.scales, |s| scale.divisor(s), n, k)?;
            assert!(!table.computes_factors());
            let f32s = Packed::from_f32(&dequantized, n, k)?;
            let x = values(rows * k, 4);
            for isa in Isa::available() {
                let b = product(isa, &x, rows, &f32s);
                for (how, fp4) in [("computed", &fp4), ("table", &table)] {
                    let a = product(isa, &x, rows, fp4);
                    assert!(bits_eq(&a, &b), "{flavor:?} {isa:?} {how} {rows}x{n}x{k}");
                }
            }
            let mut row = vec![0.0f32; k];
            for r in [0, n / 2, n - 1] {
                fp4.row(r, &mut row);
                assert!(bits_eq(&row, &dequantized[r * k..(r + 1) * k]), "row {r}");
            }
            // Kept packed: 4.5 bits a weight and the divisor table.
            assert_eq!(fp4.bytes(), (panels(n) * NR * k * 9 / 16 + 1024) as u64);
        }
    }
    Ok(())
}

#[test]
fn scale_bytes_the_computed_factors_miss_keep_the_table() -> Result {
    let (n, k) = (32, 64);
    let codes: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scale = TensorScale::from_value(Flavor::CompressedTensors, Dtype::Bf16, 2688.0);
    let x = values(3 * k, 5);
    // Positive E4M3 bytes, subnormals among them: computed.
    let plain: Vec<u8> = (0..n * k / 16).map(|i| (i * 13 % 0x7F) as u8).collect();
    // A negative scale (0xB8, -1.0) and the NaN byte: what the shift into an f32 does
    // not give, so the table stays.
    for (bytes, computed) in [
        (plain.clone(), true),
        ([&[0xB8u8][..], &plain[1..]].concat(), false),
    ] {
        let packed = Packed::from_nvfp4_scale(&codes, &bytes, &scale, n, k)?;
        assert_eq!(packed.computes_factors(), computed);
        let table = Packed::from_nvfp4(&codes, &bytes, |s| scale.divisor(s), n, k)?;
        for isa in Isa::available() {
            let (a, b) = (product(isa, &x, 3, &packed), product(isa, &x, 3, &table));
            assert!(bits_eq(&a, &b), "{isa:?} computed {computed}");
        }
    }
    let nan = [&[0x7Fu8][..], &plain[1..]].concat();
    assert!(!Packed::from_nvfp4_scale(&codes, &nan, &scale, n, k)?.computes_factors());
    // Every byte but the NaN ones, in both flavors: the form is the table.
    for flavor in [Flavor::CompressedTensors, Flavor::ModelOptGpu] {
        let scale = TensorScale::from_value(flavor, Dtype::Bf16, 0.37);
        let form = Form {
            divide: scale.divides(),
            value: scale.value(),
        };
        for s in (0..=0x7Eu8).chain(0x80..=0xFE) {
            let want = scale.divisor(s);
            let got = form.apply(s);
            if s & 0x80 == 0 {
                assert_eq!(got.to_bits(), want.to_bits(), "{flavor:?} byte {s:#04x}");
            } else {
                assert_ne!(got.to_bits(), want.to_bits(), "{flavor:?} byte {s:#04x}");
            }
        }
    }
    Ok(())
}

#[test]
fn q8_products_equal_products_of_the_dequantized_weights_bit_for_bit() -> Result {
    use crate::formats::q8;
    // One row (the lm_head of a decode step), a few (speculation), a batch, a prompt
    // chunk past one pass of depth; widths that leave a panel part-filled.
    for (rows, n, k) in [
        (1, 37, 64),
        (4, 1040, 256),
        (5, 300, 576),
        (13, 40, 1536),
        (30, 33, 288),
        (200, 40, 544),
        (140, 20, 4128),
    ] {
        let mut w = values(n * k, 7);
        // A block of zeros, and one of tiny values (an f16 subnormal scale).
        w[..32].fill(0.0);
        w[k..k + 32].iter_mut().for_each(|v| *v *= 1e-4);
        let packed = Packed::q8_0(&w, n, k)?;
        assert_eq!(packed.format(), "q8_0");
        let dequantized: Vec<f32> = w
            .chunks_exact(q8::BLOCK)
            .flat_map(|b| {
                let (scale, codes) = q8::quantize(b.try_into().expect("32 values"));
                codes.map(|c| q8::value(c, scale))
            })
            .collect();
        let f32s = Packed::from_f32(&dequantized, n, k)?;
        let x = values(rows * k, 8);
        let mut first = None;
        for isa in Isa::available() {
            let (a, b) = (product(isa, &x, rows, &packed), product(isa, &x, rows, &f32s));
            assert!(bits_eq(&a, &b), "{isa:?} {rows}x{n}x{k}");
            match &first {
                None => first = Some(a),
                Some(f) => assert!(bits_eq(f, &a), "{isa:?} {rows}x{n}x{k} differs"),
            }
        }
        let mut row = vec![0.0f32; k];
        for r in [0, 1, n / 2, n - 1] {
            packed.row(r, &mut row);
            assert!(bits_eq(&row, &dequantized[r * k..(r + 1) * k]), "row {r}");
        }
        // Close to the weights it came from: within half a step of each block's scale.
        assert!(
            w.iter()
                .zip(&dequantized)
                .all(|(a, b)| (a - b).abs() <= 40.0 / 127.0 * 0.51)
        );
        // 8.5 bits a weight.
        assert_eq!(packed.bytes(), (panels(n) * NR * k * 17 / 16) as u64);
        assert_eq!(packed.bytes(), Packed::q8_0_bytes(n, k));
    }
    assert!(matches!(
        Packed::q8_0(&[0.0; 48], 1, 48),
        Err(KernelError::NotQ8Aligned { cols: 48 })
    ));
    assert!(matches!(
        Packed::q8_0(&[0.0; 60], 2, 32),
        Err(KernelError::WrongLength { .. })
    ));
    Ok(())
}

#[test]
fn a_row_gets_the_same_bits_alone_and_in_any_batch() -> Result {
    // An odd width, and one of whole panels with enough of them for many tasks.
    for (n, k) in [(70, 600), (4096, 576), (40, 4130)] {
        let w = Packed::from_bf16(&bf16_bits(&values(n * k, 5)), n, k)?;
        // 111 rows: blocks of rows whose last one (15 rows) is tiled differently from
        // the others.
        let x = values(111 * k, 6);
        for isa in Isa::available() {
            let batch = product(isa, &x, 111, &w);
            for rows in [1, 3, 5, 6, 7, 16, 20] {
                let part = product(isa, &x[..rows * k], rows, &w);
                assert!(
                    bits_eq(&part, &batch[..rows * n]),
                    "{isa:?} {n}x{k}: the first {rows} rows"
                );
            }
            for r in [0, 11, 12, 40, 96, 105, 110] {
                let alone = product(isa, &x[r * k..(r + 1) * k], 1, &w);
                assert!(bits_eq(&alone, &batch[r * n..(r + 1) * n]), "{isa:?} row {r}");
            }
        }
    }
    Ok(())
}

#[test]
fn rows_read_back_and_bad_shapes_are_refused() -> Result {
    let (n, k) = (20, 8);
    let w = values(n * k, 7);
    let packed = Packed::from_f32(&w, n, k)?;
    let mut row = vec![0.0; k];
    packed.row(17, &mut row);
    assert_eq!(row, w[17 * k..18 * k]);
    assert!(Packed::from_f32(&w[1..], n, k).is_err());
    assert!(matches!(
        Packed::from_nvfp4(&[0; 40], &[0; 5], |_| 1.0, 5, 8 * 2 + 1),
        Err(KernelError::NotBlockAligned { cols: 17 })
    ));
    Ok(())
}

#[test]
fn stacked_matrices_with_their_own_scales_multiply_as_separate_ones() -> Result {
    let k = 64;
    let x = values(9 * k, 8);
    let mut parts = Vec::new();
    let mut want = Vec::new();
    for (i, n) in [32usize, 48, 21].into_iter().enumerate() {
        // A different amax each, so a different global scale and divisor table.
        let w: Vec<f32> = values(n * k, 10 + i as u64)
            .iter()
            .map(|v| v * (i + 1) as f32)
            .collect();
        let bytes: Vec<u8> = bf16_bits(&w).iter().flat_map(|b| b.to_le_bytes()).collect();
        let matrix = Matrix::new(Dtype::Bf16, n, k, &bytes)?;
        let scale = TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, reference::amax(&matrix));
        let q = reference::quantize(&matrix, &scale);
        // The middle member looks its factors up in the table; the others compute them.
        let part = if i == 1 {
            Packed::from_nvfp4(&q.packed, &q.scales, |s| scale.divisor(s), n, k)?
        } else {
            Packed::from_nvfp4_scale(&q.packed, &q.scales, &scale, n, k)?
        };
        want.push(product(Isa::best(), &x, 9, &part));
        parts.push(part);
    }
    let stacked = Packed::stack(parts)?;
    assert_eq!(stacked.n(), 101);
    for isa in Isa::available() {
        let got = product(isa, &x, 9, &stacked);
        for m in 0..9 {
            let row: Vec<f32> = want
                .iter()
                .flat_map(|w| w[m * w.len() / 9..(m + 1) * w.len() / 9].to_vec())
                .collect();
            assert!(bits_eq(&got[m * 101..(m + 1) * 101], &row), "{isa:?} row {m}");
        }
    }
    let odd = Packed::from_f32(&values(5 * k, 1), 5, k)?;
    let more = Packed::from_f32(&values(5 * k, 2), 5, k)?;
    assert_eq!(
        Packed::stack(vec![odd, more]).err(),
        Some(StackError::Unaligned { rows: 5 })
    );
    Ok(())
}

#[test]
fn bf16_products_round_the_inputs_and_match_the_plain_product() -> Result {
    for (rows, n, k) in [
        (1, 32, 64),
        (5, 48, 577),
        (7, 48, 577),
        (12, 2048, 576),
        (16, 64, 576),
        (20, 48, 577),
        (40, 48, 577),
        (30, 64, 576),
        (100, 32, 1536),
        // Past `BY_COLUMNS_MAX`: rows split among tasks; tiles of two panels, and a
        // last panel alone.
        (150, 32, 576),
        (150, 48, 577),
    ] {
        let x = values(rows * k, 21);
        let w = values(n * k, 22);
        let bits = bf16_bits(&w);
        let wide: Vec<f32> = bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
        let rounded: Vec<f32> = x.iter().map(|&v| round_bf16(v)).collect();
        let want = naive(&rounded, rows, &wide, n, k);
        let packed = Packed::from_bf16(&bits, n, k)?;
        // With the dot-product kernel where the CPU has it, and with the f32 kernels
        // (what `calibrate_bf16_dot` chooses between).
        for dot in [true, false] {
            let tuning = Tuning {
                bf16_dot: dot,
                ..Tuning::default()
            };
            let mut got = vec![f32::NAN; rows * n];
            tuning.matmul_bf16(&x, rows, &packed, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{rows}x{n}x{k} dot {dot} [{i}]: {g} vs {w}"
                );
            }
            // Each row alone gets the bits it got among the others: the same kernel
            // whatever the number of rows.
            for m in [0, rows / 2, rows - 1] {
                let mut alone = vec![f32::NAN; n];
                tuning.matmul_bf16(&x[m * k..(m + 1) * k], 1, &packed, &mut alone);
                assert!(
                    bits_eq(&alone, &got[m * n..(m + 1) * n]),
                    "{rows}x{n}x{k} dot {dot}: row {m} alone differs"
                );
            }
        }
    }
    assert_eq!(
        round_bf16(1.0 + 1.0 / 256.0),
        1.0,
        "a tie goes to the even mantissa"
    );
    assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
    assert!(round_bf16(f32::NAN).is_nan());
    Ok(())
}

#[test]
fn one_row_products_get_the_same_bits_whatever_panels_share_a_tile() -> Result {
    // 23 panels: no multiple of two or four, so the last tile is a narrower one.
    let (n, k) = (16 * 23, 576);
    let w = values(n * k, 11);
    let x = values(k, 12);
    if Isa::best() != Isa::Avx512 {
        // Nothing to choose on the narrower kernels: one panel at a time.
        let packed = Packed::from_bf16(&bf16_bits(&w), n, k)?;
        let mut tuning = Tuning::default();
        assert_eq!(tuning.calibrate_decode_panels(&packed, Some(2)), None);
        assert_eq!(tuning, Tuning::default(), "nothing chosen");
        return Ok(());
    }
    for packed in [
        Packed::from_f32(&w, n, k)?,
        Packed::from_bf16(&bf16_bits(&w), n, k)?,
    ] {
        let mut want = vec![0.0f32; n];
        matmul_tiled(Isa::Avx512, (12, 1), &x, 1, &packed, &mut want);
        for np in 2..=4 {
            let mut got = vec![0.0f32; n];
            matmul_tiled(Isa::Avx512, (12, np), &x, 1, &packed, &mut got);
            assert!(bits_eq(&want, &got), "{np} panels side by side");
        }
    }
    // The calibration picks one of the choices it measured, and the products after it
    // give the same bits as before.
    let packed = Packed::from_bf16(&bf16_bits(&w), n, k)?;
    // The user's choice is kept without measuring (`SOUS_DECODE_PANELS`); one out of
    // range is ignored, and measured instead.
    let mut tuning = Tuning::new(Isa::Avx512);
    let chosen = tuning
        .calibrate_decode_panels(&packed, Some(2))
        .ok_or("AVX-512 bf16 weights are calibrated")?;
    assert_eq!((chosen.panels, chosen.seconds.len()), (2, 0));
    assert_eq!(tuning.decode_panels(), 2);
    let calibration = tuning
        .calibrate_decode_panels(&packed, Some(7))
        .ok_or("AVX-512 bf16 weights are calibrated")?;
    let measured: Vec<usize> = calibration.seconds.iter().map(|s| s.0).collect();
    assert_eq!(measured, [1, 2, 4]);
    let fastest = calibration.seconds.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    assert_eq!(
        fastest.map(|s| s.0),
        Some(calibration.panels),
        "the fastest is kept"
    );
    assert_eq!(tuning.decode_panels(), calibration.panels);
    let mut want = vec![0.0f32; n];
    matmul_tiled(Isa::Avx512, (12, 1), &x, 1, &packed, &mut want);
    let mut got = vec![0.0f32; n];
    tuning.matmul(&x, 1, &packed, &mut got);
    assert!(bits_eq(&want, &got), "after calibration");
    Ok(())
}

#[test]
fn batch_products_get_the_same_bits_whatever_the_tile() -> Result {
    let (n, k) = (16 * 23, 576);
    let w = values(n * k, 13);
    let packed = Packed::from_bf16(&bf16_bits(&w), n, k)?;
    if Isa::best() != Isa::Avx512 {
        assert_eq!(
            Tuning::default().calibrate_batch_tile(&packed, Some((8, 2))),
            None
        );
        return Ok(());
    }
    for rows in [5, 8, 11, 16] {
        let x = values(rows * k, 14 + rows as u64);
        let mut want = vec![0.0f32; rows * n];
        matmul_tiled(Isa::Avx512, (16, 1), &x, rows, &packed, &mut want);
        let mut got = vec![0.0f32; rows * n];
        matmul_tiled(Isa::Avx512, (8, 2), &x, rows, &packed, &mut got);
        assert!(bits_eq(&want, &got), "{rows} rows in tiles of 8 x 2");
    }
    // The user's choice is kept without measuring (`SOUS_BATCH_TILE`); a tile that is
    // not one of the two is ignored, and measured instead.
    let mut tuning = Tuning::new(Isa::Avx512);
    let chosen = tuning
        .calibrate_batch_tile(&packed, Some((8, 2)))
        .ok_or("AVX-512 is calibrated")?;
    assert_eq!((chosen.tile, chosen.seconds.len()), ((8, 2), 0));
    assert_eq!(tuning.batch_tile(), (8, 2));
    let calibration = tuning
        .calibrate_batch_tile(&packed, Some((4, 4)))
        .ok_or("AVX-512 is calibrated")?;
    let fastest = calibration.seconds.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    assert_eq!(
        fastest.map(|s| s.0),
        Some(calibration.tile),
        "the fastest is kept"
    );
    assert_eq!(tuning.batch_tile(), calibration.tile);
    let x = values(16 * k, 30);
    let mut want = vec![0.0f32; 16 * n];
    matmul_tiled(Isa::Avx512, (16, 1), &x, 16, &packed, &mut want);
    let mut got = vec![0.0f32; 16 * n];
    tuning.matmul(&x, 16, &packed, &mut got);
    assert!(bits_eq(&want, &got), "after calibration");
    Ok(())
}

#[test]
fn passes_cover_the_depth_in_whole_blocks_of_every_format() {
    for k in [
        1,
        2,
        15,
        576,
        1536,
        KC,
        KC + 1,
        4097,
        4130,
        8192,
        14336,
        3 * KC + 5,
    ] {
        let depth = pass_depth(k);
        if k <= KC {
            assert_eq!(depth, k, "k {k} is one pass");
        } else {
            assert!(
                depth.is_multiple_of(32) && depth < KC + 32,
                "k {k}: a pass of {depth}"
            );
            assert!(
                k.div_ceil(depth) <= k.div_ceil(KC),
                "k {k}: more passes than needed"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
#[allow(clippy::print_stderr)]
fn bf16_pairs_are_packed_with_the_scalar_rounding_bits() {
    if !super::x86::avx512() {
        eprintln!("no AVX-512F here: the vector packing is not run");
        return;
    }
    // Ties to even both ways, values that round up into the next exponent, the
    // largest finite value (rounds to infinity), subnormals, zeros of both signs,
    // infinities and NaNs (quiet, signalling, negative), among ordinary values.
    let special = [
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -(1.0 + 1.0 / 256.0),
        f32::from_bits(0x3FFF_FFFF),
        f32::MAX,
        f32::MIN_POSITIVE / 3.0,
        -f32::MIN_POSITIVE / 7.0,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC1_2345),
        // NaNs that rounding would carry into another value (kept as they are).
        f32::from_bits(0x7FC1_FFFF),
        f32::from_bits(0xFFFF_FFFF),
    ];
    for k in [1, 15, 16, 17, 33, 576, 577] {
        for (rows, mr) in [(1, 1), (5, 8), (19, 8), (16, 16)] {
            let mut x = values(rows * k, 31);
            for (i, v) in x.iter_mut().enumerate() {
                if i % 5 == 2 {
                    *v = special[(i / 5) % special.len()];
                }
            }
            let got = super::x86::pack_bf16_pairs(&x, rows, k, mr);
            let pairs = k.div_ceil(2);
            let bits = |v: f32| round_bf16(v).to_bits() >> 16;
            for r in 0..rows {
                let (b, m) = (r / mr, r % mr);
                let width = mr.min(rows - b * mr);
                for t in 0..pairs {
                    let lo = bits(x[r * k + 2 * t]);
                    let hi = if 2 * t + 1 < k {
                        bits(x[r * k + 2 * t + 1])
                    } else {
                        0
                    };
                    assert_eq!(
                        got[b * mr * pairs + t * width + m],
                        lo | (hi << 16),
                        "k {k}, rows {rows} in blocks of {mr}: row {r}, pair {t}"
                    );
                }
            }
        }
    }
}

/// Every tile shape the NEON kernel takes, in every weight format, from one pass and from
/// two (the second adding to the first's sums), gives the portable kernel's bits.
#[cfg(target_arch = "aarch64")]
#[test]
fn every_neon_tile_gives_the_portable_bits_in_every_format() -> Result {
    // Nine panels: no multiple of two, three or four, so a narrower tile ends each run.
    let n = 16 * 9;
    for k in [96, KC + 96] {
        let w = values(n * k, 21);
        let bytes: Vec<u8> = bf16_bits(&w).iter().flat_map(|b| b.to_le_bytes()).collect();
        let matrix = Matrix::new(Dtype::Bf16, n, k, &bytes)?;
        let scale = TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, reference::amax(&matrix));
        let q = reference::quantize(&matrix, &scale);
        let computed = Packed::from_nvfp4_scale(&q.packed, &q.scales, &scale, n, k)?;
        assert!(computed.computes_factors());
        let formats = [
            ("f32", Packed::from_f32(&w, n, k)?),
            // An odd depth: the last pair of bf16 values holds one.
            (
                "bf16",
                Packed::from_bf16(&bf16_bits(&w[..n * (k - 1)]), n, k - 1)?,
            ),
            ("nvfp4 computed", computed),
            (
                "nvfp4 table",
                Packed::from_nvfp4(&q.packed, &q.scales, |s| scale.divisor(s), n, k)?,
            ),
            ("q8_0", Packed::q8_0(&w, n, k)?),
        ];
        for (name, packed) in &formats {
            let shapes = (1..=6)
                .map(|mr| (mr, 1))
                .chain([(1, 2), (2, 2), (3, 2), (1, 3), (2, 3), (1, 4)]);
            for (mr, np) in shapes {
                for rows in [mr, 2 * mr + 1] {
                    let x = values(rows * packed.k, 22 + rows as u64);
                    let mut want = vec![0.0f32; rows * n];
                    matmul_tiled(Isa::Portable, (4, 1), &x, rows, packed, &mut want);
                    let mut got = vec![f32::NAN; rows * n];
                    matmul_tiled(Isa::Neon, (mr, np), &x, rows, packed, &mut got);
                    assert!(
                        bits_eq(&want, &got),
                        "{name} k {k}: {rows} rows in tiles of {mr} x {np}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn choices_are_read_as_their_switches_spell_them() {
    assert_eq!(Choices::parse(None, None, None, None), Choices::default());
    assert_eq!(
        Choices::parse(Some("portable"), Some(" on "), Some("4"), Some("8x2")),
        Choices {
            isa: Some(Isa::Portable),
            bf16_dot: Some(true),
            decode_panels: Some(4),
            batch_tile: Some((8, 2)),
        }
    );
    assert_eq!(
        Choices::parse(None, Some("off"), Some("1"), Some("16x1")),
        Choices {
            isa: None,
            bf16_dot: Some(false),
            decode_panels: Some(1),
            batch_tile: Some((16, 1)),
        }
    );
    // What names no valid choice is as if unset; an instruction set this CPU lacks (or
    // none) is the widest it has.
    assert_eq!(
        Choices::parse(None, Some("maybe"), Some("5"), Some("4x4")),
        Choices::default()
    );
    assert_eq!(
        Choices::parse(Some("sse9"), None, None, None).isa,
        Some(Isa::best())
    );
}

#[test]
fn every_path_of_this_cpu_is_listed_once_and_chosen_as_listed() {
    let paths = KernelPath::available();
    let isas: Vec<Isa> = paths.iter().map(|p| p.isa).collect();
    let mut distinct = isas.clone();
    distinct.dedup();
    assert_eq!(distinct, Isa::available(), "{paths:?}");
    assert_eq!(
        paths.iter().filter(|p| p.bf16_dot).count(),
        usize::from(bf16_dot_available())
    );
    for path in paths {
        let choices = path.choices();
        assert_eq!(choices.tuning().isa(), path.isa, "{path}");
        assert_eq!(choices.bf16_dot, Some(path.bf16_dot), "{path}");
        assert_eq!(choices.tuning().bf16_dot(), path.bf16_dot, "{path}");
        // What is measured at load stays open.
        assert_eq!((choices.decode_panels, choices.batch_tile), (None, None));
        assert_eq!(
            Choices::parse(Some(path.isa.name()), None, None, None).isa,
            Some(path.isa)
        );
    }
}

#[test]
fn the_users_bf16_dot_choice_is_kept_without_measuring() -> Result {
    let (n, k) = (32, 64);
    let packed = Packed::from_bf16(&bf16_bits(&values(n * k, 3)), n, k)?;
    let mut tuning = Tuning::default();
    match tuning.calibrate_bf16_dot(&packed, Some(false)) {
        Some(calibration) => {
            assert_eq!(
                calibration,
                Bf16DotCalibration {
                    dot: false,
                    seconds: None
                }
            );
            assert!(!tuning.bf16_dot());
        }
        // No AVX512-BF16 here: nothing to choose, nothing changed.
        None => assert_eq!(tuning, Tuning::default()),
    }
    Ok(())
}

/// A fingerprint of `v`'s bits (64-bit FNV-1a over each value's bits): short enough to
/// keep in a test, and any changed bit changes it. Hand-written: six lines, for a test.
pub(super) fn fingerprint(v: &[f32]) -> u64 {
    v.iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The bits of f32 products, and of bf16 products on each side of the dot product, over
/// fixed inputs: the same on every path of every CPU (x86-64 and aarch64), which the
/// constants below hold, recorded on a Zen 4 (`scripts/bench/kernel_paths.sh` records a
/// machine; benchmarks/native.md, "Numbers across kernel paths", lists those checked). Within
/// one run the paths are compared with each other by the tests above; this one compares
/// them with the paths of other machines, so that a CPU computing other bits (another
/// vendor's AVX512-BF16, another libm) shows wherever the suite runs.
///
/// A deliberate change of the arithmetic (another summation order) changes them: the
/// failure prints the new values to record.
#[test]
fn every_path_gives_the_bits_recorded_on_other_machines() -> Result {
    const F32: u64 = 0xee4a_8ab1_2100_231b;
    const BF16_PLAIN: u64 = 0xffdd_92c7_9220_cc8a;
    const BF16_DOT: u64 = 0x94a0_e556_c354_d571;
    // One row (a decode step), a few (a batch), and many (a prompt chunk, split among
    // tasks); a depth past one pass.
    let shapes = [
        (1, 48, 576),
        (5, 48, 577),
        (16, 64, 576),
        (150, 32, 576),
        (20, 32, 4097),
    ];
    for path in KernelPath::available() {
        let tuning = path.choices().tuning();
        let (mut f32s, mut bf16s) = (Vec::new(), Vec::new());
        for (rows, n, k) in shapes {
            let x = values(rows * k, 41);
            let w = Packed::from_bf16(&bf16_bits(&values(n * k, 42)), n, k)?;
            let mut out = vec![f32::NAN; rows * n];
            tuning.matmul(&x, rows, &w, &mut out);
            f32s.extend_from_slice(&out);
            tuning.matmul_bf16(&x, rows, &w, &mut out);
            bf16s.extend_from_slice(&out);
        }
        let (f32s, bf16s) = (fingerprint(&f32s), fingerprint(&bf16s));
        let want = if path.bf16_dot { BF16_DOT } else { BF16_PLAIN };
        assert_eq!(
            (f32s, bf16s),
            (F32, want),
            "{path}: products of other bits than recorded (f32 {f32s:#018x}, bf16 {bf16s:#018x})"
        );
    }
    Ok(())
}

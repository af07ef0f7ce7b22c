//! NVFP4 weights in bf16 arithmetic ([`Tuning::matmul_bf16`]): against the exact sums
//! of the rounded inputs and the FP4 values times their blocks' factors, and a row's
//! bits the same alone and in any batch, with the dot-product kernel where the CPU has
//! AVX512-BF16 and with the f32 kernels (what `calibrate_bf16_dot` chooses between).

use super::tests::{bits_eq, fingerprint, values};
use super::*;
use crate::formats::fp4;
use crate::reference;
use crate::{Dtype, Flavor, Matrix, TensorScale};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

/// An NVFP4 matrix of `n × k` values and what its weights are: every code's FP4 value
/// and every block's factor.
struct Quantized {
    packed: Packed,
    values: Vec<f64>,
    factors: Vec<f64>,
}

fn quantize(
    flavor: Flavor,
    n: usize,
    k: usize,
    salt: u64,
    table: bool,
) -> std::result::Result<Quantized, Box<dyn std::error::Error>> {
    let w = values(n * k, salt);
    let bytes: Vec<u8> = w
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let matrix = Matrix::new(Dtype::Bf16, n, k, &bytes)?;
    let scale = TensorScale::from_amax(flavor, Dtype::Bf16, reference::amax(&matrix));
    let q = reference::quantize(&matrix, &scale);
    let packed = if table {
        Packed::from_nvfp4(&q.packed, &q.scales, |s| scale.divisor(s), n, k)?
    } else {
        Packed::from_nvfp4_scale(&q.packed, &q.scales, &scale, n, k)?
    };
    assert_eq!(packed.computes_factors(), !table);
    let values = (0..n * k)
        .map(|i| f64::from(fp4::decode((q.packed[i / 2] >> (4 * (i % 2))) & 0xF)))
        .collect();
    let factors = q.scales.iter().map(|&s| f64::from(scale.divisor(s))).collect();
    Ok(Quantized {
        packed,
        values,
        factors,
    })
}

/// The exact products, and the sum of the terms' magnitudes (what rounding is relative to).
fn exact(x: &[f32], rows: usize, q: &Quantized, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; rows * n];
    let mut size = vec![0.0; rows * n];
    for m in 0..rows {
        for j in 0..n {
            for kk in 0..k {
                let term = f64::from(round_bf16(x[m * k + kk]))
                    * q.values[j * k + kk]
                    * q.factors[j * k / 16 + kk / 16];
                out[m * n + j] += term;
                size[m * n + j] += term.abs();
            }
        }
    }
    (out, size)
}

#[test]
fn nvfp4_products_in_bf16_arithmetic_are_the_exact_sums_and_batch_invariant() -> Result {
    for flavor in [Flavor::CompressedTensors, Flavor::ModelOptGpu] {
        for (rows, n, k, table) in [
            (1, 64, 64, false),
            (1, 96, 2048, false),
            (2, 80, 576, false),
            (2, 64, 64, true),
            (3, 48, 576, false),
            (12, 32, 1536, false),
            (13, 64, 576, true),
            (40, 48, 576, false),
            // Past `BY_COLUMNS_MAX`: rows in tasks of whole tiles.
            (150, 32, 576, false),
            // Not whole panels: the f32 kernels on the rounded inputs.
            (3, 37, 64, false),
        ] {
            let q = quantize(flavor, n, k, 3 + n as u64, table)?;
            let x = values(rows * k, 4 + rows as u64);
            let (want, size) = exact(&x, rows, &q, n, k);
            let mut outs = Vec::new();
            for dot in [true, false] {
                let tuning = Tuning {
                    bf16_dot: dot,
                    ..Tuning::default()
                };
                let mut got = vec![f32::NAN; rows * n];
                tuning.matmul_bf16(&x, rows, &q.packed, &mut got);
                for (i, g) in got.iter().enumerate() {
                    let err = (f64::from(*g) - want[i]).abs();
                    assert!(
                        err <= 1e-6 * size[i] + 1e-30,
                        "{flavor:?} {rows}x{n}x{k} table {table} dot {dot} [{i}]: {g} vs {}",
                        want[i]
                    );
                }
                for m in [0, rows / 2, rows - 1] {
                    let mut alone = vec![f32::NAN; n];
                    tuning.matmul_bf16(&x[m * k..(m + 1) * k], 1, &q.packed, &mut alone);
                    assert!(
                        bits_eq(&alone, &got[m * n..(m + 1) * n]),
                        "{flavor:?} {rows}x{n}x{k} dot {dot}: row {m} alone differs"
                    );
                }
                outs.push(got);
            }
            // Where the CPU has the dot product, it is what ran: its block sums round
            // otherwise than the dequantized weights' products.
            if bf16_dot_available() && n % NR == 0 {
                assert!(
                    !bits_eq(&outs[0], &outs[1]),
                    "{flavor:?} {rows}x{n}x{k}: no dot product ran"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn stacked_nvfp4_members_keep_their_own_factors_in_bf16_arithmetic() -> Result {
    let k = 128;
    let mut parts = Vec::new();
    let mut members = Vec::new();
    // Two panels each: a decode tile of four panels would span both members.
    for (i, table) in [(0u64, false), (1, true), (2, false)] {
        let q = quantize(Flavor::CompressedTensors, 32, k, 50 + i, table)?;
        // Another global scale each.
        parts.push(q.packed.clone());
        members.push(q);
    }
    let stacked = Packed::stack(parts)?;
    for rows in [1, 2, 5, 150] {
        let x = values(rows * k, 60 + rows as u64);
        let tuning = Tuning::default();
        let mut got = vec![f32::NAN; rows * 96];
        tuning.matmul_bf16(&x, rows, &stacked, &mut got);
        for (i, q) in members.iter().enumerate() {
            let mut alone = vec![f32::NAN; rows * 32];
            tuning.matmul_bf16(&x, rows, &q.packed, &mut alone);
            for m in 0..rows {
                assert!(
                    bits_eq(
                        &got[m * 96 + 32 * i..m * 96 + 32 * (i + 1)],
                        &alone[m * 32..(m + 1) * 32]
                    ),
                    "{rows} rows: member {i}, row {m}"
                );
            }
        }
    }
    Ok(())
}

/// The bits of NVFP4 products in bf16 arithmetic on each side of the dot product, over
/// fixed inputs: the same on every path of every CPU, as
/// `every_path_gives_the_bits_recorded_on_other_machines` holds for bf16 weights
/// (recorded on a Zen 4; benchmarks/native.md, "Decode at the memory wall", lists the CPUs
/// checked).
#[test]
fn nvfp4_bf16_products_give_the_bits_recorded_on_other_machines() -> Result {
    const PLAIN: u64 = 0xd4e6_17d9_8874_4403;
    const DOT: u64 = 0x5433_c0d0_434e_88ce;
    // One row, two (four panels a tile), a batch and many rows (tiles of three panels,
    // and of one where fewer are left).
    let shapes = [(1, 64, 576), (2, 96, 256), (7, 48, 576), (150, 32, 256)];
    for path in KernelPath::available() {
        let tuning = path.choices().tuning();
        let mut all = Vec::new();
        for (i, (rows, n, k)) in shapes.into_iter().enumerate() {
            let q = quantize(Flavor::CompressedTensors, n, k, 70 + i as u64, false)?;
            let x = values(rows * k, 80 + i as u64);
            let mut out = vec![f32::NAN; rows * n];
            tuning.matmul_bf16(&x, rows, &q.packed, &mut out);
            all.extend_from_slice(&out);
        }
        let got = fingerprint(&all);
        let want = if path.bf16_dot { DOT } else { PLAIN };
        assert_eq!(
            got, want,
            "{path}: NVFP4 bf16 products of other bits than recorded ({got:#018x})"
        );
    }
    Ok(())
}

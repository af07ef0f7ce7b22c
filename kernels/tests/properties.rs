//! Property tests: on random matrices of every source type, with outliers, zeros,
//! `-0.0`, subnormals, exact grid ties, infinities and NaNs, every fast kernel gives the
//! reference's bytes, and dequantization and the error statistics agree.

use proptest::prelude::*;
use sous_kernels::fast::{self, Kernel};
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale, reference};

/// One element as f32, before conversion to the source type.
fn element() -> impl Strategy<Value = f32> {
    prop_oneof![
        // Ordinary weights of one scale.
        6 => (-1.0f32..1.0).prop_map(|x| x * 0.05),
        // Exact multiples of a quarter times a power of two: grid points and ties
        // once the block scale is a power of two.
        3 => (-28i32..=28, -8i32..8).prop_map(|(n, e)| n as f32 / 4.0 * 2f32.powi(e)),
        // Outliers.
        1 => (-1.0f32..1.0).prop_map(|x| x * 300.0),
        // Zeros of both signs, tiny values that round to zero (negative ones get code 8).
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => (-1.0f32..1.0).prop_map(|x| x * 1e-39),
        // Any bit pattern at all: subnormals, huge values, infinities, NaNs.
        1 => any::<u32>().prop_map(f32::from_bits),
    ]
}

fn special() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(f32::NAN),
        Just(-f32::NAN),
        Just(f32::MAX),
        Just(f32::MIN_POSITIVE),
    ]
}

/// `value` in the source type's little-endian bytes (rounded to it first).
fn encode(dtype: Dtype, value: f32, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F32 => out.extend_from_slice(&value.to_le_bytes()),
        // Truncation is fine here: any bf16 bit pattern is a valid input.
        Dtype::Bf16 => out.extend_from_slice(&((value.to_bits() >> 16) as u16).to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&f32_to_f16_bits(value).to_le_bytes()),
    }
}

/// A valid f16 pattern near `value` (truncating; overflow to infinity, NaN kept).
fn f32_to_f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if value.is_nan() {
        return sign | 0x7E00;
    }
    let a = value.abs();
    if a >= 65520.0 {
        return sign | 0x7C00;
    }
    if a < 2f32.powi(-14) {
        // Subnormal: multiples of 2^-24.
        return sign | (a * 2f32.powi(24)) as u16;
    }
    let e = ((bits >> 23) & 0xFF) as i32 - 127 + 15;
    sign | ((e as u16) << 10) | ((bits >> 13) & 0x3FF) as u16
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::Bf16), Just(Dtype::F16), Just(Dtype::F32)]
}

fn flavor() -> impl Strategy<Value = Flavor> {
    prop_oneof![
        Just(Flavor::CompressedTensors),
        Just(Flavor::ModelOptGpu),
        Just(Flavor::ModelOptCpu)
    ]
}

/// (dtype, rows, cols, bytes): up to 6 x 128, with a few specials sprinkled in when
/// `with_specials`.
fn matrix(with_specials: bool) -> impl Strategy<Value = (Dtype, usize, usize, Vec<u8>)> {
    (dtype(), 1usize..6, 1usize..8).prop_flat_map(move |(dtype, rows, blocks)| {
        let cols = blocks * 16;
        let n = rows * cols;
        let specials = if with_specials { 0..4usize } else { 0..1usize };
        (
            Just(dtype),
            Just(rows),
            Just(cols),
            prop::collection::vec(element(), n),
            prop::collection::vec((0..n, special()), specials),
        )
            .prop_map(move |(dtype, rows, cols, mut values, specials)| {
                if with_specials {
                    for (i, v) in specials {
                        values[i] = v;
                    }
                }
                let mut bytes = Vec::with_capacity(n * dtype.size());
                for v in values {
                    encode(dtype, v, &mut bytes);
                }
                (dtype, rows, cols, bytes)
            })
    })
}

fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

proptest! {
    // Failures print the minimal input; nothing is persisted into the source tree.
    #![proptest_config(ProptestConfig { cases: 768, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fast_equals_reference((dtype, rows, cols, bytes) in matrix(true), flavor in flavor()) {
        let m = Matrix::new(dtype, rows, cols, &bytes).expect("valid");
        let amax = reference::amax(&m);
        let scale = TensorScale::from_amax(flavor, dtype, amax);
        let want = reference::quantize(&m, &scale);
        for kernel in Kernel::available() {
            prop_assert!(same_f32(fast::amax_with(kernel, &m), amax), "{} amax", kernel.name());
            let got = fast::quantize_with(kernel, &m, &scale);
            prop_assert_eq!(&got, &want, "{} kernel", kernel.name());
            let (with_stats, _) = fast::quantize_with_stats_on(kernel, &m, &scale);
            prop_assert_eq!(&with_stats, &want, "{} kernel with statistics", kernel.name());
        }
        let slow = reference::dequantize(&want.packed, &want.scales, &scale);
        let quick = fast::dequantize(&want.packed, &want.scales, &scale);
        prop_assert_eq!(slow.len(), quick.len());
        for (a, b) in slow.iter().zip(&quick) {
            prop_assert!(same_f32(*a, *b));
        }
    }

    #[test]
    fn finite_weights_never_give_nan_scales((dtype, rows, cols, bytes) in matrix(false), flavor in flavor()) {
        let m = Matrix::new(dtype, rows, cols, &bytes).expect("valid");
        // Finite, and far enough below f32::MAX that 6 x the block scale cannot round
        // past it when dequantizing (the tools overflow there too).
        let finite = (0..rows * cols).all(|i| m.get(i).abs() < 1e37);
        prop_assume!(finite);
        let amax = fast::amax(&m);
        let scale = TensorScale::from_amax(flavor, dtype, amax);
        let q = fast::quantize(&m, &scale);
        prop_assert!(q.scales.iter().all(|&c| c & 0x7F != 0x7F), "NaN scale byte in {:?}", q.scales);
        // The statistics measured while quantizing agree with the reference's exact
        // (f64) comparison of its dequantization, up to f32 rounding of the sums.
        let slow = reference::error_stats(&m, &q.packed, &q.scales, &scale);
        prop_assert!(slow.max_abs_error.is_finite());
        for kernel in Kernel::available() {
            let (_, stats) = fast::quantize_with_stats_on(kernel, &m, &scale);
            let close = |a: f64, b: f64, rel: f64| (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-300;
            prop_assert_eq!(stats.count, slow.count);
            prop_assert!(close(stats.max_abs_error, slow.max_abs_error, 1e-6),
                "{}: max error {} vs {}", kernel.name(), stats.max_abs_error, slow.max_abs_error);
            prop_assert!(close(stats.sum_sq_error, slow.sum_sq_error, 1e-4),
                "{}: squared error {} vs {}", kernel.name(), stats.sum_sq_error, slow.sum_sq_error);
            prop_assert!(close(stats.sum_sq_weight, slow.sum_sq_weight, 1e-4));
        }
    }
}

/// A matrix larger than one parallel chunk, so rayon splits it: the bytes must not
/// depend on the split.
#[test]
fn many_chunks_equal_reference() {
    let rows = 96;
    let cols = 1024;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut bytes = Vec::with_capacity(rows * cols * 2);
    for i in 0..rows * cols {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
        if i % 997 == 0 {
            v *= 400.0;
        }
        if i % 4096 < 16 {
            v = 0.0;
        }
        bytes.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    let m = Matrix::new(Dtype::Bf16, rows, cols, &bytes).expect("valid");
    assert!(rows * cols / 16 > fast::CHUNK_BLOCKS * 2);
    for flavor in [Flavor::CompressedTensors, Flavor::ModelOptGpu] {
        let scale = TensorScale::from_amax(flavor, Dtype::Bf16, reference::amax(&m));
        let want = reference::quantize(&m, &scale);
        assert!(want.blocks.zero > 0);
        for kernel in Kernel::available() {
            assert_eq!(fast::quantize_with(kernel, &m, &scale), want, "{}", kernel.name());
        }
    }
}

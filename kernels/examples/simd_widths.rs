//! Times the x86 micro-kernels of `sous_kernels::gemm` at each vector width this CPU
//! has (AVX-512 and AVX2), on one thread, for every weight format: one row and six rows
//! (the tile kernels reading the stored weights in registers) and 64 rows (the
//! quantized and AVX2 bf16 weights widened to f32 once per pass, then the f32 tiles).
//! The matrix (384 × 512) stays in L2, so that the figures follow the kernels' code
//! rather than the memory: `cargo run -p sous-kernels --example simd_widths [reps]`.
//!
//! Prints the best time of `reps` (default 7) repetitions of about 50 ms each, per
//! product, and its GFLOP/s (2·rows·n·k per product).
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_kernels::gemm::{Isa, Packed, matmul_with};

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    // One thread: the kernels alone, not how the tasks share the cores.
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .expect("the first pool of the process");
    let (n, k) = (384usize, 512usize);
    let values = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 1e-3)
            .collect()
    };
    let w = values(n * k);
    let bf16: Vec<u16> = w.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let codes: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u8> = (0..n * k / 16).map(|i| 0x30 + (i % 16) as u8).collect();
    let scale = sous_kernels::TensorScale::from_value(
        sous_kernels::Flavor::CompressedTensors,
        sous_kernels::Dtype::Bf16,
        1e3,
    );
    let formats = [
        ("f32", Packed::from_f32(&w, n, k)),
        ("bf16", Packed::from_bf16(&bf16, n, k)),
        // The block factors computed from the scale bytes, then looked up in the table.
        ("nvfp4", Packed::from_nvfp4_scale(&codes, &scales, &scale, n, k)),
        (
            "nvfp4-table",
            Packed::from_nvfp4(&codes, &scales, |s| scale.divisor(s), n, k),
        ),
        ("q8_0", Packed::q8_0(&w, n, k)),
    ];
    let isas: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|isa| matches!(isa.name(), "avx512" | "avx2"))
        .collect();
    println!("{n} × {k}, one thread, best of {reps}; instruction sets: {isas:?}");
    for (name, packed) in &formats {
        let packed = packed.as_ref().expect("shapes are block-aligned");
        for &isa in &isas {
            for rows in [1usize, 6, 64] {
                let x = values(rows * k);
                let mut out = vec![0.0; rows * n];
                let flops = 2.0 * (rows * n * k) as f64;
                // Calls enough for a repetition of a billion floating-point operations.
                let calls = (1e9 / flops).clamp(4.0, 20_000.0) as usize;
                matmul_with(isa, &x, rows, packed, &mut out);
                let best = (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        for _ in 0..calls {
                            matmul_with(isa, &x, rows, packed, &mut out);
                        }
                        t.elapsed().as_secs_f64() / calls as f64
                    })
                    .fold(f64::INFINITY, f64::min);
                println!(
                    "{name:>11} {:>6} rows {rows:>2}: {:>8.2} µs {:>6.1} GFLOP/s",
                    isa.name(),
                    best * 1e6,
                    flops / best / 1e9
                );
            }
        }
    }
}

//! Times `sous_kernels::gemm` on the products of SmolLM2-135M (the four matrices of a
//! layer and the 49152-row lm_head), for one row (a decode step) up to a 512-row prompt
//! chunk, in every weight format and on every instruction set this CPU has:
//! `cargo run -p sous-kernels --example gemm [rows,...]` (`SOUS_KERNELS_ISA=NAME`: that
//! instruction set alone).
//!
//! Prints GFLOP/s (2·rows·n·k per product) and, for one row, GB/s of weights read.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_kernels::gemm::{Isa, Packed, matmul_with};

fn main() {
    let rows: Vec<usize> = std::env::args()
        .nth(1)
        .map(|a| a.split(',').filter_map(|r| r.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 64, 512]);
    // One layer: qkv, o, gate_up, down.
    let shapes = [(960usize, 576usize), (576, 576), (3072, 576), (576, 1536)];
    let lm_head = (49152usize, 576usize);
    let values = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 1e-3)
            .collect()
    };
    let bf16 = |v: &[f32]| -> Vec<u16> { v.iter().map(|x| (x.to_bits() >> 16) as u16).collect() };
    let pack = |format: &str, n: usize, k: usize| -> Packed {
        let w = values(n * k);
        match format {
            "f32" => Packed::from_f32(&w, n, k),
            "bf16" => Packed::from_bf16(&bf16(&w), n, k),
            _ => {
                let codes: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 251) as u8).collect();
                let scales: Vec<u8> = (0..n * k / 16).map(|i| 0x30 + (i % 16) as u8).collect();
                // As the engine packs a compressed-tensors checkpoint: the block factors
                // computed from the scale bytes (`SOUS_GEMM_TABLE=1`: looked up in the
                // table instead, as for a tensor whose scales the computation misses).
                let scale = sous_kernels::TensorScale::from_value(
                    sous_kernels::Flavor::CompressedTensors,
                    sous_kernels::Dtype::Bf16,
                    1e3,
                );
                if std::env::var_os("SOUS_GEMM_TABLE").is_some() {
                    Packed::from_nvfp4(&codes, &scales, |s| scale.divisor(s), n, k)
                } else {
                    Packed::from_nvfp4_scale(&codes, &scales, &scale, n, k)
                }
            }
        }
        .expect("shapes are block-aligned")
    };
    println!(
        "{} threads; instruction sets: {:?}",
        rayon::current_num_threads(),
        Isa::available()
    );
    // bf16 arithmetic (inputs rounded to bf16; AVX512-BF16 dot products where the CPU
    // has them), on the bf16 weights.
    {
        let layer: Vec<Packed> = shapes.iter().map(|&(n, k)| pack("bf16", n, k)).collect();
        for &r in &rows {
            let (s, flops) = time_layer(&shapes, &layer, r, values, sous_kernels::gemm::matmul_bf16);
            println!(
                "bf16·bf16 (matmul_bf16) rows {r:>4}: layer {:>7.3} ms {:>6.1} GFLOP/s",
                s * 1e3,
                flops / s / 1e9
            );
        }
    }
    for format in ["f32", "bf16", "nvfp4"] {
        let layer: Vec<Packed> = shapes.iter().map(|&(n, k)| pack(format, n, k)).collect();
        let head = pack(format, lm_head.0, lm_head.1);
        for isa in Isa::available() {
            // `SOUS_KERNELS_ISA=avx2` (or another) times that set alone.
            if std::env::var("SOUS_KERNELS_ISA").is_ok_and(|only| only != isa.name()) {
                continue;
            }
            for &r in &rows {
                let (s, flops) = time_layer(&shapes, &layer, r, values, |x, rows, w, out| {
                    matmul_with(isa, x, rows, w, out)
                });
                let bytes: u64 = layer.iter().map(Packed::bytes).sum();
                let head_x = values(r.min(16) * lm_head.1);
                let mut head_out = vec![0.0; r.min(16) * lm_head.0];
                let t = Instant::now();
                for _ in 0..5 {
                    matmul_with(isa, &head_x, r.min(16), &head, &mut head_out);
                }
                let sh = t.elapsed().as_secs_f64() / 5.0;
                println!(
                    "{format:>5} {:>8} rows {r:>4}: layer {:>7.3} ms {:>6.1} GFLOP/s {:>6.1} GB/s | lm_head ({} rows) {:>6.2} ms {:>6.1} GB/s",
                    isa.name(),
                    s * 1e3,
                    flops / s / 1e9,
                    bytes as f64 / s / 1e9,
                    r.min(16),
                    sh * 1e3,
                    head.bytes() as f64 / sh / 1e9,
                );
            }
        }
    }
}

/// Seconds per pass of `product` over one layer (`shapes`, `layer`) with `rows` input
/// rows, averaged over enough passes for about 2 GFLOP; and the FLOP of one pass.
fn time_layer(
    shapes: &[(usize, usize)],
    layer: &[Packed],
    rows: usize,
    values: impl Fn(usize) -> Vec<f32>,
    product: impl Fn(&[f32], usize, &Packed, &mut [f32]),
) -> (f64, f64) {
    let xs: Vec<Vec<f32>> = shapes.iter().map(|&(_, k)| values(rows * k)).collect();
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0.0; rows * n]).collect();
    let mut run = || {
        for ((w, x), out) in layer.iter().zip(&xs).zip(outs.iter_mut()) {
            product(x, rows, w, out);
        }
    };
    let flops: f64 = shapes.iter().map(|&(n, k)| 2.0 * (rows * n * k) as f64).sum();
    let reps = (2e9 / flops).clamp(3.0, 200.0) as usize;
    run();
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    (t.elapsed().as_secs_f64() / reps as f64, flops)
}

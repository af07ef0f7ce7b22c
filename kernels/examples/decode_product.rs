//! Times the decode-time product (one row against every weight matrix of SmolLM2-135M,
//! stacked) in f32 and bf16: `cargo run -p sous-kernels --example decode_product`.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_kernels::transformer::{matmul_t, matmul_t_bf16};

fn time(name: &str, bytes: usize, mut run: impl FnMut()) {
    run();
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        run();
    }
    let s = t.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{name}: {:.2} ms per product, {:.1} GB/s of weights",
        s * 1e3,
        bytes as f64 / s / 1e9
    );
}

fn main() {
    let (n, k) = (49152 + 4992 * 30, 576);
    let w: Vec<f32> = (0..n * k).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
    let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.1).sin()).collect();
    let mut out = vec![0.0; n];
    time("f32", n * k * 4, || matmul_t(&x, 1, &w, k, &mut out));
    time("bf16", n * k * 2, || matmul_t_bf16(&x, 1, &bits, k, &mut out));
    // The same bytes as the model's layers: 30 × (qkv, o, gate_up, down).
    let shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)];
    let layers: Vec<Vec<u16>> = shapes.iter().map(|&(n, k)| bits[..n * k].to_vec()).collect();
    let xs: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(_, k)| x.iter().cycle().take(k).copied().collect())
        .collect();
    let bytes: usize = 30 * shapes.iter().map(|&(n, k)| n * k * 2).sum::<usize>();
    time("bf16 per layer", bytes, || {
        for _ in 0..30 {
            for (i, &(n, k)) in shapes.iter().enumerate() {
                matmul_t_bf16(&xs[i], 1, &layers[i], k, &mut out[..n]);
            }
        }
    });
}

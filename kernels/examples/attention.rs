//! Times `sous_kernels::transformer::attention` in SmolLM2-135M's shape (9 query heads,
//! 3 KV heads of 64 values, blocks of 16 slots) for the 30 layers of one step: a prompt
//! of `TOKENS` tokens attending causally to itself (a prefill), or with `decode` one
//! token at position `TOKENS - 1` (a decode step):
//! `cargo run -p sous-kernels --example attention -- [TOKENS] [decode]`
//! (`SOUS_KERNELS_ISA=avx2` or `portable`: the paths an older CPU takes).
//!
//! Prints milliseconds per step and GFLOP/s (4 · head_dim flops per query head and key
//! seen: the scores and the weighted values).
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_kernels::gemm::Isa;
use sous_kernels::transformer::{KvShape, Span, attention};

fn main() {
    // The example reads its own switch; the engine passes its choice the same way.
    let isa = Isa::chosen(std::env::var("SOUS_KERNELS_ISA").ok().as_deref());
    let mut args = std::env::args().skip(1);
    let tokens: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512).max(1);
    let decode = args.next().as_deref() == Some("decode");
    let shape = KvShape {
        block_size: 16,
        kv_heads: 3,
        head_dim: 64,
    };
    let (heads, layers) = (9, 30);
    let blocks = tokens.div_ceil(shape.block_size);
    let len = blocks * shape.block_size * shape.slot_len();
    let value = |i: usize, salt: f32| (i as f32 * salt).sin();
    let k: Vec<f32> = (0..len).map(|i| value(i, 0.37)).collect();
    let v: Vec<f32> = (0..len).map(|i| value(i, 0.11)).collect();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let (start, rows) = if decode { (tokens - 1, 1) } else { (0, tokens) };
    let q: Vec<f32> = (0..rows * heads * shape.head_dim)
        .map(|i| value(i, 0.29))
        .collect();
    let spans = [Span {
        blocks: &table,
        start,
        len: rows,
        row: 0,
    }];
    let mut out = vec![0.0f32; q.len()];
    let pairs = if decode { tokens } else { tokens * (tokens + 1) / 2 };
    let flop = (layers * 4 * shape.head_dim * heads * pairs) as f64;
    // Steps per timing: enough for tens of milliseconds.
    let steps = (2e8 / flop).ceil().max(1.0) as usize;
    println!(
        "{} {tokens} tokens, {steps} steps per timing",
        if decode { "decode at" } else { "prefill of" }
    );
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..steps {
            for _ in 0..layers {
                attention(&q, &spans, heads, shape, &k, &v, &mut out, isa);
            }
        }
        let s = started.elapsed().as_secs_f64() / steps as f64;
        println!("{:.3} ms per step, {:.1} GFLOP/s", s * 1e3, flop / s / 1e9);
    }
}

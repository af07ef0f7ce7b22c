//! Where single-row (decode) products stand against the memory wall: each weight format
//! timed twice, on weights that stay in the caches (what the arithmetic alone allows)
//! and on weights far larger than the last-level cache (what a decode step meets), beside
//! a STREAM-style read of the same bytes (`sous_kernels::bandwidth`):
//!
//!     cargo run -p sous-kernels --example decode_roofline [MB] [ROUNDS]
//!
//! `MB` (default 1024) is the size of the large set of weights, per format; each round
//! times every measure once, so that a busy minute of a shared host falls on all of them.
//! `SOUS_KERNELS_ISA=avx2` narrows the products; `RAYON_NUM_THREADS` sets the threads.
//! Each is timed in f32 arithmetic (`matmul`) and in bf16 arithmetic (`matmul_bf16`:
//! AVX512-BF16's dot products where the CPU has them). `ROWS=N` (default 1) multiplies
//! N rows at once, as a batch of N decoding sequences does. Prints one line per measure
//! and round: GB/s of packed weight bytes read, and the nanoseconds per sixteen weights
//! of one thread (a row of lanes of one panel), whatever the rows.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous_kernels::gemm::{Isa, Packed, Tuning};
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale, bandwidth, reference};

/// Columns (`k`) of every matrix: a 1B-class model's hidden size.
const K: usize = 2048;

fn values(len: usize, salt: u64) -> Vec<f32> {
    let mut state = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 0.05
        })
        .collect()
}

fn pack(format: &str, n: usize, salt: u64) -> Result<Packed, Box<dyn std::error::Error>> {
    let w = values(n * K, salt);
    let bits: Vec<u16> = w.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    Ok(match format {
        "bf16" => Packed::from_bf16(&bits, n, K)?,
        _ => {
            let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            let matrix = Matrix::new(Dtype::Bf16, n, K, &bytes)?;
            let scale =
                TensorScale::from_amax(Flavor::CompressedTensors, Dtype::Bf16, reference::amax(&matrix));
            let q = reference::quantize(&matrix, &scale);
            if format == "nvfp4" {
                Packed::from_nvfp4_scale(&q.packed, &q.scales, &scale, n, K)?
            } else {
                Packed::from_nvfp4(&q.packed, &q.scales, |s| scale.divisor(s), n, K)?
            }
        }
    })
}

/// Seconds per pass of single-row products over `set`, the best of passes lasting
/// about `seconds` in all.
fn time(tuning: &Tuning, bf16: bool, set: &[Packed], rows: usize, seconds: f64) -> f64 {
    let x = values(rows * K, 7);
    let mut outs: Vec<Vec<f32>> = set.iter().map(|w| vec![0.0; rows * w.n()]).collect();
    let mut best = f64::MAX;
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < seconds || best == f64::MAX {
        let t = Instant::now();
        for (w, out) in set.iter().zip(&mut outs) {
            if bf16 {
                tuning.matmul_bf16(&x, rows, w, out);
            } else {
                tuning.matmul(&x, rows, w, out);
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&outs);
    best
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mb: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let isa = Isa::chosen(std::env::var("SOUS_KERNELS_ISA").ok().as_deref());
    let tuning = Tuning::new(isa);
    let threads = rayon::current_num_threads();
    let rows: usize = std::env::var("ROWS").map_or(Ok(1), |r| r.parse())?;
    println!(
        "# {} threads, {} kernels, k = {K}, {rows} row(s), large sets of {mb} MB per format",
        threads,
        isa.name()
    );
    // An MLP's gate/up (8192 rows) as the large set's matrices; four of 512 rows for the
    // cached set (8 MB in bf16: in the last-level cache, large enough that a product
    // outlasts handing it to the threads).
    let mut sets = Vec::new();
    for format in ["bf16", "nvfp4", "nvfp4-table"] {
        let one = pack(format, 8192, 1)?;
        let count = (mb as u64 * 1_000_000).div_ceil(one.bytes()) as usize;
        let mut large = vec![one];
        for i in 1..count {
            large.push(pack(format, 8192, 1 + i as u64)?);
        }
        let small = (0..4)
            .map(|i| pack(format, 512, 99 + i))
            .collect::<Result<Vec<_>, _>>()?;
        sets.push((format, small, large));
    }
    let bytes = mb * 1_000_000;
    for round in 1..=rounds {
        let probe = bandwidth::measure(bytes, threads, 3, 1.0);
        println!(
            "round {round}  read bandwidth {:.1} GB/s best, {:.1} median",
            probe.best_gb_per_s, probe.median_gb_per_s
        );
        for (format, small, large) in &sets {
            for (what, set) in [("cached", small), ("memory", large)] {
                for arithmetic in ["f32", "bf16"] {
                    let seconds = time(&tuning, arithmetic == "bf16", set, rows, 1.0);
                    let (weights, packed): (u64, u64) = set
                        .iter()
                        .fold((0, 0), |(w, b), p| (w + (p.n() * p.k()) as u64, b + p.bytes()));
                    let gbs = packed as f64 / seconds / 1e9;
                    let ns16 = seconds * 1e9 * threads as f64 / (weights as f64 / 16.0);
                    let fraction = gbs / probe.best_gb_per_s * 100.0;
                    println!(
                        "round {round}  {format:<12} {arithmetic} arithmetic  {what:<7} {gbs:6.1} GB/s ({fraction:3.0} % of the read)  {ns16:.3} ns per 16 weights a thread"
                    );
                }
            }
        }
    }
    Ok(())
}

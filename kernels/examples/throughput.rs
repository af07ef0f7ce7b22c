//! Kernel throughput on a model's real weights: quantizes every 2-D bf16/f16/f32
//! tensor of a safetensors file whose name ends in `proj.weight` (the decoder's
//! Linear layers), with each flavour and kernel, on 1 thread and on all of them, and
//! prints GB/s of source bytes as JSON lines: per second of wall time, and per second
//! of CPU time the process used (on a machine shared with other work, the second is
//! the per-core figure). Used by `scripts/bench/quantize.sh`.
//!
//!     cargo run -p sous-kernels --example throughput -- MODEL.safetensors [SECONDS] [--all-kernels]

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sous_kernels::fast::{self, Kernel};
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: throughput MODEL.safetensors [SECONDS]");
    let seconds: f64 = args.get(2).map_or(3.0, |s| s.parse().unwrap());
    let all_kernels = args.iter().any(|a| a == "--all-kernels");
    let file = std::fs::read(path).unwrap();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
    let data = &file[8 + header_len..];
    let mut tensors = Vec::new();
    for (name, info) in header.as_object().unwrap() {
        if !name.ends_with("proj.weight") {
            continue;
        }
        let dtype = match info["dtype"].as_str().unwrap() {
            "BF16" => Dtype::Bf16,
            "F16" => Dtype::F16,
            "F32" => Dtype::F32,
            _ => continue,
        };
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let offsets: Vec<usize> = info["data_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        if shape.len() == 2 {
            tensors.push(Matrix::new(dtype, shape[0], shape[1], &data[offsets[0]..offsets[1]]).unwrap());
        }
    }
    let bytes: usize = tensors.iter().map(|m| m.data().len()).sum();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let kernels = if all_kernels {
            Kernel::available()
        } else {
            vec![Kernel::detect()]
        };
        for kernel in kernels {
            for flavor in [Flavor::CompressedTensors, Flavor::ModelOptGpu] {
                let pass = || {
                    for m in &tensors {
                        let scale = TensorScale::from_amax(flavor, m.dtype(), fast::amax_with(kernel, m));
                        std::hint::black_box(fast::quantize_with(kernel, m, &scale));
                    }
                };
                pool.install(pass);
                let start = Instant::now();
                let cpu_start = cpu_seconds();
                let mut passes = 0u32;
                while start.elapsed() < Duration::from_secs_f64(seconds) {
                    pool.install(pass);
                    passes += 1;
                }
                let secs = start.elapsed().as_secs_f64() / f64::from(passes);
                let cpu = (cpu_seconds() - cpu_start) / f64::from(passes);
                println!(
                    "{{\"threads\": {threads}, \"kernel\": \"{}\", \"flavor\": \"{flavor:?}\", \"tensors\": {}, \"bytes\": {bytes}, \"seconds\": {secs:.6}, \"gb_per_s\": {:.3}, \"cpu_seconds\": {cpu:.6}, \"gb_per_cpu_s\": {:.3}}}",
                    kernel.name(),
                    tensors.len(),
                    bytes as f64 / secs / 1e9,
                    bytes as f64 / cpu / 1e9
                );
            }
        }
    }
}

/// User + system CPU seconds of this process, from `/proc/self/stat` (Linux; clock
/// ticks of 1/100 s there); NaN elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ") ".
    (ticks(11) + ticks(12)) / 100.0
}

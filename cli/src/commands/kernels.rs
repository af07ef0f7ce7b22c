//! `sous kernels bandwidth`: the CPU's read bandwidth, what bounds decode
//! (`sous_kernels::bandwidth`).
//!
//! `sous kernels check|bench --device cuda[:N]`: whether this machine's GPU gives the
//! CPU's NVFP4 bytes, and how fast. `check` quantizes generated tensors full of edge
//! cases (zero blocks, subnormals, the dtype's largest finite values, blocks that
//! saturate or underflow, sizes that are no multiple of a warp's work) on both and
//! compares every byte; `bench` times the kernels on data already on the GPU beside a
//! device-to-device copy of the same bytes. `scripts/gpu-check.sh` runs both.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use sous::quantize::Device;
use sous_kernels::cuda::Gpu;
use sous_kernels::{BLOCK, Dtype, Flavor, Matrix, TensorScale, fast};

use crate::failure::UserError;
use crate::shell::Shell;

#[derive(Debug, Subcommand)]
pub enum KernelsCommand {
    /// Quantize generated tensors with edge cases on the GPU and on the CPU and compare
    /// every byte (amax, block scales, packed FP4, dequantized values).
    Check(CheckArgs),
    /// Time the GPU kernels beside a device-to-device copy of the same bytes.
    Bench(BenchArgs),
    /// Measure the CPU's read bandwidth as STREAM does: threads summing a buffer far
    /// larger than the last-level cache, pass after pass (the best pass is reported).
    /// Single-stream decode reads the weights once per token, so it cannot beat this
    /// divided by the bytes a token reads.
    Bandwidth(BandwidthArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  sous kernels bandwidth --threads 2 --json")]
pub struct BandwidthArgs {
    /// Buffer size in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 2048)]
    mib: usize,
    /// Reading threads. Default: the engine's (its thread pool's size).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Keep reading for at least this long (and at least 5 passes).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    seconds: f64,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  sous kernels check --device cuda:0")]
pub struct CheckArgs {
    /// The GPU: `cuda` or `cuda:N`.
    #[arg(long, value_name = "cuda[:N]", default_value = "cuda")]
    device: Device,
    /// Size of the largest generated tensor, in MiB of bf16 (at least 256 for the
    /// documented check).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    mib: usize,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The GPU: `cuda` or `cuda:N`.
    #[arg(long, value_name = "cuda[:N]", default_value = "cuda")]
    device: Device,
    /// Tensor size in GiB of bf16.
    #[arg(long, value_name = "GIB", default_value_t = 1.0)]
    gib: f64,
    /// Timed runs of each kernel (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 10)]
    repeats: usize,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

pub fn exec(cmd: KernelsCommand, shell: &Shell) -> anyhow::Result<ExitCode> {
    match cmd {
        KernelsCommand::Check(args) => check(args, shell),
        KernelsCommand::Bench(args) => bench(args, shell),
        KernelsCommand::Bandwidth(args) => bandwidth(args, shell),
    }
}

fn open(device: Device, shell: &Shell) -> anyhow::Result<Gpu> {
    let Device::Cuda(ordinal) = device else {
        return Err(UserError::new(
            "the kernels are checked against the CPU on a GPU: give `--device cuda` or `cuda:N`",
            None,
        )
        .into());
    };
    let gpu = Gpu::open(ordinal as usize, Some(&sous_engine::paths::cache_dir())).map_err(|e| {
        UserError::new(
            e.to_string(),
            Some("this needs an NVIDIA driver (libcuda) and NVRTC (libnvrtc) on the library path"),
        )
    })?;
    shell.status("gpu", &gpu.info().to_string());
    Ok(gpu)
}

/// One generated case.
struct Case {
    name: String,
    dtype: Dtype,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

/// xorshift64: the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Raw element bits of `dtype` for the value kinds the kernels must agree on.
fn element(dtype: Dtype, rng: &mut Rng, block_kind: u64) -> u32 {
    let r = rng.next();
    let sign = (r >> 63) as u32;
    match dtype {
        Dtype::Bf16 | Dtype::F32 => {
            // f32 bits; bf16 keeps the top half.
            let exponent = match block_kind % 8 {
                0 => 0,                              // zero or subnormal
                1 => 254,                            // largest finite exponent
                2 => 1 + (r >> 8) as u32 % 30,       // tiny normals
                3 => 100 + (r >> 8) as u32 % 54,     // around 1
                4 => ((r >> 8) as u32 % 254) + 1,    // anywhere finite
                5 => 127 - 20 + (r >> 8) as u32 % 4, // one narrow range
                6 => 0,
                _ => 60 + (r >> 8) as u32 % 134,
            };
            let mantissa = if block_kind % 8 == 6 {
                0
            } else {
                (r >> 20) as u32 & 0x7F_FFFF
            };
            let bits = (sign << 31) | (exponent << 23) | mantissa;
            if dtype == Dtype::Bf16 { bits >> 16 } else { bits }
        }
        Dtype::F16 => {
            let exponent = match block_kind % 6 {
                0 => 0,
                1 => 30,
                2 => 1 + (r >> 8) as u32 % 4,
                3 => 10 + (r >> 8) as u32 % 10,
                4 => ((r >> 8) as u32 % 30) + 1,
                _ => 15,
            };
            (sign << 15) | (exponent << 10) | ((r >> 20) as u32 & 0x3FF)
        }
    }
}

fn case(name: &str, dtype: Dtype, rows: usize, cols: usize, seed: u64) -> Case {
    let mut rng = Rng(seed | 1);
    let n = rows * cols;
    let mut bytes = Vec::with_capacity(n * dtype.size());
    let mut block_kind = 0;
    for i in 0..n {
        if i % BLOCK == 0 {
            block_kind = rng.next() >> 32;
        }
        let bits = element(dtype, &mut rng, block_kind);
        match dtype {
            Dtype::Bf16 | Dtype::F16 => bytes.extend_from_slice(&(bits as u16).to_le_bytes()),
            Dtype::F32 => bytes.extend_from_slice(&bits.to_le_bytes()),
        }
    }
    // A block of one huge weight among tiny ones (saturation), as the last block.
    if n >= BLOCK {
        let at = (n - BLOCK) * dtype.size();
        let huge = match dtype {
            Dtype::Bf16 => 0x7F7Fu32,
            Dtype::F16 => 0x7BFF,
            Dtype::F32 => 0x7F7F_FFFF,
        };
        bytes[at..at + dtype.size()].copy_from_slice(&huge.to_le_bytes()[..dtype.size()]);
    }
    Case {
        name: name.to_owned(),
        dtype,
        rows,
        cols,
        bytes,
    }
}

fn cases(mib: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for (d, dtype) in [Dtype::Bf16, Dtype::F16, Dtype::F32].into_iter().enumerate() {
        let d = d as u64;
        out.push(case("one block", dtype, 1, BLOCK, 11 + d));
        out.push(case(
            "3 x 112 (lanes no multiple of a warp)",
            dtype,
            3,
            112,
            12 + d,
        ));
        out.push(case("129 x 4112", dtype, 129, 4112, 13 + d));
        out.push(case("4096 x 4096", dtype, 4096, 4096, 14 + d));
    }
    // The large one: `mib` MiB of bf16, rows of 8192.
    let rows = (mib << 20) / (8192 * 2);
    out.push(case(
        &format!("{rows} x 8192 ({mib} MiB)"),
        Dtype::Bf16,
        rows.max(1),
        8192,
        99,
    ));
    out
}

fn bandwidth(args: BandwidthArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    use sous_engine::size::human;
    use sous_kernels::bandwidth;
    if args.mib == 0 || args.threads == Some(0) {
        return Err(UserError::new("--mib and --threads must be at least 1", None).into());
    }
    let threads = args.threads.unwrap_or_else(rayon::current_num_threads);
    let bytes = args.mib << 20;
    let llc = bandwidth::last_level_cache_bytes();
    if let Some(llc) = llc.filter(|&llc| (bytes as u64) < 8 * llc) {
        shell.warn(&format!(
            "the buffer ({}) is not far larger than the last-level cache ({}): the figure is partly the cache's",
            human(bytes as u64),
            human(llc)
        ));
    }
    let b = bandwidth::measure(bytes, threads, 5, args.seconds);
    if args.json {
        let report = json!({
            "bytes": b.bytes,
            "threads": b.threads,
            "passes": b.passes,
            "best_gb_per_s": b.best_gb_per_s,
            "median_gb_per_s": b.median_gb_per_s,
            "last_level_cache_bytes": llc,
        });
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&format!(
            "read bandwidth: {:.1} GB/s (best of {} passes; median {:.1}) over {} with {} thread(s){}",
            b.best_gb_per_s,
            b.passes,
            b.median_gb_per_s,
            human(b.bytes),
            b.threads,
            llc.map(|l| format!("; last-level cache {}", human(l)))
                .unwrap_or_default()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn check(args: CheckArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    let gpu = open(args.device, shell)?;
    let flavors = [
        Flavor::CompressedTensors,
        Flavor::ModelOptGpu,
        Flavor::ModelOptCpu,
    ];
    let mut results = Vec::new();
    let mut failures = 0;
    for c in cases(args.mib) {
        let matrix = Matrix::new(c.dtype, c.rows, c.cols, &c.bytes)?;
        let cpu_amax = fast::amax(&matrix);
        let gpu_amax = gpu.amax(&matrix)?;
        let amax_equal = cpu_amax.to_bits() == gpu_amax.to_bits() || (cpu_amax.is_nan() && gpu_amax.is_nan());
        for flavor in flavors {
            let scale = TensorScale::from_amax(flavor, c.dtype, cpu_amax);
            let (cpu, cpu_errors) = fast::quantize_with_stats(&matrix, &scale);
            let (out, gpu_errors) = gpu.quantize(&matrix, &scale)?;
            let packed_equal = cpu.packed == out.packed;
            let scales_equal = cpu.scales == out.scales;
            let blocks_equal = cpu.blocks == out.blocks;
            let cpu_values = fast::dequantize(&cpu.packed, &cpu.scales, &scale);
            let gpu_values = gpu.dequantize(&out.packed, &out.scales, &scale)?;
            let values_equal = cpu_values.len() == gpu_values.len()
                && cpu_values
                    .iter()
                    .zip(&gpu_values)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            // The error statistics are a report, not output bytes: the CPU's AVX2 path
            // sums squares in f32 (and overflows on the largest finite weights), the
            // GPU in f64, so they agree to f32 rounding where the CPU's are finite.
            let (a, b) = (cpu_errors.relative_rms_error(), gpu_errors.relative_rms_error());
            let cpu_finite = cpu_errors.sum_sq_weight.is_finite() && cpu_errors.sum_sq_error.is_finite();
            let stats = if !cpu_finite {
                "cpu f32 sums overflow"
            } else if a == b || (a - b).abs() <= 1e-4 * a.abs() {
                "close"
            } else {
                "DIFFER"
            };
            let stats_close = stats != "DIFFER";
            let ok =
                amax_equal && packed_equal && scales_equal && blocks_equal && values_equal && stats_close;
            failures += usize::from(!ok);
            let line = format!(
                "{:<44} {:<5} {:<18} amax {} packed {} scales {} blocks {} dequantized {} error stats {}",
                c.name,
                c.dtype.name(),
                format!("{flavor:?}"),
                word(amax_equal),
                word(packed_equal),
                word(scales_equal),
                word(blocks_equal),
                word(values_equal),
                stats
            );
            if args.json {
                shell.status(if ok { "ok" } else { "FAILED" }, &line);
            } else {
                shell.data(&format!("{} {line}", if ok { "ok    " } else { "FAILED" }))?;
            }
            results.push(json!({
                "case": c.name,
                "dtype": c.dtype.name(),
                "flavor": format!("{flavor:?}"),
                "elements": c.rows * c.cols,
                "amax_equal": amax_equal,
                "packed_equal": packed_equal,
                "scales_equal": scales_equal,
                "blocks_equal": blocks_equal,
                "dequantized_equal": values_equal,
                "error_stats": stats,
                "saturated_blocks": cpu.blocks.saturated,
                "underflow_blocks": cpu.blocks.underflow,
                "zero_blocks": cpu.blocks.zero,
            }));
        }
    }
    if args.json {
        shell.data(&serde_json::to_string_pretty(&json!({
            "device": gpu.info().to_string(),
            "failures": failures,
            "cases": results,
        }))?)?;
    }
    if failures > 0 {
        shell.warn(&format!("{failures} case(s) differ between the GPU and the CPU"));
        return Ok(ExitCode::FAILURE);
    }
    shell.status(
        "identical",
        &format!("{} cases, GPU bytes = CPU bytes", results.len()),
    );
    Ok(ExitCode::SUCCESS)
}

fn word(ok: bool) -> &'static str {
    if ok { "equal" } else { "DIFFER" }
}

fn bench(args: BenchArgs, shell: &Shell) -> anyhow::Result<ExitCode> {
    if !(args.gib > 0.0 && args.gib <= 64.0) {
        return Err(UserError::new(
            format!("--gib {} is out of range", args.gib),
            Some("give 0 < GIB <= 64"),
        )
        .into());
    }
    let gpu = open(args.device, shell)?;
    let bytes = (args.gib * (1u64 << 30) as f64) as usize;
    let b = gpu.bench(Dtype::Bf16, bytes, args.repeats)?;
    let gbs = |s: f64| b.bytes as f64 / s / 1e9;
    let copy_rw = 2.0 * b.bytes as f64 / b.copy_s;
    let quant_rw = b.quantize_bytes() / b.quantize_s;
    let both_s = b.amax_s + b.quantize_s;
    let both_rw = (b.bytes as f64 + b.quantize_bytes()) / both_s;
    let report = json!({
        "device": gpu.info().to_string(),
        "bytes": b.bytes,
        "repeats": args.repeats,
        "copy": {"seconds": b.copy_s, "read_write_tb_per_s": copy_rw / 1e12},
        "host_to_device": {"seconds": b.upload_s, "gb_per_s": gbs(b.upload_s)},
        "amax": {"seconds": b.amax_s, "input_gb_per_s": gbs(b.amax_s)},
        "quantize": {"seconds": b.quantize_s, "input_gb_per_s": gbs(b.quantize_s), "read_write_tb_per_s": quant_rw / 1e12, "of_copy": quant_rw / copy_rw},
        "quantize_with_stats": {"seconds": b.quantize_stats_s, "input_gb_per_s": gbs(b.quantize_stats_s)},
        "amax_then_quantize": {"seconds": both_s, "input_gb_per_s": gbs(both_s), "read_write_tb_per_s": both_rw / 1e12, "of_copy": both_rw / copy_rw},
    });
    if args.json {
        shell.data(&serde_json::to_string_pretty(&report)?)?;
    } else {
        shell.data(&format!(
            "{:<32} {:>10.3} {:>16.1}  (pinned memory)",
            "host-to-device copy",
            b.upload_s * 1e3,
            gbs(b.upload_s)
        ))?;
        shell.data(&format!(
            "{:<32} {:>10} {:>16} {:>18} {:>9}\n{:<32} {:>10.3} {:>16} {:>18.2} {:>9}\n{:<32} {:>10.3} {:>16.0} {:>18} {:>9}\n{:<32} {:>10.3} {:>16.0} {:>18.2} {:>8.0}%\n{:<32} {:>10.3} {:>16.0} {:>18} {:>9}\n{:<32} {:>10.3} {:>16.0} {:>18.2} {:>8.0}%",
            "bf16, bytes",
            "ms",
            "GB/s of input",
            "TB/s read+written",
            "of copy",
            "device-to-device copy",
            b.copy_s * 1e3,
            "",
            copy_rw / 1e12,
            "",
            "amax",
            b.amax_s * 1e3,
            gbs(b.amax_s),
            "",
            "",
            "quantize (scales + FP4)",
            b.quantize_s * 1e3,
            gbs(b.quantize_s),
            quant_rw / 1e12,
            100.0 * quant_rw / copy_rw,
            "quantize with error stats",
            b.quantize_stats_s * 1e3,
            gbs(b.quantize_stats_s),
            "",
            "",
            "amax + quantize",
            both_s * 1e3,
            gbs(both_s),
            both_rw / 1e12,
            100.0 * both_rw / copy_rw,
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

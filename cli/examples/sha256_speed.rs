//! SHA-256 throughput of each backend `sous pull` can verify with, one thread, on
//! this CPU: `cargo run --example sha256_speed [MiB] [rounds]`. The figures in
//! BENCHMARKS.md ("`sous pull` at line rate") come from here; compare them with
//! `openssl speed -bytes 1048576 sha256` (and with SHA-NI masked:
//! `OPENSSL_ia32cap=:~0x20000000`), which runs the assembly `ring` shares.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use sous::hub::download::sha256::{Backend, cpu_has_sha_extensions};

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let data: Vec<u8> = (0..mib << 20)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    println!(
        "{mib} MiB x {rounds} rounds per backend, 1 MiB updates; CPU SHA extensions: {}; auto picks {}",
        cpu_has_sha_extensions(),
        Backend::auto()
    );
    for backend in [Backend::Sha2, Backend::Ring, Backend::Portable] {
        let mut best = f64::MAX;
        let mut digest = String::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let mut hasher = backend.hasher();
            for piece in data.chunks(1 << 20) {
                hasher.update(piece);
            }
            digest = hasher.finish_hex();
            best = best.min(started.elapsed().as_secs_f64());
        }
        println!(
            "{:<32} {:>8.0} MB/s  {}",
            backend.describe(),
            data.len() as f64 / 1e6 / best,
            &digest[..16]
        );
    }
}

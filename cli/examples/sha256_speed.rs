//! SHA-256 throughput of each backend `sous pull` can verify with, and of the Xet hash
//! (`sous::hub::download::xet`), one thread, on this CPU:
//! `cargo run --example sha256_speed [MiB] [rounds] [FILE]` (with FILE, the Xet hash
//! of that file too, read into memory first: to compare with `hf_xet.hash_files`). The figures in
//! benchmarks/pull.md ("`sous pull` at line rate") come from here; compare them with
//! `openssl speed -bytes 1048576 sha256` (and with SHA-NI masked:
//! `OPENSSL_ia32cap=:~0x20000000`), which runs the assembly `ring` shares.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Instant;

use sous::hub::download::sha256::{Backend, cpu_has_sha_extensions};
use sous::hub::download::xet::XetHasher;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    // xorshift64: no short period, so the Xet chunker cuts where it would in real data.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
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
    let (seconds, digest) = time_xet(&data, rounds);
    println!(
        "{:<32} {:>8.0} MB/s  {}",
        "xet (gear hash + keyed BLAKE3)",
        data.len() as f64 / 1e6 / seconds,
        &digest[..16]
    );
    if let Some(path) = args.next() {
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("cannot read {path}: {e}");
                std::process::exit(1);
            }
        };
        let (seconds, digest) = time_xet(&bytes, rounds);
        println!(
            "{:<32} {:>8.0} MB/s  {digest} ({path})",
            "xet of FILE",
            bytes.len() as f64 / 1e6 / seconds
        );
    }
}

/// The best of `rounds` Xet hashes of `data` fed in 1 MiB pieces: seconds, and the hash.
fn time_xet(data: &[u8], rounds: usize) -> (f64, String) {
    let mut best = f64::MAX;
    let mut digest = String::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let mut hasher = XetHasher::new();
        for piece in data.chunks(1 << 20) {
            hasher.update(piece);
        }
        digest = hasher.finalize();
        best = best.min(started.elapsed().as_secs_f64());
    }
    (best, digest)
}

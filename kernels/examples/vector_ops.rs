//! What the NVFP4 dot-product kernel's instructions cost on this CPU, one thread: the
//! throughput of `vpermw` (the FP4 lookup), `vpshufb` (the byte lookup other kernels
//! use), `vdpbf16ps` (the dot product) and `vpsrld` (the shift to the next code), each
//! alone in eight independent chains, and of a lookup and a dot product together (two
//! instructions that share execution pipes cost the sum of their times; two that do not,
//! the larger):
//!
//!     cargo run -p sous-kernels --example vector_ops [MILLIONS]
//!
//! Needs AVX512-BW and AVX512-BF16; elsewhere it says so and stops.
#![allow(clippy::print_stdout)]
// Intrinsics are unsafe to call; this measure is nothing but them.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod ops {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// `n` rounds of eight independent `vpermw` (each lane's index, its own value).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn permw(n: usize, seed: __m512i) -> __m512i {
        let table = _mm512_set1_epi16(3);
        let mut a = [seed; 8];
        for _ in 0..n {
            for v in &mut a {
                *v = _mm512_permutexvar_epi16(*v, table);
            }
        }
        a.into_iter().fold(seed, |r, v| _mm512_xor_si512(r, v))
    }

    /// `n` rounds of eight independent `vpshufb`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn pshufb(n: usize, seed: __m512i) -> __m512i {
        let table = _mm512_set1_epi8(3);
        let mut a = [seed; 8];
        for _ in 0..n {
            for v in &mut a {
                *v = _mm512_shuffle_epi8(table, *v);
            }
        }
        a.into_iter().fold(seed, |r, v| _mm512_xor_si512(r, v))
    }

    /// `n` rounds of eight independent `vdpbf16ps`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn dpbf16(n: usize, seed: __m512i) -> __m512 {
        let x: __m512bh = unsafe { std::mem::transmute(seed) };
        let mut a = [_mm512_setzero_ps(); 8];
        for _ in 0..n {
            for v in &mut a {
                *v = _mm512_dpbf16_ps(*v, x, x);
            }
        }
        a.into_iter()
            .fold(_mm512_setzero_ps(), |r, v| _mm512_add_ps(r, v))
    }

    /// `n` rounds of eight independent `vpsrld` (by one bit, so that the chains do not
    /// become constants).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn srld(n: usize, seed: __m512i) -> __m512i {
        let mut a = [seed; 8];
        for _ in 0..n {
            for v in &mut a {
                *v = _mm512_or_si512(_mm512_srli_epi32::<1>(*v), seed);
            }
        }
        a.into_iter().fold(seed, |r, v| _mm512_xor_si512(r, v))
    }

    /// `n` rounds of four independent pairs of a `vpermw` and a `vdpbf16ps`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn permw_dpbf16(n: usize, seed: __m512i) -> __m512 {
        let table = _mm512_set1_epi16(3);
        let x: __m512bh = unsafe { std::mem::transmute(seed) };
        let mut p = [seed; 4];
        let mut a = [_mm512_setzero_ps(); 4];
        for _ in 0..n {
            for (v, s) in p.iter_mut().zip(&mut a) {
                *v = _mm512_permutexvar_epi16(*v, table);
                *s = _mm512_dpbf16_ps(*s, x, x);
            }
        }
        black_box(p);
        a.into_iter()
            .fold(_mm512_setzero_ps(), |r, v| _mm512_add_ps(r, v))
    }
}

#[cfg(target_arch = "x86_64")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::arch::x86_64::_mm512_set1_epi32;
    use std::hint::black_box;
    use std::time::Instant;

    let millions: usize = std::env::args().nth(1).map_or(Ok(50), |a| a.parse())?;
    let needs = ["avx512f", "avx512bw", "avx512bf16"];
    if !(is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16"))
    {
        println!("this CPU lacks one of {needs:?}: nothing to measure");
        return Ok(());
    }
    let n = millions * 1_000_000;
    let time = |name: &str, ops: usize, f: &dyn Fn()| {
        let started = Instant::now();
        f();
        let ns = started.elapsed().as_secs_f64() * 1e9 / (ops * n) as f64;
        println!("{name:<22} {ns:.3} ns");
    };
    // SAFETY: AVX512-F, -BW and -BF16 are present (checked above).
    unsafe {
        let seed = black_box(_mm512_set1_epi32(0x3f80_3f80));
        time("vpermw", 8, &|| {
            black_box(ops::permw(n, seed));
        });
        time("vpshufb", 8, &|| {
            black_box(ops::pshufb(n, seed));
        });
        time("vdpbf16ps", 8, &|| {
            black_box(ops::dpbf16(n, seed));
        });
        time("vpsrld + vpord", 8, &|| {
            black_box(ops::srld(n, seed));
        });
        time("vpermw + vdpbf16ps", 4, &|| {
            black_box(ops::permw_dpbf16(n, seed));
        });
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("an x86-64 measure: nothing to measure on this CPU");
}

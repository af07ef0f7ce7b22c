//! Which instruction set the products run on ([`Isa`]): the sets this CPU has, the one
//! in use, and the register tile each takes for a product of a given number of rows.
//! Not here: the kernels themselves (`x86`, `neon`, `portable`) or the drivers that
//! call them (`drive`).

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::x86;

/// The instruction sets a product can run on, widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F with FMA: 12 rows × 32 columns per tile (up to 16 rows × 16 columns,
    /// 6 × 48 or 4 × 64 for a few rows).
    Avx512,
    /// AVX2 with FMA: 6 rows × 16 columns per tile.
    Avx2,
    /// aarch64's Advanced SIMD (NEON, in every ARMv8-A CPU): 6 rows × 16 columns per
    /// tile (up to 4 panels side by side for one to three rows).
    Neon,
    /// Scalar code with `f32::mul_add`: 4 rows × 16 columns per tile.
    Portable,
}

impl Isa {
    /// The widest set this CPU has; checked once per process.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::available().first().copied().unwrap_or(Isa::Portable))
    }

    /// The set a user's choice names, as `SOUS_KERNELS_ISA` spells it: `portable`, or
    /// `avx2` where the CPU has it, narrow the products to that set; anything else
    /// (`avx512` and `neon` name the widest), or no choice, gives [`Isa::best`].
    pub fn chosen(name: Option<&str>) -> Isa {
        match name {
            Some("portable") => Isa::Portable,
            Some("avx2") if Isa::available().contains(&Isa::Avx2) => Isa::Avx2,
            _ => Isa::best(),
        }
    }

    /// Every set this CPU can run, widest first (the portable one always).
    pub fn available() -> Vec<Isa> {
        let mut sets = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            if x86::avx512() {
                sets.push(Isa::Avx512);
            }
            if x86::avx2() {
                sets.push(Isa::Avx2);
            }
        }
        #[cfg(target_arch = "aarch64")]
        sets.push(Isa::Neon);
        sets.push(Isa::Portable);
        sets
    }

    /// Rows and panels of one register tile for a product of `rows` rows. Up to four
    /// rows (decode steps) are bound by reading the weights, and how many panels to
    /// read side by side depends on the CPU (`decode_panels`, measured at load by
    /// [`super::Tuning::calibrate_decode_panels`]): on a Zen 4 one panel at a time, one sequential
    /// stream per task, measured fastest; on a Sapphire-Rapids-class Xeon four panels.
    /// `quantized` weights (NVFP4, Q8_0) always take four: a panel's chain of fused
    /// multiply-adds waits on itself (four cycles a step) long before the packed weights
    /// run out (benchmarks/native.md, "Figures that were in code comments").
    /// Products of 9 to 16 rows take `batch_tile`, also measured at load
    /// ([`super::Tuning::calibrate_batch_tile`]).
    pub(super) fn tile(
        self,
        rows: usize,
        quantized: bool,
        decode_panels: usize,
        batch_tile: (usize, usize),
    ) -> (usize, usize) {
        match self {
            Isa::Avx512 if rows <= 4 && quantized => (4, 4),
            Isa::Avx512 if rows <= 4 => (12, decode_panels),
            // Five or six rows of float weights (a speculative step verifying four or
            // five drafted tokens): one block, three panels side by side. One block
            // means every weight is widened once; three panels give each row three
            // chains of fused multiply-adds and three weight streams. A block of 16
            // rows × 1 panel left five rows five chains, too few to hide the FMA's
            // latency, and measured slowest of the three shapes tried (benchmarks/native.md,
            // "Figures that were in code comments"). NVFP4 and Q8_0 weights, whose
            // widening takes more registers, take 8 × 2 (6 × 3 measured no better).
            Isa::Avx512 if rows <= 6 && !quantized => (6, 3),
            // Up to eight rows fit one block of 8, so every weight is widened once.
            Isa::Avx512 if rows <= 8 => (8, 2),
            // A larger batch: as measured at load (`calibrate_batch_tile`).
            Isa::Avx512 if rows <= 16 => batch_tile,
            Isa::Avx512 => (12, 2),
            Isa::Avx2 => (6, 1),
            // Within 24 of NEON's 32 vector registers for the accumulators: four
            // panels for one row of float weights, whose chains of multiply-adds would
            // otherwise wait on themselves; two where the NVFP4 and Q8_0 factors take
            // registers too.
            Isa::Neon if rows <= 1 && !quantized => (1, 4),
            Isa::Neon if rows <= 2 && !quantized => (2, 3),
            Isa::Neon if rows <= 3 => (3, 2),
            Isa::Neon => (6, 1),
            Isa::Portable => (4, 1),
        }
    }

    /// The name `SOUS_KERNELS_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Portable => "portable",
        }
    }
}

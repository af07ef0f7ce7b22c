//! The choices a product runs with, as a value ([`Tuning`]): the instruction set, the
//! tiles of decode-sized and batch-sized products, and whether bf16 arithmetic uses
//! AVX512-BF16's dot product. The owner of the weights (the native engine's model)
//! holds one, filled at load by the calibrations (`calibrate`, `bf16`) from what the
//! user chose ([`Choices`]) or from measurement, and hands it to every product; no
//! product reads a global or the environment for them. None of these choices changes
//! the bits of a product of f32 arithmetic, only its speed; the dot product changes
//! bf16 products' bits, the same for every row count.
//!
//! Not here: reading the user's choices from the environment (the engine's `env`
//! module does, and passes the text to [`Choices::parse`] and [`Isa::chosen`]).

use super::{Isa, Packed};

/// The register tiles a product of 9 to 16 rows (a batch of decode steps) may take with
/// AVX-512: one block of up to 16 rows, so that every weight is widened once (fastest on
/// a Zen 4), or blocks of 8 rows with two panels side by side (fastest on a
/// Sapphire-Rapids-class Xeon; benchmarks/native.md, "Figures that were in code comments").
pub(super) const BATCH_TILES: [(usize, usize); 2] = [(16, 1), (8, 2)];

/// The choices products run with ([`Tuning::matmul`], [`Tuning::matmul_bf16`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// The instruction set (one of [`Isa::available`]).
    pub(super) isa: Isa,
    /// Panels that products of up to four rows of f32 or bf16 weights read side by
    /// side with AVX-512 (NVFP4 and Q8_0 always take four; see `Isa::tile`), 1 to 4.
    /// Every output is the same chain of fused multiply-adds whichever panels share a
    /// tile, so this never changes a result.
    pub(super) decode_panels: usize,
    /// The tile of products of 9 to 16 rows with AVX-512: one of [`BATCH_TILES`].
    /// Results do not depend on it.
    pub(super) batch_tile: (usize, usize),
    /// Whether [`Tuning::matmul_bf16`] uses AVX512-BF16's dot product where the CPU
    /// has it.
    pub(super) bf16_dot: bool,
}

impl Default for Tuning {
    /// [`Tuning::new`] on [`Isa::best`].
    fn default() -> Tuning {
        Tuning::new(Isa::best())
    }
}

impl Tuning {
    /// The choices before any calibration, on `isa`: one panel at a time for decode
    /// steps, one block of 16 rows for batches, and the dot product where there is one.
    pub fn new(isa: Isa) -> Tuning {
        Tuning {
            isa,
            decode_panels: 1,
            batch_tile: BATCH_TILES[0],
            bf16_dot: true,
        }
    }

    /// The instruction set the products run on.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Panels products of up to four rows read side by side with AVX-512.
    pub fn decode_panels(&self) -> usize {
        self.decode_panels
    }

    /// `(rows, panels)` of the tile of products of 9 to 16 rows with AVX-512.
    pub fn batch_tile(&self) -> (usize, usize) {
        self.batch_tile
    }

    /// Whether bf16 arithmetic uses AVX512-BF16's dot product where the CPU has it.
    pub fn bf16_dot(&self) -> bool {
        self.bf16_dot
    }

    /// Rows and panels of one register tile for a product of `rows` rows of `w`.
    pub(super) fn tile(&self, rows: usize, w: &Packed) -> (usize, usize) {
        self.isa
            .tile(rows, w.quantized(), self.decode_panels, self.batch_tile)
    }
}

/// What the user chose for the products, each `None` where the load is to measure (the
/// instruction set: where it is to be the widest this CPU has).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Choices {
    /// The instruction set (one of [`Isa::available`]).
    pub isa: Option<Isa>,
    /// Use AVX512-BF16's dot product in bf16 arithmetic, or not.
    pub bf16_dot: Option<bool>,
    /// Panels a decode step's tile reads side by side (1 to 4).
    pub decode_panels: Option<usize>,
    /// The tile of products of 9 to 16 rows (`(16, 1)` or `(8, 2)`).
    pub batch_tile: Option<(usize, usize)>,
}

impl Choices {
    /// The choices as their switches spell them, each `None` when unset:
    /// `SOUS_KERNELS_ISA` (as [`Isa::chosen`] reads it), `SOUS_BF16_DOT` (`on` or `off`),
    /// `SOUS_DECODE_PANELS` (1 to 4) and `SOUS_BATCH_TILE` (`16x1` or `8x2`). Text that
    /// names no valid choice is ignored, as if unset.
    pub fn parse(
        isa: Option<&str>,
        bf16_dot: Option<&str>,
        decode_panels: Option<&str>,
        batch_tile: Option<&str>,
    ) -> Choices {
        Choices {
            isa: isa.map(|name| Isa::chosen(Some(name.trim()))),
            bf16_dot: bf16_dot.and_then(|v| match v.trim() {
                "on" => Some(true),
                "off" => Some(false),
                _ => None,
            }),
            decode_panels: decode_panels
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|np| (1..=4).contains(np)),
            batch_tile: batch_tile.and_then(|v| {
                BATCH_TILES
                    .into_iter()
                    .find(|(mr, np)| v.trim() == format!("{mr}x{np}"))
            }),
        }
    }

    /// The tuning these choices start from, before the load measures what they leave
    /// open: [`Tuning::new`] on the chosen instruction set (or [`Isa::best`]) with every
    /// other choice made applied.
    pub fn tuning(&self) -> Tuning {
        let start = Tuning::new(self.isa.unwrap_or_else(Isa::best));
        Tuning {
            bf16_dot: self.bf16_dot.unwrap_or(start.bf16_dot),
            decode_panels: self.decode_panels.unwrap_or(start.decode_panels),
            batch_tile: self.batch_tile.unwrap_or(start.batch_tile),
            ..start
        }
    }
}

/// One way this CPU can compute a product, as far as its bits go: an instruction set
/// and, for bf16 arithmetic, whether AVX512-BF16's dot product is used. The tiles
/// (`decode_panels`, `batch_tile`) are not part of it: they never change a bit.
///
/// f32 products are the same bits on every path (every output is one chain of fused
/// multiply-adds in order). bf16 products are the same bits on every path but the dot
/// product's, which adds its two products per lane in its own order: the one place where
/// two CPUs, or two loads on one CPU ([`Tuning::calibrate_bf16_dot`] measures), can give
/// different numbers for the same model and input. The test suite runs its numerics once
/// per path this CPU has ([`KernelPath::available`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPath {
    /// The instruction set.
    pub isa: Isa,
    /// Whether bf16 products use AVX512-BF16's dot product.
    pub bf16_dot: bool,
}

impl KernelPath {
    /// Every path this CPU can take, the widest first: each of [`Isa::available`], and on
    /// a CPU with AVX512-BF16 the AVX-512 kernels twice, with the dot product and without.
    pub fn available() -> Vec<KernelPath> {
        let mut paths = Vec::with_capacity(4);
        for isa in Isa::available() {
            if isa == Isa::Avx512 && bf16_dot_available() {
                paths.push(KernelPath { isa, bf16_dot: true });
            }
            paths.push(KernelPath { isa, bf16_dot: false });
        }
        paths
    }

    /// The choices that take this path (what is not part of a path left to measure).
    pub fn choices(self) -> Choices {
        Choices {
            isa: Some(self.isa),
            bf16_dot: Some(self.bf16_dot),
            ..Choices::default()
        }
    }
}

impl std::fmt::Display for KernelPath {
    /// `avx512 + bf16 dot`, `avx512`, `avx2`, `neon`, `portable`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.isa.name())?;
        if self.bf16_dot {
            f.write_str(" + bf16 dot")?;
        }
        Ok(())
    }
}

/// Whether this CPU has AVX512-BF16's dot product (with the AVX-512 kernels it needs).
pub fn bf16_dot_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::avx512_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

//! One micro-kernel call ([`Tile`]) over a slice of packed weights ([`Panels`]): the
//! bounds the kernels rely on, the dispatch to the instruction set's kernel, and the
//! widening of a pass's weights to f32 once for every row tile that reads them. Not
//! here: the kernels (`x86`, `neon`, `portable`) or the split of a product into tiles.

#[cfg(target_arch = "aarch64")]
use super::neon;
use super::packed::{Data, Form};
use super::portable;
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{Isa, NR, Packed};

/// The packed weights of one tile call, starting at the pass's first `kk`.
#[derive(Clone, Copy)]
pub(crate) enum Panels<'a> {
    /// `[kk][16]` f32 per panel; panels `stride` values apart.
    F32 { data: &'a [f32], stride: usize },
    /// `[kk/2][16][2]` bf16 bits per panel (pairs of `kk`, see `pack_pairs`); the
    /// slice starts at an even `kk`.
    Bf16 { data: &'a [u16], stride: usize },
    /// `[kk/2][16]` code bytes and `[kk/16][16]` scale bytes per panel.
    Nvfp4 {
        codes: &'a [u8],
        code_stride: usize,
        scales: &'a [u8],
        scale_stride: usize,
        divisors: &'a [f32; 256],
        /// The table's values computed, where [`Form`] allows (read by the x86 kernels;
        /// the portable one looks the table up).
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        form: Option<Form>,
    },
    /// `[kk][16]` codes and `[kk/32][16]` f16 scale bits per panel; the slice starts at
    /// a multiple of 32.
    Q8 {
        codes: &'a [i8],
        code_stride: usize,
        scales: &'a [u16],
        scale_stride: usize,
    },
}

/// One micro-kernel call: `c[m][j] (+)= Σ_kk a[kk][m] · w[j][kk]` for `mr` rows and
/// `np` panels over `kc` values of `kk`.
pub(crate) struct Tile<'a> {
    /// Packed inputs, `[kc][mr]`.
    pub a: &'a [f32],
    pub mr: usize,
    pub kc: usize,
    pub panels: Panels<'a>,
    pub np: usize,
    /// The output tile, rows `ldc` apart, `16·np` columns each.
    pub c: &'a mut [f32],
    pub ldc: usize,
    /// Continue from the values in `c` (a later pass over `kk`) instead of zero.
    pub accumulate: bool,
}

impl Tile<'_> {
    /// Panics unless every access the kernels make is inside the slices; the kernels
    /// rely on it.
    fn check(&self) {
        assert!(self.a.len() >= self.kc * self.mr);
        assert!(self.mr >= 1 && self.np >= 1);
        assert!(self.c.len() >= (self.mr - 1) * self.ldc + self.np * NR);
        self.panels.check(self.np, self.kc);
    }
}

impl Panels<'_> {
    /// Panics unless `np ≥ 1` panels of `kc` values of `kk` are inside the slices.
    pub(super) fn check(&self, np: usize, kc: usize) {
        assert!(np >= 1);
        let last = np - 1;
        match *self {
            Panels::F32 { data, stride } => assert!(data.len() >= last * stride + kc * NR),
            Panels::Bf16 { data, stride } => {
                assert!(data.len() >= last * stride + kc.next_multiple_of(2) * NR)
            }
            Panels::Nvfp4 {
                codes,
                code_stride,
                scales,
                scale_stride,
                ..
            } => {
                assert!(kc.is_multiple_of(crate::BLOCK));
                assert!(codes.len() >= last * code_stride + kc / 2 * NR);
                assert!(scales.len() >= last * scale_stride + kc / crate::BLOCK * NR);
            }
            Panels::Q8 {
                codes,
                code_stride,
                scales,
                scale_stride,
            } => {
                use crate::formats::q8::BLOCK;
                assert!(kc.is_multiple_of(BLOCK));
                assert!(codes.len() >= last * code_stride + kc * NR);
                assert!(scales.len() >= last * scale_stride + kc / BLOCK * NR);
            }
        }
    }
}

pub(super) fn run_tile(isa: Isa, tile: &mut Tile) {
    tile.check();
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::tile_avx512(tile),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::tile_avx2(tile),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::tile(tile),
        _ => portable::tile(tile),
    }
}

/// Writes the f32 values of panels `0..np` of `panels` over `kc` values of `kk` into
/// `wide` (`[p][kk][16]`, resized to fit) and says whether it did: on AVX-512 and AVX2,
/// for weights that are not f32 already. The values are the ones the kernels widen in
/// registers, bit for bit (a bf16 value shifted; an FP4 value times its block's divisor,
/// one f32 multiply; a Q8_0 code times its f16 scale), so a tile reading them computes
/// the same sums.
///
/// Why: a pass over many rows runs every row tile of the pass over the same slice of
/// weights, and in registers each tile widened it again: for NVFP4 a lookup, a
/// multiply and a shift per sixteen values (a large share of a 12-row AVX-512 tile's
/// vector instructions; more on AVX2, which looks up magnitude and sign apart), for
/// bf16 on AVX2 two integer instructions (the shares: benchmarks/native.md, "Figures
/// that were in code comments"). Widened once into a
/// buffer that stays in L2 (`np · depth · 16` f32: 72 KiB for two panels at SmolLM2's
/// depth of 576, at most 512 KiB for four at [`KC`]), the cost is paid once
/// per pass instead of once per tile, as BLIS packs its B panels. The weights stay in
/// their stored precision in memory: this is one pass's slice, never a matrix.
///
/// bf16 with AVX-512 is not widened: its tiles read half the bytes of f32 ones and widen
/// in two instructions per 48 multiply-adds, and measured no faster from the buffer
/// (benchmarks/native.md, "Figures that were in code comments").
pub(super) fn widen(isa: Isa, panels: Panels, np: usize, kc: usize, wide: &mut Vec<f32>) -> bool {
    match panels {
        Panels::F32 { .. } => return false,
        Panels::Bf16 { .. } if matches!(isa, Isa::Avx512 | Isa::Neon) => return false,
        _ => {}
    }
    panels.check(np, kc);
    wide.resize(np * kc * NR, 0.0);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            x86::widen_avx512(panels, np, kc, wide);
            true
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            x86::widen_avx2(panels, np, kc, wide);
            true
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => {
            neon::widen(panels, np, kc, wide);
            true
        }
        _ => false,
    }
}

/// The weights of panel `panel` and the ones after it, from `kk = k0`.
pub(super) fn panel_slice(w: &Packed, panel: usize, k0: usize) -> Panels<'_> {
    let k = w.k;
    match &w.data {
        Data::F32(v) => Panels::F32 {
            data: &v[panel * k * NR + k0 * NR..],
            stride: k * NR,
        },
        // `k0` is a multiple of the pass depth, so even.
        Data::Bf16(v) => Panels::Bf16 {
            data: &v[panel * k.next_multiple_of(2) * NR + k0 * NR..],
            stride: k.next_multiple_of(2) * NR,
        },
        Data::Nvfp4(q) => Panels::Nvfp4 {
            codes: &q.codes[panel * k / 2 * NR + k0 / 2 * NR..],
            code_stride: k / 2 * NR,
            scales: &q.scales[panel * k / crate::BLOCK * NR + k0 / crate::BLOCK * NR..],
            scale_stride: k / crate::BLOCK * NR,
            divisors: q.table(panel).0,
            form: q.table(panel).1,
        },
        Data::Q8(q) => {
            let blocks = k / crate::formats::q8::BLOCK;
            Panels::Q8 {
                codes: &q.codes[panel * k * NR + k0 * NR..],
                code_stride: k * NR,
                scales: &q.scales[panel * blocks * NR + k0 / crate::formats::q8::BLOCK * NR..],
                scale_stride: blocks * NR,
            }
        }
    }
}

/// How many panels from `panel` on one tile may span (NVFP4 panels of two stacked
/// members have different divisor tables).
pub(super) fn run_length(w: &Packed, panel: usize) -> usize {
    match &w.data {
        Data::Nvfp4(q) => q.table(panel).2,
        _ => usize::MAX,
    }
}

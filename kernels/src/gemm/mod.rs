//! Matrix products of the native engine: `out = x · wᵀ` for a linear layer's weight `w`
//! (`[n, k]`, `[out, in]` as checkpoints store it), for one row (a decode step) or
//! hundreds (a prompt chunk), with the weight kept in its stored precision.
//!
//! The weight is repacked once, at load, into column panels of [`NR`] output columns:
//! panel `p` holds `w[16p..16p+16][kk]` for every `kk`, sixteen consecutive values per
//! `kk` (the layout of BLIS's packed B). The micro-kernel keeps an `MR × 16·NP` tile of
//! the output in registers and, for every `kk`, loads sixteen weights per panel, widens
//! them to f32 in registers (bf16 by a shift; NVFP4 by a 16-entry table lookup times the
//! block's scale, which comes from a 256-entry table of the tensor's divisors), and does
//! one fused multiply-add per row and panel with `x[m][kk]` broadcast. The input rows
//! are packed too (`[k][MR]` per block of rows), so every load is sequential. In a
//! product of many rows, where every row tile of a pass reads the same slice of
//! weights, NVFP4 and Q8_0 weights (and bf16 ones on AVX2) are widened once per pass
//! into a small f32 buffer instead of once per tile (`widen`).
//!
//! Why our own and not candle's GEMM (the `gemm` crate): for many rows that crate's
//! AVX-512 kernels need a nightly compiler, its stable AVX2 kernel is several times
//! slower than ours, and it multiplies f32 by f32 only, so bf16 weights had to be widened
//! in memory before every product and NVFP4 weights dequantized at load (the memory of
//! bf16). The numbers: `BENCHMARKS.md`, issue 16.
//!
//! The arithmetic is the same on every path (AVX-512, AVX2, NEON, portable): each output is
//! one chain of fused multiply-adds over `kk` in order, starting from zero, so a row's
//! result does not depend on which other rows share its batch, on the blocking, or on
//! the CPU's vector width. An NVFP4 weight is `fp4 value × divisor`, one f32 multiply,
//! exactly [`crate::reference::dequantize`]'s value; the product from packed NVFP4
//! equals the product from the dequantized f32 matrix bit for bit (tested).
//!
//! The kernel in use is chosen at run time ([`Isa::current`]): AVX-512 or AVX2 on x86-64,
//! NEON on aarch64 (every ARMv8-A CPU has it). `SOUS_KERNELS_ISA=avx2` or `=portable`
//! forces a narrower one, for tests and for measuring the paths an older CPU would take.

#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use crate::KernelError;
use crate::formats::fp4;
use crate::pages::{Buf, Movable};

/// Output columns per packed panel.
pub const NR: usize = 16;

/// Most depth (values of `kk`) of one pass over the packed weights in a product of many
/// rows; a deeper `k` is split into the fewest equal passes of about this many (rounded
/// up to a multiple of 32: whole blocks of every format). Each pass loads and stores
/// the row tiles' outputs once, and adds to them from the second pass on: one chain per
/// output whatever the depth, so the depth never changes a result.
///
/// Why this deep and not BLIS's L1-sized passes: a tile's packed inputs and a panel's
/// weights are read front to back, which the prefetchers follow from L2, while every
/// pass costs a load and a store of the tile's outputs and a restart of their chains.
/// Measured, one pass beat passes of 256 for nearly every product of SmolLM2's matrices
/// and for deeper ones up to `k` = 8192 with bf16 and f32 weights; NVFP4 weights at 8192,
/// whose pass is widened into a buffer (`widen`) that then outgrows L2, were fastest in
/// passes of 2048 (BENCHMARKS.md, "Figures that were in code comments").
const KC: usize = 2048;

/// The depth of each pass over `k` values of `kk` for a product of many rows (see
/// [`KC`]): `k` itself up to `KC`, else the equal share of the fewest passes.
fn pass_depth(k: usize) -> usize {
    if k <= KC {
        k
    } else {
        k.div_ceil(k.div_ceil(KC)).next_multiple_of(32)
    }
}

/// Most rows a product splits by columns among tasks (every weight read once, by one
/// task); past it, the rows are split (each task then reads every weight, and keeps
/// its own rows' inputs in L2). Up to it the weights cost more than the rows; from 192
/// rows on, the rows' split measured faster (BENCHMARKS.md, "Figures that were in code comments").
const BY_COLUMNS_MAX: usize = 128;

/// Rows per pass over a column panel: their packed inputs (`MC` rows of one pass's
/// depth, 864 KiB of f32 at SmolLM2's 576) stay in L2 while every panel of a task
/// streams past them. A prompt's rows are split among tasks first (`row_tasks`), so a
/// task holds more than this many only on one thread past 1,536 rows.
const MC: usize = 384;

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
    /// The widest set this CPU has, narrowed by `SOUS_KERNELS_ISA` (`avx2` or `portable`;
    /// `avx512` and `neon` name the widest) if set; checked once per process.
    pub fn current() -> Isa {
        static CURRENT: OnceLock<Isa> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let best = Isa::available().first().copied().unwrap_or(Isa::Portable);
            match std::env::var("SOUS_KERNELS_ISA").ok().as_deref() {
                Some("portable") => Isa::Portable,
                Some("avx2") if Isa::available().contains(&Isa::Avx2) => Isa::Avx2,
                _ => best,
            }
        })
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
    /// read side by side depends on the CPU ([`decode_panels`], measured at load by
    /// [`calibrate_decode_panels`]): on a Zen 4 one panel at a time, one sequential
    /// stream per task, measured fastest; on a Sapphire-Rapids-class Xeon four panels.
    /// `quantized` weights (NVFP4, Q8_0) always take four: a panel's chain of fused
    /// multiply-adds waits on itself (four cycles a step) long before the packed weights
    /// run out (BENCHMARKS.md, "Figures that were in code comments").
    fn tile(self, rows: usize, quantized: bool) -> (usize, usize) {
        match self {
            Isa::Avx512 if rows <= 4 && quantized => (4, 4),
            Isa::Avx512 if rows <= 4 => (12, decode_panels()),
            // Five or six rows of float weights (a speculative step verifying four or
            // five drafted tokens): one block, three panels side by side. One block
            // means every weight is widened once; three panels give each row three
            // chains of fused multiply-adds and three weight streams. A block of 16
            // rows × 1 panel left five rows five chains, too few to hide the FMA's
            // latency, and measured slowest of the three shapes tried (BENCHMARKS.md,
            // "Figures that were in code comments"). NVFP4 and Q8_0 weights, whose
            // widening takes more registers, take 8 × 2 (6 × 3 measured no better).
            Isa::Avx512 if rows <= 6 && !quantized => (6, 3),
            // Up to eight rows fit one block of 8, so every weight is widened once.
            Isa::Avx512 if rows <= 8 => (8, 2),
            // A larger batch: as measured at load (`calibrate_batch_tile`).
            Isa::Avx512 if rows <= 16 => batch_tile(),
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

/// A weight matrix packed for [`matmul`].
#[derive(Clone)]
pub struct Packed {
    n: usize,
    k: usize,
    data: Data,
}

#[derive(Clone)]
enum Data {
    F32(Buf<f32>),
    /// Raw bf16 bits.
    Bf16(Buf<u16>),
    Nvfp4(Nvfp4),
    Q8(Q8),
}

/// Q8_0 panels ([`crate::formats::q8`]): per panel, `k` rows of 16 codes (`[kk][16]`,
/// column `j` in lane `j`) and `k/32` rows of 16 f16 scale bits.
#[derive(Clone)]
struct Q8 {
    codes: Buf<i8>,
    scales: Buf<u16>,
}

/// NVFP4 panels: per panel, `k/8` rows of 16 little-endian u32 (lane `j` holds column
/// `j`'s eight codes for `kk = 8t..8t + 8`, `kk = 8t + i` in bits `4i..4i + 4`; see
/// [`fp4_byte`]), and `k/16` rows of 16 block-scale bytes. A kernel shifts a row of
/// lanes right by four between lookups instead of widening bytes to lanes.
#[derive(Clone)]
struct Nvfp4 {
    codes: Buf<u8>,
    scales: Buf<u8>,
    /// What a block with scale byte `s` multiplies its FP4 values by, per stacked
    /// member: `(first panel, table, form)`, in panel order (one entry unless
    /// [`Packed::stack`]ed from tensors with different global scales). `form`, where
    /// present, computes the table's value for every scale byte the member holds.
    divisors: Vec<(usize, Box<[f32; 256]>, Option<Form>)>,
}

impl Nvfp4 {
    /// The table and form of `panel` and how many panels from it share them.
    fn table(&self, panel: usize) -> (&[f32; 256], Option<Form>, usize) {
        let at = self.divisors.partition_point(|(first, ..)| *first <= panel) - 1;
        let end = self.divisors.get(at + 1).map_or(usize::MAX, |(first, ..)| *first);
        (&self.divisors[at].1, self.divisors[at].2, end - panel)
    }
}

/// A block's factor computed rather than looked up: the scale byte's E4M3 value, as the
/// byte shifted left by 20 into an f32 (its exponent and mantissa fields) times 2^120,
/// then divided by `value` or multiplied by it, as [`crate::TensorScale::divisor`]
/// computes it for compressed-tensors and ModelOpt checkpoints.
///
/// Why: the AVX-512 and AVX2 kernels otherwise gather sixteen entries of the 256-entry
/// table per block and panel, and a gather costs more on AMD's Zen 4 and Zen 5 than the
/// shift and two arithmetic instructions that replace it (BENCHMARKS.md, "Figures that were in code comments").
/// A form is kept only where it gives the table's bits for every scale byte the tensor
/// holds ([`Form::matches`]): negative bytes and the NaN byte 0x7F fall outside it, and
/// such a tensor keeps the table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Form {
    /// Divide by `value` (compressed-tensors) or multiply by it (ModelOpt).
    pub divide: bool,
    /// The tensor's global scale.
    pub value: f32,
}

/// 2^120: an f32 whose exponent field holds an E4M3 exponent (bias 7) is that value
/// times 2^-120 (bias 127), subnormals included.
pub(crate) const E4M3_UNBIAS: f32 = f32::from_bits((120 + 127) << 23);

impl Form {
    /// The factor of scale byte `s`, with the kernels' arithmetic.
    pub(crate) fn apply(self, s: u8) -> f32 {
        let e4m3 = f32::from_bits(u32::from(s) << 20) * E4M3_UNBIAS;
        if self.divide {
            e4m3 / self.value
        } else {
            e4m3 * self.value
        }
    }

    /// Whether the form gives `table`'s bits for every byte of `scales`.
    fn matches(self, table: &[f32; 256], scales: &[u8]) -> bool {
        let mut seen = [false; 256];
        for &s in scales {
            seen[usize::from(s)] = true;
        }
        (0..=255u8)
            .filter(|&s| seen[usize::from(s)])
            .all(|s| self.apply(s).to_bits() == table[usize::from(s)].to_bits())
    }
}

/// Where the code of column `j` at depth `kk` lies in a panel's packed codes: its byte
/// (the low nibble for even `kk`, the high one for odd).
pub(super) fn fp4_byte(kk: usize, j: usize) -> usize {
    kk / 8 * 4 * NR + j * 4 + kk % 8 / 2
}

/// The FP4 values of codes 0..=15 (code 8 is -0.0), in the order a 16-lane table
/// lookup takes them.
fn fp4_table() -> [f32; 16] {
    std::array::from_fn(|c| fp4::decode(c as u8))
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("format", &self.format())
            .finish()
    }
}

/// Panels covering `n` columns.
fn panels(n: usize) -> usize {
    n.div_ceil(NR)
}

/// Repacks a row-major `[n, k]` matrix into panels (`[panel][kk][16]`, columns past `n`
/// zero).
fn pack_panels<T: Copy + Default + Send + Sync>(w: &[T], n: usize, k: usize) -> Vec<T> {
    let mut out = vec![T::default(); panels(n) * k * NR];
    out.par_chunks_mut(k * NR).enumerate().for_each(|(p, panel)| {
        for j in 0..NR.min(n - p * NR) {
            let row = &w[(p * NR + j) * k..(p * NR + j + 1) * k];
            for (kk, &v) in row.iter().enumerate() {
                panel[kk * NR + j] = v;
            }
        }
    });
    out
}

/// Repacks a row-major `[n, k]` bf16 matrix into panels of `kk` pairs:
/// `[panel][kk / 2][16][2]`, so one 64-byte load holds two consecutive `kk` of sixteen
/// columns and each `kk` is widened by a shift (even) or a mask (odd), with no lane
/// crossing. An odd `k` gets a zero pair partner; columns past `n` are zero.
fn pack_pairs(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    let depth = k.next_multiple_of(2);
    let mut out = vec![0u16; panels(n) * depth * NR];
    out.par_chunks_mut(depth * NR).enumerate().for_each(|(p, panel)| {
        for j in 0..NR.min(n - p * NR) {
            let row = &w[(p * NR + j) * k..(p * NR + j + 1) * k];
            for (kk, &v) in row.iter().enumerate() {
                panel[bf16_at(kk, j)] = v;
            }
        }
    });
    out
}

/// Where column `j`'s bf16 weight at `kk` is in a panel of `kk` pairs.
#[inline(always)]
pub(crate) fn bf16_at(kk: usize, j: usize) -> usize {
    kk / 2 * 2 * NR + j * 2 + kk % 2
}

fn check_len(
    rows: usize,
    cols: usize,
    dtype: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::WrongLength {
            rows,
            cols,
            dtype,
            expected,
            actual,
        })
    }
}

impl Packed {
    /// Packs f32 weights (`n × k`, row-major).
    pub fn from_f32(w: &[f32], n: usize, k: usize) -> Result<Packed, KernelError> {
        check_len(n, k, "f32", n * k * 4, w.len() * 4)?;
        Ok(Packed {
            n,
            k,
            data: Data::F32(pack_panels(w, n, k).into()),
        })
    }

    /// Packs bf16 weights given as their raw bits (`n × k`, row-major).
    pub fn from_bf16(w: &[u16], n: usize, k: usize) -> Result<Packed, KernelError> {
        check_len(n, k, "bf16", n * k * 2, w.len() * 2)?;
        Ok(Packed {
            n,
            k,
            data: Data::Bf16(pack_pairs(w, n, k).into()),
        })
    }

    /// [`Packed::from_nvfp4`] with the factors of `scale`
    /// ([`crate::TensorScale::divisor`]), which the x86 kernels compute instead of
    /// looking them up wherever that gives the same bits (see [`Form`]).
    pub fn from_nvfp4_scale(
        codes: &[u8],
        scales: &[u8],
        scale: &crate::TensorScale,
        n: usize,
        k: usize,
    ) -> Result<Packed, KernelError> {
        let mut packed = Packed::from_nvfp4(codes, scales, |s| scale.divisor(s), n, k)?;
        let form = Form {
            divide: scale.divides(),
            value: scale.value(),
        };
        if let Data::Nvfp4(q) = &mut packed.data
            && let [(_, table, kept)] = q.divisors.as_mut_slice()
            && form.matches(table, scales)
        {
            *kept = Some(form);
        }
        Ok(packed)
    }

    /// Whether the kernels compute this NVFP4 weight's block factors rather than look
    /// them up (every stacked member's; false for other formats).
    pub fn computes_factors(&self) -> bool {
        matches!(&self.data, Data::Nvfp4(q) if q.divisors.iter().all(|(.., form)| form.is_some()))
    }

    /// Packs an NVFP4 weight from its checkpoint layout: `codes` `n × k/2` bytes (even
    /// element in the low nibble), `scales` `n × k/16` E4M3 bytes, and `divisor(s)` the
    /// factor a block with scale byte `s` is multiplied by
    /// ([`crate::TensorScale::divisor`]). The kernels look the factors up in a table of
    /// `divisor`'s 256 values.
    pub fn from_nvfp4(
        codes: &[u8],
        scales: &[u8],
        divisor: impl Fn(u8) -> f32,
        n: usize,
        k: usize,
    ) -> Result<Packed, KernelError> {
        if !k.is_multiple_of(crate::BLOCK) {
            return Err(KernelError::NotBlockAligned { cols: k });
        }
        check_len(n, k, "fp4", n * k / 2, codes.len())?;
        check_len(n, k / crate::BLOCK, "fp8", n * k / crate::BLOCK, scales.len())?;
        let p = panels(n);
        let mut packed_codes = vec![0u8; p * k / 2 * NR];
        packed_codes
            .par_chunks_mut(k / 2 * NR)
            .enumerate()
            .for_each(|(panel, dst)| {
                for j in 0..NR.min(n - panel * NR) {
                    let row = &codes[(panel * NR + j) * k / 2..(panel * NR + j + 1) * k / 2];
                    // The checkpoint's byte t holds elements 2t (low) and 2t+1 (high):
                    // the pair this layout puts in one byte too.
                    for (t, &byte) in row.iter().enumerate() {
                        dst[fp4_byte(2 * t, j)] = byte;
                    }
                }
            });
        let blocks = k / crate::BLOCK;
        let mut packed_scales = vec![0u8; p * blocks * NR];
        for (panel, dst) in packed_scales.chunks_mut(blocks * NR).enumerate() {
            for j in 0..NR.min(n - panel * NR) {
                let row = &scales[(panel * NR + j) * blocks..(panel * NR + j + 1) * blocks];
                for (b, &s) in row.iter().enumerate() {
                    dst[b * NR + j] = s;
                }
            }
        }
        Ok(Packed {
            n,
            k,
            data: Data::Nvfp4(Nvfp4 {
                codes: packed_codes.into(),
                scales: packed_scales.into(),
                divisors: vec![(0, Box::new(std::array::from_fn(|s| divisor(s as u8))), None)],
            }),
        })
    }

    /// Quantizes f32 weights (`n × k`, row-major; `k` a multiple of 32) to llama.cpp's
    /// Q8_0 ([`crate::formats::q8`]): each row's blocks of 32 values get an f16 scale
    /// and 8-bit codes, 8.5 bits a value. Products read the codes and widen them in
    /// registers (`code · scale`, the value [`Packed::row`] gives).
    pub fn q8_0(w: &[f32], n: usize, k: usize) -> Result<Packed, KernelError> {
        check_len(n, k, "f32", n * k * 4, w.len() * 4)?;
        Packed::q8_0_rows(n, k, |r, out| out.copy_from_slice(&w[r * k..(r + 1) * k]))
    }

    /// [`Packed::q8_0`] of the matrix whose row `r` `row(r, out)` writes into `out`
    /// (`k` values), so that a large embedding is quantized straight from its file
    /// without an f32 copy of the whole of it. Rows are read in parallel, each once.
    pub fn q8_0_rows(
        n: usize,
        k: usize,
        row: impl Fn(usize, &mut [f32]) + Sync,
    ) -> Result<Packed, KernelError> {
        use crate::formats::q8::{self, BLOCK};
        if !k.is_multiple_of(BLOCK) {
            return Err(KernelError::NotQ8Aligned { cols: k });
        }
        let p = panels(n);
        let blocks = k / BLOCK;
        let mut codes = vec![0i8; p * k * NR];
        let mut scales = vec![0u16; p * blocks * NR];
        codes
            .par_chunks_mut(k * NR)
            .zip(scales.par_chunks_mut(blocks * NR))
            .enumerate()
            .for_each(|(panel, (codes, scales))| {
                let mut values = vec![0.0f32; k];
                for j in 0..NR.min(n - panel * NR) {
                    row(panel * NR + j, &mut values);
                    for (b, block) in values.chunks_exact(BLOCK).enumerate() {
                        let block: &[f32; BLOCK] = block.try_into().expect("chunks of BLOCK");
                        let (scale, q) = q8::quantize(block);
                        scales[b * NR + j] = scale;
                        for (i, c) in q.into_iter().enumerate() {
                            codes[(b * BLOCK + i) * NR + j] = c;
                        }
                    }
                }
            });
        Ok(Packed {
            n,
            k,
            data: Data::Q8(Q8 {
                codes: codes.into(),
                scales: scales.into(),
            }),
        })
    }

    /// Output columns (`n`).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns (`k`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// `f32`, `bf16`, `nvfp4` or `q8_0`.
    pub fn format(&self) -> &'static str {
        match self.data {
            Data::F32(_) => "f32",
            Data::Bf16(_) => "bf16",
            Data::Nvfp4(_) => "nvfp4",
            Data::Q8(_) => "q8_0",
        }
    }

    /// Bytes [`Packed::q8_0`] of an `n × k` matrix takes in memory, without the matrix:
    /// a code per value and an f16 scale per 32, for rows padded to whole panels.
    pub fn q8_0_bytes(n: usize, k: usize) -> u64 {
        let values = (panels(n) * NR * k) as u64;
        values + values / crate::formats::q8::BLOCK as u64 * 2
    }

    /// Bytes the packed weight takes in memory.
    pub fn bytes(&self) -> u64 {
        let b = match &self.data {
            Data::F32(v) => v.len() * 4,
            Data::Bf16(v) => v.len() * 2,
            Data::Nvfp4(q) => q.codes.len() + q.scales.len() + q.divisors.len() * 256 * 4,
            Data::Q8(q) => q.codes.len() + q.scales.len() * 2,
        };
        b as u64
    }

    /// One matrix of the rows of `parts`, in order (q, k and v; gate and up), so that
    /// one product computes them all. Every part but the last must have a multiple of
    /// 16 rows (a panel never mixes two parts), and all must have the same `k` and
    /// format.
    pub fn stack(parts: Vec<Packed>) -> Result<Packed, StackError> {
        let mut parts = parts.into_iter();
        let Some(mut out) = parts.next() else {
            return Err(StackError::Empty);
        };
        for part in parts {
            if !out.n.is_multiple_of(NR) {
                return Err(StackError::Unaligned { rows: out.n });
            }
            if part.k != out.k || part.format() != out.format() {
                return Err(StackError::Mismatch {
                    first: (out.format(), out.k),
                    other: (part.format(), part.k),
                });
            }
            let first_panel = panels(out.n);
            match (&mut out.data, part.data) {
                (Data::F32(a), Data::F32(b)) => a.vec_mut().extend_from_slice(&b),
                (Data::Bf16(a), Data::Bf16(b)) => a.vec_mut().extend_from_slice(&b),
                (Data::Nvfp4(a), Data::Nvfp4(b)) => {
                    a.codes.vec_mut().extend_from_slice(&b.codes);
                    a.scales.vec_mut().extend_from_slice(&b.scales);
                    for (first, table, form) in b.divisors {
                        if a.divisors
                            .last()
                            .is_some_and(|(_, t, f)| **t == *table && *f == form)
                        {
                            continue;
                        }
                        a.divisors.push((first_panel + first, table, form));
                    }
                }
                (Data::Q8(a), Data::Q8(b)) => {
                    a.codes.vec_mut().extend_from_slice(&b.codes);
                    a.scales.vec_mut().extend_from_slice(&b.scales);
                }
                _ => unreachable!("formats compared above"),
            }
            out.n += part.n;
        }
        Ok(out)
    }

    /// The first byte of the matrix's (first) buffer (tests).
    #[cfg(test)]
    pub(crate) fn first_byte(&self) -> *const u8 {
        match &self.data {
            Data::F32(v) => v.as_ptr().cast(),
            Data::Bf16(v) => v.as_ptr().cast(),
            Data::Nvfp4(q) => q.codes.as_ptr(),
            Data::Q8(q) => q.codes.as_ptr().cast(),
        }
    }

    /// Row `r` of the matrix as f32 (an embedding lookup): the values the product uses.
    pub fn row(&self, r: usize, out: &mut [f32]) {
        let (panel, j) = (r / NR, r % NR);
        let k = self.k;
        match &self.data {
            Data::F32(v) => {
                let base = panel * k * NR + j;
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    *o = v[base + kk * NR];
                }
            }
            Data::Bf16(v) => {
                let base = panel * k.next_multiple_of(2) * NR;
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    *o = f32::from_bits(u32::from(v[base + bf16_at(kk, j)]) << 16);
                }
            }
            Data::Nvfp4(q) => {
                let table = fp4_table();
                let codes = &q.codes[panel * k / 2 * NR..];
                let scales = &q.scales[panel * k / crate::BLOCK * NR..];
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    let byte = codes[fp4_byte(kk, j)];
                    let code = if kk.is_multiple_of(2) {
                        byte & 0xF
                    } else {
                        byte >> 4
                    };
                    let factor = q.table(panel).0[usize::from(scales[kk / crate::BLOCK * NR + j])];
                    *o = table[usize::from(code)] * factor;
                }
            }
            Data::Q8(q) => {
                use crate::formats::q8::{BLOCK, value};
                let codes = &q.codes[panel * k * NR..];
                let scales = &q.scales[panel * k / BLOCK * NR..];
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    *o = value(codes[kk * NR + j], scales[kk / BLOCK * NR + j]);
                }
            }
        }
    }
}

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
    fn check(&self, np: usize, kc: usize) {
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

fn run_tile(isa: Isa, tile: &mut Tile) {
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

/// `out = x · wᵀ`: `x` is `rows × k`, `out` `rows × n`, row-major.
pub fn matmul(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    matmul_with(Isa::current(), x, rows, w, out);
}

/// [`matmul`] in bf16 arithmetic: the inputs are rounded to bf16 (to nearest, ties to
/// even) and multiplied with bf16 weights, accumulating in f32, as llama.cpp's and
/// PyTorch's bf16 CPU kernels do. On a CPU with AVX512-BF16, products of bf16 weights
/// use its dot-product instruction (`vdpbf16ps`: two products per lane per instruction,
/// twice the f32 rate, and no widening of the weights); elsewhere the f32 kernels run on
/// the rounded inputs. Either way every product of the same weights takes the same
/// kernel, whatever its number of rows, so a row's bits do not depend on what shares
/// its product (a decode step alone, in a batch, or verifying drafted tokens): the
/// instruction adds its two products in its own order, so mixing it with the f32
/// kernels by row count changed greedy tokens when sequences were batched or
/// speculated. Weights that are not bf16 go through [`matmul`] on the rounded inputs.
///
/// Whether the dot-product instruction is used is measured at load
/// ([`calibrate_bf16_dot`]): it is not faster on every CPU that has it.
pub fn matmul_bf16(x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    matmul_bf16_with(BF16_DOT.load(Ordering::Relaxed), x, rows, w, out);
}

/// Whether [`matmul_bf16`] uses AVX512-BF16's dot product
/// where the CPU has it; until [`calibrate_bf16_dot`] measures otherwise, it does.
static BF16_DOT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// [`matmul_bf16`] with the dot-product kernel allowed (`dot`) or not.
fn matmul_bf16_with(dot: bool, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let isa = Isa::current();
    #[cfg(target_arch = "x86_64")]
    if let Data::Bf16(_) = w.data
        && dot
        && isa == Isa::Avx512
        && x86::avx512_bf16()
        && w.n.is_multiple_of(NR)
    {
        let (n, k) = (w.n, w.k);
        assert_eq!(x.len(), rows * k, "x is not rows × k");
        assert_eq!(out.len(), rows * n, "out is not rows × n");
        // The inputs are rounded as they are packed, by each task for its own rows,
        // not copied whole first on one thread.
        if rows > BY_COLUMNS_MAX {
            // Many rows (past `BY_COLUMNS_MAX`, as in `matmul_with`): tasks own blocks
            // of rows.
            row_tasks(x, rows, k, x86::DP_MR, out, n).for_each(|(xs, o)| {
                let r = xs.len() / k;
                let a = x86::pack_bf16_pairs(xs, r, k, x86::DP_MR);
                x86::dot_bf16(&a, r, (x86::DP_MR, x86::DP_NP), w, 0, n / NR, o, n);
            });
        } else {
            // A batch of decodes: one block of rows (tiles of 8 rows × 3 panels past
            // 16), tasks own panels.
            let (mr, np) = if rows <= x86::DP_MR_MAX {
                (rows, 1)
            } else {
                (x86::DP_MR, x86::DP_NP)
            };
            let a = x86::pack_bf16_pairs(x, rows, k, mr);
            by_columns(rows, w, np, out, |first, count, c| {
                x86::dot_bf16(&a, rows, (mr, np), w, first, count, c, count * NR);
            });
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = dot;
    let rounded: Vec<f32> = x.iter().map(|&v| round_bf16(v)).collect();
    matmul_with(isa, &rounded, rows, w, out);
}

/// What [`calibrate_bf16_dot`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct Bf16DotCalibration {
    /// Whether bf16 products use the dot-product instruction from now on.
    pub dot: bool,
    /// The fastest of a few 64-row products with it and with the f32 kernels, in
    /// seconds (`None` when `SOUS_BF16_DOT` chose).
    pub seconds: Option<(f64, f64)>,
}

impl std::fmt::Display for Bf16DotCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kernel = if self.dot {
            "AVX512-BF16 dot products"
        } else {
            "f32 multiply-adds on the rounded inputs"
        };
        write!(f, "{kernel}")?;
        match self.seconds {
            None => write!(f, " (SOUS_BF16_DOT)"),
            Some((dot, fma)) => write!(
                f,
                " (measured: dot products {:.2} ms, multiply-adds {:.2} ms)",
                dot * 1e3,
                fma * 1e3
            ),
        }
    }
}

/// Measures 64-row bf16-arithmetic products of `w` (a layer's bf16 matrix) with
/// AVX512-BF16's dot product (`vdpbf16ps`) and with the f32 kernels on the rounded
/// inputs, and keeps the faster for every later [`matmul_bf16`] of the process (the first
/// call decides; later ones return its choice), one row or many (one
/// kernel for all, so that batching never changes a row's bits);
/// `SOUS_BF16_DOT` (`on` or `off`) chooses without measuring. `None` where there is
/// nothing to choose: no AVX512-BF16, or `w` not bf16.
///
/// Why measure: the instruction does two products per lane, but not at the same rate
/// on every CPU: on one Sapphire-Rapids-class Xeon it doubled a layer's speed, on
/// another of the same class it was slower than the f32 kernels, issuing one `vdpbf16ps`
/// every two cycles (BENCHMARKS.md, "Figures that were in code comments").
pub fn calibrate_bf16_dot(w: &Packed) -> Option<Bf16DotCalibration> {
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::current() != Isa::Avx512 || !x86::avx512_bf16() || w.bf16_panels().is_none() || w.n == 0 {
            return None;
        }
        // Once per process: a second engine loaded in it (the tests load many) must not
        // switch the kernel under the first, whose tokens would then change.
        static DECIDED: std::sync::OnceLock<Bf16DotCalibration> = std::sync::OnceLock::new();
        Some(DECIDED.get_or_init(|| measure_bf16_dot(w)).clone())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        None
    }
}

/// [`calibrate_bf16_dot`]'s choice, made and stored.
#[cfg(target_arch = "x86_64")]
fn measure_bf16_dot(w: &Packed) -> Bf16DotCalibration {
    if let Some(choice @ ("on" | "off")) = std::env::var("SOUS_BF16_DOT").ok().as_deref().map(str::trim) {
        let dot = choice == "on";
        BF16_DOT.store(dot, Ordering::Relaxed);
        return Bf16DotCalibration { dot, seconds: None };
    }
    let rows = 64;
    let x: Vec<f32> = (0..rows * w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; rows * w.n];
    let mut fastest = |dot: bool| {
        matmul_bf16_with(dot, &x, rows, w, &mut out);
        (0..3)
            .map(|_| {
                let started = Instant::now();
                matmul_bf16_with(dot, &x, rows, w, &mut out);
                started.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (with_dot, with_fma) = (fastest(true), fastest(false));
    let dot = with_dot <= with_fma;
    BF16_DOT.store(dot, Ordering::Relaxed);
    Bf16DotCalibration {
        dot,
        seconds: Some((with_dot, with_fma)),
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as an f32.
pub fn round_bf16(v: f32) -> f32 {
    let bits = v.to_bits();
    if v.is_nan() {
        return v;
    }
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}

impl Packed {
    /// Whether the weights are integer codes widened with a scale (NVFP4, Q8_0), which
    /// takes more of a tile's registers and instructions than a float weight.
    fn quantized(&self) -> bool {
        matches!(self.data, Data::Nvfp4(_) | Data::Q8(_))
    }

    /// The bf16 panels and their per-panel stride, if the weight is bf16.
    #[cfg(target_arch = "x86_64")]
    fn bf16_panels(&self) -> Option<(&[u16], usize)> {
        match &self.data {
            Data::Bf16(v) => Some((v, self.k.next_multiple_of(2) * NR)),
            _ => None,
        }
    }
}

/// [`matmul`] on a given instruction set (one of [`Isa::available`]).
pub fn matmul_with(isa: Isa, x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), rows * k, "x is not rows × k");
    assert_eq!(out.len(), rows * n, "out is not rows × n");
    if rows == 0 || n == 0 {
        return;
    }
    let tile = isa.tile(rows, w.quantized());
    matmul_tiled(isa, tile, x, rows, w, out);
}

/// [`matmul_with`] in register tiles of `mr` rows and `np` panels.
fn matmul_tiled(isa: Isa, (mr, np): (usize, usize), x: &[f32], rows: usize, w: &Packed, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    let total = panels(n);
    if rows > BY_COLUMNS_MAX && n.is_multiple_of(NR) {
        // Many rows are bound by arithmetic: tasks own blocks of rows, pack only their
        // own inputs and write straight into their rows of `out`; each reads every
        // weight once (from L2/L3: a layer's weights are a few MB).
        row_tasks(x, rows, k, mr, out, n).for_each(|(xs, o)| {
            let r = xs.len() / k;
            with_packed_rows(xs, r, k, mr, |a| columns(isa, (mr, np), a, r, w, 0, total, o));
        });
        return;
    }
    let a = pack_rows(x, rows, k, mr);
    by_columns(rows, w, np, out, |first, count, c| {
        columns(isa, (mr, np), &a, rows, w, first, count, c);
    });
}

/// The inputs `x` (`rows × k`) and outputs `out` (`rows × n`) of a product of many rows,
/// split into about four tasks per thread of whole `mr`-row tiles, as even as whole
/// tiles allow: equal chunks rounded up to whole tiles left the last task short, and on
/// two threads one thread a tile or more behind the other (512 rows in tiles of 12:
/// seven tasks of 72 rows and one of 8).
fn row_tasks<'a>(
    x: &'a [f32],
    rows: usize,
    k: usize,
    mr: usize,
    out: &'a mut [f32],
    n: usize,
) -> impl ParallelIterator<Item = (&'a [f32], &'a mut [f32])> {
    let tiles = rows.div_ceil(mr);
    let tasks = tiles.min(4 * rayon::current_num_threads()).max(1);
    let mut parts = Vec::with_capacity(tasks);
    let (mut x, mut out) = (x, out);
    let mut done = 0;
    for t in 0..tasks {
        let end = (tiles * (t + 1) / tasks * mr).min(rows);
        let (xs, x_rest) = x.split_at((end - done) * k);
        let (o, out_rest) = out.split_at_mut((end - done) * n);
        parts.push((xs, o));
        (x, out, done) = (x_rest, out_rest, end);
    }
    parts.into_par_iter()
}

/// Panels that products of up to four rows of f32 or bf16 weights read side by side
/// with AVX-512 (NVFP4 always takes four; see [`Isa::tile`]); 1 until
/// [`calibrate_decode_panels`] measures otherwise. The choice never changes a result:
/// every output is the same chain of fused multiply-adds whichever panels share a tile.
static DECODE_PANELS: AtomicUsize = AtomicUsize::new(1);

/// See [`DECODE_PANELS`].
pub fn decode_panels() -> usize {
    DECODE_PANELS.load(Ordering::Relaxed)
}

/// What [`calibrate_decode_panels`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeCalibration {
    /// Panels side by side from now on.
    pub panels: usize,
    /// The fastest of a few one-row products for each choice, in seconds (empty when
    /// `SOUS_DECODE_PANELS` chose).
    pub seconds: Vec<(usize, f64)>,
}

impl std::fmt::Display for DecodeCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} panel(s) side by side in one-row products", self.panels)?;
        if self.seconds.is_empty() {
            return write!(f, " (SOUS_DECODE_PANELS)");
        }
        let times: Vec<String> = self
            .seconds
            .iter()
            .map(|(np, s)| format!("{np}: {:.2} ms", s * 1e3))
            .collect();
        write!(f, " (measured: {})", times.join(", "))
    }
}

/// Measures one-row products of `w` (the largest matrix of a model, so that it streams
/// from memory as decode does) with 1, 2 and 4 panels side by side and keeps the
/// fastest for every later product of up to four rows; `SOUS_DECODE_PANELS` (1 to 4)
/// chooses without measuring. `None` where there is nothing to choose: not the AVX-512
/// kernels, or NVFP4 weights. Takes about ten products of `w`.
pub fn calibrate_decode_panels(w: &Packed) -> Option<DecodeCalibration> {
    let isa = Isa::current();
    if isa != Isa::Avx512 || w.quantized() || w.n == 0 {
        return None;
    }
    if let Some(np) = std::env::var("SOUS_DECODE_PANELS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|np| (1..=4).contains(np))
    {
        DECODE_PANELS.store(np, Ordering::Relaxed);
        return Some(DecodeCalibration {
            panels: np,
            seconds: Vec::new(),
        });
    }
    let x: Vec<f32> = (0..w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; w.n];
    let mut seconds = Vec::with_capacity(3);
    for np in [1, 2, 4] {
        seconds.push((np, fastest_of_three(isa, (12, np), &x, 1, w, &mut out)));
    }
    let panels = seconds
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1, |(np, _)| *np);
    DECODE_PANELS.store(panels, Ordering::Relaxed);
    Some(DecodeCalibration { panels, seconds })
}

/// The register tiles a product of 9 to 16 rows (a batch of decode steps) may take with
/// AVX-512: one block of up to 16 rows, so that every weight is widened once (fastest on
/// a Zen 4), or blocks of 8 rows with two panels side by side (fastest on a
/// Sapphire-Rapids-class Xeon; BENCHMARKS.md, "Figures that were in code comments").
const BATCH_TILES: [(usize, usize); 2] = [(16, 1), (8, 2)];

/// Which of [`BATCH_TILES`] products of 9 to 16 rows take; the first until
/// [`calibrate_batch_tile`] measures otherwise. Results do not depend on it.
static BATCH_TILE: AtomicUsize = AtomicUsize::new(0);

/// See [`BATCH_TILE`]: `(rows, panels)` of the tile.
pub fn batch_tile() -> (usize, usize) {
    BATCH_TILES[BATCH_TILE.load(Ordering::Relaxed)]
}

/// What [`calibrate_batch_tile`] chose, and from what.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCalibration {
    /// Rows and panels per tile from now on.
    pub tile: (usize, usize),
    /// The fastest of a few 16-row products for each tile, in seconds (empty when
    /// `SOUS_BATCH_TILE` chose).
    pub seconds: Vec<((usize, usize), f64)>,
}

impl std::fmt::Display for BatchCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mr, np) = self.tile;
        write!(f, "tiles of {mr} rows × {np} panel(s) for 9 to 16 rows")?;
        if self.seconds.is_empty() {
            return write!(f, " (SOUS_BATCH_TILE)");
        }
        let times: Vec<String> = self
            .seconds
            .iter()
            .map(|((mr, np), s)| format!("{mr}x{np}: {:.2} ms", s * 1e3))
            .collect();
        write!(f, " (measured: {})", times.join(", "))
    }
}

/// Measures 16-row products of `w` (the model's largest matrix, read from memory as a
/// batch of decode steps reads it) with each of [`BATCH_TILES`] and keeps the fastest
/// for every later product of 9 to 16 rows; `SOUS_BATCH_TILE` (`16x1` or `8x2`) chooses
/// without measuring. `None` where there is nothing to choose (not the AVX-512 kernels).
/// Takes about eight products of `w`.
pub fn calibrate_batch_tile(w: &Packed) -> Option<BatchCalibration> {
    let isa = Isa::current();
    if isa != Isa::Avx512 || w.n == 0 {
        return None;
    }
    let named = std::env::var("SOUS_BATCH_TILE").ok().and_then(|v| {
        BATCH_TILES
            .iter()
            .position(|(mr, np)| v.trim() == format!("{mr}x{np}"))
    });
    if let Some(choice) = named {
        BATCH_TILE.store(choice, Ordering::Relaxed);
        return Some(BatchCalibration {
            tile: BATCH_TILES[choice],
            seconds: Vec::new(),
        });
    }
    let rows = 16;
    let x: Vec<f32> = (0..rows * w.k).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let mut out = vec![0.0f32; rows * w.n];
    let mut seconds = Vec::with_capacity(BATCH_TILES.len());
    for tile in BATCH_TILES {
        seconds.push((tile, fastest_of_three(isa, tile, &x, rows, w, &mut out)));
    }
    let choice = (0..BATCH_TILES.len())
        .min_by(|&a, &b| seconds[a].1.total_cmp(&seconds[b].1))
        .unwrap_or(0);
    BATCH_TILE.store(choice, Ordering::Relaxed);
    Some(BatchCalibration {
        tile: BATCH_TILES[choice],
        seconds,
    })
}

/// Seconds of the fastest of three products of `rows` rows of `x` by `w` in `tile`,
/// after one to warm up (what the load-time calibrations compare).
fn fastest_of_three(
    isa: Isa,
    tile: (usize, usize),
    x: &[f32],
    rows: usize,
    w: &Packed,
    out: &mut [f32],
) -> f64 {
    matmul_tiled(isa, tile, x, rows, w, out);
    (0..3)
        .map(|_| {
            let started = Instant::now();
            matmul_tiled(isa, tile, x, rows, w, out);
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Few rows, bound by reading the weights: `product(first, count, c)` computes panels
/// `first..first + count` for every row into `c` (`rows × count·16`), in tasks of
/// whole multiples of `np` panels and about 64 KiB of weights each (many small tasks
/// balance best); the results are copied into `out` (`rows × n`).
fn by_columns(
    rows: usize,
    w: &Packed,
    np: usize,
    out: &mut [f32],
    product: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let n = w.n;
    let total = panels(n);
    let weight_bytes = (w.bytes() as usize / total).max(1);
    let per_task = (65536 / weight_bytes).max(1).next_multiple_of(np);
    if rows == 1 && n.is_multiple_of(NR) {
        // One row: each task's panels are a contiguous run of `out`.
        out.par_chunks_mut(per_task * NR)
            .enumerate()
            .for_each(|(t, c)| product(t * per_task, c.len() / NR, c));
        return;
    }
    let tasks = total.div_ceil(per_task);
    let results: Vec<Vec<f32>> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let first = t * per_task;
            let count = per_task.min(total - first);
            let mut c = vec![0.0f32; rows * count * NR];
            product(first, count, &mut c);
            c
        })
        .collect();
    for (t, c) in results.iter().enumerate() {
        let first = t * per_task * NR;
        let width = c.len() / rows;
        let valid = width.min(n - first);
        for (dst, src) in out.chunks_exact_mut(n).zip(c.chunks_exact(width)) {
            dst[first..first + valid].copy_from_slice(&src[..valid]);
        }
    }
}

/// Packs `x` (`rows × k`) into blocks of `mr` rows, `[k][width]` each (the last block
/// as wide as the rows left).
fn pack_rows(x: &[f32], rows: usize, k: usize, mr: usize) -> Vec<f32> {
    let mut a = vec![0.0f32; rows * k];
    pack_rows_into(x, k, mr, &mut a);
    a
}

/// [`pack_rows`] into `a` (`rows × k` values, every one overwritten): for each `kk`, the
/// block's `width` values are written side by side, so the stores are sequential and
/// the loads come from `width` rows at once.
fn pack_rows_into(x: &[f32], k: usize, mr: usize, a: &mut [f32]) {
    for (rows, block) in x.chunks(mr * k).zip(a.chunks_mut(mr * k)) {
        let width = block.len() / k;
        match width {
            12 => pack_block::<12>(rows, k, block),
            16 => pack_block::<16>(rows, k, block),
            8 => pack_block::<8>(rows, k, block),
            6 => pack_block::<6>(rows, k, block),
            4 => pack_block::<4>(rows, k, block),
            _ => {
                for (kk, column) in block.chunks_exact_mut(width).enumerate() {
                    for (m, v) in column.iter_mut().enumerate() {
                        *v = rows[m * k + kk];
                    }
                }
            }
        }
    }
}

/// One block of `W` rows, `rows` (`W × k`) into `block` (`[k][W]`).
#[inline]
fn pack_block<const W: usize>(rows: &[f32], k: usize, block: &mut [f32]) {
    let rows: [&[f32]; W] = std::array::from_fn(|m| &rows[m * k..(m + 1) * k]);
    for (kk, column) in block.chunks_exact_mut(W).enumerate() {
        for m in 0..W {
            column[m] = rows[m][kk];
        }
    }
}

/// Runs `f` on `x` packed by [`pack_rows`], in a buffer this thread keeps for the next
/// product: a prompt chunk's inputs are megabytes, and fresh pages for every product
/// (each faulted in and zeroed by the kernel) cost as much as the packing itself.
fn with_packed_rows<R>(x: &[f32], rows: usize, k: usize, mr: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len = rows * k;
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut buffer) => {
            if buffer.len() < len {
                buffer.resize(len, 0.0);
            }
            pack_rows_into(&x[..len], k, mr, &mut buffer[..len]);
            f(&buffer[..len])
        }
        // In use further up this thread's stack (a task stolen while waiting): a
        // buffer of its own.
        Err(_) => f(&pack_rows(x, rows, k, mr)),
    })
}

/// Computes panels `first..first + count` for every row into `c` (`rows × count·16`),
/// in tiles of `mr` rows (the blocks `a` was packed in) and up to `np` panels.
#[allow(clippy::too_many_arguments)]
fn columns(
    isa: Isa,
    (mr, np): (usize, usize),
    a: &[f32],
    rows: usize,
    w: &Packed,
    first: usize,
    count: usize,
    c: &mut [f32],
) {
    let k = w.k;
    let ldc = count * NR;
    // A few rows are bound by reading the weights: one pass over the whole depth reads
    // each panel front to back, which the prefetchers follow best.
    let depth = if rows <= mr { k } else { pass_depth(k) };
    // Stored weights widened to f32 once per pass, for every row tile of the pass to
    // read (see `widen`); empty until a pass has two tiles or more.
    let mut wide = Vec::new();
    for k0 in (0..k).step_by(depth) {
        let kc = depth.min(k - k0);
        for i0 in (0..rows).step_by(MC) {
            let i1 = (i0 + MC).min(rows);
            let mut p = 0;
            while p < count {
                let np = np.min(count - p).min(run_length(w, first + p));
                let mut panels = panel_slice(w, first + p, k0);
                if (i1 - i0) > mr && widen(isa, panels, np, kc, &mut wide) {
                    panels = Panels::F32 {
                        data: &wide,
                        stride: kc * NR,
                    };
                }
                let mut m = i0;
                while m < i1 {
                    let width = mr.min(rows - m);
                    // Block `m / mr` of the packed rows, from `kk = k0`.
                    let block = &a[m * k + k0 * width..];
                    let mut tile = Tile {
                        a: block,
                        mr: width,
                        kc,
                        panels,
                        np,
                        c: &mut c[m * ldc + p * NR..],
                        ldc,
                        accumulate: k0 > 0,
                    };
                    run_tile(isa, &mut tile);
                    m += width;
                }
                p += np;
            }
        }
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
/// multiply and a shift per sixteen values (a quarter of a 12-row AVX-512 tile's
/// vector instructions; more on AVX2, which looks up magnitude and sign apart), for
/// bf16 on AVX2 two integer instructions (14 % of a 6-row tile's). Widened once into a
/// buffer that stays in L2 (`np · depth · 16` f32: 72 KiB for two panels at SmolLM2's
/// depth of 576, at most 512 KiB for four at [`KC`]), the cost is paid once
/// per pass instead of once per tile, as BLIS packs its B panels. The weights stay in
/// their stored precision in memory: this is one pass's slice, never a matrix.
///
/// Measured on a 512-row layer of SmolLM2 (`cargo run -p sous-kernels --example gemm
/// 512`, two cores of a Sapphire-Rapids-class Xeon): NVFP4 300 → 347 GFLOP/s with
/// AVX-512 and 114 → 222 with AVX2, bf16 205 → 220 with AVX2. bf16 with AVX-512 is not
/// widened: its tiles read half the bytes of f32 ones and widen in two instructions
/// per 48 multiply-adds, and it ran at 345-351 GFLOP/s in registers against 323-329
/// from the buffer.
fn widen(isa: Isa, panels: Panels, np: usize, kc: usize, wide: &mut Vec<f32>) -> bool {
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
fn panel_slice(w: &Packed, panel: usize, k0: usize) -> Panels<'_> {
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
fn run_length(w: &Packed, panel: usize) -> usize {
    match &w.data {
        Data::Nvfp4(q) => q.table(panel).2,
        _ => usize::MAX,
    }
}

/// Why [`Packed::stack`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StackError {
    /// Nothing to stack.
    #[error("no matrices to stack")]
    Empty,
    /// A part other than the last has rows that do not fill whole panels.
    #[error("a stacked part has {rows} rows, not a multiple of 16")]
    Unaligned {
        /// Its rows.
        rows: usize,
    },
    /// Parts differ in format or input columns.
    #[error("cannot stack a {} matrix of {} columns on a {} matrix of {} columns", other.0, other.1, first.0, first.1)]
    Mismatch {
        /// Format and `k` of the first part.
        first: (&'static str, usize),
        /// Those of the part refused.
        other: (&'static str, usize),
    },
}

/// Moves every buffer of `weights` into one mapping advised for transparent huge pages
/// ([`crate::pages`] says why and how). Nothing moves, and `Ok(None)` comes back, where
/// `SOUS_HUGE_PAGES=off` says so or there is nothing to move; an error (the mapping could
/// not be made) leaves every buffer where it was. The values are the same bytes either
/// way.
pub fn place(weights: &mut [&mut Packed]) -> std::io::Result<Option<crate::pages::Placement>> {
    crate::pages::place(weights)
}

impl crate::pages::Placeable for Packed {
    /// Hands each of the matrix's buffers to `f` ([`crate::pages::place`]).
    fn for_each_buf(&mut self, f: &mut dyn FnMut(&mut dyn Movable)) {
        match &mut self.data {
            Data::F32(v) => f(v),
            Data::Bf16(v) => f(v),
            Data::Nvfp4(q) => {
                f(&mut q.codes);
                f(&mut q.scales);
            }
            Data::Q8(q) => {
                f(&mut q.codes);
                f(&mut q.scales);
            }
        }
    }
}

#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod tests;

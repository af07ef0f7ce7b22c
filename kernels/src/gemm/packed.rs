//! Weight matrices packed for the products ([`Packed`]): the panel layouts of f32,
//! bf16, NVFP4 and Q8_0 weights, packing from a checkpoint's row-major layout, stacking
//! several matrices into one, reading a row back, and handing the buffers to
//! [`crate::pages`]. Not here: the products that read the panels.

use rayon::prelude::*;

use super::NR;
use crate::KernelError;
use crate::formats::fp4;
use crate::pages::{Buf, Movable};

/// A weight matrix packed for [`super::matmul`].
#[derive(Clone)]
pub struct Packed {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) data: Data,
}

#[derive(Clone)]
pub(super) enum Data {
    F32(Buf<f32>),
    /// Raw bf16 bits.
    Bf16(Buf<u16>),
    Nvfp4(Nvfp4),
    Q8(Q8),
}

/// Q8_0 panels ([`crate::formats::q8`]): per panel, `k` rows of 16 codes (`[kk][16]`,
/// column `j` in lane `j`) and `k/32` rows of 16 f16 scale bits.
#[derive(Clone)]
pub(super) struct Q8 {
    pub(super) codes: Buf<i8>,
    pub(super) scales: Buf<u16>,
}

/// NVFP4 panels: per panel, `k/8` rows of 16 little-endian u32 (lane `j` holds column
/// `j`'s eight codes for `kk = 8t..8t + 8`, `kk = 8t + i` in bits `4i..4i + 4`; see
/// [`fp4_byte`]), and `k/16` rows of 16 block-scale bytes. A kernel shifts a row of
/// lanes right by four between lookups instead of widening bytes to lanes.
#[derive(Clone)]
pub(super) struct Nvfp4 {
    pub(super) codes: Buf<u8>,
    pub(super) scales: Buf<u8>,
    /// What a block with scale byte `s` multiplies its FP4 values by, per stacked
    /// member: `(first panel, table, form)`, in panel order (one entry unless
    /// [`Packed::stack`]ed from tensors with different global scales). `form`, where
    /// present, computes the table's value for every scale byte the member holds.
    pub(super) divisors: Vec<(usize, Box<[f32; 256]>, Option<Form>)>,
}

impl Nvfp4 {
    /// The table and form of `panel` and how many panels from it share them.
    pub(super) fn table(&self, panel: usize) -> (&[f32; 256], Option<Form>, usize) {
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
/// shift and two arithmetic instructions that replace it (benchmarks/native.md, "Figures that were in code comments").
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
pub(super) fn fp4_table() -> [f32; 16] {
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
pub(super) fn panels(n: usize) -> usize {
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

impl Packed {
    /// Whether the weights are integer codes widened with a scale (NVFP4, Q8_0), which
    /// takes more of a tile's registers and instructions than a float weight.
    pub(super) fn quantized(&self) -> bool {
        matches!(self.data, Data::Nvfp4(_) | Data::Q8(_))
    }

    /// The bf16 panels and their per-panel stride, if the weight is bf16.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn bf16_panels(&self) -> Option<(&[u16], usize)> {
        match &self.data {
            Data::Bf16(v) => Some((v, self.k.next_multiple_of(2) * NR)),
            _ => None,
        }
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

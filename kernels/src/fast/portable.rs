//! The portable block kernels: fixed-size arrays and straight-line loops the compiler
//! vectorizes for whatever the baseline target offers. Also the dequantization kernel
//! for every CPU (it is not on the hot path of `sous quantize`).

use super::Prepared;
use crate::BLOCK;
use crate::formats::bf16::{bf16_to_f32, f16_to_f32};
use crate::formats::fp4;
use crate::matrix::Dtype;
use crate::scale::TensorScale;
use crate::stats::{BlockCounts, ErrorStats};

/// One block as f32 and its largest magnitude (NaN if any element is NaN).
///
/// The maximum is taken over the magnitude *bits*: for non-NaN floats of one format,
/// integer order is value order, and every NaN's bits exceed infinity's, so a NaN wins
/// exactly as in `torch.amax`.
#[inline(always)]
fn load_block(dtype: Dtype, bytes: &[u8]) -> ([f32; BLOCK], f32) {
    let mut w = [0.0f32; BLOCK];
    match dtype {
        Dtype::Bf16 | Dtype::F16 => {
            let mut max_bits = 0u16;
            for (i, pair) in bytes.chunks_exact(2).enumerate() {
                let bits = u16::from_le_bytes([pair[0], pair[1]]);
                max_bits = max_bits.max(bits & 0x7FFF);
                w[i] = if dtype == Dtype::Bf16 {
                    bf16_to_f32(bits)
                } else {
                    f16_to_f32(bits)
                };
            }
            (w, half_bits_to_f32(dtype, max_bits))
        }
        Dtype::F32 => {
            let mut max_bits = 0u32;
            for (i, quad) in bytes.chunks_exact(4).enumerate() {
                let bits = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
                max_bits = max_bits.max(bits & 0x7FFF_FFFF);
                w[i] = f32::from_bits(bits);
            }
            (w, f32_bits_to_f32(max_bits))
        }
    }
}

/// The value of a 16-bit magnitude, NaN for any NaN pattern.
pub(crate) fn half_bits_to_f32(dtype: Dtype, bits: u16) -> f32 {
    match dtype {
        Dtype::Bf16 if bits > 0x7F80 => f32::NAN,
        Dtype::F16 if bits > 0x7C00 => f32::NAN,
        Dtype::F16 => f16_to_f32(bits),
        _ => bf16_to_f32(bits),
    }
}

/// The value of an f32 magnitude, NaN for any NaN pattern.
pub(crate) fn f32_bits_to_f32(bits: u32) -> f32 {
    if bits > 0x7F80_0000 {
        f32::NAN
    } else {
        f32::from_bits(bits)
    }
}

pub(super) fn max_abs(dtype: Dtype, bytes: &[u8]) -> f32 {
    match dtype {
        Dtype::Bf16 | Dtype::F16 => {
            let bits = bytes
                .chunks_exact(2)
                .map(|p| u16::from_le_bytes([p[0], p[1]]) & 0x7FFF)
                .max()
                .unwrap_or(0);
            half_bits_to_f32(dtype, bits)
        }
        Dtype::F32 => {
            let bits = bytes
                .chunks_exact(4)
                .map(|q| u32::from_le_bytes([q[0], q[1], q[2], q[3]]) & 0x7FFF_FFFF)
                .max()
                .unwrap_or(0);
            f32_bits_to_f32(bits)
        }
    }
}

// Not inlined: called once per chunk of blocks (`CHUNK_BLOCKS`), so a call costs nothing,
// and its code keeps a symbol of its own, which `scripts/bench/aarch64-asm.sh` finds to
// show what the compiler made of the loop.
#[inline(never)]
pub(super) fn quantize_blocks<const STATS: bool>(
    dtype: Dtype,
    src: &[u8],
    scale: &Prepared,
    packed: &mut [u8],
    scales: &mut [u8],
) -> (BlockCounts, ErrorStats) {
    let mut counts = BlockCounts::default();
    let mut stats = ErrorStats::default();
    let width = BLOCK * dtype.size();
    for ((bytes, code), out) in src
        .chunks_exact(width)
        .zip(scales.iter_mut())
        .zip(packed.chunks_exact_mut(BLOCK / 2))
    {
        let (w, bmax) = load_block(dtype, bytes);
        let (scale_code, kind, divisor) = scale.block(bmax);
        *code = scale_code;
        counts.add(kind);
        let mut codes = [0u8; BLOCK];
        for (c, w) in codes.iter_mut().zip(w) {
            *c = fp4::encode(w / divisor);
        }
        for (byte, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
            *byte = fp4::pack(pair[0], pair[1]);
        }
        if STATS {
            for (&c, w) in codes.iter().zip(w) {
                stats.add(w, fp4::decode(c) * divisor);
            }
        }
    }
    (counts, stats)
}

pub(super) fn dequantize_blocks(packed: &[u8], scales: &[u8], scale: &TensorScale, out: &mut [f32]) {
    for ((bytes, &code), out) in packed
        .chunks_exact(BLOCK / 2)
        .zip(scales)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let factor = scale.divisor(code);
        for (pair, &byte) in out.chunks_exact_mut(2).zip(bytes) {
            let [even, odd] = fp4::unpack(byte);
            pair[0] = fp4::decode(even) * factor;
            pair[1] = fp4::decode(odd) * factor;
        }
    }
}

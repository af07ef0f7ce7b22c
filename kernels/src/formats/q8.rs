//! llama.cpp's Q8_0: blocks of 32 values, each an 8-bit integer times the block's f16
//! scale. The native engine holds the token embedding and output projection in it when
//! a recipe asks (`memory.embedding_dtype = "q8_0"`): 8.5 bits a value instead of 16.
//!
//! The rounding mirrors ggml's reference quantizer, `quantize_row_q8_0_ref` in
//! ggml-org/llama.cpp `ggml/src/ggml-quants.c` (b6000 and later): `d = amax / 127` in
//! f32, stored rounded to the nearest f16; each value is `roundf(x · (1/d))` (half away
//! from zero) with the unrounded `d`; a block of zeros has `d = 0` and zero codes. A
//! value is read back as `code · d16` (`dequantize_row_q8_0`), one f32 multiply.

use super::bf16::f16_to_f32;

/// Values per block: one scale for every 32 consecutive values of a row.
pub const BLOCK: usize = 32;

/// One block quantized: the scale's f16 bits and the 32 codes, as ggml computes them.
pub fn quantize(x: &[f32; BLOCK]) -> (u16, [i8; BLOCK]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `as i8` saturates; `x · id` is at most 127 plus a rounding error, so it never
    // needs to.
    let codes = std::array::from_fn(|j| (x[j] * id).round() as i8);
    (half::f16::from_f32(d).to_bits(), codes)
}

/// The value of `code` in a block with scale bits `scale`.
#[inline]
pub fn value(code: i8, scale: u16) -> f32 {
    f32::from(code) * f16_to_f32(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_takes_its_largest_magnitude_as_127_and_rounds_half_away_from_zero() {
        let mut x = [0.0f32; BLOCK];
        x[..7].copy_from_slice(&[-127.0, 0.5, -0.5, 2.5, 0.49, -3.5, 100.0]);
        let (scale, codes) = quantize(&x);
        assert_eq!(scale, 0x3C00, "d = 127 / 127 = 1.0");
        assert_eq!(&codes[..8], &[-127, 1, -1, 3, 0, -4, 100, 0]);
        assert_eq!(value(codes[5], scale), -4.0);
        // d = 0.02 is stored as its nearest f16, 0.0200043..., and values read back with it.
        x[0] = -2.54;
        let (scale, codes) = quantize(&x.map(|v| v.clamp(-2.54, 2.54)));
        assert_eq!(scale, half::f16::from_f32(0.02).to_bits());
        assert_eq!(codes[0], -127);
        assert_eq!(value(codes[0], scale), -127.0 * f16_to_f32(scale));
    }

    #[test]
    fn a_block_of_zeros_has_a_zero_scale() {
        let (scale, codes) = quantize(&[0.0; BLOCK]);
        assert_eq!(scale, 0);
        assert!(codes.iter().all(|&c| c == 0));
        let (scale, codes) = quantize(&[-0.0; BLOCK]);
        assert_eq!(f16_to_f32(scale), 0.0);
        assert!(codes.iter().all(|&c| c == 0));
    }

    #[test]
    fn every_value_is_within_half_a_step_of_its_input() {
        let x: [f32; BLOCK] = std::array::from_fn(|i| ((i * 37 % 29) as f32 - 14.0) * 0.013);
        let (scale, codes) = quantize(&x);
        let step = f16_to_f32(scale);
        for (v, c) in x.iter().zip(codes) {
            // Half a step, plus what rounding the scale to f16 moves the largest code.
            assert!(
                (value(c, scale) - v).abs() <= 0.5 * step + 127.0 * step * 1e-3,
                "{v} {c}"
            );
        }
    }
}

//! 16-bit floats: reading bf16 and fp16 bits exactly as f32, and rounding an f32 to the
//! nearest bf16 the way PyTorch does when an operation's result is stored as bf16
//! (round half to even on the dropped 16 bits).

/// The f32 with the same value as the bf16 `bits` (exact: bf16 is the top half of f32).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The f32 with the same value as the IEEE half-precision `bits` (exact: every f16,
/// subnormals included, is a normal f32; NaN payloads are kept).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1F);
    let mantissa = u32::from(bits & 0x3FF);
    let magnitude = match exponent {
        // Zero and subnormals: mantissa * 2^-24, exact in f32.
        0 => (mantissa as f32 * f32::from_bits((127 - 24) << 23)).to_bits(),
        // Infinity and NaN.
        0x1F => 0x7F80_0000 | (mantissa << 13),
        // Normals: rebias the exponent (15 -> 127), widen the mantissa.
        _ => ((exponent + 127 - 15) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// `x` rounded to the nearest bf16 value, ties to even, returned as f32.
///
/// This is c10's `round_to_nearest_even` (`c10/util/BFloat16.h`): add `0x7FFF` plus the
/// lowest kept bit and truncate. Overflow rounds to infinity as it should; a NaN stays
/// a NaN (the bit trick alone could carry a NaN payload into infinity, so it is checked
/// first, as c10 does).
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return f32::NAN;
    }
    let bits = x.to_bits();
    let bias = 0x7FFF + ((bits >> 16) & 1);
    f32::from_bits(bits.wrapping_add(bias) & 0xFFFF_0000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_half_to_even() {
        // 1 + 2^-8 is exactly between bf16 1.0 and 1.0078125: even (1.0) wins.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3 * 2^-8 is between 1.0078125 (odd) and 1.015625 (even).
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.015625);
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0078125);
        assert_eq!(round_bf16(-1.0 - 2f32.powi(-8)), -1.0);
    }

    #[test]
    fn keeps_bf16_values_and_specials() {
        for bits in (0..=u16::MAX).step_by(7) {
            let x = bf16_to_f32(bits);
            if x.is_nan() {
                assert!(round_bf16(x).is_nan());
            } else {
                assert_eq!(round_bf16(x).to_bits(), x.to_bits());
            }
        }
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        assert_eq!(round_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(round_bf16(f32::from_bits(0x7FFF_FFFF)).is_nan());
    }

    #[test]
    fn reads_every_f16() {
        for bits in 0..=u16::MAX {
            let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
            let e = i32::from((bits >> 10) & 0x1F);
            let m = f64::from(bits & 0x3FF);
            let want = match e {
                0 => sign * m * 2f64.powi(-24),
                0x1F if m == 0.0 => sign * f64::INFINITY,
                0x1F => f64::NAN,
                _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
            };
            let got = f16_to_f32(bits);
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(f64::from(got), want, "{bits:#06x}");
                assert_eq!(got.is_sign_negative(), bits & 0x8000 != 0, "{bits:#06x}");
            }
        }
    }

    #[test]
    fn reads_f16() {
        assert_eq!(f16_to_f32(0x3C00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }
}

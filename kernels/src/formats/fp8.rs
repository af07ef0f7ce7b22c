//! FP8 E4M3 (`float8_e4m3fn`): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits,
//! no infinities, and `S.1111.111` (`0x7F`, `0xFF`) as NaN. The largest finite value
//! is 448, the smallest subnormal 2^-9.
//!
//! Encoding follows torch's float → `float8_e4m3fn` cast (c10
//! `Float8_e4m3fn.h`, `fp8e4m3fn_from_fp32_value`): round half to even, no saturation,
//! so values above 464 become NaN. The scale paths clamp to 448 before encoding,
//! as both tools do (compressed-tensors `round_to_quantized_type_dtype`; ModelOpt 0.47.0
//! clamps to [2^-9, 448] since NaN scales were found, Model-Optimizer #1633), so a NaN
//! byte only comes from a NaN input.

/// The largest finite E4M3 value.
pub const MAX: f32 = 448.0;

/// The canonical NaN code. torch copies the input's sign into a NaN; sous writes one
/// NaN byte whatever the sign, because the sign of a NaN produced by arithmetic is not
/// reproducible across compilers and CPUs.
pub const NAN: u8 = 0x7F;

/// `v` rounded to the nearest E4M3 value, ties to even.
pub fn encode(v: f32) -> u8 {
    if v.is_nan() {
        return NAN;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    let magnitude = if a < MIN_NORMAL {
        // Subnormals are multiples of 2^-9; scaling by 512 is exact, so rounding the
        // product rounds the value. 8 * 2^-9 = 2^-6 is code 8, the first normal: the
        // codes run on without a gap.
        rint(a * 512.0) as u32
    } else if a >= 480.0 {
        // Beyond the halfway point between 448 and the (NaN) next step; includes +inf.
        u32::from(NAN)
    } else {
        let exponent = ((a.to_bits() >> 23) as i32) - 127;
        // a / 2^e is in [1, 2) and exact (a division by a power of two).
        let mantissa = a / pow2(exponent);
        let mut q = rint((mantissa - 1.0) * 8.0) as u32;
        let mut e = exponent + 7;
        if q == 8 {
            q = 0;
            e += 1;
        }
        (((e as u32) << 3) | q).min(u32::from(NAN))
    };
    (magnitude as u8) | sign
}

/// The value of an E4M3 code (NaN for `0x7F` and `0xFF`).
pub fn decode(code: u8) -> f32 {
    if code & 0x7F == NAN {
        return f32::NAN;
    }
    let e = i32::from((code >> 3) & 0xF);
    let m = f32::from(code & 7);
    let magnitude = if e == 0 {
        m * pow2(-9)
    } else {
        (1.0 + m / 8.0) * pow2(e - 7)
    };
    if code & 0x80 != 0 { -magnitude } else { magnitude }
}

/// [`encode`] as c10 writes it (`fp8e4m3fn_from_fp32_value`): integer arithmetic on
/// the f32 bits, one float addition for subnormals, one branch each way. The fast path
/// uses it; the tests check it against [`encode`] on every rounding boundary.
#[inline]
pub fn encode_fast(v: f32) -> u8 {
    // 480.0: from here on the result is the NaN code (NaN inputs included: their
    // magnitude bits exceed infinity's).
    const OVERFLOW: u32 = 0x43F0_0000;
    // 2^-6, the smallest normal E4M3 value, as f32 bits.
    const MIN_NORMAL_BITS: u32 = 121 << 23;
    // 2^14 as f32: adding it to a subnormal leaves 2^-9 as the last bit, so the float
    // addition rounds to E4M3's subnormal grid.
    const SUBNORMAL_MAGIC: u32 = 141 << 23;
    let bits = v.to_bits();
    let magnitude = bits & 0x7FFF_FFFF;
    if magnitude > 0x7F80_0000 {
        return NAN;
    }
    let sign = ((bits >> 24) & 0x80) as u8;
    let code = if magnitude >= OVERFLOW {
        NAN
    } else if magnitude < MIN_NORMAL_BITS {
        let sum = f32::from_bits(magnitude) + f32::from_bits(SUBNORMAL_MAGIC);
        (sum.to_bits() - SUBNORMAL_MAGIC) as u8
    } else {
        // Rebias the exponent (127 -> 7), then round the 20 dropped bits half to even.
        let odd = (magnitude >> 20) & 1;
        let rounded = magnitude - (120 << 23) + 0x7_FFFF + odd;
        (rounded >> 20) as u8
    };
    code | sign
}

/// The smallest normal E4M3 value, 2^-6.
const MIN_NORMAL: f32 = 0.015625;

/// 2^e for a normal f32 exponent, built from bits (no libm call on the hot path).
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Round half to even for 0 <= x < 2^22: adding 2^23 leaves no fraction bits, so the
/// addition itself rounds (IEEE default rounding is half to even). Portable and free
/// of libm, unlike `round_ties_even` on a baseline x86-64 target.
fn rint(x: f32) -> f32 {
    const MAGIC: f32 = 8_388_608.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=u8::MAX {
            let v = decode(code);
            if code & 0x7F == NAN {
                assert!(v.is_nan());
            } else {
                assert_eq!(encode(v), code, "code {code:#04x} = {v}");
            }
        }
    }

    #[test]
    fn rint_is_round_half_to_even() {
        for (x, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (2.4999998, 2.0),
            (7.5, 8.0),
            (0.0, 0.0),
        ] {
            assert_eq!(rint(x), want, "{x}");
            assert_eq!(rint(x), f32::round_ties_even(x));
        }
    }

    #[test]
    fn fast_encoder_agrees_on_every_rounding_boundary() {
        // Every choice of the top 16 bits (sign, exponent, 7 mantissa bits: every
        // rounding position of E4M3, normal or subnormal, lies among them) with the
        // low bits exactly zero (ties), just above, and just below the next pattern.
        for top in 0..=u16::MAX {
            for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let v = f32::from_bits((u32::from(top) << 16) | low);
                let (slow, fast) = (encode(v), encode_fast(v));
                assert_eq!(slow, fast, "{v:e} ({:#010x})", v.to_bits());
            }
        }
        // And a spread of other patterns.
        let mut state = 0x9E37_79B9u32;
        for _ in 0..1_000_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let v = f32::from_bits(state);
            assert_eq!(encode(v), encode_fast(v), "{v:e} ({state:#010x})");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert_eq!(decode(0x08), 2f32.powi(-6));
        assert_eq!(decode(0x20), 0.125);
        assert_eq!(decode(0x38), 1.0);
    }

    #[test]
    fn rounds_half_to_even_and_overflows_to_nan() {
        // Between 1.0 (code 0x38, even) and 1.125 (0x39).
        assert_eq!(encode(1.0625), 0x38);
        // Between 1.125 (odd) and 1.25 (0x3A, even).
        assert_eq!(encode(1.1875), 0x3A);
        // Subnormal ties: 0.5 * 2^-9 -> 0, 1.5 * 2^-9 -> 2 * 2^-9, 2.5 * 2^-9 -> 2 * 2^-9.
        assert_eq!(encode(0.5 * 2f32.powi(-9)), 0);
        assert_eq!(encode(1.5 * 2f32.powi(-9)), 2);
        assert_eq!(encode(2.5 * 2f32.powi(-9)), 2);
        // 7.5 * 2^-9 rounds to 8 * 2^-9, the smallest normal.
        assert_eq!(encode(7.5 * 2f32.powi(-9)), 0x08);
        // 448 < v <= 464 rounds to 448 (464 is a tie, and 448's mantissa is even);
        // above, the next step is the NaN code.
        assert_eq!(encode(464.0), 0x7E);
        assert_eq!(encode(464.1), NAN);
        assert_eq!(encode(1.0e9), NAN);
        assert_eq!(encode(f32::INFINITY), NAN);
        assert_eq!(encode(f32::NAN), NAN);
        assert_eq!(encode(-1.0), 0xB8);
        assert_eq!(encode(-0.0), 0x80);
    }
}

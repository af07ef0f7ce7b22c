//! FP4 E2M1 codes: a sign bit (bit 3) over a 3-bit index into the grid
//! `0, 0.5, 1, 1.5, 2, 3, 4, 6` (compressed-tensors 0.19.0 `kE2M1ToFloat` in
//! `compressors/nvfp4/helpers.py`; ModelOpt 0.47.0 `e2m1_values`), and their packing two
//! per byte with the even element in the low nibble (`pack_fp4_to_uint8` in the same
//! compressed-tensors file). `docs/nvfp4.md`, "FP4 codes".

/// The magnitudes of codes 0..=7.
pub const GRID: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The largest magnitude.
pub const MAX: f32 = 6.0;

/// The code of `y`, rounded to the nearest grid point with ties to the even mantissa,
/// saturating at ±6.
///
/// The thresholds are compressed-tensors' `cast_to_fp4`
/// (`quantization/utils/fp4_utils.py`): a tie goes down at 0.25, 1.25, 2.5 and 5.0
/// (`>`) and up at 0.75, 1.75 and 3.5 (`>=`). The sign bit is set iff `y < 0`, so
/// `-0.0` gives code 0 and a tiny negative that rounds to zero gives code 8, as both
/// tools do (ModelOpt's `sign_bit = weight < 0`). A NaN gives code 0: every comparison
/// with it is false.
pub fn encode(y: f32) -> u8 {
    let y = y.clamp(-MAX, MAX);
    let a = y.abs();
    let magnitude = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    magnitude | (u8::from(y < 0.0) << 3)
}

/// The value of a code (code 8 is -0.0).
pub fn decode(code: u8) -> f32 {
    let magnitude = GRID[usize::from(code & 7)];
    if code & 8 != 0 { -magnitude } else { magnitude }
}

/// Two codes in one byte: `even | odd << 4`.
pub fn pack(even: u8, odd: u8) -> u8 {
    (even & 0xF) | (odd << 4)
}

/// The two codes of a byte, even element first.
pub fn unpack(byte: u8) -> [u8; 2] {
    [byte & 0xF, byte >> 4]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_even_mantissas() {
        let cases = [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.000001, 6.0),
            (7.0, 6.0),
            (f32::INFINITY, 6.0),
        ];
        for (y, want) in cases {
            assert_eq!(decode(encode(y)), want, "{y}");
            assert_eq!(decode(encode(-y)), -want, "-{y}");
        }
    }

    #[test]
    fn grid_points_are_fixed_points() {
        for code in 0..16u8 {
            if code == 8 {
                continue;
            }
            assert_eq!(encode(decode(code)), code);
        }
    }

    #[test]
    fn sign_rules() {
        assert_eq!(encode(-0.0), 0);
        assert_eq!(encode(-1e-30), 8);
        assert_eq!(encode(f32::NAN), 0);
        assert_eq!(encode(-f32::NAN), 0);
    }

    #[test]
    fn packs_even_low() {
        assert_eq!(pack(0x3, 0xA), 0xA3);
        assert_eq!(unpack(0xA3), [0x3, 0xA]);
    }
}

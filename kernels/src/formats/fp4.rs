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

/// [`encode`] with integer arithmetic on the bits instead of seven comparisons: the
/// form the GPU kernels use (`kernels/src/cuda/nvfp4.cu`), equal to [`encode`] for every
/// f32 (tested on all 2^32 of them). Below 1 the grid steps by 0.5, so the code is
/// `rint(2|y|)`; from 1 up E2M1 keeps one mantissa bit, rounded half to even by adding
/// just under half a unit plus the kept bit, and saturates at code 7 (6.0).
pub fn encode_bits(y: f32) -> u8 {
    const MAGIC: f32 = 8_388_608.0; // 2^23: adding it rounds to an integer, half to even
    let bits = y.to_bits();
    let a = bits & 0x7FFF_FFFF;
    // Below 1: 2|y| + 2^23 is 2^23 + k for k in 0..=2, whose bits end in k.
    let below_one = (f32::from_bits(a) * 2.0 + MAGIC)
        .to_bits()
        .wrapping_sub(0x4B00_0000);
    let odd = (a >> 22) & 1;
    let from_one = ((a + 0x1F_FFFF + odd) >> 22).wrapping_sub(252).min(7);
    let magnitude = if a < 0x3F80_0000 { below_one } else { from_one };
    let sign = (bits >> 28) & 8;
    let code = magnitude | if a != 0 { sign } else { 0 };
    if a > 0x7F80_0000 { 0 } else { code as u8 }
}

/// [`encode`] in floating-point arithmetic, the form the GPU kernels use where the
/// block holds no NaN (`kernels/src/cuda/nvfp4.cu`: there the integer units are the
/// bottleneck, and this leaves them little to do). Equal to [`encode`] for every f32
/// (tested on all 2^32). `|y|`, saturated at 6, is rounded half to even onto the E2M1
/// grid by adding and subtracting `2^22` times its binade (the step is 0.5 below 2,
/// then 1, then 2); the code is then the concave piecewise-linear
/// `min(2q, q + 2, q/2 + 4)`, and its bits come out of `code + 2^23`.
pub fn encode_fp(y: f32) -> u8 {
    const STEP_HALF: f32 = 4_194_304.0; // 2^22: ulp 0.5
    if y.is_nan() {
        return 0;
    }
    let a = y.abs().min(MAX);
    let binade = f32::from_bits(a.to_bits() & 0x7F80_0000);
    let magic = (binade * STEP_HALF).max(STEP_HALF);
    let q = (a + magic) - magic;
    // Every step below is exact (small integers and halves), so the fused multiply-add
    // rounds nothing.
    let code = (q + q).min(q + 2.0).min(q.mul_add(0.5, 4.0));
    let base = if y < 0.0 { 8_388_616.0 } else { 8_388_608.0 }; // 2^23, + 8 for the sign
    ((code + base).to_bits() & 0xF) as u8
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

    /// Every f32, in parallel: the GPU's encoders are the CPU's. Under an emulator (the
    /// aarch64 job runs its tests in qemu) every f32 is too slow for CI
    /// (benchmarks/aarch64.md, "Under qemu, the job of `scripts/test.sh`"):
    /// `SOUS_TEST_F32_STRIDE=N` takes every N-th low half of each high half
    /// instead, which still meets every exponent and sign; the 4,096 f32s around each
    /// rounding boundary of the FP4 grid are always tested.
    #[test]
    fn the_bit_encoder_agrees_on_every_f32() {
        use rayon::prelude::*;
        let agree = |y: f32| {
            let want = encode(y);
            want == encode_bits(y) && want == encode_fp(y)
        };
        for boundary in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] {
            for sign in [1.0f32, -1.0] {
                let bits = (sign * boundary).to_bits();
                for y in (bits - 2048..bits + 2048).map(f32::from_bits) {
                    assert!(agree(y), "{y:e} ({:#010x})", y.to_bits());
                }
            }
        }
        let stride = std::env::var("SOUS_TEST_F32_STRIDE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1);
        let wrong = (0u32..=0xFFFF)
            .into_par_iter()
            .map(|top| {
                (0u32..=0xFFFF)
                    .step_by(stride)
                    .filter(|low| !agree(f32::from_bits((top << 16) | low)))
                    .count()
            })
            .sum::<usize>();
        assert_eq!(wrong, 0);
    }

    #[test]
    fn packs_even_low() {
        assert_eq!(pack(0x3, 0xA), 0xA3);
        assert_eq!(unpack(0xA3), [0x3, 0xA]);
    }
}

//! `e^x` in f32 that vectorizes ([`exp`]) and the constants its vector forms in
//! `scores` share with it.

/// The constants of [`exp`], which its vector form (`scores::x86::vector::exp`, one body for
/// every x86 width) uses too: they must give its bits.
pub(crate) mod exp_consts {
    /// Below this the result is 0 (where f32 goes subnormal).
    pub const LOW: f32 = -87.3;
    /// Above this the result is infinite.
    pub const HIGH: f32 = 88.3;
    /// 1.5 · 2^23: adding and subtracting it rounds to the nearest integer.
    pub const ROUND: f32 = 12_582_912.0;
    /// `ln 2` in two parts (Cody–Waite).
    pub const LN2_HI: f32 = 0.693_359_4;
    /// The rest of `ln 2`.
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// Cephes's polynomial for `e^r`, highest degree first (Horner's order).
    pub const POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}

/// `e^x` in f32, within two units in the last place of the exact value, written so that
/// loops over it vectorize: glibc's `expf` is a call per value, and a softmax over a
/// block of keys or a SiLU over a row spent more time in those calls than in the dot
/// products around them. No crate offers a vectorizable f32 `exp` on stable Rust, so
/// it is ours: Cody–Waite reduction `x = n·ln 2 + r` (`|r| ≤ ln 2 / 2`, `ln 2` in two
/// parts), Cephes's degree-7 polynomial for `e^r`, and `2^n` built in the exponent
/// bits. Plain multiplies and adds (no fused ones), so every instruction set gives the
/// same bits. Below −87.3 the result is 0 (where f32 goes subnormal), above 88.3 it is
/// infinite; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    use exp_consts::*;
    let clamped = x.clamp(LOW, HIGH);
    // `t`'s low mantissa bits hold the integer `n` (offset by ROUND's own bits).
    let t = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p * r + c;
    }
    let e = p * (r * r) + r + 1.0;
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    // Selects, not branches, so that loops over it vectorize.
    let y = e * scale;
    let y = if x < LOW { 0.0 } else { y };
    let y = if x > HIGH { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

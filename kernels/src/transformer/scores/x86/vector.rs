//! A register of f32 lanes at either x86 vector width ([`Vector`]: `__m512` with
//! AVX-512F, `__m256` with AVX2) and steps of the attention kernels written once over
//! it: the vector `exp` ([`exp`]), the sum of a block's sixteen registers in
//! `scores::sum`'s tree ([`tree`]), the correction for a new maximum ([`correction`])
//! and the division by the sums ([`normalize`]). The kernels themselves, the lane
//! kernel's one body over [`Vector`] included, are in `super`.

use std::arch::x86_64::*;

use super::super::LANES;

/// One register of f32 lanes at one x86 vector width (`__m512`: sixteen lanes, with
/// AVX-512F; `__m256`: eight, with AVX2 and FMA), with the operations the attention
/// lane kernel and the shared steps ([`exp`], [`tree`], [`correction`], [`normalize`])
/// apply to it, written once over this trait and instantiated inside each width's
/// `#[target_feature]` kernel; every method is `#[inline(always)]`, so once inlined
/// there its intrinsics sit in a function that has their features, and inline in
/// turn (no calls remain).
///
/// # Safety
///
/// Every method needs its width's features and is called only from functions that
/// enable them; pointers are valid for the lanes each method reads or writes.
pub(super) trait Vector: Copy {
    /// Lanes per register.
    const WIDTH: usize;
    /// Which lanes a comparison held in (`__mmask16`; on AVX2 all bits set in a
    /// register).
    type Mask: Copy;

    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self;
    /// `WIDTH` f32 at `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// Stores `WIDTH` f32 at `p`.
    unsafe fn store(self, p: *mut f32);
    /// `self + b`, lane by lane.
    unsafe fn add(self, b: Self) -> Self;
    /// `self - b`.
    unsafe fn sub(self, b: Self) -> Self;
    /// `self · b` (not fused with anything).
    unsafe fn mul(self, b: Self) -> Self;
    /// `self / b`.
    unsafe fn div(self, b: Self) -> Self;
    /// The smaller of `self` and `b` (`b` where either is NaN, as `minps`).
    unsafe fn min(self, b: Self) -> Self;
    /// The larger of `self` and `b` (`b` where either is NaN, as `maxps`).
    unsafe fn max(self, b: Self) -> Self;
    /// Where `self < b` (ordered, quiet).
    unsafe fn lt(self, b: Self) -> Self::Mask;
    /// Where `self > b` (ordered, quiet).
    unsafe fn gt(self, b: Self) -> Self::Mask;
    /// Where `self == b` (ordered, quiet).
    unsafe fn eq(self, b: Self) -> Self::Mask;
    /// Where `self` is NaN.
    unsafe fn nan(self) -> Self::Mask;
    /// `yes` where `mask` holds, else `no`.
    unsafe fn select(mask: Self::Mask, yes: Self, no: Self) -> Self;
    /// `2^n` for the integer `n` that `t = x · log2 e + ROUND` holds in its low
    /// mantissa bits (`exp`'s `scale`): `((bits(t) − bits(ROUND)) + 127) << 23`.
    unsafe fn pow2(t: Self) -> Self;

    /// Whether a masked operation costs no more than the plain one (AVX-512's mask
    /// registers), so that no loop needs a copy without masks.
    const FREE_MASKS: bool;
    /// `WIDTH` 32-bit integers.
    type Int: Copy;
    /// Zero in every lane.
    unsafe fn zero() -> Self;
    /// The f32 at `p` in every lane.
    unsafe fn broadcast(p: *const f32) -> Self;
    /// `self · b + c`, fused.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    /// Every lane.
    unsafe fn all() -> Self::Mask;
    /// `WIDTH` integers at `p`.
    unsafe fn ints(p: *const i32) -> Self::Int;
    /// Where `v ≥ k`.
    unsafe fn at_least(v: Self::Int, k: i32) -> Self::Mask;
    /// `max(acc, x)` where `mask` holds, else `acc`.
    unsafe fn mask_max(mask: Self::Mask, acc: Self, x: Self) -> Self;
    /// `x` where `mask` holds, else zero.
    unsafe fn maskz(mask: Self::Mask, x: Self) -> Self;
    /// `a · b + c` (fused) where `mask` holds, else `c`.
    unsafe fn mask_fmadd(mask: Self::Mask, a: Self, b: Self, c: Self) -> Self;
}

// SAFETY (every method of both implementations): the trait's contract, that the
// caller has the width's features and valid pointers.
impl Vector for __m512 {
    const WIDTH: usize = 16;
    type Mask = __mmask16;

    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm512_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm512_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm512_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm512_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm512_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm512_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn lt(self, b: Self) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn gt(self, b: Self) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn eq(self, b: Self) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn nan(self) -> __mmask16 {
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self, self) }
    }
    #[inline(always)]
    unsafe fn select(mask: __mmask16, yes: Self, no: Self) -> Self {
        unsafe { _mm512_mask_blend_ps(mask, no, yes) }
    }
    #[inline(always)]
    unsafe fn pow2(t: Self) -> Self {
        use crate::transformer::exponential::exp_consts::ROUND;
        unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(ROUND.to_bits() as i32)),
                _mm512_set1_epi32(127),
            )))
        }
    }

    const FREE_MASKS: bool = true;
    type Int = __m512i;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> Self {
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn all() -> __mmask16 {
        0xFFFF
    }
    #[inline(always)]
    unsafe fn ints(p: *const i32) -> __m512i {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn at_least(v: __m512i, k: i32) -> __mmask16 {
        unsafe { _mm512_cmp_epi32_mask::<_MM_CMPINT_NLT>(v, _mm512_set1_epi32(k)) }
    }
    #[inline(always)]
    unsafe fn mask_max(mask: __mmask16, acc: Self, x: Self) -> Self {
        unsafe { _mm512_mask_max_ps(acc, mask, acc, x) }
    }
    #[inline(always)]
    unsafe fn maskz(mask: __mmask16, x: Self) -> Self {
        unsafe { _mm512_maskz_mov_ps(mask, x) }
    }
    #[inline(always)]
    unsafe fn mask_fmadd(mask: __mmask16, a: Self, b: Self, c: Self) -> Self {
        unsafe { _mm512_mask3_fmadd_ps(a, b, c, mask) }
    }
}

impl Vector for __m256 {
    const WIDTH: usize = 8;
    type Mask = __m256;

    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm256_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm256_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm256_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm256_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm256_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm256_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn lt(self, b: Self) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn gt(self, b: Self) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn eq(self, b: Self) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn nan(self) -> __m256 {
        unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(self, self) }
    }
    #[inline(always)]
    unsafe fn select(mask: __m256, yes: Self, no: Self) -> Self {
        unsafe { _mm256_blendv_ps(no, yes, mask) }
    }
    #[inline(always)]
    unsafe fn pow2(t: Self) -> Self {
        use crate::transformer::exponential::exp_consts::ROUND;
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND.to_bits() as i32)),
                _mm256_set1_epi32(127),
            )))
        }
    }

    const FREE_MASKS: bool = false;
    type Int = __m256i;
    #[inline(always)]
    unsafe fn zero() -> Self {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> Self {
        unsafe { _mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn all() -> __m256 {
        unsafe { _mm256_castsi256_ps(_mm256_set1_epi32(-1)) }
    }
    #[inline(always)]
    unsafe fn ints(p: *const i32) -> __m256i {
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    /// `v > k − 1`.
    #[inline(always)]
    unsafe fn at_least(v: __m256i, k: i32) -> __m256 {
        unsafe { _mm256_castsi256_ps(_mm256_cmpgt_epi32(v, _mm256_set1_epi32(k - 1))) }
    }
    #[inline(always)]
    unsafe fn mask_max(mask: __m256, acc: Self, x: Self) -> Self {
        unsafe { _mm256_blendv_ps(acc, _mm256_max_ps(acc, x), mask) }
    }
    #[inline(always)]
    unsafe fn maskz(mask: __m256, x: Self) -> Self {
        unsafe { _mm256_and_ps(x, mask) }
    }
    #[inline(always)]
    unsafe fn mask_fmadd(mask: __m256, a: Self, b: Self, c: Self) -> Self {
        unsafe { _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), mask) }
    }
}

/// `crate::transformer::exp` on every lane of `x`, the same operations in the same order (no
/// fused multiply-adds), so the same bits.
///
/// # Safety
/// `V`'s features present (see [`Vector`]).
#[inline(always)]
pub(super) unsafe fn exp<V: Vector>(x: V) -> V {
    use crate::transformer::exponential::exp_consts::*;
    unsafe {
        let splat = V::splat;
        let clamped = x.max(splat(LOW)).min(splat(HIGH));
        let round = splat(ROUND);
        let t = clamped.mul(splat(std::f32::consts::LOG2_E)).add(round);
        let n = t.sub(round);
        let r = clamped.sub(n.mul(splat(LN2_HI))).sub(n.mul(splat(LN2_LO)));
        let mut p = splat(POLY[0]);
        for &c in &POLY[1..] {
            p = p.mul(r).add(splat(c));
        }
        let e = p.mul(r.mul(r)).add(r).add(splat(1.0));
        let y = e.mul(V::pow2(t));
        let y = V::select(x.lt(splat(LOW)), splat(0.0), y);
        let y = V::select(x.gt(splat(HIGH)), splat(f32::INFINITY), y);
        V::select(x.nan(), x, y)
    }
}

/// The sum of a block's sixteen registers in `scores::sum`'s tree: keys `j` and `j + 8`,
/// then `+ 4`, `+ 2`, `+ 1`.
///
/// # Safety
/// `V`'s features present.
#[inline(always)]
pub(super) unsafe fn tree<V: Vector>(s: &[V; LANES]) -> V {
    let mut t: [V; 8] = std::array::from_fn(|l| unsafe { s[l].add(s[l + 8]) });
    for width in [4, 2, 1] {
        for l in 0..width {
            t[l] = unsafe { t[l].add(t[l + width]) };
        }
    }
    t[0]
}

/// The factor that rescales what was summed under the maximum `max` to the maximum
/// `new`: 1 where the maximum stayed, else `e^(max − new)`, lane by lane (as the tile
/// loop).
///
/// # Safety
/// `V`'s features present.
#[inline(always)]
pub(super) unsafe fn correction<V: Vector>(max: V, new: V) -> V {
    unsafe { V::select(max.eq(new), V::splat(1.0), exp(max.sub(new))) }
}

/// Divides the `rows` registers at `o` (`[d][lane]`) lane by lane by `sum`, the
/// lanes' sums of probabilities: times `1 / sum`, as the tile loop.
///
/// # Safety
/// `V`'s features present; `o` holds `rows · V::WIDTH` values.
#[inline(always)]
pub(super) unsafe fn normalize<V: Vector>(o: *mut f32, rows: usize, sum: V) {
    unsafe {
        let inv = V::splat(1.0).div(sum);
        for d in 0..rows {
            let at = o.add(d * V::WIDTH);
            V::load(at).mul(inv).store(at);
        }
    }
}

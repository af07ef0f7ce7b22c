// NVFP4 quantization on NVIDIA GPUs, compiled at run time by NVRTC (kernels/src/cuda/mod.rs).
//
// The arithmetic is the CPU reference's (kernels/src/scale.rs, formats/fp4.rs,
// formats/fp8.rs), step for step, so that the bytes are the same: IEEE division and
// multiplication with round-to-nearest written out (__fdiv_rn, __fmul_rn), no fused
// multiply-add (NVRTC runs with --fmad=false), no flushing of subnormals, clamps that let
// NaN through as Rust's f32::clamp does, and maxima that let NaN win as torch.amax does.
// On sm_90 and later, bf16 elements are not divided at all: they are compared with
// thresholds that this arithmetic itself computed (below, "bf16 by thresholds"), which
// gives the same codes with half the instructions.
//
// Layout: the input is read in 16-byte loads ("lanes"; a bf16 or f16 lane is half an
// NVFP4 block, an f32 lane a quarter). The quantize kernels give each thread a whole
// block (its scale is computed once, not once per lane: on an H200 that overhead was the
// bottleneck) and write its eight packed bytes in one store; the amax kernel reads one
// lane per thread. Both walk the tensor with grid-stride loops, and reduce with warp
// shuffles once at the end.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;

#define DT_BF16 0
#define DT_F16 1
#define DT_F32 2

#define FLAVOR_CT 0
#define FLAVOR_MO 1

#define KIND_NORMAL 0
#define KIND_ZERO 1
#define KIND_SATURATED 2
#define KIND_UNDERFLOW 3

__device__ __forceinline__ float bf16_to_f32(u32 bits) { return __uint_as_float(bits << 16); }

// kernels/src/formats/bf16.rs `f16_to_f32`: exact, bit for bit the same NaNs.
__device__ __forceinline__ float f16_to_f32(u32 bits) {
    u32 sign = (bits & 0x8000u) << 16;
    u32 exponent = (bits >> 10) & 0x1Fu;
    u32 mantissa = bits & 0x3FFu;
    u32 magnitude;
    if (exponent == 0) {
        magnitude = __float_as_uint(__fmul_rn((float)mantissa, __uint_as_float((127u - 24u) << 23)));
    } else if (exponent == 0x1F) {
        magnitude = 0x7F800000u | (mantissa << 13);
    } else {
        magnitude = ((exponent + 127u - 15u) << 23) | (mantissa << 13);
    }
    return __uint_as_float(sign | magnitude);
}

// kernels/src/formats/bf16.rs `round_bf16`.
__device__ __forceinline__ float round_bf16(float x) {
    if (isnan(x)) return __uint_as_float(0x7FC00000u);
    u32 bits = __float_as_uint(x);
    u32 bias = 0x7FFFu + ((bits >> 16) & 1u);
    return __uint_as_float((bits + bias) & 0xFFFF0000u);
}

// Rust's f32::clamp: a NaN stays NaN.
__device__ __forceinline__ float clamp_rs(float x, float lo, float hi) {
    if (x < lo) x = lo;
    if (x > hi) x = hi;
    return x;
}

// kernels/src/formats/fp8.rs `encode_fast` (E4M3, round half to even, NaN above 464).
__device__ __forceinline__ u32 e4m3_encode(float v) {
    u32 bits = __float_as_uint(v);
    u32 magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return 0x7Fu;
    u32 sign = (bits >> 24) & 0x80u;
    u32 code;
    if (magnitude >= 0x43F00000u) {
        code = 0x7Fu;
    } else if (magnitude < (121u << 23)) {
        float sum = __fadd_rn(__uint_as_float(magnitude), __uint_as_float(141u << 23));
        code = (__float_as_uint(sum) - (141u << 23)) & 0xFFu;
    } else {
        u32 odd = (magnitude >> 20) & 1u;
        u32 rounded = magnitude - (120u << 23) + 0x7FFFFu + odd;
        code = (rounded >> 20) & 0xFFu;
    }
    return code | sign;
}

// kernels/src/formats/fp8.rs `decode`: every value is exact in f32.
__device__ __forceinline__ float e4m3_decode(u32 code) {
    if ((code & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u);
    u32 e = (code >> 3) & 0xFu;
    float m = (float)(code & 7u);
    float magnitude;
    if (e == 0) {
        magnitude = __fmul_rn(m, __uint_as_float((127u - 9u) << 23));
    } else {
        magnitude = __fmul_rn(__fadd_rn(1.0f, __fmul_rn(m, 0.125f)), __uint_as_float((e + 127u - 7u) << 23));
    }
    return (code & 0x80u) ? -magnitude : magnitude;
}

// kernels/src/formats/fp4.rs `encode_bits` (equal to `encode`, compressed-tensors'
// thresholds, for every f32): rint(2|y|) below 1, one mantissa bit rounded half to even
// from 1 up, saturating at code 7; sign iff y < 0; NaN gives 0.
__device__ __forceinline__ u32 e2m1_encode(float y) {
    // Both cases are computed and one selected: lanes of a warp take different cases, and
    // a branch would run them one after the other.
    u32 bits = __float_as_uint(y);
    u32 a = bits & 0x7FFFFFFFu;
    u32 below_one = __float_as_uint(__fadd_rn(__fmul_rn(__uint_as_float(a), 2.0f), 8388608.0f)) - 0x4B000000u;
    u32 odd = (a >> 22) & 1u;
    u32 from_one = min(((a + 0x1FFFFFu + odd) >> 22) - 252u, 7u);
    u32 magnitude = a < 0x3F800000u ? below_one : from_one;
    u32 sign = (bits >> 28) & 8u;
    u32 code = magnitude | (a != 0u ? sign : 0u);
    return a > 0x7F800000u ? 0u : code;
}

// kernels/src/formats/fp4.rs `encode_fp` (equal to `encode` for every f32), for a
// y that is not NaN: the arithmetic runs on the FMA pipes, leaving the integer units,
// this kernel's bottleneck, three operations an element. Returns code bits in 0..=15.
__device__ __forceinline__ u32 e2m1_encode_fp_biased(float y) {
    const float step_half = 4194304.0f; // 2^22
    float a = fminf(fabsf(y), 6.0f);
    float binade = __uint_as_float(__float_as_uint(a) & 0x7F800000u);
    float magic = fmaxf(__fmul_rn(binade, step_half), step_half);
    float q = __fsub_rn(__fadd_rn(a, magic), magic);
    float code = fminf(fminf(__fadd_rn(q, q), __fadd_rn(q, 2.0f)), __fmaf_rn(q, 0.5f, 4.0f));
    float base = y < 0.0f ? 8388616.0f : 8388608.0f; // 2^23, + 8 for the sign
    return __float_as_uint(__fadd_rn(code, base)); // 0x4B000000 + the code
}

__device__ __forceinline__ u32 e2m1_encode_fp(float y) { return e2m1_encode_fp_biased(y) & 0xFu; }

// The sum over i < 8 of 0x4B000000 << 4i, modulo 2^32: what packing eight biased codes
// with multiply-adds (`code_i * 16^i + acc`, one instruction each) adds to the packed
// word, subtracted once at the end.
__device__ __forceinline__ u32 packing_bias() {
    u32 bias = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) bias += 0x4B000000u << (4 * i);
    return bias;
}

// The grid 0, 0.5, 1, 1.5, 2, 3, 4, 6 without a table (a table would live in local memory).
__device__ __forceinline__ float e2m1_decode(u32 code) {
    u32 m = code & 7u;
    float magnitude = m < 4u ? __fmul_rn((float)m, 0.5f) : (m == 7u ? 6.0f : (float)(m - 2u));
    return (code & 8u) ? -magnitude : magnitude;
}

// x / d rounded to nearest even, as div.rn.f32, with the reciprocal of d computed once
// for a lane's elements. div.rn.f32 compiles (sm_90, CUDA 13) to exactly this sequence,
// an approximate reciprocal refined by one Newton step and a quotient corrected by its
// residual, guarded by FCHK, which sends operands whose exponents could break the
// sequence to an exact slow path; here the guard is a range test stricter than FCHK's
// (the divisor and every element of the block zero or within [2^-60, 2^60]), and a block
// outside it takes __fdiv_rn itself.
struct Reciprocal {
    float d, r;
    bool usable; // d is a normal number in [2^-60, 2^60]
};

__device__ __forceinline__ Reciprocal reciprocal(float d) {
    Reciprocal out;
    out.d = d;
    float r0;
    asm("rcp.approx.f32 %0, %1;" : "=f"(r0) : "f"(d));
    out.r = __fmaf_rn(r0, __fmaf_rn(-d, r0, 1.0f), r0);
    u32 m = __float_as_uint(d) & 0x7FFFFFFFu;
    out.usable = m >= 0x21800000u && m <= 0x5D800000u; // 2^-60 .. 2^60
    return out;
}

__device__ __forceinline__ float divide(float x, const Reciprocal& c) {
    float q0 = __fmul_rn(x, c.r);
    float rem = __fmaf_rn(-c.d, q0, x);
    return __fmaf_rn(c.r, rem, q0);
}

// The per-tensor scale as the CPU's TensorScale holds it.
struct Scale {
    int flavor;     // FLAVOR_CT or FLAVOR_MO
    int arith_bf16; // compressed-tensors rounds its intermediates to bf16 for bf16 weights
    float value;    // weight_global_scale (CT) or weight_scale_2 (ModelOpt)
};

// kernels/src/scale.rs `divisor`: what a block with scale byte `code` divides by.
__device__ __forceinline__ float divisor_of(const Scale s, u32 code) {
    return s.flavor == FLAVOR_CT ? __fdiv_rn(e4m3_decode(code), s.value) : __fmul_rn(e4m3_decode(code), s.value);
}

// kernels/src/scale.rs `block_code`: a block's scale byte and what happened to it.
// `per_block` is bmax / 6 (compressed-tensors) or bmax / (6 * value) (ModelOpt), divided
// by the caller.
__device__ __forceinline__ void block_code(const Scale s, float bmax, float per_block, u32* code, u32* kind) {
    if (s.flavor == FLAVOR_CT) {
        if (s.arith_bf16) per_block = round_bf16(per_block);
        float scaled = __fmul_rn(s.value, per_block);
        u32 c = e4m3_encode(clamp_rs(scaled, -448.0f, 448.0f));
        if ((c & 0x7Fu) == 0) {
            *kind = (bmax == 0.0f) ? KIND_ZERO : KIND_UNDERFLOW;
            c = 0x20u;
        } else if (scaled > 448.0f) {
            *kind = KIND_SATURATED;
        } else {
            *kind = KIND_NORMAL;
        }
        *code = c;
    } else {
        if (s.value == 0.0f) per_block = 0.0f;
        u32 c;
        if (per_block == 0.0f) {
            *kind = (bmax == 0.0f) ? KIND_ZERO : KIND_UNDERFLOW;
            c = e4m3_encode(1.0f);
        } else {
            const float smallest = 0.001953125f;
            c = e4m3_encode(clamp_rs(per_block, smallest, 448.0f));
            if (per_block < smallest) {
                *kind = KIND_UNDERFLOW;
            } else if (per_block > 448.0f) {
                *kind = KIND_SATURATED;
            } else {
                *kind = KIND_NORMAL;
            }
        }
        *code = c;
    }
}

// The denominator of `per_block`: 6, or 6 * value for ModelOpt.
__device__ __forceinline__ float per_block_denominator(const Scale s) {
    return s.flavor == FLAVOR_CT ? 6.0f : __fmul_rn(6.0f, s.value);
}

// A maximum of magnitudes that lets NaN win: magnitudes compared as integers, where
// every NaN is above infinity.
__device__ __forceinline__ u32 magnitude_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

template <int DT> struct Lane;
template <> struct Lane<DT_BF16> {
    static const int N = 8;
    static __device__ __forceinline__ void load(const uint4 v, float* out) {
        u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[2 * i] = bf16_to_f32(w[i] & 0xFFFFu);
            out[2 * i + 1] = bf16_to_f32(w[i] >> 16);
        }
    }
};
template <> struct Lane<DT_F16> {
    static const int N = 8;
    static __device__ __forceinline__ void load(const uint4 v, float* out) {
        u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[2 * i] = f16_to_f32(w[i] & 0xFFFFu);
            out[2 * i + 1] = f16_to_f32(w[i] >> 16);
        }
    }
};
template <> struct Lane<DT_F32> {
    static const int N = 4;
    static __device__ __forceinline__ void load(const uint4 v, float* out) {
        out[0] = __uint_as_float(v.x);
        out[1] = __uint_as_float(v.y);
        out[2] = __uint_as_float(v.z);
        out[3] = __uint_as_float(v.w);
    }
};

// Sums a double over the block into one atomic add (stats only, once per thread).
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 other = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = other > v ? other : v;
    }
    return v;
}

// The error statistics a quantize kernel gathers (one per thread, then one atomic
// each per warp): sums [0] of squared errors, [1] of squared weights (doubles);
// counts [0] largest |error| as the bits of a non-negative double (NaN wins),
// [1] zero blocks, [2] saturated blocks, [3] underflow blocks.
struct Stats {
    double sse = 0.0;
    double ssw = 0.0;
    u64 max_err = 0, zero = 0, saturated = 0, underflow = 0;

    // One block: x its elements, lo/hi its packed codes, divisor its scale's.
    __device__ __forceinline__ void add(const float* x, u32 lo, u32 hi, float divisor, u32 kind) {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 q = ((i < 8 ? lo : hi) >> (4 * (i & 7))) & 0xFu;
            double e = (double)__fmul_rn(e2m1_decode(q), divisor) - (double)x[i];
            sse += e * e;
            ssw += (double)x[i] * (double)x[i];
            u64 eb = __double_as_longlong(fabs(e));
            if (isnan(e)) eb = 0x7FF8000000000000ull;
            max_err = eb > max_err ? eb : max_err;
        }
        zero += kind == KIND_ZERO;
        saturated += kind == KIND_SATURATED;
        underflow += kind == KIND_UNDERFLOW;
    }

    __device__ __forceinline__ void flush(double* __restrict__ sums, u64* __restrict__ counts) {
        sse = warp_sum(sse);
        ssw = warp_sum(ssw);
        max_err = warp_max_u64(max_err);
        zero = warp_sum_u64(zero);
        saturated = warp_sum_u64(saturated);
        underflow = warp_sum_u64(underflow);
        if ((threadIdx.x & 31u) == 0) {
            atomicAdd(&sums[0], sse);
            atomicAdd(&sums[1], ssw);
            atomicMax(&counts[0], max_err);
            atomicAdd(&counts[1], zero);
            atomicAdd(&counts[2], saturated);
            atomicAdd(&counts[3], underflow);
        }
    }
};

// One thread per NVFP4 block of 16 elements: two (f32: four) 16-byte loads, eight bytes
// of packed codes and one scale byte written. The 256 possible divisors (and their
// reciprocals) are computed once per CUDA block into shared memory, as the CPU's fast
// path tabulates them. With STATS, `stats` and `counts` receive `Stats`'s sums.
template <int DT, bool STATS>
__device__ __forceinline__ void quantize_body(const uint4* __restrict__ in, u64 lanes, void* __restrict__ packed,
                                              u8* __restrict__ scales, const Scale s, double* __restrict__ stats,
                                              u64* __restrict__ counts) {
    __shared__ float table_divisor[256];
    __shared__ float table_rcp[256]; // 0 where the divisor is outside the fast division's range
    for (u32 c = threadIdx.x; c < 256u; c += blockDim.x) {
        const float d = divisor_of(s, c);
        const Reciprocal r = reciprocal(d);
        table_divisor[c] = d;
        table_rcp[c] = (r.usable && d > 0.0f) ? r.r : 0.0f;
    }
    __syncthreads();
    const int N = Lane<DT>::N;
    const int G = 16 / N; // 16-byte loads per block
    const u64 blocks = lanes / G;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const Reciprocal per_block_rcp = reciprocal(per_block_denominator(s));
    const u32 bias = packing_bias();
    Stats block_stats;
    for (u64 block = (u64)blockIdx.x * blockDim.x + threadIdx.x; block < blocks; block += stride) {
        float x[16];
#pragma unroll
        for (int g = 0; g < G; g++) Lane<DT>::load(__ldg(in + block * G + g), x + g * N);
        // The largest magnitude (NaN above infinity) and the smallest non-zero one.
        u32 bits = 0, smallest = 0xFFFFFFFFu;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 m = magnitude_bits(x[i]);
            bits = m > bits ? m : bits;
            const u32 m1 = m - 1u; // a zero becomes the largest value and drops out
            smallest = m1 < smallest ? m1 : smallest;
        }
        const float bmax = bits > 0x7F800000u ? __uint_as_float(0x7FC00000u) : __uint_as_float(bits);
        // Every element zero or within [2^-60, 2^60] (so no NaN or infinity either).
        const bool in_range_block = bits <= 0x5D800000u && (smallest == 0xFFFFFFFFu || smallest >= 0x21800000u - 1u);
        const float per_block = (in_range_block && per_block_rcp.usable && bits != 0u)
                                    ? divide(bmax, per_block_rcp)
                                    : __fdiv_rn(bmax, per_block_denominator(s));
        u32 code, kind;
        block_code(s, bmax, per_block, &code, &kind);
        const float divisor = table_divisor[code];
        const float r = table_rcp[code];
        u32 lo, hi;
        if (in_range_block && r != 0.0f) {
            // The fast division and the floating-point FP4 rounding; the biased codes are
            // packed with one multiply-add each.
            const Reciprocal rcp = {divisor, r, true};
            lo = 0;
            hi = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lo = e2m1_encode_fp_biased(divide(x[i], rcp)) * (1u << (4 * i)) + lo;
                hi = e2m1_encode_fp_biased(divide(x[i + 8], rcp)) * (1u << (4 * i)) + hi;
            }
            lo -= bias;
            hi -= bias;
        } else {
            // A block with no NaN or infinity and a finite positive divisor gives no NaN
            // quotient, so the floating-point rounding still applies; others take the
            // integer one, which sends NaN to code 0.
            const bool clean = bits < 0x7F800000u && divisor > 0.0f && divisor < __uint_as_float(0x7F800000u);
            lo = 0;
            hi = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float a = __fdiv_rn(x[i], divisor), b = __fdiv_rn(x[i + 8], divisor);
                lo |= (clean ? e2m1_encode_fp(a) : e2m1_encode(a)) << (4 * i);
                hi |= (clean ? e2m1_encode_fp(b) : e2m1_encode(b)) << (4 * i);
            }
        }
        if (STATS) block_stats.add(x, lo, hi, divisor, kind);
        ((uint2*)packed)[block] = make_uint2(lo, hi);
        scales[block] = (u8)code;
    }
    if (STATS) block_stats.flush(stats, counts);
}

// bf16 by thresholds (sm_90 and later). For a fixed divisor d >= 0 (or NaN), the FP4
// magnitude code of x / d, division rounded to nearest, is a non-decreasing step
// function of |x|, and so is "x / d rounds away from zero": a bf16 input has each code
// from the smallest magnitude that reaches it. `nvfp4_thresholds_bf16` finds those
// magnitudes once per tensor, by bisection with the reference's own division and
// rounding, for each of the 256 scale bytes; the quantize kernel then compares two
// bf16 elements at a time against them (set.bf16x2, a binary search over the eight
// codes) instead of dividing and rounding each element. A NaN input compares false
// everywhere (code 0, as the reference's NaN quotient), an infinity reaches every
// threshold there is.
//
// The table: per scale byte, eight words, each threshold in both halves: the smallest
// magnitudes with code >= 1..7, then the negated smallest magnitude whose quotient is
// not zero (x <= it iff x / d < 0, the reference's sign). A threshold that no bf16
// value reaches is NaN (it compares false).
#define THRESHOLD_NONE 0x7FC0u

__device__ __forceinline__ bool threshold_reached(float d, u32 magnitude, u32 k) {
    const float y = __fdiv_rn(bf16_to_f32(magnitude), d);
    return k < 7u ? (e2m1_encode(y) & 7u) >= k + 1u : y > 0.0f;
}

// One thread per (scale byte, threshold): 256 x 8 threads.
extern "C" __global__ void nvfp4_thresholds_bf16(int flavor, int arith_bf16, float value, u32* __restrict__ table) {
    const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= 256u * 8u) return;
    Scale s;
    s.flavor = flavor;
    s.arith_bf16 = arith_bf16;
    s.value = value;
    const u32 code = t >> 3, k = t & 7u;
    const float d = divisor_of(s, code);
    // Zero never reaches a threshold (its quotient is zero or NaN); 0x7F81 stands for
    // "none" (past infinity, 0x7F80).
    u32 lo = 0, hi = 0x7F81u;
    while (hi - lo > 1u) {
        const u32 mid = (lo + hi) >> 1;
        if (threshold_reached(d, mid, k)) hi = mid; else lo = mid;
    }
    u32 threshold = hi == 0x7F81u ? THRESHOLD_NONE : hi;
    if (k == 7u) threshold |= 0x8000u;
    table[t] = threshold | (threshold << 16);
}

#if __CUDA_ARCH__ >= 900
// Each half 1.0 where the comparison holds, else 0 (a NaN operand: never).
__device__ __forceinline__ u32 ge_bf16x2(u32 a, u32 b) {
    u32 d;
    asm("set.ge.bf16x2.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 le_bf16x2(u32 a, u32 b) {
    u32 d;
    asm("set.le.bf16x2.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
    u32 d;
    asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The codes of the pair x (two bf16: elements j and j + 4 of a half block; a = |x|)
// added into their nibbles of `acc` (bits 4j.. and 4j + 16..). ta, tb: the block's
// eight threshold words. The thresholds reached are counted in bf16 arithmetic from
// 128, where the last mantissa bits are the count (128 + 15 is exact), so the counting
// runs on the floating-point pipes; a binary search over the thresholds with integer
// masks measured slower on an H200 (its selections and bit assembly are logic
// operations, which issue at half the rate; benchmarks/native.md, "Figures that were in
// code comments").
__device__ __forceinline__ u32 codes_of_pair(u32 acc, u32 x, u32 a, int j, const uint4 ta, const uint4 tb) {
    const u32 one = 0x3F803F80u;
    u32 c = 0x43004300u; // 128.0 in both halves
    c = fma_bf16x2(ge_bf16x2(a, ta.x), one, c);
    c = fma_bf16x2(ge_bf16x2(a, ta.y), one, c);
    c = fma_bf16x2(ge_bf16x2(a, ta.z), one, c);
    c = fma_bf16x2(ge_bf16x2(a, ta.w), one, c);
    c = fma_bf16x2(ge_bf16x2(a, tb.x), one, c);
    c = fma_bf16x2(ge_bf16x2(a, tb.y), one, c);
    c = fma_bf16x2(ge_bf16x2(a, tb.z), one, c);
    c = fma_bf16x2(le_bf16x2(x, tb.w), 0x41004100u, c); // the sign: + 8
    return (c - 0x43004300u) * (1u << (4 * j)) + acc;
}

template <bool STATS>
__device__ __forceinline__ void quantize_bf16_body(const uint4* __restrict__ in, u64 lanes, void* __restrict__ packed,
                                                   u8* __restrict__ scales, const Scale s,
                                                   const uint4* __restrict__ table, double* __restrict__ stats,
                                                   u64* __restrict__ counts) {
    const u64 blocks = lanes / 2;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const Reciprocal per_block_rcp = reciprocal(per_block_denominator(s));
    const u32 value_sign = __float_as_uint(s.value) >> 31;
    Stats block_stats;
    for (u64 block = (u64)blockIdx.x * blockDim.x + threadIdx.x; block < blocks; block += stride) {
        const uint4 v0 = __ldg(in + block * 2), v1 = __ldg(in + block * 2 + 1);
        // Elements j and j + 4 of each half block side by side, as their nibbles lie.
        const u32 x[8] = {__byte_perm(v0.x, v0.z, 0x5410), __byte_perm(v0.x, v0.z, 0x7632),
                          __byte_perm(v0.y, v0.w, 0x5410), __byte_perm(v0.y, v0.w, 0x7632),
                          __byte_perm(v1.x, v1.z, 0x5410), __byte_perm(v1.x, v1.z, 0x7632),
                          __byte_perm(v1.y, v1.w, 0x5410), __byte_perm(v1.y, v1.w, 0x7632)};
        u32 a[8], m = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            a[i] = x[i] & 0x7FFF7FFFu;
            m = max_u16x2(m, a[i]);
        }
        // The largest magnitude as f32 bits (NaN above infinity).
        const u32 bits = max(m & 0xFFFFu, m >> 16) << 16;
        const float bmax = bits > 0x7F800000u ? __uint_as_float(0x7FC00000u) : __uint_as_float(bits);
        // The fast division is exact for an operand within [2^-60, 2^60].
        const float per_block = (per_block_rcp.usable && bits >= 0x21800000u && bits <= 0x5D800000u)
                                    ? divide(bmax, per_block_rcp)
                                    : __fdiv_rn(bmax, per_block_denominator(s));
        u32 code, kind;
        block_code(s, bmax, per_block, &code, &kind);
        u32 lo = 0, hi = 0;
        if ((((code >> 7) ^ value_sign) & 1u) == 0) {
            // The divisor is >= 0 or NaN (its sign is the scale byte's times the
            // tensor scale's): the thresholds hold.
            const uint4 ta = __ldg(table + 2 * code), tb = __ldg(table + 2 * code + 1);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                lo = codes_of_pair(lo, x[j], a[j], j, ta, tb);
                hi = codes_of_pair(hi, x[j + 4], a[j + 4], j, ta, tb);
            }
        } else {
            // A negative divisor (a negative tensor scale): the reference's arithmetic.
            const float divisor = divisor_of(s, code);
            float f[16];
            Lane<DT_BF16>::load(v0, f);
            Lane<DT_BF16>::load(v1, f + 8);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lo |= e2m1_encode(__fdiv_rn(f[i], divisor)) << (4 * i);
                hi |= e2m1_encode(__fdiv_rn(f[i + 8], divisor)) << (4 * i);
            }
        }
        if (STATS) {
            float f[16];
            Lane<DT_BF16>::load(v0, f);
            Lane<DT_BF16>::load(v1, f + 8);
            block_stats.add(f, lo, hi, divisor_of(s, code), kind);
        }
        ((uint2*)packed)[block] = make_uint2(lo, hi);
        scales[block] = (u8)code;
    }
    if (STATS) block_stats.flush(stats, counts);
}
#endif

#define QUANTIZE(NAME, DT, STATS)                                                                              \
    extern "C" __global__ void NAME(const uint4* __restrict__ in, u64 lanes, void* __restrict__ packed,        \
                                    u8* __restrict__ scales, int flavor, int arith_bf16, float value,          \
                                    const uint4* __restrict__ table, double* __restrict__ stats,               \
                                    u64* __restrict__ counts) {                                                \
        Scale s;                                                                                               \
        s.flavor = flavor;                                                                                     \
        s.arith_bf16 = arith_bf16;                                                                             \
        s.value = value;                                                                                       \
        if constexpr (DT == DT_BF16 && BF16_BY_THRESHOLDS) {                                                   \
            quantize_bf16<STATS>(in, lanes, packed, scales, s, table, stats, counts);                          \
        } else {                                                                                               \
            quantize_body<DT, STATS>(in, lanes, packed, scales, s, stats, counts);                             \
        }                                                                                                      \
    }

// The bf16 kernels take the thresholds where set.bf16x2 and max.u16x2 exist (sm_90),
// and divide and round as the other dtypes do before that.
#if __CUDA_ARCH__ >= 900
#define BF16_BY_THRESHOLDS 1
template <bool STATS>
__device__ __forceinline__ void quantize_bf16(const uint4* in, u64 lanes, void* packed, u8* scales, const Scale s,
                                              const uint4* table, double* stats, u64* counts) {
    quantize_bf16_body<STATS>(in, lanes, packed, scales, s, table, stats, counts);
}
#else
#define BF16_BY_THRESHOLDS 0
template <bool STATS>
__device__ __forceinline__ void quantize_bf16(const uint4*, u64, void*, u8*, const Scale, const uint4*, double*, u64*) {}
#endif

QUANTIZE(nvfp4_quantize_bf16, DT_BF16, false)
QUANTIZE(nvfp4_quantize_f16, DT_F16, false)
QUANTIZE(nvfp4_quantize_f32, DT_F32, false)
QUANTIZE(nvfp4_quantize_bf16_stats, DT_BF16, true)
QUANTIZE(nvfp4_quantize_f16_stats, DT_F16, true)
QUANTIZE(nvfp4_quantize_f32_stats, DT_F32, true)

// The largest magnitude, as bits (NaN above infinity), into *out with one atomic per warp.
template <int DT>
__device__ __forceinline__ void amax_body(const uint4* __restrict__ in, u64 lanes, u32* __restrict__ out) {
    const int N = Lane<DT>::N;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u32 bits = 0;
    for (u64 lane = (u64)blockIdx.x * blockDim.x + threadIdx.x; lane < lanes; lane += stride) {
        float x[N];
        Lane<DT>::load(__ldg(in + lane), x);
#pragma unroll
        for (int i = 0; i < N; i++) {
            u32 m = magnitude_bits(x[i]);
            bits = m > bits ? m : bits;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u32 other = __shfl_xor_sync(0xFFFFFFFFu, bits, o);
        bits = other > bits ? other : bits;
    }
    if ((threadIdx.x & 31u) == 0) atomicMax(out, bits);
}

extern "C" __global__ void nvfp4_amax_bf16(const uint4* __restrict__ in, u64 lanes, u32* __restrict__ out) {
    amax_body<DT_BF16>(in, lanes, out);
}
extern "C" __global__ void nvfp4_amax_f16(const uint4* __restrict__ in, u64 lanes, u32* __restrict__ out) {
    amax_body<DT_F16>(in, lanes, out);
}
extern "C" __global__ void nvfp4_amax_f32(const uint4* __restrict__ in, u64 lanes, u32* __restrict__ out) {
    amax_body<DT_F32>(in, lanes, out);
}

// Dequantization to f32 (kernels/src/reference.rs `dequantize`): one thread per packed
// byte, `fp4 value * divisor` in one multiply.
extern "C" __global__ void nvfp4_dequantize(const u8* __restrict__ packed, u64 bytes, const u8* __restrict__ scales,
                                            int flavor, float value, float* __restrict__ out) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride) {
        u32 code = scales[i / 8];
        float f = e4m3_decode(code);
        float divisor = flavor == FLAVOR_CT ? __fdiv_rn(f, value) : __fmul_rn(f, value);
        u32 byte = packed[i];
        out[2 * i] = __fmul_rn(e2m1_decode(byte & 0xFu), divisor);
        out[2 * i + 1] = __fmul_rn(e2m1_decode(byte >> 4), divisor);
    }
}

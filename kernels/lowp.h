/*
** lowp.h — scalar conversions between fp32 and the low-precision formats DeepSeek-V4 uses
** (bf16, fp16, fp8 e4m3fn / e4m3fnuz / e5m2, fp4 e2m1, ue8m0 scales), plus the QAT round-trips
** of SPEC-dsv4 §4.1/§4.2 that reference mode and replay apply to activations.
**
** Header only: every function is `static inline ST_HD`, so the same text compiles as C17, as host
** C++ and as CUDA/HIP device code (ST_HD = __host__ __device__ under nvcc/hipcc). No libm, no
** tables, no C-only syntax (no hex-float literals, no compound literals): bit patterns are built
** with integer arithmetic and reinterpreted through memcpy, which every compiler turns into a
** register move.
**
** Rounding: every f32 -> narrow conversion is round-to-nearest, ties-to-even, computed exactly on
** the bit pattern (never through a chain of float operations that could double-round).
** Out of range:
**   bf16, f16   IEEE behaviour: overflow rounds to +-inf, NaN stays NaN (quiet).
**   fp8 e4m3fn  saturates to +-448 (the reference kernels clamp before casting), inf included;
**               NaN -> 0x7f (0xff when negative). -0.0 -> 0x80.
**   fp8 fnuz    saturates to +-240; NaN -> 0x80 (its only NaN); no negative zero: anything that
**               rounds to zero encodes as 0x00.
**   fp4 e2m1    saturates to +-6; the format has no NaN, so NaN encodes as +6 (0x7). The QAT
**               round-trip below keeps NaN as NaN instead.
*/
#ifndef ST_LOWP_H
#define ST_LOWP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef ST_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ST_HD __host__ __device__
#else
#define ST_HD
#endif
#endif

/* ---------------------------------------------------------------- bit reinterpretation */

static inline ST_HD uint32_t st_lowp_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline ST_HD float st_lowp_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* 2^k as a float for -149 <= k <= 127 (subnormal powers included), built from bits. */
static inline ST_HD float st_lowp_pow2(int k) {
  if (k >= -126) return st_lowp_bits_f32((uint32_t)(k + 127) << 23);
  return st_lowp_bits_f32((uint32_t)1 << (k + 149));
}

/* v >> s rounded to nearest, ties to even; 1 <= s <= 31. */
static inline ST_HD uint32_t st_lowp_shift_rne(uint32_t v, int s) {
  uint32_t q = v >> s;
  uint32_t rem = v & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return q;
}

/*
** Magnitude code of |x| (given as the f32 bits of a finite, non-negative value) in a small float
** format with `mbits` mantissa bits and exponent bias `bias` (subnormals, no inf), rounded to
** nearest even and saturated at max_code. The code's layout is exponent field above mantissa
** field, so a mantissa carry moves into the exponent by itself.
*/
static inline ST_HD uint32_t st_lowp_encode_magnitude(uint32_t a, int mbits, int bias,
                                                      uint32_t max_code) {
  int e = (int)(a >> 23) - 127; /* unbiased exponent of a normal f32 */
  int emin = 1 - bias;          /* smallest normal exponent of the target */
  if ((a >> 23) == 0) return 0; /* zero or f32 subnormal: far below half the smallest code */
  if (e + bias > 30) return max_code; /* far beyond any small format's range */
  uint32_t code;
  if (e < emin) {
    /* subnormal in the target: units of 2^(emin - mbits) */
    uint32_t m24 = (a & 0x7fffffu) | 0x800000u;
    int s = 23 + emin - mbits - e;
    if (s > 25) return 0;
    code = st_lowp_shift_rne(m24, s);
  } else {
    uint32_t rebased = ((uint32_t)(e + bias) << 23) | (a & 0x7fffffu);
    code = st_lowp_shift_rne(rebased, 23 - mbits);
  }
  return code > max_code ? max_code : code;
}

/* ---------------------------------------------------------------- bf16 */

static inline ST_HD float st_bf16_to_f32(uint16_t h) { return st_lowp_bits_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays NaN (quiet bit forced so a payload in the low bits cannot
** turn it into inf); overflow rounds to inf as IEEE does. */
static inline ST_HD uint16_t st_f32_to_bf16(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline ST_HD float st_round_bf16(float f) { return st_bf16_to_f32(st_f32_to_bf16(f)); }

/* ---------------------------------------------------------------- fp16 (IEEE binary16) */

static inline ST_HD float st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return st_lowp_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e != 0) return st_lowp_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  /* zero or subnormal: m * 2^-24, exact in f32 */
  float v = (float)m * st_lowp_pow2(-24);
  return sign ? -v : v;
}

static inline ST_HD uint16_t st_f32_to_f16(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf) -> inf */
  if (a < 0x38800000u) { /* below 2^-14: f16 subnormal or zero, units of 2^-24 */
    int e = (int)(a >> 23);
    if (e < 102) return sign; /* < 2^-25: rounds to zero (2^-25 itself ties to even 0) */
    uint32_t m24 = (a & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | st_lowp_shift_rne(m24, 126 - e));
  }
  return (uint16_t)(sign | st_lowp_shift_rne(a - 0x38000000u, 13)); /* rebias 127 -> 15 */
}

/* ---------------------------------------------------------------- fp8 */

/* OCP e4m3fn: bias 7, max 448, 0x7f/0xff NaN, no inf. */
static inline ST_HD float st_fp8_e4m3fn_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if ((b & 0x7fu) == 0x7fu) return st_lowp_bits_f32(sign | 0x7fc00000u);
  if (e == 0) {
    float v = (float)m * st_lowp_pow2(-9);
    return sign ? -v : v;
  }
  return st_lowp_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

static inline ST_HD uint8_t st_f32_to_fp8_e4m3fn(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7eu);
  return (uint8_t)(sign | st_lowp_encode_magnitude(a, 3, 7, 0x7eu));
}

/* e4m3fnuz (AMD gfx942): bias 8, max 240, 0x80 is the only NaN, no inf, no negative zero. */
static inline ST_HD float st_fp8_e4m3fnuz_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (b == 0x80u) return st_lowp_bits_f32(0x7fc00000u);
  if (e == 0) {
    float v = (float)m * st_lowp_pow2(-10);
    return sign ? -v : v;
  }
  return st_lowp_bits_f32(sign | ((e + 119u) << 23) | (m << 20));
}

static inline ST_HD uint8_t st_f32_to_fp8_e4m3fnuz(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x80u;
  uint32_t mag = a >= 0x7f800000u ? 0x7fu : st_lowp_encode_magnitude(a, 3, 8, 0x7fu);
  return (uint8_t)(mag ? (sign | mag) : 0u);
}

/* OCP e5m2 (safetensors F8_E5M2): the top byte of an IEEE binary16. Decode only. */
static inline ST_HD float st_fp8_e5m2_to_f32(uint8_t b) { return st_f16_to_f32((uint16_t)(b << 8)); }

/* ---------------------------------------------------------------- fp4 e2m1 */

/* Nibble 0..7 = +{0, .5, 1, 1.5, 2, 3, 4, 6}; 8..15 the same magnitudes negated. Bits above the
** low nibble are ignored. */
static inline ST_HD float st_fp4_e2m1_to_f32(uint8_t nibble) {
  uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
  float v = e == 0 ? (float)m * 0.5f : st_lowp_bits_f32(((e + 126u) << 23) | (m << 22));
  return (nibble & 8u) ? -v : v;
}

static inline ST_HD uint8_t st_f32_to_fp4_e2m1(float f) {
  uint32_t u = st_lowp_f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 28) & 8u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7u;
  if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7u);
  return (uint8_t)(sign | st_lowp_encode_magnitude(a, 1, 1, 0x7u));
}

/* ---------------------------------------------------------------- ue8m0 scales */

/* float8_e8m0fnu: 2^(e-127); 0xff is NaN; no zero, no sign. */
static inline ST_HD float st_e8m0_to_f32(uint8_t e) {
  if (e == 0xffu) return st_lowp_bits_f32(0x7fc00000u);
  return st_lowp_pow2((int)e - 127);
}

/* (mantissa with the implicit bit at bit 23, exponent) of a positive finite non-zero float,
** subnormals normalised. */
static inline ST_HD void st_lowp_split(uint32_t a, uint32_t *mant, int *exp) {
  int e = (int)(a >> 23);
  uint32_t m = a & 0x7fffffu;
  if (e == 0) {
    e = 1;
    while (!(m & 0x800000u)) {
      m <<= 1;
      e--;
    }
  } else {
    m |= 0x800000u;
  }
  *mant = m;
  *exp = e - 127;
}

/*
** s = 2^ceil(log2(amax/qmax)) (SPEC §4.1 fast_round_scale), exact: with amax = ma·2^ea and
** qmax = mq·2^eq (ma, mq in [1,2)), the quotient is a power of two iff ma == mq, lies in
** (1,2)·2^(ea-eq) iff ma > mq and in (1/2,1)·2^(ea-eq) otherwise, so the ceiling is decided by
** one integer comparison of the mantissas and no division is rounded. The result is clamped to
** the ue8m0 range [2^-127, 2^127]; amax == 0 gives 2^-127; NaN, inf or qmax <= 0 give NaN.
*/
static inline ST_HD float st_ue8m0_round_up_scale(float amax, float qmax) {
  uint32_t a = st_lowp_f32_bits(amax) & 0x7fffffffu;
  uint32_t q = st_lowp_f32_bits(qmax);
  if (a >= 0x7f800000u || q >= 0x7f800000u || q == 0u) return st_lowp_bits_f32(0x7fc00000u);
  if (a == 0u) return st_lowp_pow2(-127);
  uint32_t ma, mq;
  int ea, eq;
  st_lowp_split(a, &ma, &ea);
  st_lowp_split(q, &mq, &eq);
  int k = ea - eq + (ma > mq ? 1 : 0);
  if (k < -127) k = -127;
  if (k > 127) k = 127;
  return st_lowp_pow2(k);
}

/* ---------------------------------------------------------------- QAT round-trips */

/*
** Fake-quantises x[0..n) in place through FP8 (SPEC §4.1), in blocks of `block` consecutive
** elements (the last block may be shorter): amax = max(|x_block|, 1e-4); s = amax/qmax, or the
** ue8m0 power of two 2^ceil(log2(amax/qmax)) when ue8m0 != 0; x = fp8(clamp(x/s, +-qmax))·s.
** qmax = 448 for e4m3fn, 240 for e4m3fnuz (fnuz != 0). A NaN anywhere in a block makes amax and
** therefore the whole block NaN (as torch's amax would).
*/
/* Its parts, for kernels that split a block across threads: the amax starts at 1e-4 and takes
** each value through st_fp8_amax_step (a NaN makes it NaN for good, so any order of the values,
** and any tree of st_fp8_amax_merge, gives the same amax); the scale; one value's round trip. */
static inline ST_HD float st_fp8_amax_step(float amax, float x) {
  float v = x < 0 ? -x : x;
  if (v != v) return v;
  return amax == amax && v > amax ? v : amax;
}
static inline ST_HD float st_fp8_amax_merge(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}
static inline ST_HD float st_fp8_block_scale(float amax, int ue8m0, int fnuz) {
  const float qmax = fnuz ? 240.0f : 448.0f;
  return ue8m0 ? st_ue8m0_round_up_scale(amax, qmax) : amax / qmax;
}
static inline ST_HD float st_fp8_roundtrip_value(float x, float s, int fnuz) {
  const float qmax = fnuz ? 240.0f : 448.0f;
  float y = x / s;
  if (y > qmax) y = qmax;
  if (y < -qmax) y = -qmax;
  float d = fnuz ? st_fp8_e4m3fnuz_to_f32(st_f32_to_fp8_e4m3fnuz(y))
                 : st_fp8_e4m3fn_to_f32(st_f32_to_fp8_e4m3fn(y));
  return d * s;
}

static inline ST_HD void st_fp8_roundtrip_blocks(float *x, int n, int block, int ue8m0, int fnuz) {
  if (block <= 0) block = n;
  for (int b0 = 0; b0 < n; b0 += block) {
    int b1 = n - b0 < block ? n : b0 + block;
    float amax = 1e-4f;
    for (int i = b0; i < b1; i++) amax = st_fp8_amax_step(amax, x[i]);
    float s = st_fp8_block_scale(amax, ue8m0, fnuz);
    for (int i = b0; i < b1; i++) x[i] = st_fp8_roundtrip_value(x[i], s, fnuz);
  }
}

/*
** Fake-quantises x[0..n) in place through FP4 e2m1 (SPEC §4.2), blocks of `block` (32 in the
** model): amax = max(|x_block|, 6·2^-126); s = 2^ceil(log2(amax/6)); x = e2m1(clamp(x/s, +-6))·s.
** NaN propagates to the whole block as in st_fp8_roundtrip_blocks.
*/
static inline ST_HD void st_fp4_roundtrip_blocks(float *x, int n, int block) {
  const float floor_amax = 6.0f * st_lowp_pow2(-126);
  if (block <= 0) block = n;
  for (int b0 = 0; b0 < n; b0 += block) {
    int b1 = n - b0 < block ? n : b0 + block;
    float amax = floor_amax;
    for (int i = b0; i < b1; i++) {
      float v = x[i] < 0 ? -x[i] : x[i];
      if (v != v) amax = v;
      else if (amax == amax && v > amax) amax = v;
    }
    float s = st_ue8m0_round_up_scale(amax, 6.0f);
    for (int i = b0; i < b1; i++) {
      float y = x[i] / s;
      if (y != y) {
        x[i] = y;
        continue;
      }
      if (y > 6.0f) y = 6.0f;
      if (y < -6.0f) y = -6.0f;
      x[i] = st_fp4_e2m1_to_f32(st_f32_to_fp4_e2m1(y)) * s;
    }
  }
}

/*
** The F2 fault (SPEC §6): x[0..n) in blocks of `block` through the writer's e4m3fn scale
** (max(amax, 1e-4) / 448, never ue8m0) and bytes, decoded by a reader that assumes e4m3fnuz.
** NaN values do not raise amax (as fmaxf).
*/
static inline ST_HD void st_fp8_fn_as_fnuz_blocks(float *x, int n, int block) {
  if (block <= 0) block = n;
  for (int b0 = 0; b0 < n; b0 += block) {
    int b1 = n - b0 < block ? n : b0 + block;
    float amax = 0;
    for (int i = b0; i < b1; i++) {
      float v = x[i] < 0 ? -x[i] : x[i];
      if (v > amax) amax = v;
    }
    if (amax < 1e-4f) amax = 1e-4f;
    float scale = amax / 448.0f;
    for (int i = b0; i < b1; i++) x[i] = st_fp8_e4m3fnuz_to_f32(st_f32_to_fp8_e4m3fn(x[i] / scale)) * scale;
  }
}

/* Rounds each of x[0..n) to the nearest bf16 in place. */
static inline ST_HD void st_bf16_roundtrip(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = st_round_bf16(x[i]);
}

#endif

/*
** test_lowp.c — kernels/lowp.h against references written independently here: formats decoded
** from their definitions with double arithmetic (ldexp), nearest-value searches instead of bit
** tricks, and exhaustive sweeps wherever the domain is small.
*/
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/lowp.h"

/* ------------------------------------------------------------------ helpers */

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* xorshift64*: deterministic pseudo-random bits */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* Same value, or both NaN. */
static int same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* A small float format from its definition: sign bit, `eb` exponent bits, `mb` mantissa bits,
** bias; value = (-1)^s * 2^(1-bias) * m/2^mb if e == 0, else 2^(e-bias) * (1 + m/2^mb). */
static double small_float_value(unsigned code, int eb, int mb, int bias) {
  unsigned s = (code >> (eb + mb)) & 1, e = (code >> mb) & ((1u << eb) - 1), m = code & ((1u << mb) - 1);
  double v = e == 0 ? ldexp((double)m, 1 - bias - mb) : ldexp(1.0 + ldexp((double)m, -mb), (int)e - bias);
  return s ? -v : v;
}

static double e4m3fn_ref(unsigned code) {
  if ((code & 0x7f) == 0x7f) return NAN;
  return small_float_value(code, 4, 3, 7);
}

static double e4m3fnuz_ref(unsigned code) {
  if (code == 0x80) return NAN;
  return small_float_value(code, 4, 3, 8);
}

/* ------------------------------------------------------------------ fp8 */

static void test_fp8_e4m3fn_decode_all(void **state) {
  (void)state;
  for (unsigned c = 0; c < 256; c++) {
    double want = e4m3fn_ref(c);
    float got = st_fp8_e4m3fn_to_f32((uint8_t)c);
    if (!same_value(got, want)) fail_msg("e4m3fn code 0x%02x: got %.9g want %.9g", c, got, want);
    if (!isnan(want) && !!signbit(got) != ((c & 0x80) != 0)) fail_msg("e4m3fn code 0x%02x: sign", c);
  }
  assert_true(st_fp8_e4m3fn_to_f32(0x7e) == 448.0f);
  assert_true(st_fp8_e4m3fn_to_f32(0x01) == (float)ldexp(1, -9));
}

static void test_fp8_e4m3fnuz_decode_all(void **state) {
  (void)state;
  for (unsigned c = 0; c < 256; c++) {
    double want = e4m3fnuz_ref(c);
    float got = st_fp8_e4m3fnuz_to_f32((uint8_t)c);
    if (!same_value(got, want)) fail_msg("e4m3fnuz code 0x%02x: got %.9g want %.9g", c, got, want);
  }
  assert_true(st_fp8_e4m3fnuz_to_f32(0x7f) == 240.0f);
  assert_true(st_fp8_e4m3fnuz_to_f32(0x01) == (float)ldexp(1, -10));
}

/* Every code's value encodes back to that code (NaNs to a NaN code). */
static void test_fp8_roundtrip_every_code(void **state) {
  (void)state;
  for (unsigned c = 0; c < 256; c++) {
    float v = st_fp8_e4m3fn_to_f32((uint8_t)c);
    uint8_t back = st_f32_to_fp8_e4m3fn(v);
    if (isnan(v)) assert_int_equal(back & 0x7f, 0x7f);
    else if (back != c) fail_msg("e4m3fn 0x%02x -> %g -> 0x%02x", c, v, back);

    float u = st_fp8_e4m3fnuz_to_f32((uint8_t)c);
    uint8_t back_uz = st_f32_to_fp8_e4m3fnuz(u);
    if (back_uz != c) fail_msg("e4m3fnuz 0x%02x -> %g -> 0x%02x", c, u, back_uz);
  }
}

/* Midpoints between adjacent positive codes round to the even code; a hair either side rounds
** to the nearer one. Checked for both signs. `decode`/`encode` select the format. */
static void check_midpoints(double (*ref)(unsigned), uint8_t (*encode)(float), unsigned max_code,
                            const char *what) {
  for (unsigned c = 0; c < max_code; c++) {
    double lo = ref(c), hi = ref(c + 1);
    float mid = (float)((lo + hi) / 2);
    assert_true((double)mid == (lo + hi) / 2); /* exact in f32: at most 5 significant bits */
    unsigned even = (c & 1) ? c + 1 : c;
    for (int sign = 0; sign < 2; sign++) {
      float m = sign ? -mid : mid;
      unsigned sbit = sign ? 0x80u : 0u;
      if (sign && even == 0 && max_code == 0x7f) sbit = 0; /* fnuz: no negative zero */
      uint8_t got = encode(m);
      if (got != (sbit | even)) fail_msg("%s: midpoint %.9g: got 0x%02x want 0x%02x", what, m, got, sbit | even);
      float below = nextafterf(m, 0.0f), above = nextafterf(m, sign ? -INFINITY : INFINITY);
      unsigned sb_lo = (sign && c == 0 && max_code == 0x7f) ? 0 : (sign ? 0x80u : 0u);
      if (encode(below) != (sb_lo | c)) fail_msg("%s: below midpoint %.9g", what, below);
      if (encode(above) != ((sign ? 0x80u : 0u) | (c + 1))) fail_msg("%s: above midpoint %.9g", what, above);
    }
  }
}

static void test_fp8_midpoints_round_to_even(void **state) {
  (void)state;
  check_midpoints(e4m3fn_ref, st_f32_to_fp8_e4m3fn, 0x7e, "e4m3fn");
  check_midpoints(e4m3fnuz_ref, st_f32_to_fp8_e4m3fnuz, 0x7f, "e4m3fnuz");
}

static void test_fp8_saturation_and_specials(void **state) {
  (void)state;
  /* e4m3fn: +-448 for everything beyond, inf included; NaN stays NaN; -0 keeps its sign */
  const float big[] = {448.0f, 449.0f, 464.0f, 465.0f, 1000.0f, 1e30f, FLT_MAX, INFINITY};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    assert_int_equal(st_f32_to_fp8_e4m3fn(big[i]), 0x7e);
    assert_int_equal(st_f32_to_fp8_e4m3fn(-big[i]), 0xfe);
    assert_int_equal(st_f32_to_fp8_e4m3fnuz(big[i] < 240 ? 240.0f : big[i]), 0x7f);
    assert_int_equal(st_f32_to_fp8_e4m3fnuz(-(big[i] < 240 ? 240.0f : big[i])), 0xff);
  }
  assert_int_equal(st_f32_to_fp8_e4m3fnuz(250.0f), 0x7f);
  assert_int_equal(st_f32_to_fp8_e4m3fn(NAN) & 0x7f, 0x7f);
  assert_int_equal(st_f32_to_fp8_e4m3fn(-NAN) & 0x7f, 0x7f);
  assert_int_equal(st_f32_to_fp8_e4m3fn(-0.0f), 0x80);
  assert_int_equal(st_f32_to_fp8_e4m3fn(0.0f), 0x00);
  assert_int_equal(st_f32_to_fp8_e4m3fnuz(NAN), 0x80);
  assert_int_equal(st_f32_to_fp8_e4m3fnuz(-0.0f), 0x00);
  assert_int_equal(st_f32_to_fp8_e4m3fnuz(-1e-10f), 0x00); /* rounds to zero: no -0 */
  assert_int_equal(st_f32_to_fp8_e4m3fn(-1e-10f), 0x80);
  /* below half the smallest subnormal: zero; just above: the smallest subnormal */
  assert_int_equal(st_f32_to_fp8_e4m3fn((float)ldexp(1, -10)), 0x00);
  assert_int_equal(st_f32_to_fp8_e4m3fn(nextafterf((float)ldexp(1, -10), 1)), 0x01);
  assert_int_equal(st_f32_to_fp8_e4m3fn(float_of(1)), 0x00); /* f32 subnormal */
}

/* Random floats: the encoder picks the nearest code (ties even), found here by search. */
static void test_fp8_random_nearest(void **state) {
  (void)state;
  for (int fnuz = 0; fnuz < 2; fnuz++) {
    double table[128];
    unsigned max_code = fnuz ? 0x7f : 0x7e;
    for (unsigned c = 0; c <= max_code; c++) table[c] = fnuz ? e4m3fnuz_ref(c) : e4m3fn_ref(c);
    for (int i = 0; i < 200000; i++) {
      /* magnitudes spread over [2^-14, 2^10) */
      float x = (float)ldexp(1.0 + (double)(rng() >> 11) / 9007199254740992.0, (int)(rng() % 24) - 14);
      if (rng() & 1) x = -x;
      double a = fabs((double)x);
      unsigned best = 0;
      for (unsigned c = 1; c <= max_code; c++) {
        double d = fabs(table[c] - a), db = fabs(table[best] - a);
        if (d < db || (d == db && !(c & 1))) best = c;
      }
      unsigned want = (x < 0 && !(fnuz && best == 0)) ? (0x80u | best) : best;
      uint8_t got = fnuz ? st_f32_to_fp8_e4m3fnuz(x) : st_f32_to_fp8_e4m3fn(x);
      if (got != want) fail_msg("%s: %.9g -> 0x%02x, nearest is 0x%02x", fnuz ? "fnuz" : "fn", x, got, want);
    }
  }
}

/* ------------------------------------------------------------------ fp4 */

static void test_fp4_all_codes(void **state) {
  (void)state;
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (unsigned n = 0; n < 16; n++) {
    double want = small_float_value(n, 2, 1, 1);
    assert_true(fabs(want) == mags[n & 7]);
    float got = st_fp4_e2m1_to_f32((uint8_t)n);
    if (got != want || !!signbit(got) != (n >= 8)) fail_msg("fp4 nibble %u: got %g want %g", n, got, want);
    assert_int_equal(st_f32_to_fp4_e2m1(got), n);
    /* bits above the nibble are ignored by the decoder */
    assert_true(st_fp4_e2m1_to_f32((uint8_t)(n | 0xa0)) == got);
  }
}

static void test_fp4_rounding_and_saturation(void **state) {
  (void)state;
  /* midpoints go to the code with an even mantissa bit (even nibble) */
  const struct { float x; uint8_t want; } cases[] = {
    {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
    {0.2499f, 0}, {0.2501f, 1}, {1.2501f, 3}, {4.99f, 6}, {5.01f, 7},
    {6.0f, 7}, {7.0f, 7}, {100.0f, 7}, {INFINITY, 7}, {FLT_MAX, 7},
    {-0.25f, 8}, {-0.75f, 10}, {-5.0f, 14}, {-7.0f, 15}, {-INFINITY, 15}, {-0.0f, 8}, {0.0f, 0},
    {1e-30f, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t got = st_f32_to_fp4_e2m1(cases[i].x);
    if (got != cases[i].want) fail_msg("fp4 %g: got %u want %u", cases[i].x, got, cases[i].want);
  }
  assert_int_equal(st_f32_to_fp4_e2m1(NAN), 7);
}

/* ------------------------------------------------------------------ bf16 / f16 */

/* Nearest bf16 to a finite x by exact double arithmetic between the two candidates that bracket
** it (truncation and the next bf16 away from zero); ties to the even one. */
static uint16_t bf16_reference(float x) {
  uint32_t u = bits_of(x);
  uint16_t lo = (uint16_t)(u >> 16);
  if ((u & 0xffff) == 0) return lo;
  uint16_t hi = (uint16_t)(lo + 1);
  double dx = fabs((double)x);
  double dlo = fabs((double)float_of((uint32_t)lo << 16));
  double dhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1, 128) : fabs((double)float_of((uint32_t)hi << 16));
  double a = dx - dlo, b = dhi - dx;
  if (a < b) return lo;
  if (b < a) return hi;
  return (lo & 1) ? hi : lo;
}

static float random_float_bits(void) {
  /* half fully random patterns, half near rounding boundaries (low 16 bits around 0x8000) */
  uint32_t u = (uint32_t)rng();
  switch (rng() % 4) {
  case 0: u = (u & 0xffff0000u) | 0x8000u; break;
  case 1: u = (u & 0xffff0000u) | (0x8000u + (uint32_t)(rng() % 3) - 1u); break;
  case 2: u = (u & 0xffffe000u) | 0x1000u; break; /* f16 tie pattern */
  default: break;
  }
  return float_of(u);
}

static void test_bf16_rne_bruteforce(void **state) {
  (void)state;
  const float edges[] = {0.0f, -0.0f, 1.0f, -1.0f, FLT_MAX, -FLT_MAX, FLT_MIN, float_of(1),
                         float_of(0x80000001u), float_of(0x7f7f8000u), float_of(0x7f7fffffu),
                         float_of(0x3f808000u), float_of(0x3f818000u), float_of(0x00008000u),
                         float_of(0x00018000u), INFINITY, -INFINITY};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
    uint16_t got = st_f32_to_bf16(edges[i]), want = bf16_reference(edges[i]);
    if (got != want) fail_msg("bf16 edge %a: got 0x%04x want 0x%04x", edges[i], got, want);
  }
  int checked = 0;
  for (int i = 0; i < 1000000; i++) {
    float x = random_float_bits();
    uint16_t got = st_f32_to_bf16(x);
    if (isnan(x)) {
      if (!isnan(st_bf16_to_f32(got))) fail_msg("bf16 NaN %08x -> 0x%04x not NaN", bits_of(x), got);
      continue;
    }
    uint16_t want = bf16_reference(x);
    if (got != want) fail_msg("bf16 %a (%08x): got 0x%04x want 0x%04x", x, bits_of(x), got, want);
    assert_true(st_round_bf16(x) == st_bf16_to_f32(got) || isnan(x));
    checked++;
  }
  assert_true(checked > 900000);
  /* NaN with a payload only in the low bits must not become inf */
  assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(float_of(0x7f800001u)))));
  assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(float_of(0xff800001u)))));
  /* decode is exact for all 65536 codes */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = st_bf16_to_f32((uint16_t)h);
    assert_true(bits_of(f) == h << 16);
  }
}

/* All non-negative finite f16 values (plus inf as 65536) in code order: monotone. */
static double f16_table[0x7c01];

static double f16_value_ref(unsigned h) { return small_float_value(h, 5, 10, 15); }

static uint16_t f16_reference(float x) {
  double a = fabs((double)x);
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  if (a >= 65536.0) return sign | 0x7c00;
  /* binary search the last code with value <= a */
  unsigned lo = 0, hi = 0x7c00;
  while (lo < hi) {
    unsigned mid = (lo + hi + 1) / 2;
    if (f16_table[mid] <= a) lo = mid;
    else hi = mid - 1;
  }
  if (f16_table[lo] == a) return (uint16_t)(sign | lo);
  double d0 = a - f16_table[lo], d1 = f16_table[lo + 1] - a;
  unsigned c = d0 < d1 ? lo : d1 < d0 ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
  return (uint16_t)(sign | c);
}

static void test_f16_rne_bruteforce(void **state) {
  (void)state;
  for (unsigned h = 0; h < 0x7c00; h++) f16_table[h] = f16_value_ref(h);
  f16_table[0x7c00] = 65536.0; /* the rounding boundary above 65504 behaves like this value */
  /* decode: every code */
  for (unsigned h = 0; h < 65536; h++) {
    float got = st_f16_to_f32((uint16_t)h);
    unsigned e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) {
      if (m) assert_true(isnan(got));
      else assert_true(isinf(got) && !!signbit(got) == (int)(h >> 15));
      continue;
    }
    double want = f16_value_ref(h);
    if (got != want || !!signbit(got) != (int)(h >> 15)) fail_msg("f16 decode 0x%04x: got %g want %g", h, got, want);
    assert_int_equal(st_f32_to_f16(got), h); /* round trip of every finite code */
  }
  const float edges[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e10f, INFINITY,
                         (float)ldexp(1, -24), (float)ldexp(1, -25), nextafterf((float)ldexp(1, -25), 1),
                         (float)ldexp(3, -26), (float)ldexp(1, -14), nextafterf((float)ldexp(1, -14), 0),
                         0.0f, -0.0f, FLT_MIN, float_of(1)};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
    for (int s = 0; s < 2; s++) {
      float x = s ? -edges[i] : edges[i];
      uint16_t got = st_f32_to_f16(x), want = f16_reference(x);
      if (got != want) fail_msg("f16 edge %a: got 0x%04x want 0x%04x", x, got, want);
    }
  }
  for (int i = 0; i < 1000000; i++) {
    float x = random_float_bits();
    /* bias half of the samples into f16's range so the interesting cases dominate */
    if (i & 1) {
      uint32_t u = bits_of(x);
      u = (u & 0x807fffffu) | ((uint32_t)(100 + rng() % 46) << 23);
      x = float_of(u);
    }
    uint16_t got = st_f32_to_f16(x);
    if (isnan(x)) {
      if (!isnan(st_f16_to_f32(got))) fail_msg("f16 NaN %08x -> 0x%04x", bits_of(x), got);
      continue;
    }
    uint16_t want = f16_reference(x);
    if (got != want) fail_msg("f16 %a (%08x): got 0x%04x want 0x%04x", x, bits_of(x), got, want);
  }
}

/* ------------------------------------------------------------------ e8m0 and scale rounding */

static void test_e8m0_all_codes(void **state) {
  (void)state;
  for (unsigned e = 0; e < 256; e++) {
    float got = st_e8m0_to_f32((uint8_t)e);
    if (e == 255) {
      assert_true(isnan(got));
      continue;
    }
    if ((double)got != ldexp(1.0, (int)e - 127)) fail_msg("e8m0 %u: got %a", e, got);
  }
}

/* 2^ceil(log2(a/q)) from frexp in double: a/q = f * 2^k with f in [0.5, 1); the quotient of two
** floats is never within 2^-48 of a power of two unless it is one, so the double division
** cannot land on the wrong side. */
static double round_up_reference(float amax, float qmax) {
  int k;
  double f = frexp((double)amax / (double)qmax, &k);
  int c = f == 0.5 ? k - 1 : k;
  if (c < -127) c = -127;
  if (c > 127) c = 127;
  return ldexp(1.0, c);
}

static void test_ue8m0_round_up(void **state) {
  (void)state;
  const float qmaxes[] = {448.0f, 240.0f, 6.0f, 1.0f, 3.0f, 0.7f};
  for (size_t qi = 0; qi < sizeof qmaxes / sizeof qmaxes[0]; qi++) {
    float q = qmaxes[qi];
    for (int i = 0; i < 200000; i++) {
      float a;
      switch (i % 4) {
      case 0: a = float_of((uint32_t)(rng() % 0x7f800000u)); break; /* any positive finite */
      case 1: a = q * (float)ldexp(1, (int)(rng() % 60) - 30); break; /* exact power-of-2 ratio */
      case 2: a = nextafterf(q * (float)ldexp(1, (int)(rng() % 60) - 30), (rng() & 1) ? 0 : INFINITY); break;
      default: a = (float)ldexp((double)(rng() % 1000000 + 1) / 1000.0, (int)(rng() % 40) - 30); break;
      }
      if (a == 0 || isinf(a)) continue;
      double want = round_up_reference(a, q);
      /* the literal definition agrees wherever the scale is in range */
      double lit = ldexp(1.0, (int)ceil(log2((double)a / (double)q)));
      if (lit > ldexp(1, -127) && lit < ldexp(1, 127) && lit != want)
        fail_msg("references disagree for %a / %g: %a vs %a", a, q, lit, want);
      float got = st_ue8m0_round_up_scale(a, q);
      if ((double)got != want) fail_msg("round_up(%a, %g): got %a want %a", a, q, got, want);
      /* the defining property: a/s <= q (no clamp needed after scaling) when in range */
      if (want > ldexp(1, -127) && want < ldexp(1, 127)) assert_true((double)a / got <= q);
    }
  }
  assert_true(st_ue8m0_round_up_scale(448.0f, 448.0f) == 1.0f);
  assert_true(st_ue8m0_round_up_scale(449.0f, 448.0f) == 2.0f);
  assert_true(st_ue8m0_round_up_scale(224.0f, 448.0f) == 0.5f);
  assert_true(st_ue8m0_round_up_scale(6.0f * (float)ldexp(1, -126), 6.0f) == (float)ldexp(1, -126));
  assert_true(isnan(st_ue8m0_round_up_scale(NAN, 448.0f)));
  assert_true(isnan(st_ue8m0_round_up_scale(INFINITY, 448.0f)));
  assert_true(st_ue8m0_round_up_scale(0.0f, 448.0f) == (float)ldexp(1, -127));
}

/* ------------------------------------------------------------------ QAT round-trips */

static void test_fp8_roundtrip_blocks(void **state) {
  (void)state;
  enum { N = 200 }; /* 3 blocks of 64 and a tail of 8 */
  float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)sin(i * 0.37) * (float)(1 + i % 17) * 3.0f;
  for (int ue = 0; ue < 2; ue++) {
    for (int fnuz = 0; fnuz < 2; fnuz++) {
      float qmax = fnuz ? 240.0f : 448.0f;
      memcpy(y, x, sizeof x);
      st_fp8_roundtrip_blocks(y, N, 64, ue, fnuz);
      for (int b0 = 0; b0 < N; b0 += 64) {
        int b1 = b0 + 64 < N ? b0 + 64 : N;
        float amax = 1e-4f;
        for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = ue ? (float)round_up_reference(amax, qmax) : amax / qmax;
        for (int i = b0; i < b1; i++) {
          float q = x[i] / s;
          q = q > qmax ? qmax : q < -qmax ? -qmax : q;
          /* nearest code by search */
          double best = 0;
          for (unsigned c = 0; c < 256; c++) {
            double v = fnuz ? e4m3fnuz_ref(c) : e4m3fn_ref(c);
            if (isnan(v)) continue;
            double d = fabs(v - q), db = fabs(best - q);
            if (d < db || (d == db && !(c & 1) && v != best)) best = v;
          }
          float want = (float)best * s;
          if (y[i] != want) fail_msg("fp8 roundtrip ue=%d fnuz=%d i=%d: %g -> %g want %g", ue, fnuz, i, x[i], y[i], want);
        }
      }
      if (ue) { /* idempotent with power-of-two scales */
        float z[N];
        memcpy(z, y, sizeof y);
        st_fp8_roundtrip_blocks(z, N, 64, ue, fnuz);
        assert_memory_equal(z, y, sizeof y);
      }
    }
  }
  /* tiny blocks use the 1e-4 floor; a NaN poisons only its own block */
  float t[4] = {1e-12f, -2e-12f, 1.0f, NAN};
  st_fp8_roundtrip_blocks(t, 4, 2, 1, 0);
  assert_true(t[0] == 0.0f && t[1] == -0.0f);
  assert_true(isnan(t[2]) && isnan(t[3]));
}

static void test_fp4_roundtrip_blocks(void **state) {
  (void)state;
  enum { N = 96 };
  float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)cos(i * 1.3) * (float)ldexp(1, i % 7 - 3);
  memcpy(y, x, sizeof x);
  st_fp4_roundtrip_blocks(y, N, 32);
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int b0 = 0; b0 < N; b0 += 32) {
    float amax = 6.0f * (float)ldexp(1, -126);
    for (int i = b0; i < b0 + 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    double s = round_up_reference(amax, 6.0f);
    for (int i = b0; i < b0 + 32; i++) {
      double q = x[i] / s, best = 0;
      for (int c = 0; c < 8; c++) {
        double d = fabs(mags[c] - fabs(q)), db = fabs(best - fabs(q));
        if (d < db || (d == db && !(c & 1))) best = mags[c];
      }
      double want = (q < 0 ? -best : best) * s;
      if (y[i] != want) fail_msg("fp4 roundtrip i=%d: %g -> %g want %g", i, x[i], y[i], want);
    }
  }
  float n[3] = {1.0f, NAN, 2.0f};
  st_fp4_roundtrip_blocks(n, 3, 32);
  assert_true(isnan(n[0]) && isnan(n[1]) && isnan(n[2]));
  float z[2] = {0.0f, -0.0f};
  st_fp4_roundtrip_blocks(z, 2, 32);
  assert_true(z[0] == 0.0f && z[1] == 0.0f);
}

static void test_bf16_roundtrip_array(void **state) {
  (void)state;
  float x[5] = {1.0f, float_of(0x3f808000u), float_of(0x3f818000u), 3.14159265f, -1e-40f};
  st_bf16_roundtrip(x, 5);
  assert_true(bits_of(x[0]) == 0x3f800000u);
  assert_true(bits_of(x[1]) == 0x3f800000u); /* tie to even: down */
  assert_true(bits_of(x[2]) == 0x3f820000u); /* tie to even: up */
  assert_true(bits_of(x[3]) == 0x40490000u);
  assert_true((bits_of(x[4]) & 0xffff) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fp8_e4m3fn_decode_all),
    cmocka_unit_test(test_fp8_e4m3fnuz_decode_all),
    cmocka_unit_test(test_fp8_roundtrip_every_code),
    cmocka_unit_test(test_fp8_midpoints_round_to_even),
    cmocka_unit_test(test_fp8_saturation_and_specials),
    cmocka_unit_test(test_fp8_random_nearest),
    cmocka_unit_test(test_fp4_all_codes),
    cmocka_unit_test(test_fp4_rounding_and_saturation),
    cmocka_unit_test(test_bf16_rne_bruteforce),
    cmocka_unit_test(test_f16_rne_bruteforce),
    cmocka_unit_test(test_e8m0_all_codes),
    cmocka_unit_test(test_ue8m0_round_up),
    cmocka_unit_test(test_fp8_roundtrip_blocks),
    cmocka_unit_test(test_fp4_roundtrip_blocks),
    cmocka_unit_test(test_bf16_roundtrip_array),
  };
  return cmocka_run_group_tests_name("lowp", tests, NULL, NULL);
}

/*
** cpu_internal.h — what the cpu backend's driver (cpu.c) and its instruction-set kernels
** (cpu_portable.c, cpu_avx2.c, cpu_avx512.c) share.
**
** The arithmetic is defined once, independently of the vector width, so that every path gives
** the same bits (a trace recorded on an AVX-512 machine replays bit for bit on an AVX2 one):
**   - GEMM-like kernels (matmul, the indexer's q.k, attention's q.kv and p.v) compute each output
**     element as ONE fused multiply-add chain in ascending order of the reduced index, starting
**     from +0 (s = fma(a_k, b_k, s)). Vector lanes hold different output elements, never parts of
**     one sum, so neither the vector width, the register tile, the cache blocking, the thread
**     count nor the split of the token rows changes a bit.
**   - Horizontal reductions (the indexer's weighted sum over heads, dot()) use 16 fixed lanes:
**     lane l chains index l, l + 16, l + 32 ... (missing terms padded with zeros: fma(0, 0, s)),
**     then the lanes combine by the tree (l, l+8), (l, l+4), (l, l+2), (l, l+1); dot() finishes
**     the tail beyond the last multiple of 16 with a sequential fma chain.
** The portable path spells this out with fmaf (correctly rounded, like the FMA instruction).
*/
#ifndef ST_CPU_INTERNAL_H
#define ST_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define CPU_KC 256      /* k chunk of the GEMM: a panel is CPU_KC x nr floats */
#define CPU_CW 256      /* columns one GEMM task decodes per k chunk (a multiple of every nr) */
#define CPU_RB 256      /* token rows of one GEMM task */
#define CPU_HCHUNK 64   /* heads the q.k kernels hold in registers at once (lanes, padded) */

typedef struct cpu_isa {
  const char *name;
  int nr; /* panel width of gemm (16 or 32) */
  /* panel[kk * nr + j] = W[r0 + j, k0 + kk] decoded exactly as st_weight_decode, for j < cols,
  ** kk < kc; columns cols..nr-1 zero. */
  void (*pack)(float *panel, const st_weight *w, int64_t r0, int cols, int64_t k0, int kc);
  /* c[i * ldc + j] (j < cols) = chain over kk of a[i * lda + kk] * panel[kk * nr + j], starting
  ** from c (accumulate) or +0, for i < m. */
  void (*gemm)(float *c, int64_t ldc, const float *a, int64_t lda, int m, const float *panel,
               int cols, int kc, int accumulate);
  /* For each of nrows rows r (pointers rows[r], dim floats): acc[h] = chain over k of
  ** rows[r][k] * qT[k * hp + h] for h < hp (hp a multiple of 16, <= CPU_HCHUNK).
  ** w == NULL: out[r * hp + h] = acc[h] * scale.
  ** w != NULL: the indexer head sum over this chunk, continued from out16[r * 16 + l] (16 lanes,
  ** lane l += w[h] * relu(acc[h]) for h = l, l + 16, ... as an fma chain); out16 is updated. */
  void (*qk)(float *out, const float *qT, int hp, const float *const *rows, int nrows, int dim,
             const float *w, float scale);
  /* out[h * ldo + k] = chain over c < ncand of p[c * ldp + h] * rows[c][k], for h < heads, k < d */
  void (*av)(float *out, int64_t ldo, const float *p, int ldp, int heads, const float *const *rows,
             int ncand, int d);
  /* the 16-lane dot product of the header comment */
  float (*dot)(const float *a, const float *b, int n);
} cpu_isa;

extern const cpu_isa st_cpu_isa_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_isa st_cpu_isa_avx2;
extern const cpu_isa st_cpu_isa_avx512;
#define ST_CPU_HAVE_X86 1
#endif

/* The 16-lane tree of the header comment over lane[0..16). */
static inline float st_cpu_tree16(const float *lane) {
  float a[8], b[4], c[2];
  for (int l = 0; l < 8; l++) a[l] = lane[l] + lane[l + 8];
  for (int l = 0; l < 4; l++) b[l] = a[l] + a[l + 4];
  for (int l = 0; l < 2; l++) c[l] = b[l] + b[l + 2];
  return c[0] + c[1];
}

#endif

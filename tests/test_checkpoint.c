/*
** test_checkpoint.c — engine/safetensors.c, engine/config.c and engine/checkpoint.c.
**
** Every checkpoint here is written by the test itself (a small safetensors writer below) into a
** fresh temporary directory, except the transformers-saved oracle fixtures under tests/data,
** which are read when present. Bad inputs must each give an ST_E* status and a message naming
** the file and, where one is at fault, the tensor or config field.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "kernels/lowp.h"
#include "engine/safetensors.h"

/* ------------------------------------------------------------------ scratch directories */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static char *make_dir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char *tmpl = NULL;
  assert_true(asprintf(&tmpl, "%s/st_ckpt_XXXXXX", base) > 0);
  assert_non_null(mkdtemp(tmpl));
  return tmpl;
}

static void drop_dir(char *dir) {
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char *p = path_in(dir, name);
  write_bytes(p, text, strlen(text));
  free(p);
}

/* The message of the last failure must mention every given fragment. */
static void expect_message(const char *first, ...) {
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    if (!strstr(st_errmsg(), s)) fail_msg("message \"%s\" does not mention \"%s\"", st_errmsg(), s);
  va_end(ap);
}

/* ------------------------------------------------------------------ a tiny safetensors writer */

typedef struct tensor_spec {
  const char *name;
  const char *dtype;
  int rank;
  int64_t shape[4];
  const void *data;
  size_t n_bytes;
} tensor_spec;

/* Header JSON for the tensors, laid out back to back in the given order. */
static char *header_json(const tensor_spec *t, int n) {
  size_t cap = 4096 + (size_t)n * 512, o = 0;
  char *h = malloc(cap);
  assert_non_null(h);
  uint64_t off = 0;
  o += (size_t)snprintf(h + o, cap - o, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i < n; i++) {
    o += (size_t)snprintf(h + o, cap - o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].rank; d++)
      o += (size_t)snprintf(h + o, cap - o, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
    o += (size_t)snprintf(h + o, cap - o, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                          (unsigned long long)(off + t[i].n_bytes));
    off += t[i].n_bytes;
  }
  snprintf(h + o, cap - o, "}");
  return h;
}

/* Writes 8-byte LE length + header (space-padded so the data starts at a multiple of `align`) +
** data. */
static void write_raw(const char *path, const char *header, size_t align, const void *data, size_t n) {
  size_t hl = strlen(header), padded = hl;
  while ((8 + padded) % align) padded++;
  size_t total = 8 + padded + n;
  unsigned char *buf = malloc(total ? total : 1);
  assert_non_null(buf);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(buf + 8, header, hl);
  memset(buf + 8 + hl, ' ', padded - hl);
  if (n) memcpy(buf + 8 + padded, data, n);
  write_bytes(path, buf, total);
  free(buf);
}

static void write_tensors_aligned(const char *path, const tensor_spec *t, int n, size_t align) {
  char *h = header_json(t, n);
  size_t total = 0;
  for (int i = 0; i < n; i++) total += t[i].n_bytes;
  unsigned char *data = malloc(total ? total : 1);
  assert_non_null(data);
  size_t o = 0;
  for (int i = 0; i < n; i++) {
    if (t[i].n_bytes) memcpy(data + o, t[i].data, t[i].n_bytes);
    o += t[i].n_bytes;
  }
  write_raw(path, h, align, data, total);
  free(data);
  free(h);
}

static void write_tensors(const char *dir, const char *file, const tensor_spec *t, int n) {
  char *p = path_in(dir, file);
  write_tensors_aligned(p, t, n, 8);
  free(p);
}

/* A minimal valid config; `extra` is spliced in as more fields ("" for none). */
static void write_config(const char *dir, const char *extra) {
  char text[4096];
  snprintf(text, sizeof text,
           "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 16, \"hidden_size\": 8, "
           "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"head_dim\": 16, "
           "\"qk_rope_head_dim\": 4, \"q_lora_rank\": 8, \"o_groups\": 2, \"o_lora_rank\": 4, "
           "\"index_n_heads\": 2, \"index_head_dim\": 8, \"n_routed_experts\": 4, "
           "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, "
           "\"compress_ratios\": [0, 4]%s%s}",
           *extra ? ", " : "", extra);
  write_text(dir, "config.json", text);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

static float *random_floats(size_t n) {
  float *f = malloc(n * sizeof *f);
  assert_non_null(f);
  for (size_t i = 0; i < n; i++) f[i] = (float)((double)(rng() >> 11) / 9007199254740992.0 * 4 - 2);
  return f;
}

/* Random fp8 e4m3fn codes, NaN codes excluded. */
static uint8_t *random_fp8(size_t n) {
  uint8_t *q = malloc(n);
  assert_non_null(q);
  for (size_t i = 0; i < n; i++) {
    do q[i] = (uint8_t)rng();
    while ((q[i] & 0x7f) == 0x7f);
  }
  return q;
}

static st_checkpoint *open_ok(const char *dir) {
  st_checkpoint *ck = NULL;
  st_status rc = st_checkpoint_open(dir, &ck);
  if (rc != ST_OK) fail_msg("open %s: %s", dir, st_errmsg());
  return ck;
}

/* ------------------------------------------------------------------ plain dtypes */

static void test_plain_dtypes(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "");
  enum { R = 3, C = 5 };
  float f32[R * C];
  uint16_t bf16[R * C], f16[R * C];
  double f64[C];
  int64_t i64[R * 2];
  for (int i = 0; i < R * C; i++) {
    f32[i] = (float)(i * 0.25 - 1.5);
    bf16[i] = st_f32_to_bf16((float)(i * 1.5 - 7));
    f16[i] = st_f32_to_f16((float)(i * 0.125 + 0.5));
  }
  for (int i = 0; i < C; i++) f64[i] = i * 0.5;
  for (int i = 0; i < R * 2; i++) i64[i] = i % 4;
  tensor_spec t[] = {
    {"embed.weight", "BF16", 2, {R, C}, bf16, sizeof bf16},
    {"norm.weight", "F32", 2, {R, C}, f32, sizeof f32},
    {"head.weight", "F16", 2, {R, C}, f16, sizeof f16},
    {"hc_head_base", "F64", 1, {C}, f64, sizeof f64},
    {"layers.0.ffn.gate.tid2eid", "I64", 2, {R, 2}, i64, sizeof i64},
    {"hc_head_scale", "F32", 0, {0}, f32, 4}, /* rank-0 scalar */
  };
  write_tensors(dir, "model.safetensors", t, 6);
  st_checkpoint *ck = open_ok(dir);
  assert_int_equal(st_checkpoint_bytes_read(ck), 0);
  int64_t shape[2] = {R, C};
  float out[R * C];
  assert_int_equal(st_checkpoint_read_f32(ck, "norm.weight", 2, shape, out), ST_OK);
  assert_memory_equal(out, f32, sizeof f32);
  assert_int_equal(st_checkpoint_read_f32(ck, "embed.weight", 2, shape, out), ST_OK);
  for (int i = 0; i < R * C; i++) assert_true(out[i] == (float)(i * 1.5 - 7));
  float *loaded = NULL;
  assert_int_equal(st_checkpoint_load_f32(ck, "head.weight", 2, shape, &loaded), ST_OK);
  for (int i = 0; i < R * C; i++) assert_true(loaded[i] == (float)(i * 0.125 + 0.5));
  free(loaded);
  int64_t c = C;
  assert_int_equal(st_checkpoint_read_f32(ck, "hc_head_base", 1, &c, out), ST_OK);
  for (int i = 0; i < C; i++) assert_true(out[i] == (float)(i * 0.5));
  assert_int_equal(st_checkpoint_read_f32(ck, "hc_head_scale", 0, NULL, out), ST_OK);
  assert_true(out[0] == f32[0]);
  int32_t ids[R * 2];
  int64_t ishape[2] = {R, 2};
  assert_int_equal(st_checkpoint_read_i32(ck, "layers.0.ffn.gate.tid2eid", 2, ishape, ids), ST_OK);
  for (int i = 0; i < R * 2; i++) assert_int_equal(ids[i], i % 4);
  assert_int_equal(st_checkpoint_read_i32_in(ck, "layers.0.ffn.gate.tid2eid", 2, ishape, 0, 3, ids), ST_OK);
  /* range check names tensor, index and value */
  assert_int_equal(st_checkpoint_read_i32_in(ck, "layers.0.ffn.gate.tid2eid", 2, ishape, 0, 2, ids),
                   ST_EFORMAT);
  expect_message("model.safetensors", "layers.0.ffn.gate.tid2eid", "value 3", NULL);
  /* an integer read of a float tensor is refused */
  assert_int_equal(st_checkpoint_read_i32(ck, "norm.weight", 2, shape, ids), ST_EUNSUPPORTED);
  expect_message("norm.weight", NULL);
  st_dtype dt;
  assert_int_equal(st_checkpoint_dtype(ck, "embed.weight", &dt), ST_OK);
  assert_int_equal(dt, ST_BF16);
  assert_int_equal(st_checkpoint_dtype(ck, "layers.0.ffn.gate.tid2eid", &dt), ST_OK);
  assert_int_equal(dt, ST_I64);
  assert_true(st_checkpoint_has(ck, "norm.weight"));
  assert_false(st_checkpoint_has(ck, "nope.weight"));
  assert_int_equal(st_checkpoint_count(ck), 6);
  const st_config *cfg = st_checkpoint_config(ck);
  assert_int_equal(cfg->hidden_size, 8);
  assert_string_equal(st_checkpoint_dir(ck), dir);
  st_checkpoint_close(ck);
  drop_dir(dir);
}

/* ------------------------------------------------------------------ FP8 block scales */

/* Writes an FP8 weight [out, in] with block scales (E8M0 or F32) for block b, reads it back and
** compares with q * scale computed here. */
static void check_fp8(int out, int in, int block, int ue8m0) {
  char *dir = make_dir();
  char extra[256];
  snprintf(extra, sizeof extra,
           "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": "
           "\"%s\", \"weight_block_size\": [%d, %d]}",
           ue8m0 ? "ue8m0" : "float", block, block);
  write_config(dir, extra);
  int so = (out + block - 1) / block, si = (in + block - 1) / block;
  uint8_t *q = random_fp8((size_t)out * in);
  uint8_t *se = malloc((size_t)so * si);
  float *sf = malloc((size_t)so * si * sizeof *sf);
  assert_non_null(se);
  assert_non_null(sf);
  for (int i = 0; i < so * si; i++) {
    se[i] = (uint8_t)(118 + rng() % 20);
    sf[i] = (float)((double)(rng() % 1000 + 1) * 1e-4);
  }
  tensor_spec t[] = {
    {"layers.1.attn.wq_a.weight", "F8_E4M3", 2, {out, in}, q, (size_t)out * in},
    {"layers.1.attn.wq_a.scale", ue8m0 ? "F8_E8M0" : "F32", 2, {so, si}, ue8m0 ? (void *)se : (void *)sf,
     (size_t)so * si * (ue8m0 ? 1 : 4)},
  };
  write_tensors(dir, "model.safetensors", t, 2);
  st_checkpoint *ck = open_ok(dir);
  int64_t shape[2] = {out, in};
  float *w = NULL;
  assert_int_equal(st_checkpoint_load_f32(ck, "layers.1.attn.wq_a.weight", 2, shape, &w), ST_OK);
  for (int r = 0; r < out; r++)
    for (int c = 0; c < in; c++) {
      int s = (r / block) * si + c / block;
      float scale = ue8m0 ? (float)ldexp(1.0, se[s] - 127) : sf[s];
      float want = st_fp8_e4m3fn_to_f32(q[(size_t)r * in + c]) * scale;
      if (w[(size_t)r * in + c] != want) fail_msg("fp8 [%d,%d] = %g, want %g", r, c, w[(size_t)r * in + c], want);
    }
  assert_int_equal(st_checkpoint_bytes_read(ck), (uint64_t)out * in + (uint64_t)so * si * (ue8m0 ? 1 : 4));
  st_dtype dt;
  assert_int_equal(st_checkpoint_dtype(ck, "layers.1.attn.wq_a.weight", &dt), ST_OK);
  assert_int_equal(dt, ST_F8_E4M3FN);
  /* the wrong logical shape is refused with both shapes in the message */
  int64_t bad[2] = {out, in + 1};
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.attn.wq_a.weight", 2, bad, w), ST_EFORMAT);
  expect_message("model.safetensors", "layers.1.attn.wq_a.weight", "expected shape", NULL);
  free(w);
  st_checkpoint_close(ck);
  free(q);
  free(se);
  free(sf);
  drop_dir(dir);
}

static void test_fp8_block128_ue8m0_edge_blocks(void **state) {
  (void)state;
  check_fp8(200, 300, 128, 1); /* 2 x 3 scale tiles, the last ones partial */
  check_fp8(256, 128, 128, 1);
}

static void test_fp8_block128_f32_scales(void **state) {
  (void)state;
  check_fp8(130, 257, 128, 0);
}

static void test_fp8_block64(void **state) {
  (void)state;
  check_fp8(100, 130, 64, 1);
  check_fp8(64, 70, 64, 0);
}

static void test_fp8_unsupported_block_and_missing_scale(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [96, 96]}");
  uint8_t q[4 * 4] = {0};
  uint8_t s[1] = {127};
  tensor_spec t[] = {
    {"layers.0.attn.wkv.weight", "F8_E4M3", 2, {4, 4}, q, 16},
    {"layers.0.attn.wkv.scale", "F8_E8M0", 2, {1, 1}, s, 1},
    {"layers.0.attn.wo_b.weight", "F8_E4M3", 2, {4, 4}, q, 16},
  };
  write_tensors(dir, "model.safetensors", t, 3);
  st_checkpoint *ck = open_ok(dir);
  int64_t shape[2] = {4, 4};
  float out[16];
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.wkv.weight", 2, shape, out), ST_EUNSUPPORTED);
  expect_message("model.safetensors", "layers.0.attn.wkv.weight", "96", NULL);
  st_checkpoint_close(ck);
  /* with a supported block size the scale-less weight is the error */
  write_config(dir, "");
  ck = open_ok(dir);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.wkv.weight", 2, shape, out), ST_OK);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.wo_b.weight", 2, shape, out), ST_EFORMAT);
  expect_message("model.safetensors", "layers.0.attn.wo_b.weight", "scale", NULL);
  st_checkpoint_close(ck);
  drop_dir(dir);
}

/* ------------------------------------------------------------------ FP4 packed experts */

static void test_fp4_packed_experts(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "\"expert_dtype\": \"fp4\"");
  enum { OUT = 6, IN = 96 };
  uint8_t packed[OUT * IN / 2], scale[OUT * IN / 32];
  uint8_t nib[OUT * IN];
  for (int i = 0; i < OUT * IN; i++) nib[i] = (uint8_t)(rng() & 15);
  for (int i = 0; i < OUT * IN / 2; i++) packed[i] = (uint8_t)(nib[2 * i] | (nib[2 * i + 1] << 4));
  for (int i = 0; i < OUT * IN / 32; i++) scale[i] = (uint8_t)(120 + rng() % 14);
  int8_t plain[OUT * 4];
  for (int i = 0; i < OUT * 4; i++) plain[i] = (int8_t)(i * 13 - 100);
  /* a 48-column expert cannot be packed FP4 with one scale per 32 */
  uint8_t odd_packed[2 * 24] = {0}, odd_scale[2 * 2] = {127, 127, 127, 127};
  tensor_spec t[] = {
    {"layers.1.ffn.experts.3.w1.weight", "I8", 2, {OUT, IN / 2}, packed, sizeof packed},
    {"layers.1.ffn.experts.3.w1.scale", "F8_E8M0", 2, {OUT, IN / 32}, scale, sizeof scale},
    {"layers.1.ffn.experts.3.w2.weight", "I8", 2, {OUT, 4}, plain, sizeof plain},
    {"layers.1.ffn.experts.2.w1.weight", "I8", 2, {2, 24}, odd_packed, sizeof odd_packed},
    {"layers.1.ffn.experts.2.w1.scale", "F8_E8M0", 2, {2, 2}, odd_scale, sizeof odd_scale},
  };
  write_tensors(dir, "model.safetensors", t, 5);
  st_checkpoint *ck = open_ok(dir);
  int64_t shape[2] = {OUT, IN};
  float w[OUT * IN];
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn.experts.3.w1.weight", 2, shape, w), ST_OK);
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int r = 0; r < OUT; r++)
    for (int c = 0; c < IN; c++) {
      uint8_t byte = packed[r * (IN / 2) + c / 2];
      uint8_t n = (c % 2 == 0) ? (byte & 15) : (byte >> 4); /* element 2k = low nibble */
      float v = (n & 8) ? -mags[n & 7] : mags[n & 7];
      float want = v * (float)ldexp(1.0, scale[r * (IN / 32) + c / 32] - 127);
      if (w[r * IN + c] != want) fail_msg("fp4 [%d,%d] = %g want %g", r, c, w[r * IN + c], want);
    }
  st_dtype dt;
  assert_int_equal(st_checkpoint_dtype(ck, "layers.1.ffn.experts.3.w1.weight", &dt), ST_OK);
  assert_int_equal(dt, ST_F4_E2M1);
  /* the same I8 tensor requested with its stored shape is... still FP4? no: a plain I8 read
  ** needs the stored shape and no packed reading applies, so it converts values */
  int64_t pshape[2] = {OUT, 4};
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn.experts.3.w2.weight", 2, pshape, w), ST_OK);
  for (int i = 0; i < OUT * 4; i++) assert_true(w[i] == (float)plain[i]);
  assert_int_equal(st_checkpoint_dtype(ck, "layers.1.ffn.experts.3.w2.weight", &dt), ST_OK);
  assert_int_equal(dt, ST_I8);
  /* a plain I8 asked for at twice its width has no packed reading: shape error with a hint */
  int64_t wide[2] = {OUT, 8};
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn.experts.3.w2.weight", 2, wide, w), ST_EFORMAT);
  expect_message("layers.1.ffn.experts.3.w2.weight", "FP4", NULL);
  /* in % 32 != 0: clear refusal naming the tensor */
  int64_t oshape[2] = {2, 48};
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn.experts.2.w1.weight", 2, oshape, w), ST_EUNSUPPORTED);
  expect_message("model.safetensors", "layers.1.ffn.experts.2.w1.weight", "32", NULL);
  /* wrong number of scale columns */
  st_checkpoint_close(ck);
  uint8_t bad_scale[OUT * 2] = {0};
  t[1].shape[1] = 2;
  t[1].data = bad_scale;
  t[1].n_bytes = sizeof bad_scale;
  write_tensors(dir, "model.safetensors", t, 2);
  ck = open_ok(dir);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn.experts.3.w1.weight", 2, shape, w), ST_EFORMAT);
  expect_message("layers.1.ffn.experts.3.w1.scale", NULL);
  st_checkpoint_close(ck);
  drop_dir(dir);
}

/* ------------------------------------------------------------------ sharding and isolation */

static void write_index(const char *dir, const char *const *names, const char *const *files, int n) {
  char text[8192];
  size_t o = (size_t)snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
  for (int i = 0; i < n; i++)
    o += (size_t)snprintf(text + o, sizeof text - o, "%s\"%s\": \"%s\"", i ? ", " : "", names[i], files[i]);
  snprintf(text + o, sizeof text - o, "}}");
  write_text(dir, "model.safetensors.index.json", text);
}

static void test_sharded_index_and_layer_isolation(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "");
  float *a = random_floats(64), *b = random_floats(64), *e = random_floats(16 * 8);
  tensor_spec shard1[] = {
    {"layers.0.attn_norm.weight", "F32", 1, {64}, a, 256},
    {"embed.weight", "F32", 2, {16, 8}, e, 512},
  };
  tensor_spec shard2[] = {{"layers.1.attn_norm.weight", "F32", 1, {64}, b, 256}};
  write_tensors(dir, "model-00001-of-00002.safetensors", shard1, 2);
  write_tensors(dir, "model-00002-of-00002.safetensors", shard2, 1);
  const char *names[] = {"layers.0.attn_norm.weight", "embed.weight", "layers.1.attn_norm.weight"};
  const char *files[] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors"};
  write_index(dir, names, files, 3);
  st_checkpoint *ck = open_ok(dir);
  assert_int_equal(st_checkpoint_count(ck), 3);
  assert_int_equal(st_checkpoint_bytes_read(ck), 0);
  /* Cut layer 0's shard away under the open checkpoint: if anything touched its tensor bytes
  ** from now on, the mapping would fault (SIGBUS) and the test would crash. */
  char *p1 = path_in(dir, files[0]);
  assert_int_equal(truncate(p1, 0), 0);
  int64_t n = 64;
  float out[64];
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.attn_norm.weight", 1, &n, out), ST_OK);
  assert_memory_equal(out, b, 256);
  assert_int_equal(st_checkpoint_bytes_read(ck), 256);
  st_checkpoint_tensor_info info;
  assert_int_equal(st_checkpoint_info(ck, "layers.0.attn_norm.weight", &info), ST_OK);
  assert_string_equal(info.file, p1);
  assert_string_equal(info.dtype, "F32");
  assert_int_equal(info.shape[0], 64);
  st_checkpoint_close(ck);

  /* restore shard 1; then an index naming a shard that does not exist fails at open */
  write_tensors(dir, files[0], shard1, 2);
  ck = open_ok(dir);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn_norm.weight", 1, &n, out), ST_OK);
  assert_memory_equal(out, a, 256);
  st_checkpoint_close(ck);
  const char *files_missing[] = {files[0], files[0], "model-00003-of-00002.safetensors"};
  write_index(dir, names, files_missing, 3);
  assert_int_equal(st_checkpoint_open(dir, &ck), ST_ENOTFOUND);
  assert_null(ck);
  expect_message("model.safetensors.index.json", "model-00003-of-00002.safetensors",
                 "layers.1.attn_norm.weight", NULL);
  /* a shard that does not hold the tensor the index says it does */
  const char *files_wrong[] = {files[0], files[0], files[0]};
  write_index(dir, names, files_wrong, 3);
  assert_int_equal(st_checkpoint_open(dir, &ck), ST_EFORMAT);
  expect_message("model.safetensors.index.json", "layers.1.attn_norm.weight", files[0], NULL);
  /* a shard name escaping the directory */
  const char *files_escape[] = {"../x.safetensors", files[0], files[1]};
  write_index(dir, names, files_escape, 3);
  assert_int_equal(st_checkpoint_open(dir, &ck), ST_EFORMAT);
  expect_message("layers.0.attn_norm.weight", NULL);
  /* malformed index JSON */
  write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
  assert_int_equal(st_checkpoint_open(dir, &ck), ST_EFORMAT);
  expect_message("model.safetensors.index.json", "line", NULL);
  free(p1);
  free(a);
  free(b);
  free(e);
  drop_dir(dir);
}

/* One file: layer 1's tensor in the first data page, layer 0's in the next; truncating the file
** to drop the second page proves loading layer 1 never reads layer 0's bytes. */
static void test_single_file_layer_isolation(void **state) {
  (void)state;
  long page = sysconf(_SC_PAGESIZE);
  char *dir = make_dir();
  write_config(dir, "");
  size_t n = (size_t)page / 4;
  float *l1 = random_floats(n), *l0 = random_floats(n);
  tensor_spec t[] = {
    {"layers.1.ffn_norm.weight", "F32", 1, {(int64_t)n}, l1, n * 4},
    {"layers.0.ffn_norm.weight", "F32", 1, {(int64_t)n}, l0, n * 4},
  };
  char *p = path_in(dir, "model.safetensors");
  write_tensors_aligned(p, t, 2, (size_t)page);
  st_checkpoint *ck = open_ok(dir);
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal(truncate(p, sb.st_size - page), 0);
  float *out = malloc(n * 4);
  int64_t shape = (int64_t)n;
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.ffn_norm.weight", 1, &shape, out), ST_OK);
  assert_memory_equal(out, l1, n * 4);
  assert_int_equal(st_checkpoint_bytes_read(ck), n * 4);
  st_checkpoint_close(ck);
  free(out);
  free(l1);
  free(l0);
  free(p);
  drop_dir(dir);
}

/* ------------------------------------------------------------------ name dialects */

static void test_canonical_name_table(void **state) {
  (void)state;
  /* the 41 key patterns of a transformers 5.17 save_pretrained checkpoint, and the alternates */
  static const char *const pairs[][2] = {
    {"head.weight", "head.weight"},
    {"model.embed_tokens.weight", "embed.weight"},
    {"model.norm.weight", "norm.weight"},
    {"model.hc_head.hc_fn", "hc_head_fn"},
    {"model.hc_head.hc_base", "hc_head_base"},
    {"model.hc_head.hc_scale", "hc_head_scale"},
    {"model.layers.12.attn_norm.weight", "layers.12.attn_norm.weight"},
    {"model.layers.12.ffn_norm.weight", "layers.12.ffn_norm.weight"},
    {"model.layers.12.hc_attn_fn", "layers.12.hc_attn_fn"},
    {"model.layers.12.hc_attn_base", "layers.12.hc_attn_base"},
    {"model.layers.12.hc_attn_scale", "layers.12.hc_attn_scale"},
    {"model.layers.12.hc_ffn_fn", "layers.12.hc_ffn_fn"},
    {"model.layers.12.hc_ffn_base", "layers.12.hc_ffn_base"},
    {"model.layers.12.hc_ffn_scale", "layers.12.hc_ffn_scale"},
    {"model.layers.12.attn.wq_a.weight", "layers.12.attn.wq_a.weight"},
    {"model.layers.12.attn.wq_b.weight", "layers.12.attn.wq_b.weight"},
    {"model.layers.12.attn.wkv.weight", "layers.12.attn.wkv.weight"},
    {"model.layers.12.attn.wo_a.weight", "layers.12.attn.wo_a.weight"},
    {"model.layers.12.attn.wo_b.weight", "layers.12.attn.wo_b.weight"},
    {"model.layers.12.attn.q_norm.weight", "layers.12.attn.q_norm.weight"},
    {"model.layers.12.attn.norm.weight", "layers.12.attn.kv_norm.weight"},
    {"model.layers.12.attn.attn_sink", "layers.12.attn.attn_sink"},
    {"model.layers.12.attn.compressor.wkv.weight", "layers.12.attn.compressor.wkv.weight"},
    {"model.layers.12.attn.compressor.wgate.weight", "layers.12.attn.compressor.wgate.weight"},
    {"model.layers.12.attn.compressor.norm.weight", "layers.12.attn.compressor.norm.weight"},
    {"model.layers.12.attn.compressor.ape", "layers.12.attn.compressor.ape"},
    {"model.layers.12.attn.indexer.wq_b.weight", "layers.12.attn.indexer.wq_b.weight"},
    {"model.layers.12.attn.indexer.weights_proj.weight", "layers.12.attn.indexer.weights_proj.weight"},
    {"model.layers.12.attn.indexer.compressor.wkv.weight", "layers.12.attn.indexer.compressor.wkv.weight"},
    {"model.layers.12.attn.indexer.compressor.wgate.weight", "layers.12.attn.indexer.compressor.wgate.weight"},
    {"model.layers.12.attn.indexer.compressor.norm.weight", "layers.12.attn.indexer.compressor.norm.weight"},
    {"model.layers.12.attn.indexer.compressor.ape", "layers.12.attn.indexer.compressor.ape"},
    {"model.layers.12.ffn.gate.weight", "layers.12.ffn.gate.weight"},
    {"model.layers.12.ffn.gate.bias", "layers.12.ffn.gate.bias"},
    {"model.layers.12.ffn.gate.tid2eid", "layers.12.ffn.gate.tid2eid"},
    {"model.layers.12.ffn.experts.255.w1.weight", "layers.12.ffn.experts.255.w1.weight"},
    {"model.layers.12.ffn.experts.255.w2.weight", "layers.12.ffn.experts.255.w2.weight"},
    {"model.layers.12.ffn.experts.255.w3.weight", "layers.12.ffn.experts.255.w3.weight"},
    {"model.layers.12.ffn.shared_experts.w1.weight", "layers.12.ffn.shared_experts.w1.weight"},
    {"model.layers.12.ffn.shared_experts.w2.weight", "layers.12.ffn.shared_experts.w2.weight"},
    {"model.layers.12.ffn.shared_experts.w3.weight", "layers.12.ffn.shared_experts.w3.weight"},
    /* convert.py-style alternates */
    {"model.layers.3.attn.wq_a.weight_scale_inv", "layers.3.attn.wq_a.scale"},
    {"layers.3.ffn.experts.0.w1.weight_scale_inv", "layers.3.ffn.experts.0.w1.scale"},
    {"model.layers.3.ffn.gate.e_score_correction_bias", "layers.3.ffn.gate.bias"},
    {"model.layers.3.self_attn.wkv.weight", "layers.3.attn.wkv.weight"},
    {"model.layers.3.mlp.shared_experts.w2.weight", "layers.3.ffn.shared_experts.w2.weight"},
    {"lm_head.weight", "head.weight"},
    /* reference-dialect names pass through unchanged */
    {"embed.weight", "embed.weight"},
    {"hc_head_fn", "hc_head_fn"},
    {"layers.0.attn.kv_norm.weight", "layers.0.attn.kv_norm.weight"},
    {"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.scale"},
    {"layers.0.attn.compressor.norm.weight", "layers.0.attn.compressor.norm.weight"},
    /* look-alikes that must not be rewritten */
    {"layers.0.attn.norm.weight.extra", "layers.0.attn.norm.weight.extra"},
    {"layers.x.attn.norm.weight", "layers.x.attn.norm.weight"},
    {"model.layers.0.mlpx.w", "layers.0.mlpx.w"},
  };
  char buf[256];
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    int r = st_checkpoint_canonical_name(pairs[i][0], buf, sizeof buf);
    if (r != 1 || strcmp(buf, pairs[i][1]) != 0)
      fail_msg("%s -> %s (r=%d), want %s", pairs[i][0], buf, r, pairs[i][1]);
  }
  assert_int_equal(st_checkpoint_canonical_name("mtp.0.e_proj.weight", buf, sizeof buf), 0);
  assert_int_equal(st_checkpoint_canonical_name("model.mtp.0.norm.weight", buf, sizeof buf), 0);
  assert_int_equal(st_checkpoint_canonical_name("model.layers.12.attn.norm.weight", buf, 8), -1);
}

/* The same weights written once in each dialect (and, for the HF one, sharded) load identically. */
static void test_dialects_identical(void **state) {
  (void)state;
  static const char *const names[][2] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"head.weight", "head.weight"},
    {"norm.weight", "model.norm.weight"},
    {"hc_head_fn", "model.hc_head.hc_fn"},
    {"hc_head_base", "model.hc_head.hc_base"},
    {"hc_head_scale", "model.hc_head.hc_scale"},
    {"layers.0.attn.kv_norm.weight", "model.layers.0.attn.norm.weight"},
    {"layers.0.attn.compressor.norm.weight", "model.layers.0.attn.compressor.norm.weight"},
    {"layers.0.hc_attn_fn", "model.layers.0.hc_attn_fn"},
    {"layers.1.ffn.gate.bias", "model.layers.1.ffn.gate.e_score_correction_bias"},
    {"layers.1.attn.wq_b.weight", "model.layers.1.attn.wq_b.weight"},
    {"layers.1.attn.wq_b.scale", "model.layers.1.attn.wq_b.weight_scale_inv"},
  };
  enum { N = 12 };
  const char *dtypes[N] = {"BF16", "BF16", "F32", "F32", "F32", "F32", "BF16", "F16", "F32", "F32", "F8_E4M3", "F8_E8M0"};
  int64_t shapes[N][2] = {{16, 8}, {16, 8}, {8, 1}, {4, 32}, {4, 1}, {1, 1}, {16, 1}, {16, 1}, {24, 32}, {4, 1}, {130, 8}, {2, 1}};
  int ranks[N] = {2, 2, 1, 2, 1, 1, 1, 1, 2, 1, 2, 2};
  void *data[N];
  size_t bytes[N];
  for (int i = 0; i < N; i++) {
    size_t elems = (size_t)shapes[i][0] * (size_t)(ranks[i] == 2 ? shapes[i][1] : 1);
    size_t es = strcmp(dtypes[i], "F32") == 0 ? 4 : dtypes[i][0] == 'F' && dtypes[i][1] == '8' ? 1 : 2;
    bytes[i] = elems * es;
    uint8_t *d = malloc(bytes[i]);
    for (size_t k = 0; k < bytes[i]; k++) d[k] = (uint8_t)(rng() & 0x3e); /* small finite values */
    data[i] = d;
  }
  char *dir_ref = make_dir(), *dir_hf = make_dir();
  write_config(dir_ref, "");
  write_config(dir_hf, "");
  tensor_spec ref[N], hf[N];
  for (int i = 0; i < N; i++) {
    ref[i] = (tensor_spec){names[i][0], dtypes[i], ranks[i], {shapes[i][0], shapes[i][1]}, data[i], bytes[i]};
    hf[i] = ref[i];
    hf[i].name = names[i][1];
  }
  write_tensors(dir_ref, "model.safetensors", ref, N);
  write_tensors(dir_hf, "model-00001-of-00002.safetensors", hf, 6);
  write_tensors(dir_hf, "model-00002-of-00002.safetensors", hf + 6, N - 6);
  const char *hf_names[N], *hf_files[N];
  for (int i = 0; i < N; i++) {
    hf_names[i] = names[i][1];
    hf_files[i] = i < 6 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_index(dir_hf, hf_names, hf_files, N);
  st_checkpoint *a = open_ok(dir_ref), *b = open_ok(dir_hf);
  assert_int_equal(st_checkpoint_count(a), N);
  assert_int_equal(st_checkpoint_count(b), N);
  for (size_t i = 0; i < N; i++) assert_string_equal(st_checkpoint_name_at(a, i), st_checkpoint_name_at(b, i));
  float x[130 * 32], y[130 * 32];
  for (int i = 0; i < N; i++) {
    if (strstr(names[i][0], ".scale")) continue; /* read through its weight */
    memset(x, 0, sizeof x);
    memset(y, 0xff, sizeof y);
    assert_int_equal(st_checkpoint_read_f32(a, names[i][0], ranks[i], shapes[i], x), ST_OK);
    if (st_checkpoint_read_f32(b, names[i][0], ranks[i], shapes[i], y) != ST_OK)
      fail_msg("%s: %s", names[i][0], st_errmsg());
    size_t elems = (size_t)shapes[i][0] * (size_t)(ranks[i] == 2 ? shapes[i][1] : 1);
    assert_memory_equal(x, y, elems * sizeof(float));
  }
  /* a missing tensor names the directory and the canonical name */
  int64_t s1 = 1;
  assert_int_equal(st_checkpoint_read_f32(b, "layers.7.attn.attn_sink", 1, &s1, x), ST_ENOTFOUND);
  expect_message(dir_hf, "layers.7.attn.attn_sink", NULL);
  /* messages about an HF-stored tensor give both names */
  assert_int_equal(st_checkpoint_read_f32(b, "layers.0.attn.kv_norm.weight", 1, &s1, x), ST_EFORMAT);
  expect_message("model-00002-of-00002.safetensors", "layers.0.attn.kv_norm.weight",
                 "model.layers.0.attn.norm.weight", "[1]", "[16]", NULL);
  st_checkpoint_close(a);
  st_checkpoint_close(b);
  /* both dialects of one tensor in one checkpoint: ambiguous, refused at open */
  tensor_spec both[2] = {ref[6], hf[6]};
  write_tensors(dir_ref, "model.safetensors", both, 2);
  st_checkpoint *c = NULL;
  assert_int_equal(st_checkpoint_open(dir_ref, &c), ST_EFORMAT);
  expect_message("layers.0.attn.kv_norm.weight", "model.layers.0.attn.norm.weight", NULL);
  for (int i = 0; i < N; i++) free(data[i]);
  drop_dir(dir_ref);
  drop_dir(dir_hf);
}

/* ------------------------------------------------------------------ the transformers fixtures */

static void check_fixture(const char *name) {
  const char *base = getenv("ST_TEST_DATA");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/oracle/%s", base ? base : "tests/data", name);
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    print_message("fixture %s not present, skipped\n", dir);
    return;
  }
  st_checkpoint *ck = open_ok(dir);
  const st_config *c = st_checkpoint_config(ck);
  /* every stored tensor is reachable by its canonical name and loads at its stored shape */
  size_t n = st_checkpoint_count(ck);
  assert_true(n > 40);
  for (size_t i = 0; i < n; i++) {
    const char *cn = st_checkpoint_name_at(ck, i);
    assert_null(strstr(cn, "model."));
    st_checkpoint_tensor_info info;
    assert_int_equal(st_checkpoint_info(ck, cn, &info), ST_OK);
    size_t elems = 1;
    for (int d = 0; d < info.rank; d++) elems *= (size_t)info.shape[d];
    if (strcmp(info.dtype, "I64") == 0) {
      int32_t *ids = malloc(elems * sizeof *ids);
      if (st_checkpoint_read_i32_in(ck, cn, info.rank, info.shape, 0, c->n_routed_experts - 1, ids) != ST_OK)
        fail_msg("%s: %s", cn, st_errmsg());
      free(ids);
    } else {
      float *w = NULL;
      if (st_checkpoint_load_f32(ck, cn, info.rank, info.shape, &w) != ST_OK) fail_msg("%s: %s", cn, st_errmsg());
      for (size_t k = 0; k < elems; k++) assert_true(isfinite(w[k]));
      free(w);
    }
  }
  /* the dialect mapping resolved the keys that differ */
  const char *must[] = {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base",
                        "hc_head_scale", "layers.0.attn.kv_norm.weight", "layers.0.ffn.gate.tid2eid"};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    if (!st_checkpoint_has(ck, must[i])) fail_msg("%s: no %s", name, must[i]);
  for (int l = 0; l < c->num_hidden_layers; l++) {
    char key[128];
    snprintf(key, sizeof key, "layers.%d.attn.kv_norm.weight", l);
    assert_true(st_checkpoint_has(ck, key));
    snprintf(key, sizeof key, "layers.%d.attn.compressor.ape", l);
    assert_int_equal(st_checkpoint_has(ck, key), c->layer_kind[l] != ST_LAYER_SLIDING);
    snprintf(key, sizeof key, "layers.%d.attn.indexer.wq_b.weight", l);
    assert_int_equal(st_checkpoint_has(ck, key), c->layer_kind[l] == ST_LAYER_CSA);
    snprintf(key, sizeof key, "layers.%d.ffn.gate.tid2eid", l);
    assert_int_equal(st_checkpoint_has(ck, key), c->hash_moe[l]);
  }
  int64_t es[2] = {c->vocab_size, c->hidden_size};
  float *embed = NULL;
  assert_int_equal(st_checkpoint_load_f32(ck, "embed.weight", 2, es, &embed), ST_OK);
  free(embed);
  st_checkpoint_close(ck);
}

static void test_transformers_fixtures(void **state) {
  (void)state;
  check_fixture("tiny");
  check_fixture("odd");
  /* the odd fixture's config: no divisibility anywhere */
  const char *base = getenv("ST_TEST_DATA");
  char path[1024];
  snprintf(path, sizeof path, "%s/oracle/odd/config.json", base ? base : "tests/data");
  struct stat sb;
  if (stat(path, &sb) != 0) return;
  st_config c;
  assert_int_equal(st_config_load(path, &c), ST_OK);
  assert_int_equal(c.hidden_size, 72);
  assert_int_equal(c.head_dim, 40);
  assert_int_equal(c.rope_head_dim, 16);
  assert_int_equal(c.o_groups, 3);
  assert_int_equal(c.compress_rate_hca, 16);
  assert_int_equal(c.layer_kind[0], ST_LAYER_CSA);
  assert_int_equal(c.layer_kind[2], ST_LAYER_SLIDING);
  assert_int_equal(c.compress_ratio[1], 16);
  assert_int_equal(c.compress_ratio[3], 4);
  assert_true(c.hash_moe[1] && !c.hash_moe[2]);
  assert_true(c.yarn && c.yarn_factor == 16 && c.yarn_attention_factor == 1.0);
  assert_true(c.routed_scaling_factor == 2.5);
}

/* ------------------------------------------------------------------ bad files */

/* Opens DIR expecting failure `want`; the message must mention the fragments. */
static void expect_open_fails(const char *dir, st_status want, const char *first, ...) {
  st_checkpoint *ck = (st_checkpoint *)&ck; /* must be reset to NULL */
  st_status rc = st_checkpoint_open(dir, &ck);
  if (rc != want) fail_msg("open: got %d (%s), want %d", rc, st_errmsg(), want);
  assert_null(ck);
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    if (!strstr(st_errmsg(), s)) fail_msg("message \"%s\" does not mention \"%s\"", st_errmsg(), s);
  va_end(ap);
}

static void test_bad_safetensors_files(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "");
  char *p = path_in(dir, "model.safetensors");
  float v[4] = {1, 2, 3, 4};

  write_text(dir, "model.safetensors", "this is not a safetensors file, just some text");
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "not a safetensors file", NULL);
  write_text(dir, "model.safetensors", "abc");
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", NULL);
  write_text(dir, "model.safetensors", "");
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", NULL);

  /* header length longer than the file */
  unsigned char hdr[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  write_bytes(p, hdr, sizeof hdr);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "header length 200", NULL);

  /* JSON malformed */
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", ", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "line", NULL);
  write_raw(p, "[1, 2]", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", NULL);

  /* offsets out of range */
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 32]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "norm.weight", "data_offsets", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 0]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [-1, 15]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", NULL);

  /* size mismatch: dtype x shape vs byte range */
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", "need 12 bytes", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], "
               "\"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": [-4], \"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", "shape", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F32\", \"shape\": \"4\", \"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", "shape", NULL);

  /* unknown dtype */
  write_raw(p, "{\"norm.weight\": {\"dtype\": \"F7\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "norm.weight", "F7", NULL);
  write_raw(p, "{\"norm.weight\": {\"dtype\": 4, \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", "dtype", NULL);
  write_raw(p, "{\"norm.weight\": 7}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "norm.weight", NULL);
  write_raw(p, "{\"__metadata__\": [1]}", 8, v, 0);
  expect_open_fails(dir, ST_EFORMAT, "__metadata__", NULL);

  /* overlapping, gapped, and incomplete coverage */
  write_raw(p, "{\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
               "\"b.weight\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [4, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "b.weight", "overlapping", NULL);
  write_raw(p, "{\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}, "
               "\"b.weight\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "a.weight", "gap", NULL);
  write_raw(p, "{\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "16 data bytes", NULL);
  /* duplicate keys */
  write_raw(p, "{\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
               "\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 8, v, 16);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "duplicate", NULL);
  /* a NUL byte inside the header */
  write_raw(p, "{\"a.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, v, 16);
  {
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 12, SEEK_SET);
    fputc(0, f);
    fclose(f);
  }
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", NULL);

  /* truncated file: the last tensor runs past the end */
  tensor_spec t[] = {{"a.weight", "F32", 1, {4}, v, 16}, {"layers.0.b.weight", "F32", 1, {4}, v, 16}};
  write_tensors(dir, "model.safetensors", t, 2);
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal(truncate(p, sb.st_size - 3), 0);
  expect_open_fails(dir, ST_EFORMAT, "model.safetensors", "layers.0.b.weight", "truncated", NULL);

  /* missing files */
  assert_int_equal(unlink(p), 0);
  expect_open_fails(dir, ST_ENOTFOUND, dir, "model.safetensors", NULL);
  char *cfg = path_in(dir, "config.json");
  assert_int_equal(unlink(cfg), 0);
  expect_open_fails(dir, ST_EIO, "config.json", NULL);
  char *nodir = path_in(dir, "absent");
  expect_open_fails(nodir, ST_EIO, "absent", NULL);
  free(nodir);
  free(cfg);
  free(p);
  drop_dir(dir);
}

static void test_bad_tensor_requests(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "");
  float v[6] = {1, 2, 3, 4, 5, 6};
  tensor_spec t[] = {{"layers.0.attn.attn_sink", "F32", 2, {2, 3}, v, 24}};
  write_tensors(dir, "model.safetensors", t, 1);
  st_checkpoint *ck = open_ok(dir);
  float out[6];
  int64_t good[2] = {2, 3}, swapped[2] = {3, 2}, flat = 6;
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.attn_sink", 2, swapped, out), ST_EFORMAT);
  expect_message("model.safetensors", "layers.0.attn.attn_sink", "[3, 2]", "[2, 3]", NULL);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.attn_sink", 1, &flat, out), ST_EFORMAT);
  expect_message("layers.0.attn.attn_sink", "[6]", NULL);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.1.attn.attn_sink", 2, good, out), ST_ENOTFOUND);
  expect_message(dir, "layers.1.attn.attn_sink", NULL);
  int64_t negative[2] = {-2, 3};
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.attn_sink", 2, negative, out), ST_EINVAL);
  float *none = (float *)out;
  assert_int_equal(st_checkpoint_load_f32(ck, "absent", 2, good, &none), ST_ENOTFOUND);
  assert_null(none);
  st_checkpoint_tensor_info info;
  assert_int_equal(st_checkpoint_info(ck, "absent", &info), ST_ENOTFOUND);
  st_dtype dt;
  assert_int_equal(st_checkpoint_dtype(ck, "absent", &dt), ST_ENOTFOUND);
  assert_int_equal(st_checkpoint_read_f32(ck, "layers.0.attn.attn_sink", 2, good, out), ST_OK);
  st_checkpoint_close(ck);
  st_checkpoint_close(NULL);

  /* checkpoint with a bad config */
  write_text(dir, "config.json", "{\"model_type\": \"llama\"}");
  expect_open_fails(dir, ST_EUNSUPPORTED, "config.json", "model_type", "llama", NULL);
  write_text(dir, "config.json", "{\"model_type\": \"deepseek_v4\", \"hidden_size\": \"big\"}");
  expect_open_fails(dir, ST_EFORMAT, "config.json", "hidden_size", NULL);
  write_text(dir, "config.json", "{\"model_type\": \"deepseek_v4\",\n \"hidden_size\": 4096,,}");
  expect_open_fails(dir, ST_EFORMAT, "config.json", "line 2", NULL);
  drop_dir(dir);
}

/* Cut a valid file at every length inside its header region (and a sample beyond): each prefix
** must be refused cleanly, never crash or be accepted. Then flip random header bytes. */
/* issue 14 defect 7: a request sized from a config value the file does not match is a shape
** error, found before the buffer is allocated (it was an allocation of 2^40 floats: ENOMEM in
** Release, an allocation-size abort under ASan). */
static void test_shape_checked_before_allocation(void **state) {
  (void)state;
  char *dir = make_dir();
  write_config(dir, "");
  float v[4] = {1, 2, 3, 4};
  tensor_spec t[] = {{"norm.weight", "F32", 1, {4}, v, sizeof v}};
  write_tensors(dir, "model.safetensors", t, 1);
  st_checkpoint *ck = open_ok(dir);
  float *out = NULL;
  int64_t huge[2] = {1LL << 20, 1LL << 20};
  assert_int_equal(st_checkpoint_load_f32(ck, "norm.weight", 2, huge, &out), ST_EFORMAT);
  expect_message("norm.weight", "expected shape", NULL);
  assert_null(out);
  int64_t one = 1LL << 40;
  assert_int_equal(st_checkpoint_load_f32(ck, "norm.weight", 1, &one, &out), ST_EFORMAT);
  assert_int_equal(st_checkpoint_load_f32(ck, "absent.weight", 2, huge, &out), ST_ENOTFOUND);
  st_checkpoint_close(ck);
  drop_dir(dir);
}

static void test_truncation_and_mutation_fuzz(void **state) {
  (void)state;
  char *dir = make_dir();
  char *p = path_in(dir, "model.safetensors");
  float *v = random_floats(64);
  uint16_t b[32];
  for (int i = 0; i < 32; i++) b[i] = st_f32_to_bf16(v[i]);
  tensor_spec t[] = {
    {"model.layers.0.attn.norm.weight", "F32", 1, {64}, v, 256},
    {"model.embed_tokens.weight", "BF16", 2, {4, 8}, b, 64},
    {"model.layers.0.ffn.gate.tid2eid", "U8", 1, {5}, b, 5},
  };
  write_tensors(dir, "model.safetensors", t, 3);
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  unsigned char full[4096];
  size_t size = fread(full, 1, sizeof full, f);
  fclose(f);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | full[i];
  st_safetensors *st = NULL;
  assert_int_equal(st_safetensors_open(p, &st), ST_OK);
  assert_int_equal(st_safetensors_count(st), 3);
  assert_string_equal(st_safetensors_metadata(st, "format"), "pt");
  const st_safetensors_tensor *x = st_safetensors_find(st, "model.embed_tokens.weight");
  assert_non_null(x);
  assert_int_equal(x->dtype, ST_SAFETENSORS_BF16);
  assert_memory_equal(x->data, b, 64);
  st_safetensors_close(st);
  int refused = 0;
  for (size_t len = 0; len < size; len++) {
    if (len > 8 + header_len + 16 && len % 7) continue; /* sample the data region */
    write_bytes(p, full, len);
    st = (st_safetensors *)p;
    st_status rc = st_safetensors_open(p, &st);
    if (rc == ST_OK) fail_msg("prefix of %zu/%zu bytes accepted", len, size);
    assert_null(st);
    assert_non_null(strstr(st_errmsg(), "model.safetensors"));
    refused++;
  }
  assert_true(refused > (int)header_len);
  /* random single-byte mutations of the header: no crash; an accepted file stays in bounds */
  unsigned char mutated[4096];
  for (int i = 0; i < 3000; i++) {
    memcpy(mutated, full, size);
    int flips = 1 + (int)(rng() % 3);
    for (int k = 0; k < flips; k++) {
      size_t at = (size_t)(rng() % (8 + header_len));
      mutated[at] = (rng() & 1) ? (uint8_t)rng() : (uint8_t)"{}[]\",:0123456789 eE-."[rng() % 22];
    }
    write_bytes(p, mutated, size);
    st_status rc = st_safetensors_open(p, &st);
    if (rc == ST_OK) {
      for (size_t k = 0; k < st_safetensors_count(st); k++) {
        const st_safetensors_tensor *e = st_safetensors_at(st, k);
        assert_true(e->offset + e->n_bytes <= size);
      }
      st_safetensors_close(st);
    } else {
      assert_true(strlen(st_errmsg()) > 0);
    }
  }
  free(v);
  free(p);
  drop_dir(dir);
}

/* ------------------------------------------------------------------ config.json */

static st_status parse(const char *json, st_config *c) { return st_config_parse(json, "cfg.json", c); }

static void test_config_defaults(void **state) {
  (void)state;
  st_config c;
  assert_int_equal(parse("{\"model_type\": \"deepseek_v4\"}", &c), ST_OK);
  assert_string_equal(c.model_type, "deepseek_v4");
  assert_int_equal(c.vocab_size, 129280);
  assert_int_equal(c.hidden_size, 4096);
  assert_int_equal(c.num_hidden_layers, 43);
  assert_int_equal(c.num_attention_heads, 64);
  assert_int_equal(c.head_dim, 512);
  assert_int_equal(c.rope_head_dim, 64);
  assert_int_equal(c.q_lora_rank, 1024);
  assert_int_equal(c.o_groups, 8);
  assert_int_equal(c.o_lora_rank, 1024);
  assert_int_equal(c.sliding_window, 128);
  assert_int_equal(c.index_n_heads, 64);
  assert_int_equal(c.index_head_dim, 128);
  assert_int_equal(c.index_topk, 512);
  assert_int_equal(c.n_routed_experts, 256);
  assert_int_equal(c.num_experts_per_tok, 6);
  assert_int_equal(c.n_shared_experts, 1);
  assert_int_equal(c.moe_intermediate_size, 2048);
  assert_int_equal(c.hc_mult, 4);
  assert_int_equal(c.hc_sinkhorn_iters, 20);
  assert_true(c.hc_eps == 1e-6 && c.rms_norm_eps == 1e-6);
  assert_true(c.routed_scaling_factor == 1.5 && c.swiglu_limit == 10.0);
  assert_string_equal(c.scoring_func, "sqrtsoftplus");
  assert_true(c.rope_theta == 10000 && c.compress_rope_theta == 160000);
  assert_int_equal(c.yarn, 0);
  assert_int_equal(c.bos_token_id, 0);
  assert_int_equal(c.eos_token_id, 1);
  assert_int_equal(c.tie_word_embeddings, 0);
  assert_int_equal(c.max_position_embeddings, 1048576);
  assert_int_equal(c.compress_rate_csa, 4);
  assert_int_equal(c.compress_rate_hca, 128);
  assert_int_equal(c.quantized, 0);
  /* transformers' default schedule: HCA, HCA, then "CSA if i % 2 else HCA" for i = 0.. */
  for (int i = 0; i < 43; i++) {
    st_layer_kind want = i < 2 ? ST_LAYER_HCA : ((i - 2) % 2 ? ST_LAYER_CSA : ST_LAYER_HCA);
    assert_int_equal(c.layer_kind[i], want);
    assert_int_equal(c.compress_ratio[i], want == ST_LAYER_CSA ? 4 : 128);
    assert_int_equal(c.hash_moe[i], i < 3);
  }
}

static void test_config_legacy_fields(void **state) {
  (void)state;
  /* V4-Flash style: compress_ratios with the MTP tail, qk_rope_head_dim, flat rope_scaling */
  char json[4096];
  char ratios[512] = "[0, 0";
  for (int i = 0; i < 20; i++) strcat(ratios, ", 4, 128");
  strcat(ratios, ", 4, 0]");
  snprintf(json, sizeof json,
           "{\"model_type\": \"deepseek_v4\", \"num_hidden_layers\": 43, \"compress_ratios\": %s, "
           "\"num_hash_layers\": 3, \"qk_rope_head_dim\": 64, \"head_dim\": 512, "
           "\"rope_theta\": 10000, \"compress_rope_theta\": 160000, \"rope_scaling\": {\"type\": "
           "\"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, "
           "\"beta_slow\": 1}, \"eos_token_id\": [1, 2], \"quantization_config\": {\"quant_method\": "
           "\"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\", \"activation_scheme\": \"dynamic\", "
           "\"weight_block_size\": [128, 128]}, \"expert_dtype\": \"fp4\", \"compress_rate_hca\": 64}",
           ratios);
  st_config c;
  if (parse(json, &c) != ST_OK) fail_msg("%s", st_errmsg());
  assert_int_equal(c.layer_kind[0], ST_LAYER_SLIDING);
  assert_int_equal(c.layer_kind[1], ST_LAYER_SLIDING);
  assert_int_equal(c.layer_kind[2], ST_LAYER_CSA);
  assert_int_equal(c.layer_kind[3], ST_LAYER_HCA);
  assert_int_equal(c.layer_kind[42], ST_LAYER_CSA);
  assert_int_equal(c.compress_ratio[3], 64); /* legacy rate override */
  assert_int_equal(c.compress_ratio[2], 4);
  assert_true(c.hash_moe[2] && !c.hash_moe[3]);
  assert_int_equal(c.rope_head_dim, 64);
  assert_int_equal(c.yarn, 1);
  assert_true(c.yarn_factor == 16 && c.yarn_original_max_position == 65536);
  assert_true(c.yarn_beta_fast == 32 && c.yarn_beta_slow == 1);
  assert_true(c.yarn_attention_factor == 1.0); /* forced for flat configs */
  assert_int_equal(c.eos_token_id, 1);
  assert_int_equal(c.quantized, 1);
  assert_int_equal(c.scale_ue8m0, 1);
  assert_int_equal(c.weight_block[0], 128);
  assert_string_equal(c.expert_dtype, "fp4");

  /* modern fields win over legacy ones */
  assert_int_equal(parse("{\"model_type\": \"deepseek_v4\", \"num_hidden_layers\": 3, "
                         "\"layer_types\": [\"heavily_compressed_attention\", \"sliding_attention\", "
                         "\"compressed_sparse_attention\"], \"compress_ratios\": [0, 0, 0], "
                         "\"mlp_layer_types\": [\"moe\", \"hash_moe\", \"moe\"], \"num_hash_layers\": 3, "
                         "\"compress_rates\": {\"compressed_sparse_attention\": 8, "
                         "\"heavily_compressed_attention\": 32}, \"partial_rotary_factor\": 0.25, "
                         "\"qk_rope_head_dim\": 64, \"head_dim\": 64, \"index_head_dim\": 32}",
                         &c),
                   ST_OK);
  assert_int_equal(c.layer_kind[0], ST_LAYER_HCA);
  assert_int_equal(c.compress_ratio[0], 32);
  assert_int_equal(c.compress_ratio[2], 8);
  assert_true(!c.hash_moe[0] && c.hash_moe[1] && !c.hash_moe[2]);
  assert_int_equal(c.rope_head_dim, 16);

  /* nested rope_parameters; yarn without attention_factor gets transformers' default */
  assert_int_equal(parse("{\"model_type\": \"deepseek_v4\", \"rope_parameters\": {\"main\": "
                         "{\"rope_type\": \"default\", \"rope_theta\": 20000}, \"compress\": "
                         "{\"rope_type\": \"yarn\", \"rope_theta\": 40000, \"factor\": 16}}}",
                         &c),
                   ST_OK);
  assert_true(c.rope_theta == 20000 && c.compress_rope_theta == 40000);
  assert_true(fabs(c.yarn_attention_factor - (0.1 * log(16.0) + 1.0)) < 1e-12);
  assert_true(c.yarn_original_max_position == 1048576);
  /* nested without yarn */
  assert_int_equal(parse("{\"model_type\": \"deepseek_v4\", \"rope_parameters\": {\"main\": {}, "
                         "\"compress\": {\"rope_theta\": 5}}}",
                         &c),
                   ST_OK);
  assert_true(c.yarn == 0 && c.compress_rope_theta == 5);

  /* odd dimensions are fine in exact mode */
  assert_int_equal(parse("{\"model_type\": \"deepseek_v4\", \"hidden_size\": 72, \"head_dim\": 40, "
                         "\"partial_rotary_factor\": 0.4, \"num_attention_heads\": 3, \"o_groups\": 3, "
                         "\"index_head_dim\": 24, \"num_hidden_layers\": 5, \"bos_token_id\": null}",
                         &c),
                   ST_OK);
  assert_int_equal(c.rope_head_dim, 16);
  assert_int_equal(c.bos_token_id, -1);
}

static void expect_config_error(const char *json, st_status want, const char *first, ...) {
  st_config c;
  st_status rc = parse(json, &c);
  if (rc != want) fail_msg("config %s: got %d (%s), want %d", json, rc, st_errmsg(), want);
  if (!strstr(st_errmsg(), "cfg.json")) fail_msg("message \"%s\" does not name the file", st_errmsg());
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    if (!strstr(st_errmsg(), s)) fail_msg("message \"%s\" does not mention \"%s\"", st_errmsg(), s);
  va_end(ap);
}

#define V4 "{\"model_type\": \"deepseek_v4\", "

static void test_config_refusals(void **state) {
  (void)state;
  expect_config_error("{}", ST_EUNSUPPORTED, "model_type", NULL);
  expect_config_error("{\"model_type\": \"deepseek_v3\"}", ST_EUNSUPPORTED, "model_type", "deepseek_v3", NULL);
  expect_config_error("{\"model_type\": 4}", ST_EFORMAT, "model_type", NULL);
  expect_config_error("[1]", ST_EFORMAT, "object", NULL);
  expect_config_error("{\"model_type\": \"deepseek_v4\",", ST_EFORMAT, "line 1", NULL);
  expect_config_error(V4 "\"num_key_value_heads\": 2}", ST_EUNSUPPORTED, "num_key_value_heads", NULL);
  expect_config_error(V4 "\"head_dim\": 64, \"qk_rope_head_dim\": 64, \"index_head_dim\": 64}",
                      ST_EUNSUPPORTED, "head_dim", NULL);
  expect_config_error(V4 "\"qk_rope_head_dim\": 15}", ST_EUNSUPPORTED, "qk_rope_head_dim", "even", NULL);
  expect_config_error(V4 "\"head_dim\": 40}", ST_EUNSUPPORTED, "rope_head_dim 5", NULL);
  expect_config_error(V4 "\"num_hidden_layers\": 300}", ST_EUNSUPPORTED, "num_hidden_layers", NULL);
  expect_config_error(V4 "\"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"dense\"]}",
                      ST_EUNSUPPORTED, "layer_types[1]", "dense", NULL);
  expect_config_error(V4 "\"num_hidden_layers\": 2, \"compress_ratios\": [0, 7]}", ST_EUNSUPPORTED,
                      "compress_ratios[1]", NULL);
  expect_config_error(V4 "\"num_hidden_layers\": 3, \"compress_ratios\": [0, 4]}", ST_EFORMAT,
                      "compress_ratios", NULL);
  expect_config_error(V4 "\"num_hidden_layers\": 2, \"mlp_layer_types\": [\"moe\", \"dense\"]}",
                      ST_EUNSUPPORTED, "mlp_layer_types[1]", NULL);
  expect_config_error(V4 "\"num_attention_heads\": 3, \"o_groups\": 5}", ST_EUNSUPPORTED, "o_groups", NULL);
  expect_config_error(V4 "\"hidden_size\": \"big\"}", ST_EFORMAT, "hidden_size", "integer", NULL);
  expect_config_error(V4 "\"hidden_size\": 0}", ST_EFORMAT, "hidden_size", NULL);
  expect_config_error(V4 "\"hidden_size\": 4096.5}", ST_EFORMAT, "hidden_size", NULL);
  expect_config_error(V4 "\"rms_norm_eps\": \"tiny\"}", ST_EFORMAT, "rms_norm_eps", NULL);
  expect_config_error(V4 "\"layer_types\": \"abc\"}", ST_EFORMAT, "layer_types", NULL);
  expect_config_error(V4 "\"rope_parameters\": 3}", ST_EFORMAT, "rope_parameters", NULL);
  expect_config_error(V4 "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", ST_EUNSUPPORTED,
                      "rope_scaling.type", NULL);
  expect_config_error(V4 "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": \"x\"}}", ST_EFORMAT,
                      "rope_scaling.factor", NULL);
  expect_config_error(V4 "\"rope_parameters\": {\"main\": {\"rope_type\": \"yarn\"}, \"compress\": {}}}",
                      ST_EUNSUPPORTED, "rope_parameters.main", NULL);
  expect_config_error(V4 "\"eos_token_id\": \"x\"}", ST_EFORMAT, "eos_token_id", NULL);
  expect_config_error(V4 "\"tie_word_embeddings\": 3}", ST_EFORMAT, "tie_word_embeddings", NULL);
  expect_config_error(V4 "\"scoring_func\": \"relu\"}", ST_EUNSUPPORTED, "scoring_func", NULL);
  expect_config_error(V4 "\"compress_rates\": {\"mystery_attention\": 4}}", ST_EUNSUPPORTED,
                      "compress_rates", "mystery_attention", NULL);
  expect_config_error(V4 "\"compress_rates\": {\"compressed_sparse_attention\": \"4\"}}", ST_EFORMAT,
                      "compress_rates.compressed_sparse_attention", NULL);
  expect_config_error(V4 "\"quantization_config\": {\"weight_block_size\": [128]}}", ST_EFORMAT,
                      "weight_block_size", NULL);
  expect_config_error(V4 "\"num_experts_per_tok\": 9, \"n_routed_experts\": 8}", ST_EFORMAT,
                      "num_experts_per_tok", NULL);
  expect_config_error(V4 "\"model_type\": \"deepseek_v4\"}", ST_EFORMAT, "duplicate", NULL);
  /* issue 14 defect 7: every numeric field is bounded (config.h, ST_CONFIG_MAX_*) */
  expect_config_error(V4 "\"num_attention_heads\": 1000000000}", ST_EFORMAT, "num_attention_heads",
                      "[1, 1024]", NULL);
  expect_config_error(V4 "\"hc_sinkhorn_iters\": 1e9}", ST_EFORMAT, "hc_sinkhorn_iters", "[1, 1000]", NULL);
  expect_config_error(V4 "\"hidden_size\": 65537}", ST_EFORMAT, "hidden_size", "[1, 65536]", NULL);
  expect_config_error(V4 "\"n_routed_experts\": 4097}", ST_EFORMAT, "n_routed_experts", NULL);
  expect_config_error(V4 "\"vocab_size\": 2147483647}", ST_EFORMAT, "vocab_size", NULL);
  expect_config_error(V4 "\"hc_mult\": 17}", ST_EFORMAT, "hc_mult", NULL);
  expect_config_error(V4 "\"max_position_embeddings\": 9000000000000000000}", ST_EFORMAT,
                      "max_position_embeddings", NULL);
  expect_config_error(V4 "\"rope_theta\": 1e300}", ST_EFORMAT, "rope_theta", NULL);
  expect_config_error(V4 "\"rms_norm_eps\": 2}", ST_EFORMAT, "rms_norm_eps", NULL);
  expect_config_error(V4 "\"partial_rotary_factor\": 2}", ST_EFORMAT, "partial_rotary_factor", NULL);
  expect_config_error(V4 "\"quantization_config\": {\"weight_block_size\": [128, 100000]}}", ST_EFORMAT,
                      "weight_block_size", NULL);
  /* a product that sizes a buffer, each factor in range: vocab x hidden beyond 2^36 elements */
  expect_config_error(V4 "\"vocab_size\": 4194304, \"hidden_size\": 65536}", ST_EFORMAT, "vocab_size",
                      "hidden_size", NULL);
  /* at the bounds, accepted */
  st_config ok;
  assert_int_equal(parse(V4 "\"hc_sinkhorn_iters\": 1000, \"num_attention_heads\": 1024, "
                         "\"o_groups\": 8}", &ok), ST_OK);
  /* st_config_load names the file it could not read */
  st_config c;
  assert_int_equal(st_config_load("/nonexistent/dir/config.json", &c), ST_EIO);
  expect_message("/nonexistent/dir/config.json", NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_plain_dtypes),
    cmocka_unit_test(test_fp8_block128_ue8m0_edge_blocks),
    cmocka_unit_test(test_fp8_block128_f32_scales),
    cmocka_unit_test(test_fp8_block64),
    cmocka_unit_test(test_fp8_unsupported_block_and_missing_scale),
    cmocka_unit_test(test_fp4_packed_experts),
    cmocka_unit_test(test_sharded_index_and_layer_isolation),
    cmocka_unit_test(test_single_file_layer_isolation),
    cmocka_unit_test(test_canonical_name_table),
    cmocka_unit_test(test_dialects_identical),
    cmocka_unit_test(test_transformers_fixtures),
    cmocka_unit_test(test_bad_safetensors_files),
    cmocka_unit_test(test_bad_tensor_requests),
    cmocka_unit_test(test_shape_checked_before_allocation),
    cmocka_unit_test(test_truncation_and_mutation_fuzz),
    cmocka_unit_test(test_config_defaults),
    cmocka_unit_test(test_config_legacy_fields),
    cmocka_unit_test(test_config_refusals),
  };
  return cmocka_run_group_tests_name("checkpoint", tests, NULL, NULL);
}

/*
** model.c — the DeepSeek-V4 forward pass, straight-line, one readable path per layer type.
**
** Reading guide (SPEC-dsv4 §2-§3):
**   st_session_forward  splits tokens into chunks; forward_chunk runs one chunk through
**   every layer:  attention_sublayer (mHC collapse, q/kv, window, compressor, indexer, sparse
**   attention with sinks, inverse RoPE, grouped output) then moe_sublayer (mHC collapse,
**   hash- or score-routed experts + shared expert, mHC expand); then the hc_head and logits.
**
** State per layer (what a request carries between chunks and decode steps):
**   kv_all   [w + max_chunk + rows_cap, d]: slots [0, w) are the window ring (position p in slot
**            p mod w), [w, w + max_chunk) the current chunk's rows, then the compressed rows.
**   compressor state  kv/score [c m, c d] (SPEC §3.2.2), for the main and the indexer compressor.
**   indexer rows      K rows as computed (k) and as scored (k_used: rotated/quantised).
** Because every token's values depend only on earlier tokens and every reduction has a fixed
** order, one-shot prefill, chunked prefill at any split and token-by-token decode give the same
** bits (SPEC §6 F6).
**
** Taps are one line where the value exists: tap(s, ST_TAP_..., layer, p0, rows, ...).
** Shapes are written beside every buffer: n = tokens in the chunk, D hidden, hc streams,
** H heads, d head_dim, r rope dims, hI/dI indexer heads/dim.
*/
#include "model.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "indexer.h"
#include "kernels/lowp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Weights                                                                                      */

static st_status keep(st_model *m, void *p) {
  if (m->n_owned == m->cap_owned) {
    int cap = m->cap_owned ? 2 * m->cap_owned : 256;
    void **grown = realloc(m->owned, sizeof(void *) * (size_t)cap);
    if (!grown) { free(p); return st_fail(ST_ENOMEM, "model allocation table"); }
    m->owned = grown;
    m->cap_owned = cap;
  }
  m->owned[m->n_owned++] = p;
  return ST_OK;
}

/* Weights and parameter vectors are real numbers: a tensor stored as an integer type (I8 that is
** not packed FP4, I16/I32/I64, U8, BOOL) is refused, never converted by value (an F32 norm
** relabelled I32, an FP8 weight relabelled I8 whose scale would be ignored). Integers belong to
** routing tables only (tid2eid). The packed-FP4 I8 is recognised by st_checkpoint_view first. */
static st_status refuse_integer_dtype(st_model *m, const char *name) {
  st_checkpoint_tensor_info info;
  if (st_checkpoint_info(m->checkpoint, name, &info) != ST_OK) return ST_OK; /* reported by the load */
  static const char *const ints[] = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL"};
  for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
    if (strcmp(info.dtype, ints[k]) == 0)
      return st_fail(ST_EFORMAT, "%s: tensor %s: dtype %s is an integer type, but a weight must be "
                     "a float format (F32, BF16, F16, F8_E4M3 + '.scale', or packed FP4: I8 [out, "
                     "in/2] + F8_E8M0 '.scale' [out, in/32])", info.file, info.stored, info.dtype);
  return ST_OK;
}

/* Non-finite values of the stored data (and scales) of a weight; 0 for the formats without NaN
** or inf encodings. A pass over the bytes: cheap beside loading them. */
static uint64_t count_nonfinite_floats(const float *x, int64_t n) {
  uint64_t bad = 0;
  int64_t work = n;
  (void)work;
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : bad) schedule(static) if (work > 1048576)
#endif
  for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  return bad;
}

/* 16-bit floats: exponent all ones (mask) is inf or NaN. */
static uint64_t count_nonfinite_16(const void *p, int64_t n, uint16_t mask) {
  const unsigned char *b = p;
  uint64_t bad = 0;
  int64_t work = n;
  (void)work;
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : bad) schedule(static) if (work > 1048576)
#endif
  for (int64_t i = 0; i < n; i++) {
    uint16_t v;
    memcpy(&v, b + 2 * i, 2);
    bad += (v & mask) == mask;
  }
  return bad;
}

static uint64_t count_nonfinite_f32_bytes(const void *p, int64_t n) {
  const unsigned char *b = p;
  uint64_t bad = 0;
  int64_t work = n;
  (void)work;
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : bad) schedule(static) if (work > 1048576)
#endif
  for (int64_t i = 0; i < n; i++) {
    float v;
    memcpy(&v, b + 4 * i, 4);
    bad += !isfinite(v);
  }
  return bad;
}

static uint64_t count_nonfinite_weight(const st_weight *w) {
  int64_t n = w->rows * w->cols;
  uint64_t bad = 0;
  switch (w->dtype) {
  case ST_W_F32: bad = count_nonfinite_f32_bytes(w->data, n); break;
  case ST_W_BF16: bad = count_nonfinite_16(w->data, n, 0x7f80); break;
  case ST_W_F16: bad = count_nonfinite_16(w->data, n, 0x7c00); break;
  case ST_W_FP8_E4M3: { /* e4m3fn: 0x7f and 0xff are NaN, no inf */
    const unsigned char *b = w->data;
    for (int64_t i = 0; i < n; i++) bad += (b[i] & 0x7f) == 0x7f;
    break;
  }
  default: break; /* FP4 e2m1 has no NaN or inf */
  }
  if (w->scales) {
    int64_t ns = (int64_t)((w->rows + w->block[0] - 1) / w->block[0]) *
                 ((w->cols + w->block[1] - 1) / w->block[1]);
    const unsigned char *b = w->scales;
    switch (w->scale_dtype) {
    case ST_WSCALE_F32: bad += count_nonfinite_f32_bytes(b, ns); break;
    case ST_WSCALE_BF16: bad += count_nonfinite_16(b, ns, 0x7f80); break;
    case ST_WSCALE_UE8M0: for (int64_t i = 0; i < ns; i++) bad += b[i] == 0xff; break;
    default: break;
    }
  }
  return bad;
}

/* One warning per tensor holding NaN or inf (the run goes on: a trace of what such weights do is
** still worth having, but nobody should mistake its output for the model's). */
static void note_nonfinite(st_model *m, const char *name, uint64_t bad) {
  if (!bad) return;
  m->nonfinite_tensors++;
  m->nonfinite_values += bad;
  st_checkpoint_tensor_info info;
  const char *file = st_checkpoint_info(m->checkpoint, name, &info) == ST_OK ? info.file
                                                                              : st_checkpoint_dir(m->checkpoint);
  fprintf(stderr, "warning: %s: tensor %s holds %llu non-finite value%s (NaN or inf)\n", file, name,
          (unsigned long long)bad, bad == 1 ? "" : "s");
}

/* A parameter vector (or small tensor) as fp32, owned by the model. */
static st_status load_vector(st_model *m, const char *name, int rank, int64_t a, int64_t b,
                             float **out) {
  int64_t shape[2] = {a, b};
  st_status rc = refuse_integer_dtype(m, name);
  if (rc) return rc;
  rc = st_checkpoint_load_f32(m->checkpoint, name, rank, shape, out);
  if (rc) return rc;
  int64_t n = a * (rank > 1 ? b : 1);
  m->weight_bytes += sizeof(float) * (size_t)n;
  note_nonfinite(m, name, count_nonfinite_floats(*out, n));
  return keep(m, *out);
}

/* A matrix in its stored format, mapped; a float dtype no backend reads (F64, F8_E5M2) is
** converted to an fp32 copy instead. Integer dtypes are refused (refuse_integer_dtype). */
static st_status load_matrix(st_model *m, const char *name, int64_t rows, int64_t cols, st_weight *w) {
  st_status rc = st_checkpoint_view(m->checkpoint, name, rows, cols, w);
  if (rc == ST_EUNSUPPORTED) {
    st_status why = rc;
    if ((rc = refuse_integer_dtype(m, name)) != ST_OK) return rc;
    float *f = NULL;
    int64_t shape[2] = {rows, cols};
    if (st_checkpoint_load_f32(m->checkpoint, name, 2, shape, &f) != ST_OK) return why;
    st_clear_error();
    *w = (st_weight){.dtype = ST_W_F32, .block = {1, 1}, .rows = rows, .cols = cols, .data = f};
    rc = keep(m, f);
  }
  if (rc == ST_OK) {
    m->weight_bytes += st_weight_data_bytes(w) + st_weight_scale_bytes(w);
    note_nonfinite(m, name, count_nonfinite_weight(w));
  }
  return rc;
}

#define LOAD1(field, name, a) \
  do { if ((rc = load_vector(m, name, 1, a, 0, &(field))) != ST_OK) goto out; } while (0)
#define LOAD2(field, name, a, b) \
  do { if ((rc = load_vector(m, name, 2, a, b, &(field))) != ST_OK) goto out; } while (0)
#define LOADW(field, name, rows, cols) \
  do { if ((rc = load_matrix(m, name, rows, cols, &(field))) != ST_OK) goto out; } while (0)

static st_status expect_dim(st_model *m, const char *dir, const char *tensor, int rank, int dim,
                            int64_t want, const char *fields);

static st_status load_compressor(st_model *m, const char *prefix, int ratio, int dim, int overlap,
                                 st_compressor_weights *c) {
  const st_config *cfg = m->cfg;
  st_status rc = ST_OK;
  char name[160];
  int cd = (overlap ? 2 : 1) * dim;
  c->ratio = ratio;
  c->dim = dim;
  c->overlap = overlap;
  snprintf(name, sizeof name, "%s.wkv.weight", prefix);
  LOADW(c->wkv, name, cd, cfg->hidden_size);
  snprintf(name, sizeof name, "%s.wgate.weight", prefix);
  LOADW(c->wgate, name, cd, cfg->hidden_size);
  snprintf(name, sizeof name, "%s.ape", prefix);
  LOAD2(c->ape, name, ratio, cd);
  snprintf(name, sizeof name, "%s.norm.weight", prefix);
  LOAD1(c->norm, name, dim);
out:
  return rc;
}

st_status st_model_load_layer(st_model *m, int i) {
  const st_config *cfg = m->cfg;
  st_layer_weights *L = &m->layers[i];
  if (L->loaded) return ST_OK;
  st_status rc = ST_OK;
  int D = cfg->hidden_size, hc = cfg->hc_mult, H = cfg->num_attention_heads, d = cfg->head_dim;
  int G = cfg->o_groups, E = cfg->n_routed_experts, F = cfg->moe_intermediate_size;
  int mixes = (2 + hc) * hc;
  char name[160];
#define NAME(fmt) (snprintf(name, sizeof name, "layers.%d." fmt, i), name)
  LOAD1(L->attn_norm, NAME("attn_norm.weight"), D);
  LOAD1(L->ffn_norm, NAME("ffn_norm.weight"), D);
  LOAD2(L->hc_attn_fn, NAME("hc_attn_fn"), mixes, (int64_t)hc * D);
  LOAD1(L->hc_attn_base, NAME("hc_attn_base"), mixes);
  LOAD1(L->hc_attn_scale, NAME("hc_attn_scale"), 3);
  LOAD2(L->hc_ffn_fn, NAME("hc_ffn_fn"), mixes, (int64_t)hc * D);
  LOAD1(L->hc_ffn_base, NAME("hc_ffn_base"), mixes);
  LOAD1(L->hc_ffn_scale, NAME("hc_ffn_scale"), 3);
  LOADW(L->wq_a, NAME("attn.wq_a.weight"), cfg->q_lora_rank, D);
  LOAD1(L->q_norm, NAME("attn.q_norm.weight"), cfg->q_lora_rank);
  LOADW(L->wq_b, NAME("attn.wq_b.weight"), (int64_t)H * d, cfg->q_lora_rank);
  LOADW(L->wkv, NAME("attn.wkv.weight"), d, D);
  LOAD1(L->kv_norm, NAME("attn.kv_norm.weight"), d);
  LOADW(L->wo_a, NAME("attn.wo_a.weight"), (int64_t)G * cfg->o_lora_rank, (int64_t)H * d / G);
  LOADW(L->wo_b, NAME("attn.wo_b.weight"), D, (int64_t)G * cfg->o_lora_rank);
  LOAD1(L->attn_sink, NAME("attn.attn_sink"), H);
  if (cfg->layer_kind[i] != ST_LAYER_SLIDING) {
    int overlap = cfg->layer_kind[i] == ST_LAYER_CSA;
    /* the compress ratio sizes the ape tables and the compressor state: check it first */
    char field[96];
    snprintf(field, sizeof field, "\"compress_rates\" (%s, layer_types[%d])",
             overlap ? "compressed_sparse_attention" : "heavily_compressed_attention", i);
    if ((rc = expect_dim(m, st_checkpoint_dir(m->checkpoint), NAME("attn.compressor.ape"), 2, 0,
                         cfg->compress_ratio[i], field)))
      goto out;
    if (overlap && (rc = expect_dim(m, st_checkpoint_dir(m->checkpoint),
                                    NAME("attn.indexer.compressor.ape"), 2, 0, cfg->compress_ratio[i],
                                    field)))
      goto out;
    snprintf(name, sizeof name, "layers.%d.attn.compressor", i);
    if ((rc = load_compressor(m, name, cfg->compress_ratio[i], d, overlap, &L->compressor))) goto out;
  }
  if (cfg->layer_kind[i] == ST_LAYER_CSA) {
    int hI = cfg->index_n_heads, dI = cfg->index_head_dim;
    snprintf(name, sizeof name, "layers.%d.attn.indexer.compressor", i);
    if ((rc = load_compressor(m, name, cfg->compress_ratio[i], dI, 1, &L->index_compressor))) goto out;
    LOADW(L->index_wq_b, NAME("attn.indexer.wq_b.weight"), (int64_t)hI * dI, cfg->q_lora_rank);
    LOADW(L->index_weights_proj, NAME("attn.indexer.weights_proj.weight"), hI, D);
  }
  LOADW(L->gate, NAME("ffn.gate.weight"), E, D);
  if (cfg->hash_moe[i]) {
    int64_t shape[2] = {cfg->vocab_size, cfg->num_experts_per_tok};
    /* the file's shape first: the buffer is sized from the config */
    st_checkpoint_tensor_info info;
    if ((rc = st_checkpoint_info(m->checkpoint, NAME("ffn.gate.tid2eid"), &info))) goto out;
    if (info.rank != 2 || info.shape[0] != shape[0] || info.shape[1] != shape[1]) {
      rc = st_fail(ST_EFORMAT, "%s: tensor %s: expected shape [%lld, %lld] (config.json vocab_size, "
                   "num_experts_per_tok), found %s of rank %d [%lld, %lld]", info.file, info.stored,
                   (long long)shape[0], (long long)shape[1], info.dtype, info.rank,
                   (long long)info.shape[0], (long long)(info.rank > 1 ? info.shape[1] : 0));
      goto out;
    }
    L->tid2eid = malloc(sizeof(int32_t) * (size_t)shape[0] * (size_t)shape[1]);
    if (!L->tid2eid) { rc = st_fail(ST_ENOMEM, "tid2eid of layer %d", i); goto out; }
    if ((rc = keep(m, L->tid2eid))) goto out;
    m->weight_bytes += sizeof(int32_t) * (size_t)shape[0] * (size_t)shape[1];
    if ((rc = st_checkpoint_read_i32(m->checkpoint, NAME("ffn.gate.tid2eid"), 2, shape, L->tid2eid)))
      goto out;
    for (int64_t k = 0; k < shape[0] * shape[1]; k++)
      if (L->tid2eid[k] < 0 || L->tid2eid[k] >= E) {
        rc = st_fail(ST_EFORMAT, "%s/model.safetensors: tensor %s holds expert id %d, outside [0, %d)",
                     st_checkpoint_dir(m->checkpoint), NAME("ffn.gate.tid2eid"), L->tid2eid[k], E);
        goto out;
      }
  } else {
    LOAD1(L->gate_bias, NAME("ffn.gate.bias"), E);
  }
  L->w1 = calloc((size_t)E * 3, sizeof(st_weight));
  if (!L->w1 || (rc = keep(m, L->w1))) { rc = rc ? rc : st_fail(ST_ENOMEM, "expert table of layer %d", i); goto out; }
  L->w2 = L->w1 + E;
  L->w3 = L->w2 + E;
  for (int e = 0; e < E; e++) {
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w1.weight", i, e);
    LOADW(L->w1[e], name, F, D);
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w2.weight", i, e);
    LOADW(L->w2[e], name, D, F);
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w3.weight", i, e);
    LOADW(L->w3[e], name, F, D);
  }
  LOADW(L->shared_w1, NAME("ffn.shared_experts.w1.weight"), F, D);
  LOADW(L->shared_w2, NAME("ffn.shared_experts.w2.weight"), D, F);
  LOADW(L->shared_w3, NAME("ffn.shared_experts.w3.weight"), F, D);
#undef NAME
  L->loaded = 1;
out:
  if (rc == ST_EFORMAT && strstr(st_errmsg(), "expected shape")) {
    /* every expected shape in a layer comes from the config: say so */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st_errmsg());
    rc = st_fail(rc, "%s (shape from %s/config.json)", msg, st_checkpoint_dir(m->checkpoint));
  }
  return rc;
}

st_status st_model_load_all(st_model *m) {
  for (int i = 0; i < m->cfg->num_hidden_layers; i++) {
    st_status rc = st_model_load_layer(m, i);
    if (rc) return rc;
  }
  return ST_OK;
}

/* One dimension of a tensor against the config fields it comes from. An I8 tensor's columns may
** be packed FP4 (two an byte). Absent tensors are left to the load, which names them. */
static st_status expect_dim(st_model *m, const char *dir, const char *tensor, int rank, int dim,
                            int64_t want, const char *fields) {
  st_checkpoint_tensor_info info;
  if (st_checkpoint_info(m->checkpoint, tensor, &info) != ST_OK) {
    st_clear_error();
    return ST_OK;
  }
  int64_t got = info.rank == rank && dim < info.rank ? info.shape[dim] : -1;
  if (got >= 0 && dim == 1 && strcmp(info.dtype, "I8") == 0 && got * 2 == want) got = want;
  if (got == want) return ST_OK;
  char shape[160];
  int k = 0;
  k += snprintf(shape + k, sizeof shape - (size_t)k, "[");
  for (int i = 0; i < info.rank && k < (int)sizeof shape - 24; i++)
    k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? ", " : "", (long long)info.shape[i]);
  snprintf(shape + k, sizeof shape - (size_t)k, "]");
  return st_fail(ST_EFORMAT, "%s/config.json: field %s gives %lld for dimension %d of tensor %s "
                 "(rank %d), but %s holds it as %s %s", dir, fields, (long long)want, dim, tensor,
                 rank, info.file, info.dtype, shape);
}

/* The config against the checkpoint's tensor shapes, before anything is sized from it: layer 0
** (and the first CSA and hash layers) carry every dimension the config names. Each layer's load
** checks its own tensors again before allocating. */
static st_status check_config_shapes(st_model *m, const char *dir) {
  const st_config *c = m->cfg;
  st_status rc;
  int64_t hd = (int64_t)c->num_attention_heads * c->head_dim;
  int64_t mixes = (int64_t)(2 + c->hc_mult) * c->hc_mult;
#define DIM(t, rank, dim, want, fields) \
  if ((rc = expect_dim(m, dir, t, rank, dim, want, fields)) != ST_OK) return rc;
  DIM("embed.weight", 2, 0, c->vocab_size, "\"vocab_size\"")
  DIM("embed.weight", 2, 1, c->hidden_size, "\"hidden_size\"")
  DIM("hc_head_base", 1, 0, c->hc_mult, "\"hc_mult\"")
  DIM("layers.0.attn.wq_a.weight", 2, 0, c->q_lora_rank, "\"q_lora_rank\"")
  DIM("layers.0.attn.wq_b.weight", 2, 0, hd, "\"num_attention_heads\" x \"head_dim\"")
  DIM("layers.0.attn.wq_b.weight", 2, 1, c->q_lora_rank, "\"q_lora_rank\"")
  DIM("layers.0.attn.attn_sink", 1, 0, c->num_attention_heads, "\"num_attention_heads\"")
  DIM("layers.0.attn.wkv.weight", 2, 0, c->head_dim, "\"head_dim\"")
  DIM("layers.0.attn.wo_a.weight", 2, 0, (int64_t)c->o_groups * c->o_lora_rank,
      "\"o_groups\" x \"o_lora_rank\"")
  DIM("layers.0.attn.wo_a.weight", 2, 1, hd / c->o_groups,
      "\"num_attention_heads\" x \"head_dim\" / \"o_groups\"")
  DIM("layers.0.hc_attn_base", 1, 0, mixes, "\"hc_mult\" (2 + hc_mult) x hc_mult")
  DIM("layers.0.ffn.gate.weight", 2, 0, c->n_routed_experts, "\"n_routed_experts\"")
  DIM("layers.0.ffn.shared_experts.w1.weight", 2, 0, c->moe_intermediate_size,
      "\"moe_intermediate_size\"")
  char name[160];
  for (int i = 0; i < c->num_hidden_layers; i++)
    if (c->layer_kind[i] == ST_LAYER_CSA) {
      snprintf(name, sizeof name, "layers.%d.attn.indexer.wq_b.weight", i);
      DIM(name, 2, 0, (int64_t)c->index_n_heads * c->index_head_dim,
          "\"index_n_heads\" x \"index_head_dim\"")
      snprintf(name, sizeof name, "layers.%d.attn.indexer.weights_proj.weight", i);
      DIM(name, 2, 0, c->index_n_heads, "\"index_n_heads\"")
      break;
    }
  for (int i = 0; i < c->num_hidden_layers; i++)
    if (c->hash_moe[i]) {
      snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", i);
      DIM(name, 2, 0, c->vocab_size, "\"vocab_size\"")
      DIM(name, 2, 1, c->num_experts_per_tok, "\"num_experts_per_tok\"")
      break;
    }
#undef DIM
  /* the expert count: experts 0 .. E-1 of layer 0, and no expert E */
  if (st_checkpoint_has(m->checkpoint, "layers.0.ffn.gate.weight")) {
    snprintf(name, sizeof name, "layers.0.ffn.experts.%d.w1.weight", c->n_routed_experts - 1);
    if (!st_checkpoint_has(m->checkpoint, name))
      return st_fail(ST_EFORMAT, "%s/config.json: field \"n_routed_experts\" = %d, but the "
                     "checkpoint has no tensor %s", dir, c->n_routed_experts, name);
    snprintf(name, sizeof name, "layers.0.ffn.experts.%d.w1.weight", c->n_routed_experts);
    if (st_checkpoint_has(m->checkpoint, name))
      return st_fail(ST_EFORMAT, "%s/config.json: field \"n_routed_experts\" = %d, but the "
                     "checkpoint also holds tensor %s", dir, c->n_routed_experts, name);
  }
  return ST_OK;
}

st_status st_model_open(const char *dir, st_model **out) {
  *out = NULL;
  st_model *m = calloc(1, sizeof *m);
  if (!m) return st_fail(ST_ENOMEM, "model");
  st_status rc = st_checkpoint_open(dir, &m->checkpoint);
  if (rc) goto out;
  m->cfg = st_checkpoint_config(m->checkpoint);
  const st_config *cfg = m->cfg;
  if (cfg->hc_mult < 1 || cfg->hc_mult > ST_CONFIG_MAX_HC) {
    rc = st_fail(ST_EUNSUPPORTED, "%s/config.json: hc_mult %d outside 1..%d", dir, cfg->hc_mult,
                 ST_CONFIG_MAX_HC);
    goto out;
  }
  if (((int64_t)cfg->num_attention_heads * cfg->head_dim) % cfg->o_groups) {
    rc = st_fail(ST_EUNSUPPORTED, "%s/config.json: num_attention_heads*head_dim not divisible by o_groups",
                 dir);
    goto out;
  }
  if ((rc = check_config_shapes(m, dir))) goto out;
  m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers);
  if (!m->layers) { rc = st_fail(ST_ENOMEM, "layer table"); goto out; }
  int64_t V = cfg->vocab_size, D = cfg->hidden_size, hc = cfg->hc_mult;
  LOADW(m->embed, "embed.weight", V, D);
  if (st_checkpoint_has(m->checkpoint, "head.weight") || !cfg->tie_word_embeddings) {
    LOADW(m->head, "head.weight", V, D);
  } else {
    m->head = m->embed; /* tied: one copy */
  }
  LOAD1(m->norm, "norm.weight", D);
  LOAD2(m->hc_head_fn, "hc_head_fn", hc, hc * D);
  LOAD1(m->hc_head_base, "hc_head_base", hc);
  LOAD1(m->hc_head_scale, "hc_head_scale", 1);
out:
  if (rc) {
    st_model_close(m);
    return rc;
  }
  *out = m;
  return ST_OK;
}

void st_model_close(st_model *m) {
  if (!m) return;
  for (int k = 0; k < m->n_owned; k++) free(m->owned[k]);
  free(m->owned);
  free(m->layers);
  st_checkpoint_close(m->checkpoint);
  free(m);
}

size_t st_model_weight_bytes(const st_model *m) { return m->weight_bytes; }

/* ------------------------------------------------------------------------------------------ */
/* RoPE tables (SPEC §3.5)                                                                      */

void st_rope_inv_freq(const st_config *cfg, const st_settings *set, int compressed, double *out) {
  int r = cfg->rope_head_dim, half = r / 2;
  double theta = compressed ? (set->compress_rope_theta > 0 ? set->compress_rope_theta
                                                            : cfg->compress_rope_theta)
                            : cfg->rope_theta;
  for (int i = 0; i < half; i++) out[i] = 1.0 / pow(theta, (double)(2 * i) / r);
  if (!compressed || !cfg->yarn || !set->yarn) return;
  /* YaRN, applied whatever the sequence length; no attention factor (DeepSeek-V4 forces 1). */
  double orig = cfg->yarn_original_max_position, factor = cfg->yarn_factor;
  double low = floor(r * log(orig / (cfg->yarn_beta_fast * 2 * M_PI)) / (2 * log(theta)));
  double high = ceil(r * log(orig / (cfg->yarn_beta_slow * 2 * M_PI)) / (2 * log(theta)));
  if (low < 0) low = 0;
  if (high > r - 1) high = r - 1;
  if (low == high) high += 0.001;
  for (int i = 0; i < half; i++) {
    double ramp = ((double)i - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double extrapolation = 1 - ramp; /* weight of the unscaled frequency */
    out[i] = out[i] / factor * (1 - extrapolation) + out[i] * extrapolation;
  }
}

void st_rope_cos_sin(const double *inv_freq, int half, int64_t position, float *cos_out, float *sin_out) {
  for (int i = 0; i < half; i++) {
    float angle = (float)inv_freq[i] * (float)position; /* fp32 product, as the oracle computes it */
    cos_out[i] = (float)cos((double)angle);
    sin_out[i] = (float)sin((double)angle);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Session: per-request state and scratch, all sized once, all in the backend's memory         */

typedef struct rope_table {
  float *cos, *sin; /* backend memory, [max_position, r/2] */
} rope_table;

typedef struct compressor_state {
  float *kv, *score; /* [2m, c d]: slots of the current (and, overlapping, previous) block */
  int n_rows;        /* rows emitted so far */
  float *rows;       /* main: points into kv_all; indexer: [rows_cap, dI] as computed */
  float *rows_used;  /* indexer only: [rows_cap, dI] rotated/quantised as scored */
} compressor_state;

typedef struct layer_state {
  float *kv_all; /* [w + max_chunk + rows_cap, d]: window ring | chunk rows | compressed rows */
  compressor_state compressor, index_compressor;
} layer_state;

#define TAP_STAGE_DEFAULT ((size_t)64 << 20) /* st_session_options.tap_staging */

struct st_session {
  st_model *model;
  const st_config *cfg;
  st_backend be;        /* borrowed, or opened here (own_backend) */
  int own_backend;
  const st_backend_ops *ops;
  void *ctx;            /* be.ctx */
  const st_layer_weights *w; /* [n_layers] weights in the backend's memory */
  st_layer_weights *w_dev;   /* device backends: the uploaded copy (NULL on host backends) */
  st_weight embed, head;
  const float *norm, *hc_head_fn, *hc_head_base, *hc_head_scale;
  st_status status;     /* first failure: a tap sink, an upload, the backend's latched error */
  st_settings set;      /* the run's settings */
  st_settings alt;      /* replay: settings of the layers in alt_layers */
  uint8_t *alt_layers;  /* [n_layers] 1 = layer runs under alt; NULL = none */
  st_taps *taps;
  int64_t position, max_tokens;
  int max_chunk, topk;
  int64_t rows_cap_csa, rows_cap_hca;
  rope_table rope_main, rope_compress, rope_compress_alt; /* alt: only if its RoPE differs */
  layer_state *layers;
  void **allocs;        /* every backend allocation, freed together */
  int n_allocs, cap_allocs;
  size_t backend_bytes;
  st_weight *allocs_host_experts; /* device backends: the experts tables of w_dev */
  /* host side: what the host computes per chunk and uploads (routing ids, positions, masks) */
  int64_t *h_positions, *h_row_positions; /* [n], [n] */
  int *h_visible;                         /* [n] */
  int32_t *h_minus_one;                   /* [n] of -1 */
  int32_t *h_experts, *h_group_rows;      /* [n kE], [n kE] */
  float *h_expert_w, *h_group_weights;    /* [n kE], [n kE] */
  int32_t *h_hash_experts;                /* [n kE] */
  void *h_tap;                            /* device backends: a tap's download (h_tap_bytes) */
  size_t h_tap_bytes;
  /* device backends with download_async: armed taps queue their copies into pinned staging
  ** (host_alloc) behind the work that made them; flush_taps hands them to the sink in order */
  unsigned char *tap_stage;
  size_t tap_stage_bytes, tap_stage_used, tap_stage_min;
  struct queued_tap *queued;
  int n_queued, cap_queued;
  /* backend scratch, [max_chunk, ...] unless noted */
  int32_t *tokens;                     /* [n] */
  int64_t *positions, *row_positions;  /* [n], [n] */
  float *X, *X_next;                   /* [n, hc, D] residual streams */
  float *pre, *post, *comb;            /* [n, hc], [n, hc], [n, hc, hc] */
  float *x, *xn;                       /* [n, D] */
  float *qr;                           /* [n, q_lo] */
  float *q;                            /* [n, H, d] */
  float *o;                            /* [n, H, d] attention output */
  float *z;                            /* [n, G R_o] */
  float *a;                            /* [n, D] sublayer output */
  float *ckv, *cscore;                 /* [n, 2 max(d, dI)] compressor projections */
  float *iq, *iq_used, *iw;            /* [n, hI, dI], [n, hI, dI], [n, hI] */
  float *scores;                       /* [n, rows_cap_csa]; NULL unless scores_wanted */
  int32_t *topk_idx;                   /* [n, topk_width_cap] */
  int topk_width;                      /* width of topk_idx rows as the last computing layer left them */
  int first_layer;                     /* the first layer of the current forward_layers call */
  const int32_t *topk_in;              /* host, [max_tokens, topk_in_width]: opt->topk_in */
  int topk_in_width, topk_in_layer;
  int *visible;                        /* [n] */
  int32_t *cand;                       /* [n, w + compressed_cap] attention candidates */
  void *work;                          /* ops->workspace_size bytes */
  float *router_logits;                /* [n, E] */
  int32_t *experts;                    /* [n, kE] */
  float *expert_w;                     /* [n, kE] */
  int32_t *group_rows;                 /* [n kE] token rows, grouped by expert */
  float *group_weights;                /* [n kE] their routing weights */
  int32_t *hash_experts;               /* [n, kE] tid2eid rows of the chunk's tokens */
  float *xg, *g, *u, *h, *y;           /* [n kE, D], [n kE, F] x3, [n kE, D] */
  float *logits;                       /* [n, V] */
  float *tmp;                          /* [n, max(D, q_lo, H d, ...)] reference-mode copies */
  size_t tmp_size;
  int64_t nonfinite_logit_rows;        /* positions whose returned logits held NaN or inf */
};

int64_t st_session_position(const st_session *s) { return s->position; }
const st_settings *st_session_settings(const st_session *s) { return &s->set; }
int st_session_max_chunk(const st_session *s) { return s->max_chunk; }

size_t st_session_backend_bytes(const st_session *s) { return s->backend_bytes; }
const st_backend *st_session_backend(const st_session *s) { return &s->be; }

/* One zero-filled block of backend memory, remembered for st_session_free. */
static void *balloc(st_session *s, size_t bytes, int *failed) {
  void *p = NULL;
  if (*failed) return NULL;
  if (s->n_allocs == s->cap_allocs) {
    int cap = s->cap_allocs ? 2 * s->cap_allocs : 128;
    void **grown = realloc(s->allocs, sizeof(void *) * (size_t)cap);
    if (!grown) { *failed = 1; return NULL; }
    s->allocs = grown;
    s->cap_allocs = cap;
  }
  if (s->ops->alloc(s->ctx, bytes ? bytes : 1, &p) != ST_OK) { *failed = 1; return NULL; }
  s->allocs[s->n_allocs++] = p;
  s->backend_bytes += bytes;
  return p;
}

static void *balloc_floats(st_session *s, size_t n, int *failed) { return balloc(s, n * sizeof(float), failed); }

static int any_tap_armed(const st_taps *t) {
  if (!t || !t->armed) return 0;
  for (size_t k = 0; k < (size_t)(t->n_layers + 1) * ST_TAP_COUNT; k++)
    if (t->armed[k]) return 1;
  return 0;
}

/* Whether the [n, rows] indexer score matrix is allocated: where the backend has no fused
** indexer_topk, or where a layer's indexer.scores tap is armed (its sink may come later). */
static int scores_wanted(const st_session *s) {
  if (!s->ops->indexer_topk) return 1;
  const st_taps *t = s->taps;
  if (!t || !t->armed) return 0;
  for (int l = 0; l < t->n_layers; l++)
    if (t->armed[(size_t)l * ST_TAP_COUNT + ST_TAP_INDEXER_SCORES]) return 1;
  return 0;
}

/* Host data into backend memory; a failure is kept for the end of the chunk. */
static void upload(st_session *s, void *dst, const void *src, size_t bytes) {
  st_status rc = s->ops->upload(s->ctx, dst, src, bytes);
  if (rc && !s->status) s->status = rc;
}

static void download(st_session *s, void *dst, const void *src, size_t bytes) {
  st_status rc = s->ops->download(s->ctx, dst, src, bytes);
  if (rc && !s->status) s->status = rc;
}

static void copy(st_session *s, void *dst, const void *src, size_t bytes) {
  st_status rc = s->ops->copy(s->ctx, dst, src, bytes);
  if (rc && !s->status) s->status = rc;
}

static st_status rope_table_build(st_session *s, rope_table *t, const st_settings *set,
                                  int compressed, int *failed) {
  const st_config *cfg = s->cfg;
  int half = cfg->rope_head_dim / 2;
  double inv[512];
  if (half > 512) return st_fail(ST_EUNSUPPORTED, "rope dims %d > 1024", cfg->rope_head_dim);
  st_rope_inv_freq(cfg, set, compressed, inv);
  size_t count = (size_t)s->max_tokens * half;
  float *c = malloc(sizeof(float) * (count ? count : 1)), *sn = malloc(sizeof(float) * (count ? count : 1));
  if (!c || !sn) {
    free(c);
    free(sn);
    return st_fail(ST_ENOMEM, "RoPE tables for %lld positions", (long long)s->max_tokens);
  }
  for (int64_t p = 0; p < s->max_tokens; p++) st_rope_cos_sin(inv, half, p, c + p * half, sn + p * half);
  t->cos = balloc_floats(s, count, failed);
  t->sin = balloc_floats(s, count, failed);
  if (!*failed) {
    upload(s, t->cos, c, sizeof(float) * count);
    upload(s, t->sin, sn, sizeof(float) * count);
  }
  free(c);
  free(sn);
  return *failed ? st_fail(ST_ENOMEM, "RoPE tables for %lld positions", (long long)s->max_tokens)
                 : s->status;
}

/* ---- weights in the backend's memory -------------------------------------------------------- */

static float *upload_vector(st_session *s, const float *v, size_t count, int *failed) {
  if (!v) return NULL;
  float *d = balloc_floats(s, count, failed);
  if (d) upload(s, d, v, sizeof(float) * count);
  return d;
}

static void upload_weight(st_session *s, st_weight *dst, const st_weight *src, int *failed) {
  *dst = *src;
  if (!src->data) return;
  size_t data = st_weight_data_bytes(src), scales = st_weight_scale_bytes(src);
  void *d = balloc(s, data, failed), *sc = scales ? balloc(s, scales, failed) : NULL;
  if (*failed) return;
  upload(s, d, src->data, data);
  if (scales) upload(s, sc, src->scales, scales);
  dst->data = d;
  dst->scales = sc;
}

/* Host backends read the model's weights in place; a device backend gets one copy of every
** loaded layer's weights (and the model-level ones) at session create. */
/* A backend may decline a weight format (supports): refused here, before any work. */
static st_status check_formats(st_session *s) {
  const st_model *m = s->model;
  int seen[ST_W_TYPE_COUNT] = {0};
  seen[m->embed.dtype] = seen[m->head.dtype] = 1;
  for (int i = 0; i < s->cfg->num_hidden_layers; i++) {
    const st_layer_weights *L = &m->layers[i];
    if (!L->loaded) continue;
    const st_weight *mats[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->gate,
                               &L->shared_w1, &L->shared_w2, &L->shared_w3};
    for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) seen[mats[k]->dtype] = 1;
    for (int e = 0; e < s->cfg->n_routed_experts; e++)
      seen[L->w1[e].dtype] = seen[L->w2[e].dtype] = seen[L->w3[e].dtype] = 1;
  }
  for (int t = 0; t < ST_W_TYPE_COUNT; t++)
    if (seen[t] && s->ops->supports && !s->ops->supports(s->ctx, ST_OP_MATMUL, t))
      return st_fail(ST_EUNSUPPORTED, "backend %s cannot read %s weights, which %s holds",
                     s->ops->name, st_wtype_name((st_wtype)t), st_checkpoint_dir(m->checkpoint));
  return ST_OK;
}

static st_status bind_weights(st_session *s) {
  st_model *m = s->model;
  const st_config *cfg = s->cfg;
  st_status rc = check_formats(s);
  if (rc) return rc;
  s->embed = m->embed;
  s->head = m->head;
  s->norm = m->norm;
  s->hc_head_fn = m->hc_head_fn;
  s->hc_head_base = m->hc_head_base;
  s->hc_head_scale = m->hc_head_scale;
  s->w = m->layers;
  if (s->ops->host_memory) return ST_OK;
  int failed = 0, D = cfg->hidden_size, hc = cfg->hc_mult, E = cfg->n_routed_experts;
  size_t mixes = (size_t)(2 + hc) * hc;
  s->w_dev = calloc((size_t)cfg->num_hidden_layers, sizeof *s->w_dev);
  st_weight *experts = calloc((size_t)cfg->num_hidden_layers * E * 3, sizeof *experts);
  if (!s->w_dev || !experts) { free(experts); return st_fail(ST_ENOMEM, "device weight tables"); }
  s->allocs_host_experts = experts;
  upload_weight(s, &s->embed, &m->embed, &failed);
  if (m->head.data == m->embed.data) s->head = s->embed;
  else upload_weight(s, &s->head, &m->head, &failed);
  s->norm = upload_vector(s, m->norm, (size_t)D, &failed);
  s->hc_head_fn = upload_vector(s, m->hc_head_fn, (size_t)hc * hc * D, &failed);
  s->hc_head_base = upload_vector(s, m->hc_head_base, (size_t)hc, &failed);
  s->hc_head_scale = upload_vector(s, m->hc_head_scale, 1, &failed);
  for (int i = 0; i < cfg->num_hidden_layers && !failed; i++) {
    const st_layer_weights *L = &m->layers[i];
    st_layer_weights *W = &s->w_dev[i];
    if (!L->loaded) continue;
    *W = *L;
    int H = cfg->num_attention_heads, q_lo = cfg->q_lora_rank, d = cfg->head_dim;
    W->attn_norm = upload_vector(s, L->attn_norm, (size_t)D, &failed);
    W->ffn_norm = upload_vector(s, L->ffn_norm, (size_t)D, &failed);
    W->hc_attn_fn = upload_vector(s, L->hc_attn_fn, mixes * hc * D, &failed);
    W->hc_attn_base = upload_vector(s, L->hc_attn_base, mixes, &failed);
    W->hc_attn_scale = upload_vector(s, L->hc_attn_scale, 3, &failed);
    W->hc_ffn_fn = upload_vector(s, L->hc_ffn_fn, mixes * hc * D, &failed);
    W->hc_ffn_base = upload_vector(s, L->hc_ffn_base, mixes, &failed);
    W->hc_ffn_scale = upload_vector(s, L->hc_ffn_scale, 3, &failed);
    W->q_norm = upload_vector(s, L->q_norm, (size_t)q_lo, &failed);
    W->kv_norm = upload_vector(s, L->kv_norm, (size_t)d, &failed);
    W->attn_sink = upload_vector(s, L->attn_sink, (size_t)H, &failed);
    W->gate_bias = upload_vector(s, L->gate_bias, (size_t)E, &failed);
    st_weight *mats[][2] = {{&W->wq_a, NULL}, {&W->wq_b, NULL}, {&W->wkv, NULL}, {&W->wo_a, NULL},
                            {&W->wo_b, NULL}, {&W->index_wq_b, NULL}, {&W->index_weights_proj, NULL},
                            {&W->gate, NULL}, {&W->shared_w1, NULL}, {&W->shared_w2, NULL},
                            {&W->shared_w3, NULL}, {&W->compressor.wkv, NULL},
                            {&W->compressor.wgate, NULL}, {&W->index_compressor.wkv, NULL},
                            {&W->index_compressor.wgate, NULL}};
    for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
      st_weight host = *mats[k][0];
      upload_weight(s, mats[k][0], &host, &failed);
    }
    const st_compressor_weights *cs[2] = {&L->compressor, &L->index_compressor};
    st_compressor_weights *cd[2] = {&W->compressor, &W->index_compressor};
    for (int c = 0; c < 2; c++) {
      if (!cs[c]->ape) continue;
      size_t width = (size_t)(cs[c]->overlap ? 2 : 1) * cs[c]->dim;
      cd[c]->ape = upload_vector(s, cs[c]->ape, (size_t)cs[c]->ratio * width, &failed);
      cd[c]->norm = upload_vector(s, cs[c]->norm, (size_t)cs[c]->dim, &failed);
    }
    W->w1 = experts + (size_t)i * E * 3;
    W->w2 = W->w1 + E;
    W->w3 = W->w2 + E;
    for (int e = 0; e < E; e++) {
      upload_weight(s, &W->w1[e], &L->w1[e], &failed);
      upload_weight(s, &W->w2[e], &L->w2[e], &failed);
      upload_weight(s, &W->w3[e], &L->w3[e], &failed);
    }
  }
  if (failed) return st_fail(ST_ENOMEM, "%s: uploading the weights", s->ops->name);
  s->w = s->w_dev;
  return s->status;
}

void st_session_free(st_session *s) {
  if (!s) return;
  if (s->ops)
    for (int k = 0; k < s->n_allocs; k++) s->ops->free(s->ctx, s->allocs[k]);
  free(s->allocs);
  free(s->w_dev);
  free(s->allocs_host_experts);
  free(s->alt_layers);
  free(s->layers);
  void *host[] = {s->h_positions, s->h_row_positions, s->h_visible, s->h_minus_one, s->h_experts,
                  s->h_group_rows, s->h_expert_w, s->h_group_weights, s->h_hash_experts, s->h_tap};
  for (size_t k = 0; k < sizeof host / sizeof host[0]; k++) free(host[k]);
  if (s->tap_stage) s->ops->host_free(s->ctx, s->tap_stage);
  free(s->queued);
  if (s->own_backend) st_backend_close(&s->be);
  free(s);
}

static void compressor_state_reset(st_session *s, compressor_state *c, int ratio, int cd) {
  size_t n = (size_t)2 * ratio * cd; /* allocated for 2m slots in both layouts */
  s->ops->fill(s->ctx, c->kv, 0.0f, n);
  s->ops->fill(s->ctx, c->score, -INFINITY, n); /* block 0 has no previous block (SPEC §3.2.3) */
  c->n_rows = 0;
}

st_status st_session_create(st_model *m, const st_session_options *opt, st_session **out) {
  *out = NULL;
  const st_config *cfg = m->cfg;
  st_session *s = calloc(1, sizeof *s);
  if (!s) return st_fail(ST_ENOMEM, "session");
  st_status rc = ST_OK;
  int failed = 0;
  s->model = m;
  s->cfg = cfg;
  if (opt->backend) {
    s->be = *opt->backend;
  } else {
    if ((rc = st_backend_open("cpu-ref", &s->be))) { free(s); return rc; }
    s->own_backend = 1;
  }
  s->ops = s->be.ops;
  s->ctx = s->be.ctx;
  s->set = opt->settings;
  st_settings_resolve(&s->set, cfg);
  s->alt = opt->alt_layers ? opt->alt_settings : s->set;
  st_settings_resolve(&s->alt, cfg);
  if (opt->alt_layers) {
    if (s->alt.precision != s->set.precision) {
      rc = st_fail(ST_EINVAL, "precision is a setting of the whole run: it cannot differ per layer");
      goto out;
    }
    s->alt_layers = malloc((size_t)cfg->num_hidden_layers);
    if (!s->alt_layers) { rc = st_fail(ST_ENOMEM, "layer settings"); goto out; }
    memcpy(s->alt_layers, opt->alt_layers, (size_t)cfg->num_hidden_layers);
  }
  s->taps = opt->taps;
  s->tap_stage_min = opt->tap_staging > 0 ? opt->tap_staging : TAP_STAGE_DEFAULT;
  s->max_tokens = opt->max_tokens > 0 ? opt->max_tokens : 4096;
  /* A GPU fills its multiprocessors only with many rows a call (the routed experts see a chunk's
  ** tokens times kE / E each): device backends default to chunks of 4096, host ones to 256. The
  ** results are the same bits for any chunking. */
  s->max_chunk = opt->max_chunk > 0 ? opt->max_chunk : s->ops->host_memory ? 256 : 4096;
  if (s->max_chunk > s->max_tokens) s->max_chunk = (int)s->max_tokens;
  for (int k = 0; k < 2; k++) {
    const st_settings *set = k ? &s->alt : &s->set;
    if ((set->rotate & (ST_ROTATE_Q | ST_ROTATE_K)) &&
        (cfg->index_head_dim & (cfg->index_head_dim - 1))) {
      rc = st_fail(ST_EUNSUPPORTED, "--set rotate needs index_head_dim to be a power of two (it is %d)",
                   cfg->index_head_dim);
      goto out;
    }
    if ((set->index_q == ST_FORMAT_FP4_E2M1 || set->index_k == ST_FORMAT_FP4_E2M1) &&
        cfg->index_head_dim % 32) {
      rc = st_fail(ST_EUNSUPPORTED, "fp4_e2m1 index formats need index_head_dim %% 32 == 0 (it is %d)",
                   cfg->index_head_dim);
      goto out;
    }
  }
  if ((rc = st_settings_check(&s->set, cfg)) || (rc = st_settings_check(&s->alt, cfg))) goto out;
  s->topk_in = opt->topk_in;
  s->topk_in_width = opt->topk_in_width;
  s->topk_in_layer = opt->topk_in ? opt->topk_in_layer : -1;
  if ((rc = bind_weights(s))) goto out;
  s->topk = st_settings_topk(&s->set, cfg);
  if (st_settings_topk(&s->alt, cfg) > s->topk) s->topk = st_settings_topk(&s->alt, cfg); /* capacity */
  int n = s->max_chunk, D = cfg->hidden_size, hc = cfg->hc_mult, H = cfg->num_attention_heads;
  int d = cfg->head_dim, w = cfg->sliding_window, hI = cfg->index_n_heads, dI = cfg->index_head_dim;
  int G = cfg->o_groups, Ro = cfg->o_lora_rank, E = cfg->n_routed_experts, kE = cfg->num_experts_per_tok;
  int F = cfg->moe_intermediate_size, V = cfg->vocab_size, q_lo = cfg->q_lora_rank;
  s->rows_cap_csa = s->max_tokens / (cfg->compress_rate_csa > 0 ? cfg->compress_rate_csa : 4) + 1;
  s->rows_cap_hca = s->max_tokens / (cfg->compress_rate_hca > 0 ? cfg->compress_rate_hca : 128) + 1;
  if ((rc = rope_table_build(s, &s->rope_main, &s->set, 0, &failed))) goto out;
  if ((rc = rope_table_build(s, &s->rope_compress, &s->set, 1, &failed))) goto out;
  if ((s->alt.compress_rope_theta != s->set.compress_rope_theta || s->alt.yarn != s->set.yarn) &&
      (rc = rope_table_build(s, &s->rope_compress_alt, &s->alt, 1, &failed)))
    goto out;

  s->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *s->layers);
  if (!s->layers) { rc = st_fail(ST_ENOMEM, "layer states"); goto out; }
  int64_t hca_cap = 0;
  for (int i = 0; i < cfg->num_hidden_layers; i++) {
    layer_state *ls = &s->layers[i];
    int64_t rows_cap = cfg->layer_kind[i] == ST_LAYER_CSA ? s->rows_cap_csa
                       : cfg->layer_kind[i] == ST_LAYER_HCA ? s->rows_cap_hca : 0;
    if (cfg->layer_kind[i] == ST_LAYER_HCA && rows_cap > hca_cap) hca_cap = rows_cap;
    ls->kv_all = balloc_floats(s, (size_t)(w + n + rows_cap) * d, &failed);
    if (cfg->layer_kind[i] != ST_LAYER_SLIDING) {
      int m_ = cfg->compress_ratio[i], c = cfg->layer_kind[i] == ST_LAYER_CSA ? 2 : 1;
      ls->compressor.kv = balloc_floats(s, (size_t)2 * m_ * c * d, &failed);
      ls->compressor.score = balloc_floats(s, (size_t)2 * m_ * c * d, &failed);
      ls->compressor.rows = ls->kv_all ? ls->kv_all + (size_t)(w + n) * d : NULL;
      if (!failed) compressor_state_reset(s, &ls->compressor, m_, c * d);
    }
    if (cfg->layer_kind[i] == ST_LAYER_CSA) {
      int m_ = cfg->compress_ratio[i];
      ls->index_compressor.kv = balloc_floats(s, (size_t)4 * m_ * dI, &failed);
      ls->index_compressor.score = balloc_floats(s, (size_t)4 * m_ * dI, &failed);
      ls->index_compressor.rows = balloc_floats(s, (size_t)rows_cap * dI, &failed);
      ls->index_compressor.rows_used = balloc_floats(s, (size_t)rows_cap * dI, &failed);
      if (!failed) compressor_state_reset(s, &ls->index_compressor, m_, 2 * dI);
    }
    if (failed) { rc = st_fail(ST_ENOMEM, "state of layer %d (%lld tokens)", i, (long long)s->max_tokens); goto out; }
  }
  int64_t topk_cap = s->topk < s->rows_cap_csa ? s->topk : s->rows_cap_csa;
  int64_t cand_cap = w + (topk_cap > hca_cap ? topk_cap : hca_cap);
  int cmax = 2 * (d > dI ? d : dI);
  s->tmp_size = (size_t)n * ST_MAX(ST_MAX(ST_MAX(D, q_lo), H * d),
                                   ST_MAX(ST_MAX(hc * D, cmax), kE * ST_MAX(D, F)));
  st_backend_limits lim = {.max_tokens = n, .max_rows = s->rows_cap_csa, .max_topk = (int)topk_cap,
                           .max_dim = ST_MAX(ST_MAX(D, F), ST_MAX(hc * D, G * Ro)),
                           .max_experts = E, .max_expert_slots = n * kE, .max_ffn = F};
  s->tokens = balloc(s, sizeof(int32_t) * (size_t)n, &failed);
  s->positions = balloc(s, sizeof(int64_t) * (size_t)n, &failed);
  s->row_positions = balloc(s, sizeof(int64_t) * (size_t)n, &failed);
  s->X = balloc_floats(s, (size_t)n * hc * D, &failed);
  s->X_next = balloc_floats(s, (size_t)n * hc * D, &failed);
  s->pre = balloc_floats(s, (size_t)n * hc, &failed);
  s->post = balloc_floats(s, (size_t)n * hc, &failed);
  s->comb = balloc_floats(s, (size_t)n * hc * hc, &failed);
  s->x = balloc_floats(s, (size_t)n * D, &failed);
  s->xn = balloc_floats(s, (size_t)n * D, &failed);
  s->qr = balloc_floats(s, (size_t)n * q_lo, &failed);
  s->q = balloc_floats(s, (size_t)n * H * d, &failed);
  s->o = balloc_floats(s, (size_t)n * H * d, &failed);
  s->z = balloc_floats(s, (size_t)n * G * Ro, &failed);
  s->a = balloc_floats(s, (size_t)n * D, &failed);
  s->ckv = balloc_floats(s, (size_t)n * cmax, &failed);
  s->cscore = balloc_floats(s, (size_t)n * cmax, &failed);
  s->iq = balloc_floats(s, (size_t)n * hI * dI, &failed);
  s->iq_used = balloc_floats(s, (size_t)n * hI * dI, &failed);
  s->iw = balloc_floats(s, (size_t)n * hI, &failed);
  if (scores_wanted(s)) s->scores = balloc_floats(s, (size_t)n * s->rows_cap_csa, &failed);
  s->topk_idx = balloc(s, sizeof(int32_t) * (size_t)n * (topk_cap > 0 ? topk_cap : 1), &failed);
  s->visible = balloc(s, sizeof(int) * (size_t)n, &failed);
  s->cand = balloc(s, sizeof(int32_t) * (size_t)n * cand_cap, &failed);
  s->work = balloc(s, s->ops->workspace_size(s->ctx, &lim), &failed);
  s->router_logits = balloc_floats(s, (size_t)n * E, &failed);
  s->experts = balloc(s, sizeof(int32_t) * (size_t)n * kE, &failed);
  s->expert_w = balloc_floats(s, (size_t)n * kE, &failed);
  s->group_rows = balloc(s, sizeof(int32_t) * (size_t)n * kE, &failed);
  s->group_weights = balloc_floats(s, (size_t)n * kE, &failed);
  s->hash_experts = balloc(s, sizeof(int32_t) * (size_t)n * kE, &failed);
  /* an expert sees at most n kE (token, slot) rows, should a hash table repeat an expert */
  s->xg = balloc_floats(s, (size_t)n * kE * D, &failed);
  s->g = balloc_floats(s, (size_t)n * kE * F, &failed);
  s->u = balloc_floats(s, (size_t)n * kE * F, &failed);
  s->h = balloc_floats(s, (size_t)n * kE * F, &failed);
  s->y = balloc_floats(s, (size_t)n * kE * D, &failed);
  s->logits = balloc_floats(s, (size_t)n * V, &failed);
  s->tmp = balloc_floats(s, s->tmp_size, &failed);
  size_t nk = (size_t)n * kE;
  s->h_positions = malloc(sizeof(int64_t) * (size_t)n);
  s->h_row_positions = malloc(sizeof(int64_t) * (size_t)n);
  s->h_visible = malloc(sizeof(int) * (size_t)n);
  s->h_minus_one = malloc(sizeof(int32_t) * (size_t)n);
  s->h_experts = malloc(sizeof(int32_t) * nk);
  s->h_group_rows = malloc(sizeof(int32_t) * nk);
  s->h_expert_w = malloc(sizeof(float) * nk);
  s->h_group_weights = malloc(sizeof(float) * nk);
  s->h_hash_experts = malloc(sizeof(int32_t) * nk);
  if (!s->ops->host_memory) {
    /* the largest value a tap hands over: n rows of the widest tap (4-byte elements); the
    ** compressor and indexer key taps hand over the rows a chunk completes, at most n */
    int64_t widths[] = {(int64_t)hc * D, (int64_t)H * d, q_lo, (int64_t)hI * dI, hI, D, d, dI, kE, V,
                        s->rows_cap_csa, topk_cap};
    int64_t widest = 1;
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) widest = ST_MAX(widest, widths[k]);
    s->h_tap_bytes = sizeof(float) * (size_t)n * (size_t)widest;
    s->h_tap = malloc(s->h_tap_bytes);
  }
  if (failed || !s->h_positions || !s->h_row_positions || !s->h_visible || !s->h_minus_one ||
      !s->h_experts || !s->h_group_rows || !s->h_expert_w || !s->h_group_weights ||
      !s->h_hash_experts || (!s->ops->host_memory && !s->h_tap)) {
    rc = st_fail(ST_ENOMEM, "scratch buffers for chunks of %d tokens", n);
    goto out;
  }
  for (int i = 0; i < n; i++) s->h_minus_one[i] = -1;
  if (!s->ops->host_memory && s->ops->download_async && any_tap_armed(s->taps)) {
    /* the taps' pinned staging now, not in the first chunk that records (pinning takes time) */
    void *p = NULL;
    if ((rc = s->ops->host_alloc(s->ctx, s->tap_stage_min, &p))) goto out;
    s->tap_stage = p, s->tap_stage_bytes = s->tap_stage_min;
  }
  rc = s->ops->synchronize(s->ctx);
out:
  if (rc) {
    st_session_free(s);
    return rc;
  }
  *out = s;
  return ST_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                                */

static int reference(const st_session *s) { return s->set.precision == ST_PRECISION_REFERENCE; }

/* The settings a layer runs under: the run's, or the replay's alternate ones. */
static const st_settings *layer_settings(const st_session *s, int layer) {
  return s->alt_layers && s->alt_layers[layer] ? &s->alt : &s->set;
}

static int layer_topk(const st_session *s, int layer) {
  return st_settings_topk(layer_settings(s, layer), s->cfg);
}

/* RoPE table of a compressed layer (theta and YaRN are settings). */
static const rope_table *compress_rope(const st_session *s, int layer) {
  return s->alt_layers && s->alt_layers[layer] && s->rope_compress_alt.cos ? &s->rope_compress_alt
                                                                            : &s->rope_compress;
}

/* Reference mode keeps activations in bf16 (SPEC §2 precision conventions). */
static void to_bf16(st_session *s, float *x, size_t count) {
  if (reference(s)) s->ops->round_bf16(s->ctx, x, count);
}

/* FP8 QAT on the first `len` (nope) dims of each of rows rows of stride: 64-blocks, ue8m0. */
static void fp8_nope(st_session *s, float *x, int rows, int stride, int len) {
  s->ops->quantize(s->ctx, x, rows, stride, len, 64, ST_Q_FP8_E4M3FN, 1);
}

/* y[n, w.rows] = x . W^T. In reference mode an FP8 linear quantises its input per token per 128
** channels (ue8m0 scales) and the output is bf16, as the reference kernels do. */
static void linear(st_session *s, float *y, const float *x, const st_weight *w, int n, int fp8_input) {
  int in = (int)w->cols;
  if (reference(s) && fp8_input && in % 128 == 0) {
    ST_ASSERT((size_t)n * in <= s->tmp_size);
    copy(s, s->tmp, x, sizeof(float) * (size_t)n * in);
    s->ops->quantize(s->ctx, s->tmp, n, in, in, 128, ST_Q_FP8_E4M3FN, 1);
    x = s->tmp;
  }
  s->ops->matmul(s->ctx, y, x, w, n);
  to_bf16(s, y, (size_t)n * w->rows);
}

static int armed(const st_session *s, st_tap_id id, int layer) { return st_tap_armed(s->taps, id, layer); }

/* Whether an armed tap's sink keeps any row of the block of n positions at p0 (a sink without
** kept: every row). */
static int tap_keeps(const st_session *s, st_tap_id id, int layer, int64_t p0, int64_t n) {
  if (!armed(s, id, layer)) return 0;
  const st_tap_sink *sink = s->taps->sink;
  if (!sink->kept) return 1;
  int64_t k0 = 0, k1 = n;
  sink->kept(sink->ctx, id, p0, n, &k0, &k1);
  return k1 > k0;
}

/* A tap whose copy is queued: where its bytes land in the staging, and what emit is told. */
typedef struct queued_tap {
  st_tap_id id;
  int layer, rank;
  int64_t pos0, shape[3];
  st_dtype dtype;
  size_t at;
} queued_tap;


static void latch_status(st_session *s, st_status rc) {
  if (rc && !s->status) s->status = rc;
}

/* The queued taps to the sink, in the order they were taken, once the device has copied them
** (one wait for all); the staging is then free again. Called at the end of every chunk and
** whenever the staging fills. */
static void flush_taps(st_session *s) {
  if (!s->n_queued) return;
  st_status rc = s->ops->synchronize(s->ctx);
  latch_status(s, rc);
  const st_tap_sink *sink = s->taps->sink;
  for (int k = 0; k < s->n_queued && !rc; k++) {
    const queued_tap *q = &s->queued[k];
    latch_status(s, sink->emit(sink->ctx, q->id, q->layer, q->pos0, q->dtype, q->rank, q->shape,
                               s->tap_stage + q->at));
  }
  s->n_queued = 0;
  s->tap_stage_used = 0;
}

/* Queues the device-to-host copy of an armed tap into the staging (grown to hold the largest). */
static void queue_tap(st_session *s, st_tap_id id, int layer, int64_t pos0, st_dtype dtype, int rank,
                      const int64_t *shape, const void *data, size_t bytes) {
  size_t span = (bytes + 63) & ~(size_t)63;
  if (s->tap_stage_used + span > s->tap_stage_bytes) {
    flush_taps(s); /* full: what it holds goes to the sink first */
    if (span > s->tap_stage_bytes) {
      size_t want = span > s->tap_stage_min ? span : s->tap_stage_min;
      if (s->tap_stage) s->ops->host_free(s->ctx, s->tap_stage);
      s->tap_stage = NULL, s->tap_stage_bytes = 0;
      void *p = NULL;
      st_status rc = s->ops->host_alloc(s->ctx, want, &p);
      if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", st_errmsg());
        latch_status(s, st_fail(rc, "tap %s (layer %d): staging of %zu bytes: %s",
                                st_tap_catalogue[id].suffix, layer, want, why));
        return;
      }
      s->tap_stage = p, s->tap_stage_bytes = want;
    }
  }
  if (s->n_queued == s->cap_queued) {
    int cap = s->cap_queued ? 2 * s->cap_queued : 64;
    queued_tap *grown = realloc(s->queued, sizeof *grown * (size_t)cap);
    if (!grown) {
      latch_status(s, st_fail(ST_ENOMEM, "tap %s (layer %d): the queue", st_tap_catalogue[id].suffix, layer));
      return;
    }
    s->queued = grown, s->cap_queued = cap;
  }
  st_status rc = s->ops->download_async(s->ctx, s->tap_stage + s->tap_stage_used, data, bytes);
  if (rc) {
    latch_status(s, rc);
    return;
  }
  s->queued[s->n_queued++] = (queued_tap){.id = id, .layer = layer, .rank = rank, .pos0 = pos0,
                                          .shape = {shape[0], shape[1], shape[2]}, .dtype = dtype,
                                          .at = s->tap_stage_used};
  s->tap_stage_used += span;
}

/* An armed tap hands the value as it is now to the sink: at once from host memory; from a device,
** downloaded first, or queued (queue_tap) and handed over by flush_taps at the chunk's end. */
static void tap(st_session *s, st_tap_id id, int layer, int64_t pos0, st_dtype dtype, int rank,
                int64_t a, int64_t b, int64_t c, const void *data) {
  if (!st_tap_armed(s->taps, id, layer)) return;
  const st_tap_sink *sink = s->taps->sink;
  if (!s->ops->host_memory && sink->kept && rank >= 1) {
    /* from a device, only the rows the sink keeps: a block it drops is not downloaded */
    int64_t k0 = 0, k1 = a;
    sink->kept(sink->ctx, id, pos0, a, &k0, &k1);
    if (k1 <= k0) return;
    size_t row = st_dtype_size(dtype) * (size_t)(rank > 1 ? b : 1) * (size_t)(rank > 2 ? c : 1);
    data = (const unsigned char *)data + (size_t)k0 * row;
    pos0 += k0;
    a = k1 - k0;
  }
  int64_t shape[3] = {a, b, c};
  size_t bytes = st_dtype_size(dtype) * (size_t)a * (size_t)(rank > 1 ? b : 1) * (size_t)(rank > 2 ? c : 1);
  if (!s->ops->host_memory && s->ops->download_async) {
    queue_tap(s, id, layer, pos0, dtype, rank, shape, data, bytes);
    return;
  }
  if (!s->ops->host_memory) {
    if (bytes > s->h_tap_bytes) { /* a tap larger than the session's estimate: grow the buffer */
      void *grown = realloc(s->h_tap, bytes);
      if (!grown) {
        if (!s->status) s->status = st_fail(ST_ENOMEM, "tap %s (layer %d): %zu bytes", st_tap_catalogue[id].suffix, layer, bytes);
        return;
      }
      s->h_tap = grown;
      s->h_tap_bytes = bytes;
    }
    download(s, s->h_tap, data, bytes);
    data = s->h_tap;
  }
  st_status rc = sink->emit(sink->ctx, id, layer, pos0, dtype, rank, shape, data);
  if (rc && !s->status) s->status = rc;
}

/* ------------------------------------------------------------------------------------------ */
/* One chunk through the whole model (the top-level pass; its parts follow)                    */

static void attention_sublayer(st_session *s, int layer, int n, int64_t p0);
static void moe_sublayer(st_session *s, int layer, const int32_t *tokens, int n, int64_t p0);

static st_status forward_chunk(st_session *s, const int32_t *tokens, int n, const float *X_in,
                               int first, int last, float *X_out, float *last_logits,
                               float *all_logits) {
  const st_config *cfg = s->cfg;
  const st_backend_ops *ops = s->ops;
  int D = cfg->hidden_size, hc = cfg->hc_mult, V = cfg->vocab_size;
  int64_t p0 = s->position;
  for (int i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= V)
      return st_fail(ST_EINVAL, "token %d at position %lld is outside the vocabulary [0, %d)",
                     tokens[i], (long long)(p0 + i), V);
    s->h_positions[i] = p0 + i;
  }
  upload(s, s->positions, s->h_positions, sizeof(int64_t) * (size_t)n);
  upload(s, s->tokens, tokens, sizeof(int32_t) * (size_t)n);
  if (X_in) {
    upload(s, s->X, X_in, sizeof(float) * (size_t)n * hc * D);
  } else {
    /* embedding, replicated into the hc residual streams: X [n, hc, D] */
    ops->embed(s->ctx, s->X, &s->embed, s->tokens, n, hc);
    to_bf16(s, s->X, (size_t)n * hc * D);
  }

  for (int layer = first; layer <= last; layer++) {
    if (!s->model->layers[layer].loaded)
      return st_fail(ST_EINVAL, "layer %d's weights are not loaded", layer);
    tap(s, ST_TAP_INPUT, layer, p0, ST_F32, 3, n, hc, D, s->X);
    attention_sublayer(s, layer, n, p0);
    moe_sublayer(s, layer, tokens, n, p0);
    tap(s, ST_TAP_OUTPUT, layer, p0, ST_F32, 3, n, hc, D, s->X);
  }
  if (X_out) download(s, X_out, s->X, sizeof(float) * (size_t)n * hc * D);

  if (last == cfg->num_hidden_layers - 1 && (last_logits || all_logits || armed(s, ST_TAP_LOGITS, -1))) {
    /* hc_head, final norm, logits (every row only when someone wants them) */
    int all = all_logits || armed(s, ST_TAP_LOGITS, -1);
    int from = all ? 0 : n - 1, rows = n - from;
    ops->hc_head(s->ctx, s->x, s->X + (size_t)from * hc * D, s->hc_head_fn, s->hc_head_base,
                 s->hc_head_scale, rows, hc, D, (float)cfg->rms_norm_eps, (float)cfg->hc_eps);
    to_bf16(s, s->x, (size_t)rows * D);
    ops->rmsnorm(s->ctx, s->x, s->x, s->norm, rows, D, (float)cfg->rms_norm_eps);
    to_bf16(s, s->x, (size_t)rows * D);
    ops->matmul(s->ctx, s->logits, s->x, &s->head, rows);                 /* [rows, V] fp32 */
    if (all) tap(s, ST_TAP_LOGITS, -1, p0, ST_F32, 2, n, V, 0, s->logits);
    if (all_logits) download(s, all_logits, s->logits, sizeof(float) * (size_t)n * V);
    if (last_logits)
      download(s, last_logits, s->logits + (size_t)(rows - 1) * V, sizeof(float) * (size_t)V);
  }
  s->position += n;
  st_status rc = ops->synchronize(s->ctx);
  return s->status ? s->status : rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Attention sub-layer (SPEC §2.3)                                                              */

static void compressor_run(st_session *s, int layer, const st_compressor_weights *cw,
                           compressor_state *cs, int n, int64_t p0);
static int indexer_run(st_session *s, int layer, int n, int64_t p0);

static void attention_sublayer(st_session *s, int layer, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->w[layer];
  layer_state *ls = &s->layers[layer];
  const st_backend_ops *ops = s->ops;
  void *ctx = s->ctx;
  st_layer_kind kind = cfg->layer_kind[layer];
  int D = cfg->hidden_size, hc = cfg->hc_mult, H = cfg->num_attention_heads, d = cfg->head_dim;
  int r = cfg->rope_head_dim, w = cfg->sliding_window, G = cfg->o_groups, q_lo = cfg->q_lora_rank;
  int m = cfg->compress_ratio[layer];
  float eps = (float)cfg->rms_norm_eps;
  const rope_table *rope = kind == ST_LAYER_SLIDING ? &s->rope_main : compress_rope(s, layer);

  /* mHC: collapse the hc streams into the sub-layer input */
  ops->hc_weights(ctx, s->pre, s->post, s->comb, s->X, lw->hc_attn_fn, lw->hc_attn_base,
                  lw->hc_attn_scale, n, hc, D, eps, (float)cfg->hc_eps, cfg->hc_sinkhorn_iters);
  ops->hc_collapse(ctx, s->x, s->X, s->pre, n, hc, D);
  to_bf16(s, s->x, (size_t)n * D);
  ops->rmsnorm(ctx, s->xn, s->x, lw->attn_norm, n, D, eps);                /* xn [n, D] */
  to_bf16(s, s->xn, (size_t)n * D);
  tap(s, ST_TAP_ATTN_X, layer, p0, ST_F32, 2, n, D, 0, s->xn);

  /* query: low-rank, normed, per-head RMS norm, RoPE on the last r dims */
  linear(s, s->qr, s->xn, &lw->wq_a, n, 1);                                /* qr [n, q_lo] */
  ops->rmsnorm(ctx, s->qr, s->qr, lw->q_norm, n, q_lo, eps);
  to_bf16(s, s->qr, (size_t)n * q_lo);
  tap(s, ST_TAP_ATTN_QR, layer, p0, ST_F32, 2, n, q_lo, 0, s->qr);
  linear(s, s->q, s->qr, &lw->wq_b, n, 1);                                 /* q [n, H, d] */
  ops->rmsnorm(ctx, s->q, s->q, NULL, n * H, d, eps);
  ops->rope(ctx, s->q, n, H, d, r, s->positions, rope->cos, rope->sin, 0, 0);
  to_bf16(s, s->q, (size_t)n * H * d);
  tap(s, ST_TAP_ATTN_Q, layer, p0, ST_F32, 3, n, H, d, s->q);

  /* window key = value: one head, into the chunk slots of kv_all */
  float *kv_chunk = ls->kv_all + (size_t)w * d;                            /* [n, d] */
  linear(s, kv_chunk, s->xn, &lw->wkv, n, 1);
  ops->rmsnorm(ctx, kv_chunk, kv_chunk, lw->kv_norm, n, d, eps);
  ops->rope(ctx, kv_chunk, n, 1, d, r, s->positions, rope->cos, rope->sin, 0, 0);
  if (reference(s) && (d - r) % 64 == 0) {
    ops->round_bf16(ctx, kv_chunk, (size_t)n * d);
    fp8_nope(s, kv_chunk, n, d, d - r);
  }
  tap(s, ST_TAP_ATTN_KV, layer, p0, ST_F32, 2, n, d, 0, kv_chunk);

  /* compressed rows, and for CSA the indexer's choice among them */
  int compressed_width = 0;
  if (kind != ST_LAYER_SLIDING) {
    compressor_state *cs = &ls->compressor;
    int first_new = cs->n_rows;
    compressor_run(s, layer, &lw->compressor, cs, n, p0);
    int emitted = cs->n_rows - first_new;
    if (emitted > 0) {
      float *rows = cs->rows + (size_t)first_new * d;
      ops->rope(ctx, rows, emitted, 1, d, r, s->row_positions, rope->cos, rope->sin, 0, 0);
      if (reference(s) && (d - r) % 64 == 0) {
        ops->round_bf16(ctx, rows, (size_t)emitted * d);
        fp8_nope(s, rows, emitted, d, d - r); /* FP8 QAT on the nope dims */
      }
      tap(s, ST_TAP_COMPRESSOR_KV, layer, first_new, ST_F32, 2, emitted, d, 0, rows);
    }
    compressed_width = kind == ST_LAYER_CSA ? indexer_run(s, layer, n, p0) : cs->n_rows;
  }

  /* candidates of each query: window positions ascending, then compressed rows ascending */
  int width = w + compressed_width;
  ops->candidates(ctx, s->cand, kind == ST_LAYER_CSA ? s->topk_idx : NULL, n, p0, w,
                  compressed_width, w + s->max_chunk, m > 0 ? m : 1);
  ops->sparse_attention(ctx, s->o, s->q, ls->kv_all, s->cand, n, H, d, width, lw->attn_sink,
                        (float)(1.0 / sqrt((double)d)), reference(s));
  ops->rope(ctx, s->o, n, H, d, r, s->positions, rope->cos, rope->sin, 0, 1); /* undo RoPE on V */
  to_bf16(s, s->o, (size_t)n * H * d);

  /* grouped output projection: each group of heads to R_o, then all groups to D */
  ops->matmul_grouped(ctx, s->z, s->o, &lw->wo_a, n, G);                  /* z [n, G R_o] */
  to_bf16(s, s->z, (size_t)n * lw->wo_a.rows);
  linear(s, s->a, s->z, &lw->wo_b, n, 1);                                  /* a [n, D] */
  tap(s, ST_TAP_ATTN_OUT, layer, p0, ST_F32, 2, n, D, 0, s->a);

  /* mHC: expand back into the streams */
  ops->hc_expand(ctx, s->X_next, s->a, s->X, s->post, s->comb, n, hc, D);
  float *swap = s->X; s->X = s->X_next; s->X_next = swap;
  to_bf16(s, s->X, (size_t)n * hc * D);

  /* the window ring keeps the last w rows: position p in slot p mod w (at most two runs) */
  int from = n > w ? n - w : 0;
  int slot = (int)((p0 + from) % w), first_run = ST_MIN(n - from, w - slot);
  copy(s, ls->kv_all + (size_t)slot * d, kv_chunk + (size_t)from * d, sizeof(float) * (size_t)first_run * d);
  if (n - from > first_run)
    copy(s, ls->kv_all, kv_chunk + (size_t)(from + first_run) * d,
         sizeof(float) * (size_t)(n - from - first_run) * d);
}

/* ------------------------------------------------------------------------------------------ */
/* Compressor (SPEC §3.2): gated pooling of m tokens (2m overlapping for CSA) into one row      */

/* Runs the chunk through the compressor state; the rows it completes are pooled, bf16-rounded
** (reference) and normed here, and s->row_positions holds their positions for the caller's RoPE
** and post-processing (which differ between the attention and the indexer compressor). */
static void compressor_run(st_session *s, int layer, const st_compressor_weights *cw,
                           compressor_state *cs, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  int m = cw->ratio, d = cw->dim;
  s->ops->matmul(s->ctx, s->ckv, s->xn, &cw->wkv, n);                      /* K_t [n, c d] */
  s->ops->matmul(s->ctx, s->cscore, s->xn, &cw->wgate, n);                 /* Z_t [n, c d] */
  s->ops->compress(s->ctx, cs->rows, cs->kv, cs->score, s->ckv, s->cscore, cw->ape, n, p0, m, d,
                   cw->overlap);
  int first_new = cs->n_rows, emitted = (int)((p0 + n) / m - p0 / m);
  cs->n_rows += emitted;
  if (!emitted) return;
  float *rows = cs->rows + (size_t)first_new * d;
  to_bf16(s, rows, (size_t)emitted * d);
  s->ops->rmsnorm(s->ctx, rows, rows, cw->norm, emitted, d, (float)cfg->rms_norm_eps);
  for (int j = 0; j < emitted; j++) s->h_row_positions[j] = (int64_t)(first_new + j) * m;
  upload(s, s->row_positions, s->h_row_positions, sizeof(int64_t) * (size_t)emitted);
  (void)layer;
}

/* ------------------------------------------------------------------------------------------ */
/* Lightning indexer (SPEC §3.3): picks each query's top-k compressed rows                     */

/* Returns the width of s->topk_idx rows. */
static int indexer_run(st_session *s, int layer, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->w[layer];
  const st_backend_ops *ops = s->ops;
  compressor_state *cs = &s->layers[layer].index_compressor;
  const st_settings *set = layer_settings(s, layer);
  const rope_table *rope = compress_rope(s, layer);
  int hI = cfg->index_n_heads, dI = cfg->index_head_dim, m = cfg->compress_ratio[layer];
  int r = cfg->rope_head_dim;

  /* key rows: compressed, RoPE'd (the setting's pairing), then rotated/quantised as scored */
  int first_new = cs->n_rows;
  compressor_run(s, layer, &lw->index_compressor, cs, n, p0);
  int rows = cs->n_rows, emitted = rows - first_new;
  if (emitted > 0) {
    float *k = cs->rows + (size_t)first_new * dI, *k_used = cs->rows_used + (size_t)first_new * dI;
    ops->rope(s->ctx, k, emitted, 1, dI, r, s->row_positions, rope->cos, rope->sin, set->index_rope_neox, 0);
    st_indexer_k_used(&s->be, set, k_used, k, emitted, dI);
    tap(s, ST_TAP_INDEXER_K, layer, first_new, ST_F32, 2, emitted, dI, 0, k);
    tap(s, ST_TAP_INDEXER_K_USED, layer, first_new, ST_F32, 2, emitted, dI, 0, k_used);
  }

  /* queries and their per-head weights */
  linear(s, s->iq, s->qr, &lw->index_wq_b, n, 1);                          /* [n, hI, dI] */
  ops->rope(s->ctx, s->iq, n, hI, dI, r, s->positions, rope->cos, rope->sin, set->index_rope_neox, 0);
  tap(s, ST_TAP_INDEXER_Q, layer, p0, ST_F32, 3, n, hI, dI, s->iq);
  st_indexer_q_used(&s->be, set, s->iq_used, s->iq, n * hI, dI);
  tap(s, ST_TAP_INDEXER_Q_USED, layer, p0, ST_F32, 3, n, hI, dI, s->iq_used);
  ops->matmul(s->ctx, s->iw, s->xn, &lw->index_weights_proj, n);          /* [n, hI] */
  ops->scale(s->ctx, s->iw, (float)(1.0 / sqrt((double)dI) / sqrt((double)hI)), (size_t)n * hI);
  tap(s, ST_TAP_INDEXER_WEIGHTS, layer, p0, ST_F32, 2, n, hI, 0, s->iw);

  /* scores and top-k (the score matrix only when it is tapped or the backend has no fused op) */
  for (int i = 0; i < n; i++) s->h_visible[i] = st_visible_rows(p0 + i, m, rows);
  upload(s, s->visible, s->h_visible, sizeof(int) * (size_t)n);
  /* IndexCache (index_topk_reuse): a reusing layer selects with the top-k of the last CSA layer
  ** that computed one, still in topk_idx (the CSA layers between reuse it too), or given by a
  ** replay that starts after that layer; it scores nothing. */
  int source = st_settings_topk_source(set, cfg, layer);
  if (source != layer) {
    int width = s->topk_width;
    if (source < s->first_layer) { /* checked by st_session_forward_layers */
      width = s->topk_in_width;
      upload(s, s->topk_idx, s->topk_in + (size_t)p0 * (size_t)width, sizeof(int32_t) * (size_t)n * width);
    }
    tap(s, ST_TAP_INDEXER_TOPK, layer, p0, ST_I32, 2, n, width, 0, s->topk_idx);
    return width;
  }
  /* the matrix only where the scores tap keeps a row of this chunk (SPEC: never materialised
  ** otherwise), or where the backend has no fused op */
  int keep_scores = tap_keeps(s, ST_TAP_INDEXER_SCORES, layer, p0, n) || !ops->indexer_topk;
  ST_ASSERT(!keep_scores || s->scores); /* scores_wanted saw the armed tap */
  int width = st_indexer_select(&s->be, layer_topk(s, layer), keep_scores ? s->scores : NULL,
                                s->topk_idx, s->iq_used, s->iw, cs->rows_used, n, rows, hI, dI,
                                s->visible, s->work);
  if (rows == 0) upload(s, s->topk_idx, s->h_minus_one, sizeof(int32_t) * (size_t)n);
  if (keep_scores) tap(s, ST_TAP_INDEXER_SCORES, layer, p0, ST_F32, 2, n, rows > 0 ? rows : 1, 0, s->scores);
  tap(s, ST_TAP_INDEXER_TOPK, layer, p0, ST_I32, 2, n, width, 0, s->topk_idx);
  s->topk_width = width;
  return width;
}

/* ------------------------------------------------------------------------------------------ */
/* MoE sub-layer (SPEC §2.5)                                                                    */

/* The routed experts from primitives (a backend without a fused moe_experts): one expert at a
** time over the tokens that chose it; each token sums its experts in ascending expert id. */
static void routed_experts(st_session *s, const st_layer_weights *lw, int n) {
  const st_config *cfg = s->cfg;
  const st_backend_ops *ops = s->ops;
  int D = cfg->hidden_size, E = cfg->n_routed_experts, kE = cfg->num_experts_per_tok;
  int F = cfg->moe_intermediate_size;
  float limit = (float)cfg->swiglu_limit;
  size_t nk = (size_t)n * kE;
  download(s, s->h_experts, s->experts, sizeof(int32_t) * nk);
  download(s, s->h_expert_w, s->expert_w, sizeof(float) * nk);
  /* group the (token, slot) pairs by expert, tokens ascending within each */
  int start[E + 1], count = 0;
  for (int e = 0; e < E; e++) {
    start[e] = count;
    for (int i = 0; i < n; i++)
      for (int c = 0; c < kE; c++)
        if (s->h_experts[(size_t)i * kE + c] == e) {
          s->h_group_rows[count] = i;
          s->h_group_weights[count] = s->h_expert_w[(size_t)i * kE + c];
          count++;
        }
  }
  start[E] = count;
  upload(s, s->group_rows, s->h_group_rows, sizeof(int32_t) * (size_t)count);
  upload(s, s->group_weights, s->h_group_weights, sizeof(float) * (size_t)count);
  for (int e = 0; e < E; e++) {
    int c0 = start[e], rows = start[e + 1] - c0;
    if (!rows) continue;
    ops->gather_rows(s->ctx, s->xg, s->xn, s->group_rows + c0, rows, D);
    linear(s, s->g, s->xg, &lw->w1[e], rows, 1);
    linear(s, s->u, s->xg, &lw->w3[e], rows, 1);
    ops->swiglu(s->ctx, s->h, s->g, s->u, rows, F, limit);
    linear(s, s->y, s->h, &lw->w2[e], rows, 1);
    ops->scatter_add(s->ctx, s->a, s->y, s->group_rows + c0, s->group_weights + c0, rows, D);
  }
}

static void moe_sublayer(st_session *s, int layer, const int32_t *tokens, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->w[layer];
  const st_backend_ops *ops = s->ops;
  void *ctx = s->ctx;
  int D = cfg->hidden_size, hc = cfg->hc_mult, E = cfg->n_routed_experts, kE = cfg->num_experts_per_tok;
  int F = cfg->moe_intermediate_size;
  float eps = (float)cfg->rms_norm_eps, limit = (float)cfg->swiglu_limit;

  ops->hc_weights(ctx, s->pre, s->post, s->comb, s->X, lw->hc_ffn_fn, lw->hc_ffn_base,
                  lw->hc_ffn_scale, n, hc, D, eps, (float)cfg->hc_eps, cfg->hc_sinkhorn_iters);
  ops->hc_collapse(ctx, s->x, s->X, s->pre, n, hc, D);
  to_bf16(s, s->x, (size_t)n * D);
  ops->rmsnorm(ctx, s->xn, s->x, lw->ffn_norm, n, D, eps);
  to_bf16(s, s->xn, (size_t)n * D);

  /* routing: sqrt(softplus(logit)) scores; hash layers pick experts by token id, others by
  ** top-k of score + bias (bias steers selection only); weights renormalised and scaled */
  ops->matmul(ctx, s->router_logits, s->xn, &lw->gate, n);                 /* [n, E] */
  const int32_t *tid2eid = s->model->layers[layer].tid2eid;                /* host */
  if (tid2eid) { /* hash layers: the experts of each token id */
    for (int i = 0; i < n; i++)
      memcpy(s->h_hash_experts + (size_t)i * kE, tid2eid + (size_t)tokens[i] * kE, sizeof(int32_t) * (size_t)kE);
    upload(s, s->hash_experts, s->h_hash_experts, sizeof(int32_t) * (size_t)n * kE);
  }
  ops->moe_route(ctx, s->experts, s->expert_w, s->router_logits, lw->gate_bias,
                 tid2eid ? s->hash_experts : NULL, n, E, kE, (float)cfg->routed_scaling_factor);
  tap(s, ST_TAP_FFN_EXPERTS, layer, p0, ST_I32, 2, n, kE, 0, s->experts);

  ops->fill(ctx, s->a, 0.0f, (size_t)n * D);
  if (ops->moe_experts)
    ops->moe_experts(ctx, s->a, s->xn, s->experts, s->expert_w, lw->w1, lw->w2, lw->w3, n, E, kE,
                     limit, reference(s), s->work);
  else
    routed_experts(s, lw, n);
  /* shared expert, unweighted */
  linear(s, s->g, s->xn, &lw->shared_w1, n, 1);
  linear(s, s->u, s->xn, &lw->shared_w3, n, 1);
  ops->swiglu(ctx, s->h, s->g, s->u, n, F, limit);
  linear(s, s->y, s->h, &lw->shared_w2, n, 1);
  ops->add(ctx, s->a, s->a, s->y, (size_t)n * D);
  to_bf16(s, s->a, (size_t)n * D);
  tap(s, ST_TAP_FFN_OUT, layer, p0, ST_F32, 2, n, D, 0, s->a);

  ops->hc_expand(ctx, s->X_next, s->a, s->X, s->post, s->comb, n, hc, D);
  float *swap = s->X; s->X = s->X_next; s->X_next = swap;
  to_bf16(s, s->X, (size_t)n * hc * D);
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                 */

st_status st_session_forward_layers(st_session *s, const int32_t *tokens, int n, const float *X_in,
                                    int first, int last, float *X_out, float *logits,
                                    float *all_logits) {
  const st_config *cfg = s->cfg;
  if (n <= 0) return st_fail(ST_EINVAL, "nothing to run: 0 tokens");
  if (first < 0 || last >= cfg->num_hidden_layers || first > last)
    return st_fail(ST_EINVAL, "layers %d..%d outside the model's 0..%d", first, last,
                   cfg->num_hidden_layers - 1);
  if (first > 0 && !X_in) return st_fail(ST_EINVAL, "starting at layer %d needs its input streams", first);
  if (s->position + n > s->max_tokens)
    return st_fail(ST_EINVAL, "%lld tokens exceed the session capacity of %lld",
                   (long long)(s->position + n), (long long)s->max_tokens);
  for (int layer = first; layer <= last; layer++) { /* reused top-k computed before `first` */
    int source = st_settings_topk_source(layer_settings(s, layer), cfg, layer);
    if (source < 0 || source >= first) continue;
    if (source != s->topk_in_layer)
      return st_fail(ST_EINVAL, "layer %d reuses the top-k of layer %d (index_topk_reuse), which a run "
                     "starting at layer %d does not compute: give it (st_session_options.topk_in)",
                     layer, source, first);
    if (s->topk_in_width <= 0 || s->topk_in_width > s->topk ||
        s->topk_in_width > s->rows_cap_csa)
      return st_fail(ST_EINVAL, "the given top-k of layer %d is %d wide; this session holds 1..%lld",
                     source, s->topk_in_width,
                     (long long)(s->topk < s->rows_cap_csa ? s->topk : s->rows_cap_csa));
  }
  s->first_layer = first;
  size_t stream = (size_t)cfg->hc_mult * cfg->hidden_size;
  for (int done = 0; done < n;) {
    int chunk = n - done < s->max_chunk ? n - done : s->max_chunk;
    int is_last = done + chunk == n;
    st_status rc = forward_chunk(s, tokens + done, chunk, X_in ? X_in + (size_t)done * stream : NULL,
                                 first, last, X_out ? X_out + (size_t)done * stream : NULL,
                                 is_last ? logits : NULL,
                                 all_logits ? all_logits + (size_t)done * cfg->vocab_size : NULL);
    flush_taps(s); /* the chunk's taps, whether it finished or not */
    if (!rc) rc = s->status;
    if (rc) return rc;
    /* non-finite activations: counted where logits reach the host (nothing is changed) */
    if (is_last && logits) s->nonfinite_logit_rows += count_nonfinite_floats(logits, cfg->vocab_size) > 0;
    if (all_logits)
      for (int r = 0; r < chunk; r++)
        s->nonfinite_logit_rows +=
            count_nonfinite_floats(all_logits + (size_t)(done + r) * cfg->vocab_size, cfg->vocab_size) > 0;
    done += chunk;
  }
  return ST_OK;
}

int64_t st_session_nonfinite_logits(const st_session *s) { return s->nonfinite_logit_rows; }

st_status st_session_forward(st_session *s, const int32_t *tokens, int n, float *logits,
                             float *all_logits) {
  return st_session_forward_layers(s, tokens, n, NULL, 0, s->cfg->num_hidden_layers - 1, NULL,
                                   logits, all_logits);
}

static int32_t argmax(const float *v, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

st_status st_generate_greedy(st_session *s, const int32_t *prompt, int n_prompt, int max_new,
                             int stop_at_eos, int32_t *out, int *n_out) {
  *n_out = 0;
  int V = s->cfg->vocab_size;
  float *last = malloc(sizeof(float) * (size_t)V);
  if (!last) return st_fail(ST_ENOMEM, "logits");
  st_status rc = st_session_forward(s, prompt, n_prompt, last, NULL);
  for (int k = 0; rc == ST_OK && k < max_new; k++) {
    int32_t next = argmax(last, V);
    out[(*n_out)++] = next;
    if (stop_at_eos && next == s->cfg->eos_token_id) break;
    if (k + 1 < max_new) rc = st_session_forward(s, &next, 1, last, NULL);
  }
  free(last);
  return rc;
}

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

static st_status load(st_model *m, const char *name, int rank, int64_t a, int64_t b, float **out) {
  int64_t shape[2] = {a, b};
  return st_checkpoint_load_f32(m->checkpoint, name, rank, shape, out);
}

#define LOAD1(field, name, a) \
  do { if ((rc = load(m, name, 1, a, 0, &(field))) != ST_OK) goto out; } while (0)
#define LOAD2(field, name, a, b) \
  do { if ((rc = load(m, name, 2, a, b, &(field))) != ST_OK) goto out; } while (0)

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
  LOAD2(c->wkv, name, cd, cfg->hidden_size);
  snprintf(name, sizeof name, "%s.wgate.weight", prefix);
  LOAD2(c->wgate, name, cd, cfg->hidden_size);
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
  LOAD2(L->wq_a, NAME("attn.wq_a.weight"), cfg->q_lora_rank, D);
  LOAD1(L->q_norm, NAME("attn.q_norm.weight"), cfg->q_lora_rank);
  LOAD2(L->wq_b, NAME("attn.wq_b.weight"), (int64_t)H * d, cfg->q_lora_rank);
  LOAD2(L->wkv, NAME("attn.wkv.weight"), d, D);
  LOAD1(L->kv_norm, NAME("attn.kv_norm.weight"), d);
  LOAD2(L->wo_a, NAME("attn.wo_a.weight"), (int64_t)G * cfg->o_lora_rank, (int64_t)H * d / G);
  LOAD2(L->wo_b, NAME("attn.wo_b.weight"), D, (int64_t)G * cfg->o_lora_rank);
  LOAD1(L->attn_sink, NAME("attn.attn_sink"), H);
  if (cfg->layer_kind[i] != ST_LAYER_SLIDING) {
    int overlap = cfg->layer_kind[i] == ST_LAYER_CSA;
    snprintf(name, sizeof name, "layers.%d.attn.compressor", i);
    if ((rc = load_compressor(m, name, cfg->compress_ratio[i], d, overlap, &L->compressor))) goto out;
  }
  if (cfg->layer_kind[i] == ST_LAYER_CSA) {
    int hI = cfg->index_n_heads, dI = cfg->index_head_dim;
    snprintf(name, sizeof name, "layers.%d.attn.indexer.compressor", i);
    if ((rc = load_compressor(m, name, cfg->compress_ratio[i], dI, 1, &L->index_compressor))) goto out;
    LOAD2(L->index_wq_b, NAME("attn.indexer.wq_b.weight"), (int64_t)hI * dI, cfg->q_lora_rank);
    LOAD2(L->index_weights_proj, NAME("attn.indexer.weights_proj.weight"), hI, D);
  }
  LOAD2(L->gate, NAME("ffn.gate.weight"), E, D);
  if (cfg->hash_moe[i]) {
    int64_t shape[2] = {cfg->vocab_size, cfg->num_experts_per_tok};
    L->tid2eid = malloc(sizeof(int32_t) * (size_t)shape[0] * (size_t)shape[1]);
    if (!L->tid2eid) { rc = st_fail(ST_ENOMEM, "tid2eid of layer %d", i); goto out; }
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
  L->w1 = calloc((size_t)E, sizeof(float *));
  L->w2 = calloc((size_t)E, sizeof(float *));
  L->w3 = calloc((size_t)E, sizeof(float *));
  if (!L->w1 || !L->w2 || !L->w3) { rc = st_fail(ST_ENOMEM, "expert table of layer %d", i); goto out; }
  for (int e = 0; e < E; e++) {
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w1.weight", i, e);
    LOAD2(L->w1[e], name, F, D);
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w2.weight", i, e);
    LOAD2(L->w2[e], name, D, F);
    snprintf(name, sizeof name, "layers.%d.ffn.experts.%d.w3.weight", i, e);
    LOAD2(L->w3[e], name, F, D);
  }
  LOAD2(L->shared_w1, NAME("ffn.shared_experts.w1.weight"), F, D);
  LOAD2(L->shared_w2, NAME("ffn.shared_experts.w2.weight"), D, F);
  LOAD2(L->shared_w3, NAME("ffn.shared_experts.w3.weight"), F, D);
#undef NAME
  L->loaded = 1;
out:
  return rc;
}

st_status st_model_load_all(st_model *m) {
  for (int i = 0; i < m->cfg->num_hidden_layers; i++) {
    st_status rc = st_model_load_layer(m, i);
    if (rc) return rc;
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
  if (cfg->hc_mult < 1 || cfg->hc_mult > 16) {
    rc = st_fail(ST_EUNSUPPORTED, "%s/config.json: hc_mult %d outside 1..16", dir, cfg->hc_mult);
    goto out;
  }
  if ((cfg->num_attention_heads * cfg->head_dim) % cfg->o_groups) {
    rc = st_fail(ST_EUNSUPPORTED, "%s/config.json: num_attention_heads*head_dim not divisible by o_groups",
                 dir);
    goto out;
  }
  m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers);
  if (!m->layers) { rc = st_fail(ST_ENOMEM, "layer table"); goto out; }
  int64_t V = cfg->vocab_size, D = cfg->hidden_size, hc = cfg->hc_mult;
  LOAD2(m->embed, "embed.weight", V, D);
  if (st_checkpoint_has(m->checkpoint, "head.weight") || !cfg->tie_word_embeddings) {
    LOAD2(m->head, "head.weight", V, D);
  } else {
    LOAD2(m->head, "embed.weight", V, D);
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

static void free_compressor(st_compressor_weights *c) {
  free(c->wkv);
  free(c->wgate);
  free(c->ape);
  free(c->norm);
}

void st_model_close(st_model *m) {
  if (!m) return;
  if (m->layers) {
    for (int i = 0; i < m->cfg->num_hidden_layers; i++) {
      st_layer_weights *L = &m->layers[i];
      float **all[] = {&L->attn_norm, &L->ffn_norm, &L->hc_attn_fn, &L->hc_attn_base,
                       &L->hc_attn_scale, &L->hc_ffn_fn, &L->hc_ffn_base, &L->hc_ffn_scale,
                       &L->wq_a, &L->q_norm, &L->wq_b, &L->wkv, &L->kv_norm, &L->wo_a, &L->wo_b,
                       &L->attn_sink, &L->index_wq_b, &L->index_weights_proj, &L->gate,
                       &L->gate_bias, &L->shared_w1, &L->shared_w2, &L->shared_w3};
      for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(*all[k]);
      free_compressor(&L->compressor);
      free_compressor(&L->index_compressor);
      free(L->tid2eid);
      for (int e = 0; e < m->cfg->n_routed_experts; e++) {
        if (L->w1) free(L->w1[e]);
        if (L->w2) free(L->w2[e]);
        if (L->w3) free(L->w3[e]);
      }
      free(L->w1);
      free(L->w2);
      free(L->w3);
    }
    free(m->layers);
  }
  free(m->embed);
  free(m->head);
  free(m->norm);
  free(m->hc_head_fn);
  free(m->hc_head_base);
  free(m->hc_head_scale);
  st_checkpoint_close(m->checkpoint);
  free(m);
}

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

typedef struct rope_table {
  float *cos, *sin; /* [max_position, r/2] */
} rope_table;

static st_status rope_table_build(rope_table *t, const st_config *cfg, const st_settings *set,
                                  int compressed, int64_t max_position) {
  int half = cfg->rope_head_dim / 2;
  double inv[512];
  if (half > 512) return st_fail(ST_EUNSUPPORTED, "rope dims %d > 1024", cfg->rope_head_dim);
  st_rope_inv_freq(cfg, set, compressed, inv);
  t->cos = malloc(sizeof(float) * (size_t)max_position * half);
  t->sin = malloc(sizeof(float) * (size_t)max_position * half);
  if (!t->cos || !t->sin) return st_fail(ST_ENOMEM, "RoPE tables for %lld positions", (long long)max_position);
  for (int64_t p = 0; p < max_position; p++) st_rope_cos_sin(inv, half, p, t->cos + p * half, t->sin + p * half);
  return ST_OK;
}

void st_rope_cos_sin(const double *inv_freq, int half, int64_t position, float *cos_out, float *sin_out) {
  for (int i = 0; i < half; i++) {
    float angle = (float)inv_freq[i] * (float)position; /* fp32 product, as the oracle computes it */
    cos_out[i] = (float)cos((double)angle);
    sin_out[i] = (float)sin((double)angle);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Session: per-request state and scratch, all sized once                                      */

typedef struct compressor_state {
  float *kv, *score; /* [c m, c d]: slots of the current (and, overlapping, previous) block */
  int n_rows;        /* rows emitted so far */
  float *rows;       /* main: points into kv_all; indexer: [rows_cap, dI] as computed */
  float *rows_used;  /* indexer only: [rows_cap, dI] rotated/quantised as scored */
} compressor_state;

typedef struct layer_state {
  float *kv_all; /* [w + max_chunk + rows_cap, d]: window ring | chunk rows | compressed rows */
  compressor_state compressor, index_compressor;
} layer_state;

struct st_session {
  st_model *model;
  const st_config *cfg;
  const st_backend_ops *ops;
  st_settings set;      /* the run's settings */
  st_settings alt;      /* replay: settings of the layers in alt_layers */
  uint8_t *alt_layers;  /* [n_layers] 1 = layer runs under alt; NULL = none */
  st_taps *taps;
  st_status tap_status; /* first error a tap sink returned */
  int64_t position, max_tokens;
  int max_chunk, threads, topk;
  int64_t rows_cap_csa, rows_cap_hca;
  rope_table rope_main, rope_compress, rope_compress_alt; /* alt: only if its RoPE differs */
  layer_state *layers;
  /* scratch, [max_chunk, ...] unless noted */
  int64_t *positions, *row_positions;  /* [max_chunk], [max_chunk] */
  float *X, *X_next;                   /* [n, hc, D] residual streams */
  float *pre, *post, *comb;            /* [n, hc], [n, hc], [n, hc, hc] */
  float *x, *xn;                       /* [n, D] */
  float *qr;                           /* [n, q_lo] */
  float *q;                            /* [n, H, d] */
  float *o;                            /* [n, H, d] attention output */
  float *group_in, *group_out, *z;     /* [n, H d / G], [n, R_o], [n, G R_o] */
  float *a;                            /* [n, D] sublayer output */
  float *ckv, *cscore;                 /* [n, 2 max(d, dI)] compressor projections */
  float *iq, *iq_used, *iw;            /* [n, hI, dI], [n, hI, dI], [n, hI] */
  float *scores;                       /* [n, rows_cap_csa] */
  int32_t *topk_idx;                   /* [n, topk_width_cap] */
  int *visible;                        /* [n] */
  int32_t *cand;                       /* [n, w + compressed_cap] attention candidates */
  void *topk_scratch;
  float *router_logits;                /* [n, E] */
  int32_t *experts;                    /* [n, kE] */
  float *expert_w;                     /* [n, kE] */
  int32_t *group_tokens;               /* [n kE] (token, slot) pairs routed to one expert */
  int32_t *group_rows;                 /* [n kE] their token rows */
  float *group_weights;                /* [n kE] their routing weights */
  int32_t *hash_experts;               /* [n, kE] tid2eid rows of the chunk's tokens */
  float *xg, *g, *u, *h, *y;           /* [n kE, D], [n kE, F] x3, [n kE, D] */
  float *logits;                       /* [n, V] */
  float *tmp;                          /* [n, max(D, q_lo, H d, ...)] reference-mode copies */
  size_t tmp_size;
};

int64_t st_session_position(const st_session *s) { return s->position; }
const st_settings *st_session_settings(const st_session *s) { return &s->set; }

static void *alloc_floats(size_t n, int *failed) {
  void *p = calloc(n ? n : 1, sizeof(float));
  if (!p) *failed = 1;
  return p;
}

void st_session_free(st_session *s) {
  if (!s) return;
  free(s->rope_main.cos);
  free(s->rope_main.sin);
  free(s->rope_compress.cos);
  free(s->rope_compress.sin);
  free(s->rope_compress_alt.cos);
  free(s->rope_compress_alt.sin);
  free(s->alt_layers);
  if (s->layers) {
    for (int i = 0; i < s->cfg->num_hidden_layers; i++) {
      layer_state *ls = &s->layers[i];
      free(ls->kv_all);
      free(ls->compressor.kv);
      free(ls->compressor.score);
      free(ls->index_compressor.kv);
      free(ls->index_compressor.score);
      free(ls->index_compressor.rows);
      free(ls->index_compressor.rows_used);
    }
    free(s->layers);
  }
  void *scratch[] = {s->positions, s->row_positions, s->X, s->X_next, s->pre, s->post, s->comb,
                     s->x, s->xn, s->qr, s->q, s->o, s->group_in, s->group_out, s->z, s->a,
                     s->ckv, s->cscore, s->iq, s->iq_used, s->iw, s->scores, s->topk_idx,
                     s->visible, s->cand, s->topk_scratch, s->router_logits, s->experts,
                     s->expert_w, s->group_tokens, s->group_rows, s->group_weights,
                     s->hash_experts, s->xg, s->g, s->u, s->h, s->y, s->logits,
                     s->tmp};
  for (size_t k = 0; k < sizeof scratch / sizeof scratch[0]; k++) free(scratch[k]);
  free(s);
}

static void compressor_state_reset(compressor_state *c, int ratio, int cd) {
  size_t n = (size_t)2 * ratio * cd; /* allocated for 2m slots in both layouts */
  for (size_t k = 0; k < n; k++) {
    c->kv[k] = 0;
    c->score[k] = -INFINITY; /* block 0 has no previous block (SPEC §3.2.3 quirk avoided) */
  }
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
  s->ops = opt->backend ? opt->backend : &st_backend_cpu_ref;
  s->set = opt->settings;
  st_settings_resolve(&s->set, cfg);
  s->alt = opt->alt_layers ? opt->alt_settings : s->set;
  st_settings_resolve(&s->alt, cfg);
  if (opt->alt_layers) {
    if (s->alt.precision != s->set.precision) {
      free(s);
      return st_fail(ST_EINVAL, "precision is a setting of the whole run: it cannot differ per layer");
    }
    s->alt_layers = malloc((size_t)cfg->num_hidden_layers);
    if (!s->alt_layers) { free(s); return st_fail(ST_ENOMEM, "layer settings"); }
    memcpy(s->alt_layers, opt->alt_layers, (size_t)cfg->num_hidden_layers);
  }
  s->taps = opt->taps;
  s->max_tokens = opt->max_tokens > 0 ? opt->max_tokens : 4096;
  s->max_chunk = opt->max_chunk > 0 ? opt->max_chunk : 256;
  if (s->max_chunk > s->max_tokens) s->max_chunk = (int)s->max_tokens;
#ifdef _OPENMP
  s->threads = omp_get_max_threads();
#else
  s->threads = 1;
#endif
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
  s->topk = st_settings_topk(&s->set, cfg);
  if (st_settings_topk(&s->alt, cfg) > s->topk) s->topk = st_settings_topk(&s->alt, cfg); /* capacity */
  int n = s->max_chunk, D = cfg->hidden_size, hc = cfg->hc_mult, H = cfg->num_attention_heads;
  int d = cfg->head_dim, w = cfg->sliding_window, hI = cfg->index_n_heads, dI = cfg->index_head_dim;
  int G = cfg->o_groups, Ro = cfg->o_lora_rank, E = cfg->n_routed_experts, kE = cfg->num_experts_per_tok;
  int F = cfg->moe_intermediate_size, V = cfg->vocab_size, q_lo = cfg->q_lora_rank;
  s->rows_cap_csa = s->max_tokens / (cfg->compress_rate_csa > 0 ? cfg->compress_rate_csa : 4) + 1;
  s->rows_cap_hca = s->max_tokens / (cfg->compress_rate_hca > 0 ? cfg->compress_rate_hca : 128) + 1;
  if ((rc = rope_table_build(&s->rope_main, cfg, &s->set, 0, s->max_tokens))) goto out;
  if ((rc = rope_table_build(&s->rope_compress, cfg, &s->set, 1, s->max_tokens))) goto out;
  if ((s->alt.compress_rope_theta != s->set.compress_rope_theta || s->alt.yarn != s->set.yarn) &&
      (rc = rope_table_build(&s->rope_compress_alt, cfg, &s->alt, 1, s->max_tokens)))
    goto out;

  s->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *s->layers);
  if (!s->layers) { rc = st_fail(ST_ENOMEM, "layer states"); goto out; }
  int64_t hca_cap = 0;
  for (int i = 0; i < cfg->num_hidden_layers; i++) {
    layer_state *ls = &s->layers[i];
    int64_t rows_cap = cfg->layer_kind[i] == ST_LAYER_CSA ? s->rows_cap_csa
                       : cfg->layer_kind[i] == ST_LAYER_HCA ? s->rows_cap_hca : 0;
    if (cfg->layer_kind[i] == ST_LAYER_HCA && rows_cap > hca_cap) hca_cap = rows_cap;
    ls->kv_all = alloc_floats((size_t)(w + n + rows_cap) * d, &failed);
    if (cfg->layer_kind[i] != ST_LAYER_SLIDING) {
      int m_ = cfg->compress_ratio[i], c = cfg->layer_kind[i] == ST_LAYER_CSA ? 2 : 1;
      ls->compressor.kv = alloc_floats((size_t)2 * m_ * c * d, &failed);
      ls->compressor.score = alloc_floats((size_t)2 * m_ * c * d, &failed);
      ls->compressor.rows = ls->kv_all ? ls->kv_all + (size_t)(w + n) * d : NULL;
      if (!failed) compressor_state_reset(&ls->compressor, m_, c * d);
    }
    if (cfg->layer_kind[i] == ST_LAYER_CSA) {
      int m_ = cfg->compress_ratio[i];
      ls->index_compressor.kv = alloc_floats((size_t)4 * m_ * dI, &failed);
      ls->index_compressor.score = alloc_floats((size_t)4 * m_ * dI, &failed);
      ls->index_compressor.rows = alloc_floats((size_t)rows_cap * dI, &failed);
      ls->index_compressor.rows_used = alloc_floats((size_t)rows_cap * dI, &failed);
      if (!failed) compressor_state_reset(&ls->index_compressor, m_, 2 * dI);
    }
    if (failed) { rc = st_fail(ST_ENOMEM, "state of layer %d (%lld tokens)", i, (long long)s->max_tokens); goto out; }
  }
  int64_t topk_cap = s->topk < s->rows_cap_csa ? s->topk : s->rows_cap_csa;
  int64_t cand_cap = w + (topk_cap > hca_cap ? topk_cap : hca_cap);
  int cmax = 2 * (d > dI ? d : dI);
  s->tmp_size = (size_t)n * ST_MAX(ST_MAX(ST_MAX(D, q_lo), H * d),
                                   ST_MAX(ST_MAX(hc * D, cmax), kE * ST_MAX(D, F)));
  s->positions = calloc((size_t)n, sizeof(int64_t));
  s->row_positions = calloc((size_t)n, sizeof(int64_t));
  s->X = alloc_floats((size_t)n * hc * D, &failed);
  s->X_next = alloc_floats((size_t)n * hc * D, &failed);
  s->pre = alloc_floats((size_t)n * hc, &failed);
  s->post = alloc_floats((size_t)n * hc, &failed);
  s->comb = alloc_floats((size_t)n * hc * hc, &failed);
  s->x = alloc_floats((size_t)n * D, &failed);
  s->xn = alloc_floats((size_t)n * D, &failed);
  s->qr = alloc_floats((size_t)n * q_lo, &failed);
  s->q = alloc_floats((size_t)n * H * d, &failed);
  s->o = alloc_floats((size_t)n * H * d, &failed);
  s->group_in = alloc_floats((size_t)n * H * d / G, &failed);
  s->group_out = alloc_floats((size_t)n * Ro, &failed);
  s->z = alloc_floats((size_t)n * G * Ro, &failed);
  s->a = alloc_floats((size_t)n * D, &failed);
  s->ckv = alloc_floats((size_t)n * cmax, &failed);
  s->cscore = alloc_floats((size_t)n * cmax, &failed);
  s->iq = alloc_floats((size_t)n * hI * dI, &failed);
  s->iq_used = alloc_floats((size_t)n * hI * dI, &failed);
  s->iw = alloc_floats((size_t)n * hI, &failed);
  s->scores = alloc_floats((size_t)n * s->rows_cap_csa, &failed);
  s->topk_idx = calloc((size_t)n * (topk_cap > 0 ? topk_cap : 1), sizeof(int32_t));
  s->visible = calloc((size_t)n, sizeof(int));
  s->cand = calloc((size_t)n * cand_cap, sizeof(int32_t));
  s->topk_scratch = malloc(st_topk_scratch_size((int)s->rows_cap_csa, s->threads));
  s->router_logits = alloc_floats((size_t)n * E, &failed);
  s->experts = calloc((size_t)n * kE, sizeof(int32_t));
  s->expert_w = alloc_floats((size_t)n * kE, &failed);
  s->group_tokens = calloc((size_t)n * kE, sizeof(int32_t));
  s->group_rows = calloc((size_t)n * kE, sizeof(int32_t));
  s->group_weights = alloc_floats((size_t)n * kE, &failed);
  s->hash_experts = calloc((size_t)n * kE, sizeof(int32_t));
  /* an expert sees at most n kE (token, slot) rows, should a hash table repeat an expert */
  s->xg = alloc_floats((size_t)n * kE * D, &failed);
  s->g = alloc_floats((size_t)n * kE * F, &failed);
  s->u = alloc_floats((size_t)n * kE * F, &failed);
  s->h = alloc_floats((size_t)n * kE * F, &failed);
  s->y = alloc_floats((size_t)n * kE * D, &failed);
  s->logits = alloc_floats((size_t)n * V, &failed);
  s->tmp = alloc_floats(s->tmp_size, &failed);
  if (failed || !s->positions || !s->row_positions || !s->topk_idx || !s->visible || !s->cand ||
      !s->topk_scratch || !s->experts || !s->group_tokens || !s->group_rows || !s->hash_experts) {
    rc = st_fail(ST_ENOMEM, "scratch buffers for chunks of %d tokens", n);
    goto out;
  }
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
static void to_bf16(const st_session *s, float *x, size_t count) {
  if (reference(s)) st_bf16_roundtrip(x, count);
}

/* y[n, out] = x[n, in] . w^T. In reference mode an FP8 linear quantises its input per token per
** 128 channels (ue8m0 scales) and the output is bf16, as the reference kernels do. */
static void linear(st_session *s, float *y, const float *x, const float *w, int n, int in, int out,
                   int fp8_input) {
  if (reference(s) && fp8_input && in % 128 == 0) {
    ST_ASSERT((size_t)n * in <= s->tmp_size);
    memcpy(s->tmp, x, sizeof(float) * (size_t)n * in);
    for (int i = 0; i < n; i++) st_fp8_roundtrip_blocks(s->tmp + (size_t)i * in, in, 128, 1, 0);
    x = s->tmp;
  }
  s->ops->matmul(y, x, w, n, in, out);
  to_bf16(s, y, (size_t)n * out);
}

static void tap(st_session *s, st_tap_id id, int layer, int64_t pos0, st_dtype dtype, int rank,
                int64_t a, int64_t b, int64_t c, const void *data) {
  if (!st_tap_armed(s->taps, id, layer)) return;
  int64_t shape[3] = {a, b, c};
  st_status rc = s->taps->sink->emit(s->taps->sink->ctx, id, layer, pos0, dtype, rank, shape, data);
  if (rc && !s->tap_status) s->tap_status = rc;
}

static int armed(const st_session *s, st_tap_id id, int layer) { return st_tap_armed(s->taps, id, layer); }

/* ------------------------------------------------------------------------------------------ */
/* Compressor (SPEC §3.2): gated pooling of m tokens (2m overlapping for CSA) into one row      */

static void compressor_run(st_session *s, int layer, const st_compressor_weights *cw,
                           compressor_state *cs, int is_indexer, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  int m = cw->ratio, d = cw->dim, cd = (cw->overlap ? 2 : 1) * d, r = cfg->rope_head_dim;
  s->ops->matmul(s->ckv, s->xn, cw->wkv, n, cfg->hidden_size, cd);     /* K_t [n, c d] */
  s->ops->matmul(s->cscore, s->xn, cw->wgate, n, cfg->hidden_size, cd); /* Z_t [n, c d] */
  int offsets[2 * 128 * 2];
  int slots = cw->overlap ? 2 * m : m;
  ST_ASSERT(slots <= (int)(sizeof offsets / sizeof offsets[0]));
  for (int sl = 0; sl < slots; sl++) offsets[sl] = cw->overlap && sl >= m ? d : 0;
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int within = (int)(t % m);
    int slot = cw->overlap ? m + within : within;
    float *kv = cs->kv + (size_t)slot * cd, *score = cs->score + (size_t)slot * cd;
    const float *ape = cw->ape + (size_t)within * cd;
    for (int k = 0; k < cd; k++) {
      kv[k] = s->ckv[(size_t)i * cd + k];
      score[k] = s->cscore[(size_t)i * cd + k] + ape[k];
    }
    if ((t + 1) % m) continue;
    /* block j = t / m is complete: row j pools its m tokens (and the previous block's). */
    int64_t j = t / m;
    float *row = cs->rows + (size_t)j * d;
    s->ops->compressor_pool(row, cs->kv, cs->score, slots, cd, offsets, d);
    to_bf16(s, row, (size_t)d);
    s->ops->rmsnorm(row, row, cw->norm, 1, d, (float)cfg->rms_norm_eps);
    int64_t row_position = j * m;
    const rope_table *rope = compress_rope(s, layer);
    s->ops->rope(row, 1, 1, d, r, &row_position, rope->cos, rope->sin,
                 is_indexer ? layer_settings(s, layer)->index_rope_neox : 0, 0);
    if (is_indexer)
      st_indexer_k_used(s->ops, layer_settings(s, layer), cs->rows_used + (size_t)j * d, row, 1, d);
    else if (reference(s) && (d - r) % 64 == 0) {
      st_bf16_roundtrip(row, (size_t)d);
      st_fp8_roundtrip_blocks(row, d - r, 64, 1, 0); /* FP8 QAT on the nope dims */
    }
    if (cw->overlap) { /* this block becomes the previous block */
      memcpy(cs->kv, cs->kv + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
      memcpy(cs->score, cs->score + (size_t)m * cd, sizeof(float) * (size_t)m * cd);
    }
    cs->n_rows++;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Lightning indexer (SPEC §3.3): picks each query's top-k compressed rows                     */

/* Returns the width of s->topk_idx rows. */
static int indexer_run(st_session *s, int layer, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->model->layers[layer];
  compressor_state *cs = &s->layers[layer].index_compressor;
  int hI = cfg->index_n_heads, dI = cfg->index_head_dim, m = cfg->compress_ratio[layer];
  int first_new = cs->n_rows;
  compressor_run(s, layer, &lw->index_compressor, cs, 1, n, p0);
  int rows = cs->n_rows;
  if (rows > first_new) {
    tap(s, ST_TAP_INDEXER_K, layer, first_new, ST_F32, 2, rows - first_new, dI, 0,
        cs->rows + (size_t)first_new * dI);
    tap(s, ST_TAP_INDEXER_K_USED, layer, first_new, ST_F32, 2, rows - first_new, dI, 0,
        cs->rows_used + (size_t)first_new * dI);
  }

  const st_settings *set = layer_settings(s, layer);
  const rope_table *rope = compress_rope(s, layer);
  linear(s, s->iq, s->qr, lw->index_wq_b, n, cfg->q_lora_rank, hI * dI, 1); /* [n, hI, dI] */
  s->ops->rope(s->iq, n, hI, dI, cfg->rope_head_dim, s->positions, rope->cos, rope->sin,
               set->index_rope_neox, 0);
  tap(s, ST_TAP_INDEXER_Q, layer, p0, ST_F32, 3, n, hI, dI, s->iq);
  st_indexer_q_used(s->ops, set, s->iq_used, s->iq, n * hI, dI);
  tap(s, ST_TAP_INDEXER_Q_USED, layer, p0, ST_F32, 3, n, hI, dI, s->iq_used);

  s->ops->matmul(s->iw, s->xn, lw->index_weights_proj, n, cfg->hidden_size, hI); /* [n, hI] */
  float weight_scale = (float)(1.0 / sqrt((double)dI) / sqrt((double)hI));
  for (size_t k = 0; k < (size_t)n * hI; k++) s->iw[k] *= weight_scale;
  tap(s, ST_TAP_INDEXER_WEIGHTS, layer, p0, ST_F32, 2, n, hI, 0, s->iw);

  for (int i = 0; i < n; i++) {
    int64_t vis = (p0 + i + 1) / m; /* row j is visible to query t iff j < (t+1)/m */
    s->visible[i] = (int)(vis < rows ? vis : rows);
  }
  int width = st_indexer_select(s->ops, layer_topk(s, layer), s->scores, s->topk_idx, s->iq_used,
                                s->iw, cs->rows_used, n, rows, hI, dI, s->visible, s->topk_scratch);
  tap(s, ST_TAP_INDEXER_SCORES, layer, p0, ST_F32, 2, n, rows > 0 ? rows : 1, 0, s->scores);
  tap(s, ST_TAP_INDEXER_TOPK, layer, p0, ST_I32, 2, n, width, 0, s->topk_idx);
  return width;
}

/* ------------------------------------------------------------------------------------------ */
/* Attention sub-layer (SPEC §2.3)                                                              */

static void attention_sublayer(st_session *s, int layer, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->model->layers[layer];
  layer_state *ls = &s->layers[layer];
  const st_backend_ops *ops = s->ops;
  st_layer_kind kind = cfg->layer_kind[layer];
  int D = cfg->hidden_size, hc = cfg->hc_mult, H = cfg->num_attention_heads, d = cfg->head_dim;
  int r = cfg->rope_head_dim, w = cfg->sliding_window, G = cfg->o_groups, Ro = cfg->o_lora_rank;
  int m = cfg->compress_ratio[layer];
  float eps = (float)cfg->rms_norm_eps;
  const rope_table *rope = kind == ST_LAYER_SLIDING ? &s->rope_main : compress_rope(s, layer);

  /* mHC: collapse the hc streams into the sub-layer input */
  ops->hc_weights(s->pre, s->post, s->comb, s->X, lw->hc_attn_fn, lw->hc_attn_base,
                  lw->hc_attn_scale, n, hc, D, eps, (float)cfg->hc_eps, cfg->hc_sinkhorn_iters);
  ops->hc_collapse(s->x, s->X, s->pre, n, hc, D);
  to_bf16(s, s->x, (size_t)n * D);
  ops->rmsnorm(s->xn, s->x, lw->attn_norm, n, D, eps);                  /* xn [n, D] */
  to_bf16(s, s->xn, (size_t)n * D);
  tap(s, ST_TAP_ATTN_X, layer, p0, ST_F32, 2, n, D, 0, s->xn);

  /* query: low-rank, normed, per-head RMS norm, RoPE on the last r dims */
  linear(s, s->qr, s->xn, lw->wq_a, n, D, cfg->q_lora_rank, 1);        /* qr [n, q_lo] */
  ops->rmsnorm(s->qr, s->qr, lw->q_norm, n, cfg->q_lora_rank, eps);
  to_bf16(s, s->qr, (size_t)n * cfg->q_lora_rank);
  tap(s, ST_TAP_ATTN_QR, layer, p0, ST_F32, 2, n, cfg->q_lora_rank, 0, s->qr);
  linear(s, s->q, s->qr, lw->wq_b, n, cfg->q_lora_rank, H * d, 1);     /* q [n, H, d] */
  ops->rmsnorm(s->q, s->q, NULL, n * H, d, eps);
  ops->rope(s->q, n, H, d, r, s->positions, rope->cos, rope->sin, 0, 0);
  to_bf16(s, s->q, (size_t)n * H * d);
  tap(s, ST_TAP_ATTN_Q, layer, p0, ST_F32, 3, n, H, d, s->q);

  /* window key = value: one head, into the chunk slots of kv_all */
  float *kv_chunk = ls->kv_all + (size_t)w * d;                          /* [n, d] */
  linear(s, kv_chunk, s->xn, lw->wkv, n, D, d, 1);
  ops->rmsnorm(kv_chunk, kv_chunk, lw->kv_norm, n, d, eps);
  ops->rope(kv_chunk, n, 1, d, r, s->positions, rope->cos, rope->sin, 0, 0);
  if (reference(s) && (d - r) % 64 == 0)
    for (int i = 0; i < n; i++) {
      st_bf16_roundtrip(kv_chunk + (size_t)i * d, (size_t)d);
      st_fp8_roundtrip_blocks(kv_chunk + (size_t)i * d, d - r, 64, 1, 0);
    }
  tap(s, ST_TAP_ATTN_KV, layer, p0, ST_F32, 2, n, d, 0, kv_chunk);

  /* compressed rows, and for CSA the indexer's choice among them */
  int compressed_width = 0;
  if (kind != ST_LAYER_SLIDING) {
    int first_new = ls->compressor.n_rows;
    compressor_run(s, layer, &lw->compressor, &ls->compressor, 0, n, p0);
    if (ls->compressor.n_rows > first_new)
      tap(s, ST_TAP_COMPRESSOR_KV, layer, first_new, ST_F32, 2, ls->compressor.n_rows - first_new,
          d, 0, ls->compressor.rows + (size_t)first_new * d);
    compressed_width = kind == ST_LAYER_CSA ? indexer_run(s, layer, n, p0) : ls->compressor.n_rows;
  }

  /* candidates of each query: window positions ascending, then compressed rows ascending */
  int width = w + compressed_width;
  int32_t compressed_base = w + s->max_chunk;
  for (int i = 0; i < n; i++) {
    int64_t t = p0 + i;
    int32_t *c = s->cand + (size_t)i * width;
    for (int k = 0; k < w; k++) {
      int64_t pos = t - w + 1 + k;
      c[k] = pos < 0 ? -1 : pos >= p0 ? (int32_t)(w + (pos - p0)) : (int32_t)(pos % w);
    }
    if (kind == ST_LAYER_HCA) {
      int64_t visible = (t + 1) / m;
      for (int j = 0; j < compressed_width; j++) c[w + j] = j < visible ? compressed_base + j : -1;
    } else if (kind == ST_LAYER_CSA) {
      for (int j = 0; j < compressed_width; j++) {
        int32_t row = s->topk_idx[(size_t)i * compressed_width + j];
        c[w + j] = row >= 0 ? compressed_base + row : -1;
      }
    }
  }
  ops->sparse_attention(s->o, s->q, ls->kv_all, s->cand, n, H, d, width, lw->attn_sink,
                        (float)(1.0 / sqrt((double)d)), reference(s));
  ops->rope(s->o, n, H, d, r, s->positions, rope->cos, rope->sin, 0, 1); /* undo RoPE on V */
  to_bf16(s, s->o, (size_t)n * H * d);

  /* grouped output projection: each group of heads to R_o, then all groups to D */
  int group_in = H * d / G;
  for (int g = 0; g < G; g++) {
    for (int i = 0; i < n; i++)
      memcpy(s->group_in + (size_t)i * group_in, s->o + (size_t)i * H * d + (size_t)g * group_in,
             sizeof(float) * (size_t)group_in);
    linear(s, s->group_out, s->group_in, lw->wo_a + (size_t)g * Ro * group_in, n, group_in, Ro, 0);
    for (int i = 0; i < n; i++)
      memcpy(s->z + (size_t)i * G * Ro + (size_t)g * Ro, s->group_out + (size_t)i * Ro,
             sizeof(float) * (size_t)Ro);
  }
  linear(s, s->a, s->z, lw->wo_b, n, G * Ro, D, 1);                     /* a [n, D] */
  tap(s, ST_TAP_ATTN_OUT, layer, p0, ST_F32, 2, n, D, 0, s->a);

  /* mHC: expand back into the streams */
  ops->hc_expand(s->X_next, s->a, s->X, s->post, s->comb, n, hc, D);
  float *swap = s->X; s->X = s->X_next; s->X_next = swap;
  to_bf16(s, s->X, (size_t)n * hc * D);

  /* the window ring keeps the last w rows: position p in slot p mod w */
  for (int i = n > w ? n - w : 0; i < n; i++)
    memcpy(ls->kv_all + (size_t)((p0 + i) % w) * d, kv_chunk + (size_t)i * d, sizeof(float) * (size_t)d);
}

/* ------------------------------------------------------------------------------------------ */
/* MoE sub-layer (SPEC §2.5)                                                                    */

static void moe_sublayer(st_session *s, int layer, const int32_t *tokens, int n, int64_t p0) {
  const st_config *cfg = s->cfg;
  const st_layer_weights *lw = &s->model->layers[layer];
  const st_backend_ops *ops = s->ops;
  int D = cfg->hidden_size, hc = cfg->hc_mult, E = cfg->n_routed_experts, kE = cfg->num_experts_per_tok;
  int F = cfg->moe_intermediate_size;
  float eps = (float)cfg->rms_norm_eps, limit = (float)cfg->swiglu_limit;

  ops->hc_weights(s->pre, s->post, s->comb, s->X, lw->hc_ffn_fn, lw->hc_ffn_base, lw->hc_ffn_scale,
                  n, hc, D, eps, (float)cfg->hc_eps, cfg->hc_sinkhorn_iters);
  ops->hc_collapse(s->x, s->X, s->pre, n, hc, D);
  to_bf16(s, s->x, (size_t)n * D);
  ops->rmsnorm(s->xn, s->x, lw->ffn_norm, n, D, eps);
  to_bf16(s, s->xn, (size_t)n * D);

  /* routing: sqrt(softplus(logit)) scores; hash layers pick experts by token id, others by
  ** top-k of score + bias (bias steers selection only); weights renormalised and scaled */
  ops->matmul(s->router_logits, s->xn, lw->gate, n, D, E);               /* [n, E] */
  if (lw->tid2eid) /* hash layers: the experts of each token id */
    for (int i = 0; i < n; i++)
      memcpy(s->hash_experts + (size_t)i * kE, lw->tid2eid + (size_t)tokens[i] * kE, sizeof(int32_t) * (size_t)kE);
  ops->moe_route(s->experts, s->expert_w, s->router_logits, lw->gate_bias,
                 lw->tid2eid ? s->hash_experts : NULL, n, E, kE, (float)cfg->routed_scaling_factor);
  tap(s, ST_TAP_FFN_EXPERTS, layer, p0, ST_I32, 2, n, kE, 0, s->experts);

  /* routed experts, one expert at a time over the tokens that chose it; each token sums its
  ** experts in ascending expert id, whatever the chunk */
  memset(s->a, 0, sizeof(float) * (size_t)n * D);
  for (int e = 0; e < E; e++) {
    int count = 0;
    for (int i = 0; i < n; i++)
      for (int c = 0; c < kE; c++)
        if (s->experts[(size_t)i * kE + c] == e) {
          s->group_tokens[count] = i * kE + c;
          memcpy(s->xg + (size_t)count * D, s->xn + (size_t)i * D, sizeof(float) * (size_t)D);
          count++;
        }
    if (!count) continue;
    linear(s, s->g, s->xg, lw->w1[e], count, D, F, 1);
    linear(s, s->u, s->xg, lw->w3[e], count, D, F, 1);
    ops->swiglu(s->h, s->g, s->u, count, F, limit);
    linear(s, s->y, s->h, lw->w2[e], count, F, D, 1);
    for (int k = 0; k < count; k++) {
      s->group_rows[k] = s->group_tokens[k] / kE;
      s->group_weights[k] = s->expert_w[s->group_tokens[k]];
    }
    ops->scatter_add(s->a, s->y, s->group_rows, s->group_weights, count, D);
  }
  /* shared expert, unweighted */
  linear(s, s->g, s->xn, lw->shared_w1, n, D, F, 1);
  linear(s, s->u, s->xn, lw->shared_w3, n, D, F, 1);
  ops->swiglu(s->h, s->g, s->u, n, F, limit);
  linear(s, s->y, s->h, lw->shared_w2, n, F, D, 1);
  for (size_t k = 0; k < (size_t)n * D; k++) s->a[k] += s->y[k];
  to_bf16(s, s->a, (size_t)n * D);
  tap(s, ST_TAP_FFN_OUT, layer, p0, ST_F32, 2, n, D, 0, s->a);

  ops->hc_expand(s->X_next, s->a, s->X, s->post, s->comb, n, hc, D);
  float *swap = s->X; s->X = s->X_next; s->X_next = swap;
  to_bf16(s, s->X, (size_t)n * hc * D);
}

/* ------------------------------------------------------------------------------------------ */
/* One chunk through the whole model                                                            */

static st_status forward_chunk(st_session *s, const int32_t *tokens, int n, const float *X_in,
                               int first, int last, float *X_out, float *last_logits,
                               float *all_logits) {
  const st_config *cfg = s->cfg;
  int D = cfg->hidden_size, hc = cfg->hc_mult, V = cfg->vocab_size;
  int64_t p0 = s->position;
  for (int i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= V)
      return st_fail(ST_EINVAL, "token %d at position %lld is outside the vocabulary [0, %d)",
                     tokens[i], (long long)(p0 + i), V);
    s->positions[i] = p0 + i;
  }
  if (X_in) {
    memcpy(s->X, X_in, sizeof(float) * (size_t)n * hc * D);
  } else {
    /* embedding, replicated into the hc residual streams: X [n, hc, D] */
    for (int i = 0; i < n; i++)
      for (int a = 0; a < hc; a++)
        memcpy(s->X + ((size_t)i * hc + a) * D, s->model->embed + (size_t)tokens[i] * D,
               sizeof(float) * (size_t)D);
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
  if (X_out) memcpy(X_out, s->X, sizeof(float) * (size_t)n * hc * D);

  if (last == cfg->num_hidden_layers - 1 && (last_logits || all_logits || armed(s, ST_TAP_LOGITS, -1))) {
    /* hc_head, final norm, logits (every row only when someone wants them) */
    int all = all_logits || armed(s, ST_TAP_LOGITS, -1);
    int from = all ? 0 : n - 1, rows = n - from;
    s->ops->hc_head(s->x, s->X + (size_t)from * hc * D, s->model->hc_head_fn, s->model->hc_head_base,
                    s->model->hc_head_scale, rows, hc, D, (float)cfg->rms_norm_eps, (float)cfg->hc_eps);
    to_bf16(s, s->x, (size_t)rows * D);
    s->ops->rmsnorm(s->x, s->x, s->model->norm, rows, D, (float)cfg->rms_norm_eps);
    to_bf16(s, s->x, (size_t)rows * D);
    s->ops->matmul(s->logits, s->x, s->model->head, rows, D, V);         /* [rows, V] fp32 */
    if (all) tap(s, ST_TAP_LOGITS, -1, p0, ST_F32, 2, n, V, 0, s->logits);
    if (all_logits) memcpy(all_logits, s->logits, sizeof(float) * (size_t)n * V);
    if (last_logits) memcpy(last_logits, s->logits + (size_t)(rows - 1) * V, sizeof(float) * (size_t)V);
  }
  s->position += n;
  return s->tap_status;
}

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
  size_t stream = (size_t)cfg->hc_mult * cfg->hidden_size;
  for (int done = 0; done < n;) {
    int chunk = n - done < s->max_chunk ? n - done : s->max_chunk;
    int is_last = done + chunk == n;
    st_status rc = forward_chunk(s, tokens + done, chunk, X_in ? X_in + (size_t)done * stream : NULL,
                                 first, last, X_out ? X_out + (size_t)done * stream : NULL,
                                 is_last ? logits : NULL,
                                 all_logits ? all_logits + (size_t)done * cfg->vocab_size : NULL);
    if (rc) return rc;
    done += chunk;
  }
  return ST_OK;
}

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

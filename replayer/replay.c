/*
** replay.c — layer replay under alternate settings (see replay.h for the stages).
**
** The indexer stage is the fast path users sweep with: it reads the recorded indexer q, k rows
** and weights (after RoPE, before rotation and quantisation) and redoes steps 3-8 of SPEC-dsv4
** §3.3 through engine/indexer.c — the same functions the forward pass used, so the recorded
** settings reproduce the recorded scores and top-k bit for bit. Cells that share everything that
** shapes the scores (index_k, index_q, rotate, index_rope, theta, yarn) share one score pass and
** differ only in their top-k; positions are processed in blocks so memory stays bounded at any
** context length.
**
** The model stages run the real layer code (engine/model.c) from the recorded layer input with
** the alternate settings on layer N only, capturing layer N's taps in memory to compare them with
** the recording.
*/
#include "replay.h"
#include "common/json_oom.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/config.h"
#include "engine/indexer.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "metrics.h"
#include "recorder/index.h"
#include "recorder/trace_reader.h"
#include "schemas/catalogue.h"

static const char *const stage_names[] = {"indexer", "attention", "layer", "rest"};

const char *st_replay_stage_name(st_replay_stage stage) {
  return (unsigned)stage < 4 ? stage_names[stage] : "?";
}

int st_replay_stage_parse(const char *name) {
  for (int i = 0; i < 4; i++)
    if (!strcmp(name, stage_names[i])) return i;
  return -1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The recorded per-layer override (run --layer-set): 1 and *alt filled when layer is listed. */
static st_status recorded_layer_override(const char *text, int layer, st_settings *alt, int *listed,
                                         int *any) {
  *listed = *any = 0;
  errno = 0;
  json_t *root = json_loads(text, 0, NULL);
  if (!root && st_json_out_of_memory(NULL)) return st_fail(ST_ENOMEM, "reading the recorded per-layer settings");
  if (!root) return ST_OK;
  json_t *layers = json_object_get(root, "alt_layers"), *settings = json_object_get(root, "alt_settings");
  st_status rc = ST_OK;
  if (json_is_array(layers) && json_is_object(settings)) {
    size_t i;
    json_t *v;
    json_array_foreach(layers, i, v) {
      *any = 1;
      if (json_is_integer(v) && json_integer_value(v) == layer) *listed = 1;
    }
    if (*listed) {
      char *dump = json_dumps(settings, JSON_COMPACT);
      rc = dump ? st_settings_from_json(dump, alt) : st_fail(ST_ENOMEM, "settings");
      free(dump);
    }
  }
  json_decref(root);
  return rc;
}

st_status st_settings_from_json(const char *text, st_settings *out) {
  st_settings_default(out);
  json_error_t err;
  errno = 0;
  json_t *root = json_loads(text, 0, &err);
  if (!root && st_json_out_of_memory(&err)) return st_fail(ST_ENOMEM, "reading the recorded settings");
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return st_fail(ST_EFORMAT, "recorded settings are not a JSON object: %s", text);
  }
  const char *key;
  json_t *value;
  st_status rc = ST_OK;
  json_object_foreach(root, key, value) {
    char kv[ST_MAX_LAYERS + 256];
    if (json_is_string(value)) snprintf(kv, sizeof kv, "%s=%s", key, json_string_value(value));
    else if (json_is_integer(value)) snprintf(kv, sizeof kv, "%s=%lld", key, (long long)json_integer_value(value));
    else if (json_is_real(value)) snprintf(kv, sizeof kv, "%s=%.17g", key, json_real_value(value));
    else continue;
    if (st_setting_find(key) < 0) continue; /* settings of a newer build: ignored */
    if ((rc = st_settings_set(out, kv))) break;
  }
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Cells: the cross product of the sweeps over the base settings                               */

typedef struct cell_spec {
  st_settings settings;
  char label[256];
} cell_spec;

static st_status build_cells(const st_replay_request *req, const st_settings *base, cell_spec **out,
                             int *n_out) {
  int n = 1;
  int counts[16];
  char values[16][32][64];
  char keys[16][64];
  if (req->n_sweeps > 16) return st_fail(ST_EINVAL, "at most 16 --sweep keys");
  for (int k = 0; k < req->n_sweeps; k++) {
    const char *eq = strchr(req->sweeps[k], '=');
    if (!eq || eq == req->sweeps[k])
      return st_fail(ST_EINVAL, "--sweep '%s': expected key=v1,v2,...", req->sweeps[k]);
    snprintf(keys[k], sizeof keys[k], "%.*s", (int)(eq - req->sweeps[k]), req->sweeps[k]);
    counts[k] = 0;
    char list[2048];
    snprintf(list, sizeof list, "%s", eq + 1);
    for (char *save, *v = strtok_r(list, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
      if (counts[k] == 32) return st_fail(ST_EINVAL, "--sweep %s: at most 32 values", keys[k]);
      snprintf(values[k][counts[k]++], 64, "%s", v);
    }
    if (!counts[k]) return st_fail(ST_EINVAL, "--sweep %s: no values", keys[k]);
    n *= counts[k];
    if (n > 4096) return st_fail(ST_EINVAL, "the sweep has more than 4096 cells");
  }
  cell_spec *cells = calloc((size_t)n, sizeof *cells);
  if (!cells) return st_fail(ST_ENOMEM, "sweep cells");
  for (int c = 0; c < n; c++) {
    cells[c].settings = *base;
    int rest = c, len = 0;
    int idx[16]; /* the last key varies fastest */
    for (int k = req->n_sweeps - 1; k >= 0; k--) {
      idx[k] = rest % counts[k];
      rest /= counts[k];
    }
    for (int k = 0; k < req->n_sweeps; k++) {
      char kv[160];
      snprintf(kv, sizeof kv, "%s=%s", keys[k], values[k][idx[k]]);
      st_status rc = st_settings_set(&cells[c].settings, kv);
      if (rc) {
        free(cells);
        return st_fail_context(rc, "--sweep: ");
      }
      len += snprintf(cells[c].label + len, sizeof cells[c].label > (size_t)len ? sizeof cells[c].label - (size_t)len : 0,
                      "%s%s", len ? " " : "", kv);
    }
    if (!req->n_sweeps && !req->n_sets) snprintf(cells[c].label, sizeof cells[c].label, "recorded");
    for (int k = 0; !req->n_sweeps && k < req->n_sets; k++) /* the --set values name the cell */
      len += snprintf(cells[c].label + len, sizeof cells[c].label > (size_t)len ? sizeof cells[c].label - (size_t)len : 0,
                      "%s%s", len ? " " : "", req->sets[k]);
  }
  *out = cells;
  *n_out = n;
  return ST_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                               */

static int same_settings(const st_settings *a, const st_settings *b) {
  return a->precision == b->precision && a->index_k == b->index_k && a->index_q == b->index_q &&
         a->rotate == b->rotate && a->topk == b->topk && a->index_rope_neox == b->index_rope_neox &&
         a->compress_rope_theta == b->compress_rope_theta && a->yarn == b->yarn &&
         a->index_topk_reuse == b->index_topk_reuse &&
         !strcmp(a->index_topk_pattern, b->index_topk_pattern);
}

/* Everything that shapes the indexer scores (not the top-k size, nor whether it is reused). */
static int same_scores(const st_settings *a, const st_settings *b) {
  return a->index_k == b->index_k && a->index_q == b->index_q && a->rotate == b->rotate &&
         a->index_rope_neox == b->index_rope_neox && a->compress_rope_theta == b->compress_rope_theta &&
         a->yarn == b->yarn;
}

static int same_rope(const st_settings *a, const st_settings *b) {
  return a->index_rope_neox == b->index_rope_neox && a->compress_rope_theta == b->compress_rope_theta &&
         a->yarn == b->yarn;
}

/* RoPE on the last rope dims of rows vectors (heads per row) of backend memory x at given (host)
** positions, with the engine's own cos/sin (st_rope_cos_sin), uploaded for the call. */
static st_status rope_vectors(const st_backend *be, const st_config *cfg, const st_settings *set,
                              float *x, int64_t rows, int heads, int dim, const int64_t *positions,
                              int inverse) {
  int half = cfg->rope_head_dim / 2;
  size_t table = sizeof(float) * (size_t)rows * half, index_bytes = sizeof(int64_t) * (size_t)rows;
  double inv[512];
  st_rope_inv_freq(cfg, set, 1, inv);
  float *cs = malloc(table), *sn = malloc(table);
  int64_t *index = malloc(index_bytes);
  void *d_cs = NULL, *d_sn = NULL, *d_index = NULL;
  st_status rc = ST_OK;
  if (!cs || !sn || !index) {
    rc = st_fail(ST_ENOMEM, "RoPE tables");
    goto out;
  }
  for (int64_t r = 0; r < rows; r++) {
    index[r] = r;
    st_rope_cos_sin(inv, half, positions[r], cs + r * half, sn + r * half);
  }
  if ((rc = st_backend_alloc(be, table, &d_cs)) || (rc = st_backend_alloc(be, table, &d_sn)) ||
      (rc = st_backend_alloc(be, index_bytes, &d_index)) || (rc = st_backend_upload(be, d_cs, cs, table)) ||
      (rc = st_backend_upload(be, d_sn, sn, table)) || (rc = st_backend_upload(be, d_index, index, index_bytes)))
    goto out;
  be->ops->rope(be->ctx, x, (int)rows, heads, dim, cfg->rope_head_dim, d_index, d_cs, d_sn,
                set->index_rope_neox, inverse);
  rc = be->ops->synchronize(be->ctx); /* before the tables are freed */
out:
  st_backend_free(be, d_cs);
  st_backend_free(be, d_sn);
  st_backend_free(be, d_index);
  free(cs); free(sn); free(index);
  return rc;
}

int st_replay_needle_rows(int m, int64_t rows, int64_t start, int64_t end, int32_t *out, int cap) {
  int n = 0;
  for (int64_t j = start / m - 1; j <= (end - 1) / m + 1 && j < rows; j++) {
    if (j < 0) continue;
    int64_t lo = m * (j - 1), hi = m * j + m - 1;
    if (lo < end && hi >= start && n < cap) out[n++] = (int32_t)j;
  }
  return n;
}

static st_status need_tap(st_trace *t, const char *trace_path, st_tap_id id, int layer,
                          const st_trace_tap **out) {
  *out = st_trace_find_tap_id(t, id, layer);
  if (*out) return st_trace_check_tap(t, *out); /* issue 14 #9: the trace against itself */
  char name[96];
  st_tap_full_name(name, sizeof name, id, layer);
  return st_fail(ST_ENOTFOUND, "%s holds no tap %s, which this replay needs: record the run with "
                 "--tap 'layers.%d.*' (or --tap '%s')", trace_path, name, layer, name);
}

static st_status read_positions(st_trace *t, const st_trace_tap *tap, int64_t rows, int64_t **out) {
  int64_t *p = malloc(sizeof(int64_t) * (size_t)(rows ? rows : 1));
  if (!p) return st_fail(ST_ENOMEM, "positions");
  st_status rc = ST_OK;
  if (tap->has_positions) rc = st_trace_read_positions(t, tap, p);
  else for (int64_t i = 0; i < rows; i++) p[i] = i;
  if (rc) { free(p); return rc; }
  *out = p;
  return ST_OK;
}

static void record_verdict(st_replay_cell *cell, int64_t position, const float *scores, int64_t rows,
                           const int32_t *topk, int width, const int32_t *needle, int n_needle,
                           int topk_setting, int64_t visible) {
  st_needle_rank r = st_needle_best_rank(scores, rows, needle, n_needle);
  st_needle_verdict *v = &cell->verdicts[cell->n_verdicts++];
  v->position = position;
  v->best_rank = r.rank;
  v->best_row = r.row;
  v->score = r.score;
  v->in_topk = st_needle_in_topk(topk, width, needle, n_needle);
  v->topk = topk_setting;
  v->n_visible = visible;
  cell->needle_positions_in_topk += v->in_topk;
}

/* ------------------------------------------------------------------------------------------ */
/* Stage indexer                                                                                */

typedef struct indexer_inputs {
  st_trace *trace;
  const st_trace_tap *q, *k, *w, *scores, *topk, *q_used, *k_used;
  int64_t n, rows;     /* query rows, compressed rows */
  int64_t *positions;  /* [n] */
  int heads, dim, ratio;
} indexer_inputs;

/* The widest recorded top-k a cell of replay_indexer reuses (index_topk_reuse: the layer selects
** with the top-k of the CSA layer before it, read by row, so that tap must hold the same
** positions); 1 when no cell reuses. */
static st_status reused_topk_width(const st_replay_request *req, const st_config *cfg, const cell_spec *specs,
                                   int n_cells, const indexer_inputs *in, int64_t *width) {
  *width = 1;
  for (int c = 0; c < n_cells; c++) {
    int src = st_settings_topk_source(&specs[c].settings, cfg, req->layer);
    if (src == req->layer) continue;
    const st_trace_tap *tap = NULL;
    st_status rc = need_tap(in->trace, req->trace_path, ST_TAP_INDEXER_TOPK, src, &tap);
    if (rc) return st_fail_context(rc, "cell %s: layer %d reuses layer %d's top-k: ", specs[c].label, req->layer, src);
    if (tap->shape[0] != in->n)
      return st_fail(ST_EFORMAT, "%s: %s holds %lld positions, layer %d's indexer.q %lld: a cell that "
                     "reuses it needs the same positions", req->trace_path, tap->name,
                     (long long)tap->shape[0], req->layer, (long long)in->n);
    *width = ST_MAX(*width, tap->shape[1]);
  }
  return ST_OK;
}

static st_status replay_indexer(const st_backend *be, const st_replay_request *req, const st_config *cfg,
                                const st_settings *recorded, cell_spec *specs, int n_cells,
                                indexer_inputs *in, st_replay_report *rep) {
  st_status rc = ST_OK;
  int hI = in->heads, dI = in->dim;
  int64_t R = in->rows, n = in->n;
  const int block = 128;
  int64_t reuse_width;
  if ((rc = reused_topk_width(req, cfg, specs, n_cells, in, &reuse_width))) return rc;
  /* The trace's tensors are read into host buffers; every op runs on copies of them in backend
  ** memory (uploaded, results downloaded), so the stage runs on any backend. */
  float *k = malloc(sizeof(float) * (size_t)(R ? R : 1) * dI);
  float *k_used = malloc(sizeof(float) * (size_t)(R ? R : 1) * dI);
  float *rec_k_used = in->k_used ? malloc(sizeof(float) * (size_t)(R ? R : 1) * dI) : NULL;
  float *q = malloc(sizeof(float) * (size_t)block * hI * dI);
  float *q_used = malloc(sizeof(float) * (size_t)block * hI * dI);
  float *rec_q_used = in->q_used ? malloc(sizeof(float) * (size_t)block * hI * dI) : NULL;
  float *w = malloc(sizeof(float) * (size_t)block * hI);
  int64_t score_width = R > 0 ? R : 1;
  float *scores = malloc(sizeof(float) * (size_t)block * score_width);
  int64_t rec_score_width = in->scores ? in->scores->shape[1] : 0;
  float *rec_scores = in->scores ? malloc(sizeof(float) * (size_t)block * rec_score_width) : NULL;
  int64_t rec_topk_width = in->topk ? in->topk->shape[1] : 0;
  int32_t *rec_topk = in->topk ? malloc(sizeof(int32_t) * (size_t)block * rec_topk_width) : NULL;
  int max_topk = 1;
  for (int c = 0; c < n_cells; c++) {
    int kk = st_settings_topk(&specs[c].settings, cfg);
    if (kk > max_topk) max_topk = kk;
  }
  int64_t topk_cap = max_topk < R ? max_topk : (R > 0 ? R : 1);
  int32_t *topk_rows = malloc(sizeof(int32_t) * (size_t)block * topk_cap);
  int32_t *reused = malloc(sizeof(int32_t) * (size_t)block * (size_t)reuse_width);
  int32_t *set_scratch = malloc(sizeof(int32_t) * (size_t)(ST_MAX(topk_cap, reuse_width) + rec_topk_width + 2));
  st_backend_limits lim = {.max_tokens = block, .max_rows = R > 0 ? R : 1, .max_topk = (int)topk_cap,
                           .max_dim = hI * dI};
  int visible[128];
  int64_t *k_positions = malloc(sizeof(int64_t) * (size_t)(R ? R : 1));
  int *done = calloc((size_t)n_cells, sizeof(int));
  st_tensor_compare *score_cmp = calloc((size_t)n_cells, sizeof *score_cmp);
  st_index_set_compare *topk_cmp = calloc((size_t)n_cells, sizeof *topk_cmp);
  int *bits_differ = calloc((size_t)n_cells, sizeof(int));
  /* backend memory: the key rows as read and as scored, one block of queries, weights, scores,
  ** top-k rows and visible counts, the top-k workspace */
  size_t k_bytes = sizeof(float) * (size_t)(R ? R : 1) * dI, q_bytes = sizeof(float) * (size_t)block * hI * dI;
  size_t w_bytes = sizeof(float) * (size_t)block * hI, scores_bytes = sizeof(float) * (size_t)block * score_width;
  size_t topk_bytes = sizeof(int32_t) * (size_t)block * topk_cap, visible_bytes = sizeof(int) * (size_t)block;
  size_t scratch_bytes = be->ops->workspace_size(be->ctx, &lim);
  float *d_k = NULL, *d_k_used = NULL, *d_q = NULL, *d_q_used = NULL, *d_w = NULL, *d_scores = NULL;
  int32_t *d_topk = NULL;
  int *d_visible = NULL;
  void *d_scratch = NULL;
  if ((rc = st_backend_alloc(be, k_bytes, (void **)&d_k)) ||
      (rc = st_backend_alloc(be, k_bytes, (void **)&d_k_used)) ||
      (rc = st_backend_alloc(be, q_bytes, (void **)&d_q)) ||
      (rc = st_backend_alloc(be, q_bytes, (void **)&d_q_used)) ||
      (rc = st_backend_alloc(be, w_bytes, (void **)&d_w)) ||
      (rc = st_backend_alloc(be, scores_bytes, (void **)&d_scores)) ||
      (rc = st_backend_alloc(be, topk_bytes, (void **)&d_topk)) ||
      (rc = st_backend_alloc(be, visible_bytes, (void **)&d_visible)) ||
      (rc = st_backend_alloc(be, scratch_bytes ? scratch_bytes : 1, &d_scratch)))
    goto out;
  if (!k || !k_used || !q || !q_used || !w || !scores || !topk_rows || !reused || !set_scratch ||
      !k_positions || !done || !score_cmp || !topk_cmp || !bits_differ ||
      (in->scores && !rec_scores) || (in->topk && !rec_topk) || (in->k_used && !rec_k_used) ||
      (in->q_used && !rec_q_used)) {
    rc = st_fail(ST_ENOMEM, "replay buffers for %lld rows", (long long)R);
    goto out;
  }
  if (R && (rc = st_trace_read_f32(in->trace, in->k, 0, R, k))) goto out;
  if (rec_k_used && R && (rc = st_trace_read_f32(in->trace, in->k_used, 0, R, rec_k_used))) goto out;
  if ((rc = st_backend_upload(be, d_k, k, sizeof(float) * (size_t)R * dI))) goto out;
  for (int64_t j = 0; j < R; j++) k_positions[j] = j * in->ratio;
  for (int c = 0; c < n_cells; c++) {
    st_tensor_compare_init(&score_cmp[c]);
    st_index_set_compare_init(&topk_cmp[c]);
    rep->cells[c].verdicts = req->needle_end > req->needle_start
                                 ? calloc((size_t)(n ? n : 1), sizeof(st_needle_verdict)) : NULL;
  }

  /* one pass per group of cells with the same score-shaping settings */
  int cells_done = 0;
  for (int lead = 0; lead < n_cells; lead++) {
    if (done[lead]) continue;
    const st_settings *gs = &specs[lead].settings;
    double t0 = now();
    int rope_changed = !same_rope(gs, recorded);
    if (R && (rc = be->ops->copy(be->ctx, d_k_used, d_k, sizeof(float) * (size_t)R * dI))) goto out;
    if (rope_changed && R) {
      if ((rc = rope_vectors(be, cfg, recorded, d_k_used, R, 1, dI, k_positions, 1))) goto out;
      if ((rc = rope_vectors(be, cfg, gs, d_k_used, R, 1, dI, k_positions, 0))) goto out;
    }
    for (int64_t j = 0; j < R; j++) /* row by row, exactly as the forward pass emits them */
      st_indexer_k_used(be, gs, d_k_used + (size_t)j * dI, d_k_used + (size_t)j * dI, 1, dI);
    if (rec_k_used && (rc = st_backend_download(be, k_used, d_k_used, sizeof(float) * (size_t)R * dI)))
      goto out;
    int group[4096], n_group = 0;
    for (int c = lead; c < n_cells; c++)
      if (!done[c] && same_scores(&specs[c].settings, gs)) {
        group[n_group++] = c;
        done[c] = 1;
        if (rec_k_used && same_settings(&specs[c].settings, recorded) &&
            memcmp(k_used, rec_k_used, sizeof(float) * (size_t)R * dI))
          bits_differ[c] = 1;
      }
    for (int64_t p0 = 0; p0 < n; p0 += block) {
      int nb = (int)(n - p0 < block ? n - p0 : block);
      if ((rc = st_trace_read_f32(in->trace, in->q, p0, nb, q))) goto out;
      if ((rc = st_trace_read_f32(in->trace, in->w, p0, nb, w))) goto out;
      if (rec_scores && (rc = st_trace_read_f32(in->trace, in->scores, p0, nb, rec_scores))) goto out;
      if (rec_topk && (rc = st_trace_read_i32(in->trace, in->topk, p0, nb, rec_topk))) goto out;
      if (rec_q_used && (rc = st_trace_read_f32(in->trace, in->q_used, p0, nb, rec_q_used))) goto out;
      for (int i = 0; i < nb; i++) visible[i] = st_visible_rows(in->positions[p0 + i], in->ratio, R);
      if ((rc = st_backend_upload(be, d_q, q, sizeof(float) * (size_t)nb * hI * dI)) ||
          (rc = st_backend_upload(be, d_w, w, sizeof(float) * (size_t)nb * hI)) ||
          (rc = st_backend_upload(be, d_visible, visible, sizeof(int) * (size_t)nb)))
        goto out;
      if (rope_changed) {
        if ((rc = rope_vectors(be, cfg, recorded, d_q, nb, hI, dI, in->positions + p0, 1))) goto out;
        if ((rc = rope_vectors(be, cfg, gs, d_q, nb, hI, dI, in->positions + p0, 0))) goto out;
      }
      st_indexer_q_used(be, gs, d_q_used, d_q, nb * hI, dI);
      st_indexer_scores(be, d_scores, d_q_used, d_w, d_k_used, nb, (int)R, hI, dI, d_visible);
      if ((rc = st_backend_download(be, scores, d_scores, sizeof(float) * (size_t)nb * score_width)))
        goto out;
      if (rec_q_used && (rc = st_backend_download(be, q_used, d_q_used, sizeof(float) * (size_t)nb * hI * dI)))
        goto out;
      for (int g = 0; g < n_group; g++) {
        int c = group[g];
        st_replay_cell *cell = &rep->cells[c];
        int kk = st_settings_topk(&specs[c].settings, cfg);
        int src = st_settings_topk_source(&specs[c].settings, cfg, req->layer);
        int32_t *topk = topk_rows; /* this cell's top-k rows [nb, width] */
        int width;
        if (src != req->layer) {
          const st_trace_tap *src_tap = st_trace_find_tap_id(in->trace, ST_TAP_INDEXER_TOPK, src);
          width = (int)src_tap->shape[1];
          if ((rc = st_trace_read_i32(in->trace, src_tap, p0, nb, reused))) goto out;
          topk = reused;
        } else {
          width = st_indexer_topk_of(be, kk, d_scores, d_topk, nb, (int)R, d_visible, d_scratch);
          if (R > 0 && (rc = st_backend_download(be, topk, d_topk, sizeof(int32_t) * (size_t)nb * width)))
            goto out;
          if (R == 0) for (int i = 0; i < nb; i++) topk[i] = -1;
        }
        int exact_cell = same_settings(&specs[c].settings, recorded);
        if (rec_scores && rec_score_width == score_width) {
          st_tensor_compare_add(&score_cmp[c], scores, rec_scores, (int64_t)nb * score_width);
        }
        if (rec_topk) {
          st_index_set_compare_add(&topk_cmp[c], topk, width, rec_topk, rec_topk_width, nb, set_scratch);
          if (exact_cell && (width != rec_topk_width ||
                             memcmp(topk, rec_topk, sizeof(int32_t) * (size_t)nb * width)))
            bits_differ[c] = 1;
        }
        if (exact_cell && rec_q_used && memcmp(q_used, rec_q_used, sizeof(float) * (size_t)nb * hI * dI))
          bits_differ[c] = 1;
        if (cell->verdicts)
          for (int i = 0; i < nb; i++)
            if (in->positions[p0 + i] >= req->needle_end)
              record_verdict(cell, in->positions[p0 + i], scores + (size_t)i * score_width, R,
                             topk + (size_t)i * width, width, rep->needle_rows, rep->n_needle_rows,
                             kk, visible[i]);
      }
    }
    double spent = (now() - t0) / n_group;
    for (int g = 0; g < n_group; g++) rep->cells[group[g]].seconds = spent;
    cells_done += n_group;
    if (req->progress) req->progress(req->progress_ctx, cells_done, n_cells);
  }

  for (int c = 0; c < n_cells; c++) {
    st_replay_cell *cell = &rep->cells[c];
    if (in->topk) {
      cell->has_topk = 1;
      cell->topk_rows = topk_cmp[c].rows;
      cell->topk_identical_rows = topk_cmp[c].identical_rows;
      cell->topk_jaccard_mean = st_index_set_mean_jaccard(&topk_cmp[c]);
      cell->topk_jaccard_min = topk_cmp[c].min_jaccard;
      cell->topk_overlap_mean = st_index_set_mean_overlap(&topk_cmp[c]);
    }
    if (in->scores && rec_score_width == score_width) {
      st_tensor_compare *sc = &score_cmp[c];
      cell->has_scores = 1;
      cell->score_difference = st_tensor_difference(sc);
      cell->score_cosine = st_tensor_cosine(sc);
      cell->score_max_abs = sc->max_abs;
      cell->score_max_abs_position = sc->max_abs_index >= 0 ? in->positions[sc->max_abs_index / score_width] : -1;
      cell->score_max_abs_row = sc->max_abs_index >= 0 ? sc->max_abs_index % score_width : -1;
      cell->score_mask_mismatch = sc->mask_mismatch;
      if (cell->same_as_recorded && sc->bit_mismatch) bits_differ[c] = 1;
    }
    if (cell->same_as_recorded)
      cell->bit_exact = (in->scores || in->topk || in->q_used || in->k_used) ? !bits_differ[c] : -1;
    else
      cell->bit_exact = -1;
  }
  if (!rc) rc = be->ops->synchronize(be->ctx);
out:
  {
    void *device[] = {d_k, d_k_used, d_q, d_q_used, d_w, d_scores, d_topk, d_visible, d_scratch};
    for (size_t b = 0; b < sizeof device / sizeof device[0]; b++) st_backend_free(be, device[b]);
  }
  free(k); free(k_used); free(rec_k_used); free(q); free(q_used); free(rec_q_used); free(w);
  free(scores); free(rec_scores); free(rec_topk); free(topk_rows); free(reused); free(set_scratch);
  free(k_positions); free(done); free(score_cmp); free(topk_cmp); free(bits_differ);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Model stages: attention, layer, rest                                                         */

/* The recorded top-k a model-stage replay of layers N..last must give the session: that of the
** CSA layer before N which one of them reuses (index_topk_reuse; layer N under the cell's settings,
** the others under the recorded ones), read whole [T, width]. *out NULL when none reuses. */
static st_status reused_topk_input(st_trace *t, const char *trace_path, const st_config *cfg,
                                   const st_settings *recorded, const st_settings *cell, int N,
                                   int last, int64_t T, int32_t **out, int *width, int *layer) {
  *out = NULL;
  *width = 0;
  *layer = -1;
  for (int l = N; l <= last; l++) {
    int src = st_settings_topk_source(l == N ? cell : recorded, cfg, l);
    if (src >= 0 && src < N) *layer = src;
  }
  if (*layer < 0) return ST_OK;
  const st_trace_tap *tap;
  st_status rc = need_tap(t, trace_path, ST_TAP_INDEXER_TOPK, *layer, &tap);
  if (rc) return st_fail_context(rc, "layer %d reuses layer %d's top-k: ", N, *layer);
  if (tap->has_positions || tap->shape[0] < T)
    return st_fail(ST_EINVAL, "%s recorded %s at a subset of positions; a replay that reuses it needs "
                   "every position (record with --positions all)", trace_path, tap->name);
  *out = malloc(sizeof(int32_t) * (size_t)T * (size_t)(tap->shape[1] ? tap->shape[1] : 1));
  if (!*out) return st_fail(ST_ENOMEM, "%s: %lld rows", tap->name, (long long)T);
  if ((rc = st_trace_read_i32(t, tap, 0, T, *out))) {
    free(*out);
    *out = NULL;
    return rc;
  }
  *width = (int)tap->shape[1];
  return ST_OK;
}

/* Keeps the layer-N taps a model-stage replay compares (in memory, one buffer per tap). */
typedef struct keep_sink {
  int layer;
  float *attn_out, *output;     /* [T, D], [T, hc, D] */
  float *scores;                /* [T, R] or NULL */
  int32_t *topk;                /* [T, width] */
  int64_t T, R, width, stream, D;
  int64_t scores_rows, topk_rows, attn_rows, out_rows;
} keep_sink;

static st_status keep_emit(void *ctx, st_tap_id tap, int layer, int64_t pos0, st_dtype dtype,
                           int rank, const int64_t *shape, const void *data) {
  keep_sink *k = ctx;
  (void)dtype; (void)rank;
  if (layer != k->layer) return ST_OK;
  if (tap == ST_TAP_ATTN_OUT)
    memcpy(k->attn_out + (size_t)pos0 * k->D, data, sizeof(float) * (size_t)shape[0] * k->D), k->attn_rows += shape[0];
  else if (tap == ST_TAP_OUTPUT)
    memcpy(k->output + (size_t)pos0 * k->stream, data, sizeof(float) * (size_t)shape[0] * k->stream), k->out_rows += shape[0];
  else if (tap == ST_TAP_INDEXER_SCORES && k->scores) {
    for (int64_t i = 0; i < shape[0]; i++) { /* rows may be narrower early on: pad with -inf */
      float *dst = k->scores + (size_t)(pos0 + i) * k->R;
      memcpy(dst, (const float *)data + (size_t)i * shape[1], sizeof(float) * (size_t)ST_MIN(shape[1], k->R));
      for (int64_t j = shape[1]; j < k->R; j++) dst[j] = -INFINITY;
    }
    k->scores_rows += shape[0];
  } else if (tap == ST_TAP_INDEXER_TOPK && k->topk) {
    for (int64_t i = 0; i < shape[0]; i++) {
      int32_t *dst = k->topk + (size_t)(pos0 + i) * k->width;
      memcpy(dst, (const int32_t *)data + (size_t)i * shape[1], sizeof(int32_t) * (size_t)ST_MIN(shape[1], k->width));
      for (int64_t j = shape[1]; j < k->width; j++) dst[j] = -1;
    }
    k->topk_rows += shape[0];
  }
  return ST_OK;
}

static void compare_output(st_replay_cell *cell, st_trace *t, const st_trace_tap *rec, const float *mine,
                           int64_t T, int64_t row_elems, int *bits_differ) {
  float *buf = malloc(sizeof(float) * (size_t)row_elems * 64);
  st_tensor_compare cmp;
  st_tensor_compare_init(&cmp);
  int64_t rows = rec->shape[0] < T ? rec->shape[0] : T;
  int64_t *pos = NULL;
  if (buf && read_positions(t, rec, rec->shape[0], &pos) == ST_OK) {
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
      int64_t nb = rows - r0 < 64 ? rows - r0 : 64;
      if (st_trace_read_f32(t, rec, r0, nb, buf)) break;
      for (int64_t i = 0; i < nb; i++)
        if (pos[r0 + i] < T)
          st_tensor_compare_add(&cmp, mine + (size_t)pos[r0 + i] * row_elems, buf + (size_t)i * row_elems, row_elems);
    }
  }
  free(pos);
  free(buf);
  cell->has_output = 1;
  snprintf(cell->output_tap, sizeof cell->output_tap, "%s", rec->name);
  cell->output_difference = st_tensor_difference(&cmp);
  cell->output_cosine = st_tensor_cosine(&cmp);
  cell->output_max_abs = cmp.max_abs;
  if (cmp.bit_mismatch || cmp.count == 0) *bits_differ = 1;
}

static st_status replay_model(const st_backend *be, const st_replay_request *req, st_trace *t, const st_settings *recorded,
                              cell_spec *specs, int n_cells, st_replay_report *rep) {
  st_status rc = ST_OK;
  int N = req->layer;
  st_model *model = NULL;
  float *X_in = NULL, *logits = NULL, *rec_logits = NULL;
  keep_sink keep = {.layer = N};
  const st_trace_tap *input;
  if ((rc = need_tap(t, req->trace_path, ST_TAP_INPUT, N, &input))) return rc;
  if (input->has_positions)
    return st_fail(ST_EINVAL, "%s recorded %s at a subset of positions; replaying a layer needs every "
                   "position (record with --positions all)", req->trace_path, input->name);
  if ((rc = st_model_open(req->model_dir, &model))) return rc;
  const st_config *cfg = model->cfg;
  int last = req->stage == ST_REPLAY_REST ? cfg->num_hidden_layers - 1 : N;
  for (int l = N; l <= last && !rc; l++) rc = st_model_load_layer(model, l);
  if (rc) goto out;
  int64_t n_tok = 0;
  const int32_t *tokens = st_trace_tokens(t, &n_tok);
  int64_t T = input->shape[0];
  if (!tokens || T > n_tok) { rc = st_fail(ST_EFORMAT, "%s: /tokens shorter than %s", req->trace_path, input->name); goto out; }
  int hc = cfg->hc_mult, D = cfg->hidden_size, V = cfg->vocab_size;
  keep.T = T;
  keep.D = D;
  keep.stream = (int64_t)hc * D;
  keep.R = cfg->layer_kind[N] == ST_LAYER_CSA ? T / cfg->compress_ratio[N] : 0;
  int max_topk = 1;
  for (int c = 0; c < n_cells; c++) max_topk = ST_MAX(max_topk, st_settings_topk(&specs[c].settings, cfg));
  keep.width = keep.R > 0 ? ST_MIN((int64_t)max_topk, keep.R) : 1;
  X_in = malloc(sizeof(float) * (size_t)T * keep.stream);
  keep.attn_out = malloc(sizeof(float) * (size_t)T * D);
  keep.output = malloc(sizeof(float) * (size_t)T * keep.stream);
  int want_needle = req->needle_end > req->needle_start && cfg->layer_kind[N] == ST_LAYER_CSA;
  if (want_needle) keep.scores = malloc(sizeof(float) * (size_t)T * (keep.R ? keep.R : 1));
  if (cfg->layer_kind[N] == ST_LAYER_CSA) keep.topk = malloc(sizeof(int32_t) * (size_t)T * keep.width);
  const st_trace_tap *rec_logits_tap = st_trace_find_tap_id(t, ST_TAP_LOGITS, -1);
  int want_logits = req->stage == ST_REPLAY_REST;
  if (want_logits) logits = malloc(sizeof(float) * (size_t)T * V);
  if (!X_in || !keep.attn_out || !keep.output || (want_needle && !keep.scores) ||
      (cfg->layer_kind[N] == ST_LAYER_CSA && !keep.topk) || (want_logits && !logits)) {
    rc = st_fail(ST_ENOMEM, "replay buffers for %lld tokens", (long long)T);
    goto out;
  }
  if ((rc = st_trace_read_f32(t, input, 0, T, X_in))) goto out;
  st_tap_sink sink = {.ctx = &keep, .emit = keep_emit};
  const char *globs[8];
  char g1[64], g2[64], g3[64], g4[64];
  snprintf(g1, sizeof g1, "layers.%d.attn.out", N);
  snprintf(g2, sizeof g2, "layers.%d.output", N);
  snprintf(g3, sizeof g3, "layers.%d.indexer.topk", N);
  snprintf(g4, sizeof g4, "layers.%d.indexer.scores", N);
  int n_globs = 0;
  globs[n_globs++] = g1;
  globs[n_globs++] = g2;
  if (keep.topk) globs[n_globs++] = g3;
  if (keep.scores) globs[n_globs++] = g4;
  uint8_t *alt = calloc((size_t)cfg->num_hidden_layers, 1);
  if (!alt) { rc = st_fail(ST_ENOMEM, "layer mask"); goto out; }
  alt[N] = 1;
  const st_trace_tap *rec_out = st_trace_find_tap_id(t, req->stage == ST_REPLAY_ATTENTION ? ST_TAP_ATTN_OUT : ST_TAP_OUTPUT, N);
  const st_trace_tap *rec_topk = st_trace_find_tap_id(t, ST_TAP_INDEXER_TOPK, N);
  int32_t *set_scratch = malloc(sizeof(int32_t) * (size_t)(keep.width + (rec_topk ? rec_topk->shape[1] : 0) + 2));
  int32_t *rec_topk_buf = rec_topk ? malloc(sizeof(int32_t) * (size_t)rec_topk->shape[0] * rec_topk->shape[1]) : NULL;
  if (rec_topk && rec_topk_buf) rc = st_trace_read_i32(t, rec_topk, 0, rec_topk->shape[0], rec_topk_buf);
  if (rc) { free(alt); free(set_scratch); free(rec_topk_buf); goto out; }
  if (want_logits && rec_logits_tap) {
    rec_logits = malloc(sizeof(float) * (size_t)V * 64);
  }

  for (int c = 0; c < n_cells && !rc; c++) {
    st_replay_cell *cell = &rep->cells[c];
    double t0 = now();
    st_taps taps = {0};
    if ((rc = st_taps_arm(&taps, cfg->num_hidden_layers, globs, n_globs))) break;
    taps.sink = &sink;
    st_session_options opt = {.max_tokens = T, .settings = *recorded, .taps = &taps,
                              .alt_layers = alt, .alt_settings = specs[c].settings, .backend = be};
    int32_t *topk_in = NULL;
    if ((rc = reused_topk_input(t, req->trace_path, cfg, recorded, &specs[c].settings, N, last, T,
                                &topk_in, &opt.topk_in_width, &opt.topk_in_layer))) {
      st_taps_free(&taps);
      break;
    }
    opt.topk_in = topk_in;
    st_session *s = NULL;
    keep.attn_rows = keep.out_rows = keep.scores_rows = keep.topk_rows = 0;
    rc = st_session_create(model, &opt, &s);
    if (!rc) rc = st_session_forward_layers(s, tokens, (int)T, X_in, N, last, NULL, NULL, logits);
    st_session_free(s);
    st_taps_free(&taps);
    free(topk_in);
    if (rc) break;
    int bits_differ = 0;
    if (rec_out) compare_output(cell, t, rec_out, req->stage == ST_REPLAY_ATTENTION ? keep.attn_out : keep.output,
                                T, req->stage == ST_REPLAY_ATTENTION ? D : keep.stream, &bits_differ);
    if (rec_topk && rec_topk_buf && keep.topk) {
      st_index_set_compare cmp;
      st_index_set_compare_init(&cmp);
      int64_t *pos = NULL;
      if (read_positions(t, rec_topk, rec_topk->shape[0], &pos) == ST_OK) {
        for (int64_t i = 0; i < rec_topk->shape[0]; i++)
          if (pos[i] < T)
            st_index_set_compare_add(&cmp, keep.topk + (size_t)pos[i] * keep.width, keep.width,
                                     rec_topk_buf + (size_t)i * rec_topk->shape[1], rec_topk->shape[1], 1, set_scratch);
        free(pos);
      }
      cell->has_topk = 1;
      cell->topk_rows = cmp.rows;
      cell->topk_identical_rows = cmp.identical_rows;
      cell->topk_jaccard_mean = st_index_set_mean_jaccard(&cmp);
      cell->topk_jaccard_min = cmp.min_jaccard;
      cell->topk_overlap_mean = st_index_set_mean_overlap(&cmp);
      if (cmp.identical_rows != cmp.rows) bits_differ = 1;
    }
    if (want_logits && rec_logits_tap && rec_logits) {
      int64_t *pos = NULL;
      double kl_sum = 0, kl_max = 0;
      int64_t agree = 0, count = 0;
      st_tensor_compare cmp;
      st_tensor_compare_init(&cmp);
      if (read_positions(t, rec_logits_tap, rec_logits_tap->shape[0], &pos) == ST_OK) {
        for (int64_t r0 = 0; r0 < rec_logits_tap->shape[0]; r0 += 64) {
          int64_t nb = ST_MIN((int64_t)64, rec_logits_tap->shape[0] - r0);
          if (st_trace_read_f32(t, rec_logits_tap, r0, nb, rec_logits)) break;
          for (int64_t i = 0; i < nb; i++) {
            if (pos[r0 + i] >= T) continue;
            const float *mine = logits + (size_t)pos[r0 + i] * V, *theirs = rec_logits + (size_t)i * V;
            double kl = st_logits_kl(theirs, mine, V);
            kl_sum += kl;
            kl_max = fmax(kl_max, kl);
            agree += st_logits_greedy_agree(mine, theirs, V);
            count++;
            st_tensor_compare_add(&cmp, mine, theirs, V);
          }
        }
        free(pos);
      }
      cell->has_logits = 1;
      cell->logits_positions = count;
      cell->kl_mean = count ? kl_sum / count : 0;
      cell->kl_max = kl_max;
      cell->greedy_agreement = count ? (double)agree / count : 0;
      if (cmp.bit_mismatch || !count) bits_differ = 1;
    }
    if (want_needle && keep.scores) {
      cell->verdicts = calloc((size_t)T, sizeof(st_needle_verdict));
      int kk = st_settings_topk(&specs[c].settings, cfg);
      for (int64_t i = req->needle_end; cell->verdicts && i < T; i++) {
        int64_t vis = ST_MIN((i + 1) / cfg->compress_ratio[N], keep.R);
        record_verdict(cell, i, keep.scores + (size_t)i * keep.R, keep.R, keep.topk + (size_t)i * keep.width,
                       (int)keep.width, rep->needle_rows, rep->n_needle_rows, kk, vis);
      }
    }
    cell->bit_exact = cell->same_as_recorded ? ((rec_out || rec_topk || (want_logits && rec_logits_tap)) ? !bits_differ : -1) : -1;

    /* rest: a short greedy continuation, layer N under the cell's settings (a full run) */
    cell->continuation_has_needle = -1;
    if (req->stage == ST_REPLAY_REST && req->continue_tokens > 0 && !rc) {
      int64_t n_prompt = st_trace_n_prompt(t);
      if ((rc = st_model_load_all(model))) break;
      st_session_options full = {.max_tokens = n_prompt + req->continue_tokens, .settings = *recorded,
                                 .alt_layers = alt, .alt_settings = specs[c].settings, .backend = be};
      st_session *fs = NULL;
      int n_out = 0;
      int want = ST_MIN(req->continue_tokens, (int)(sizeof cell->continuation / sizeof cell->continuation[0]));
      rc = st_session_create(model, &full, &fs);
      if (!rc) rc = st_generate_greedy(fs, tokens, (int)n_prompt, want, 1, cell->continuation, &n_out); /* stops after eos */
      st_session_free(fs);
      cell->n_continuation = n_out;
      if (!rc && req->needle_end > req->needle_start) {
        int64_t len = req->needle_end - req->needle_start;
        cell->continuation_has_needle = 0;
        for (int64_t a = 0; a + len <= n_out && !cell->continuation_has_needle; a++)
          cell->continuation_has_needle = !memcmp(cell->continuation + a, tokens + req->needle_start, sizeof(int32_t) * (size_t)len);
      }
    }
    cell->seconds = now() - t0;
    if (!rc && req->progress) req->progress(req->progress_ctx, c + 1, n_cells);
  }
  free(alt);
  free(set_scratch);
  free(rec_topk_buf);
out:
  free(X_in); free(logits); free(rec_logits);
  free(keep.attn_out); free(keep.output); free(keep.scores); free(keep.topk);
  st_model_close(model);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */

void st_replay_report_free(st_replay_report *r) {
  if (!r) return;
  for (int c = 0; c < r->n_cells; c++) free(r->cells[c].verdicts);
  free(r->cells);
  free(r);
}

/* Identifies the trace by content (issue 14, defect 9): its recomputed digest must equal the
** digest the writer recorded in it and, when store_dir indexes its run, the run's row. */
static st_status check_content(st_trace *t, const char *store_dir, char digest[32]) {
  char expected[64] = "";
  const char *run_id = st_trace_attr(t, "run_id");
  char index_path[4096];
  struct stat sb;
  if (store_dir && run_id &&
      snprintf(index_path, sizeof index_path, "%s/%s", store_dir, ST_INDEX_FILE) < (int)sizeof index_path &&
      stat(index_path, &sb) == 0) {
    st_index *ix = NULL;
    int found = 0;
    st_status st = st_index_open(store_dir, ST_INDEX_READ_ONLY, &ix);
    if (!st) st = st_index_run_digest(ix, run_id, expected, sizeof expected, &found);
    st_index_close(ix);
    if (st) return st;
  }
  st_status st = st_trace_verify_digest(t, expected, NULL, digest);
  if (st) st_fail_context(st, "replay refused: ");
  return st;
}

st_status st_replay_run(const st_replay_request *req, st_replay_report **out) {
  *out = NULL;
  double t0 = now();
  st_status rc;
  st_trace *t = NULL;
  cell_spec *specs = NULL;
  int n_cells = 0;
  st_config cfg;
  st_backend be = {0};
  st_replay_report *rep = calloc(1, sizeof *rep);
  if (!rep) return st_fail(ST_ENOMEM, "replay report");
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", req->model_dir);
  if ((rc = st_config_load(config_path, &cfg))) goto out;
  if ((rc = st_trace_open(req->trace_path, 0, &t))) goto out;
  if ((rc = check_content(t, req->store_dir, rep->content_digest))) goto out;
  const char *backend_name = req->backend ? req->backend : st_trace_attr(t, "backend");
  /* an imported trace (sparsetrace import: backend "import:FORMAT") was computed by another
  ** engine: replay it on the reference backend */
  if (backend_name && !strncmp(backend_name, "import:", 7) && !req->backend) backend_name = "cpu-ref";
  if ((rc = st_backend_open(backend_name ? backend_name : "cpu-ref", &be))) goto out;
  snprintf(rep->backend, sizeof rep->backend, "%s", be.ops->name);
  if (req->layer < 0 || req->layer >= cfg.num_hidden_layers) {
    rc = st_fail(ST_EINVAL, "--layer %d: the model has layers 0..%d", req->layer, cfg.num_hidden_layers - 1);
    goto out;
  }
  const char *settings_attr = st_trace_attr(t, "settings");
  st_settings recorded, base;
  if ((rc = st_settings_from_json(settings_attr ? settings_attr : "{}", &recorded))) goto out;
  st_settings_resolve(&recorded, &cfg);
  int overridden = 0, any_override = 0;
  st_settings layer_recorded = recorded;
  if ((rc = recorded_layer_override(settings_attr ? settings_attr : "{}", req->layer, &layer_recorded,
                                    &overridden, &any_override)))
    goto out;
  if (any_override && req->stage != ST_REPLAY_INDEXER && !(overridden && req->stage != ST_REPLAY_REST)) {
    rc = st_fail(ST_EUNSUPPORTED, "%s was recorded with per-layer settings (--layer-set); replaying it "
                 "needs --stage indexer, or --stage attention|layer on an overridden layer",
                 req->trace_path);
    goto out;
  }
  if (overridden) {
    st_settings_resolve(&layer_recorded, &cfg);
    recorded = layer_recorded; /* what layer N actually ran with */
  }
  base = recorded;
  for (int i = 0; i < req->n_sets; i++)
    if ((rc = st_settings_set(&base, req->sets[i]))) goto out;
  if (base.precision != recorded.precision) {
    rc = st_fail(ST_EINVAL, "precision is a setting of the whole run; replay keeps the recorded one (%s)",
                 recorded.precision == ST_PRECISION_EXACT ? "exact" : "reference");
    goto out;
  }
  if ((rc = build_cells(req, &base, &specs, &n_cells))) goto out;
  rep->cells = calloc((size_t)n_cells, sizeof *rep->cells);
  if (!rep->cells) { rc = st_fail(ST_ENOMEM, "replay cells"); goto out; }
  rep->n_cells = n_cells;
  rep->layer = req->layer;
  rep->stage = req->stage;
  rep->n_prompt = st_trace_n_prompt(t);
  rep->needle_start = req->needle_start;
  rep->needle_end = req->needle_end;
  const char *run_id = st_trace_attr(t, "run_id");
  snprintf(rep->run_id, sizeof rep->run_id, "%s", run_id ? run_id : "");
  st_settings_json(&recorded, rep->recorded_settings, sizeof rep->recorded_settings);
  for (int c = 0; c < n_cells; c++) {
    st_settings_resolve(&specs[c].settings, &cfg);
    snprintf(rep->cells[c].label, sizeof rep->cells[c].label, "%s", specs[c].label);
    st_settings_json(&specs[c].settings, rep->cells[c].settings_json, sizeof rep->cells[c].settings_json);
    rep->cells[c].same_as_recorded = same_settings(&specs[c].settings, &recorded);
    rep->cells[c].continuation_has_needle = -1;
  }
  int csa = cfg.layer_kind[req->layer] == ST_LAYER_CSA;
  if (req->stage == ST_REPLAY_INDEXER) {
    if (!csa) {
      rc = st_fail(ST_EINVAL, "layer %d is not a CSA layer: it has no indexer to replay", req->layer);
      goto out;
    }
    indexer_inputs in = {.trace = t, .heads = cfg.index_n_heads, .dim = cfg.index_head_dim,
                         .ratio = cfg.compress_ratio[req->layer]};
    if ((rc = need_tap(t, req->trace_path, ST_TAP_INDEXER_Q, req->layer, &in.q)) ||
        (rc = need_tap(t, req->trace_path, ST_TAP_INDEXER_K, req->layer, &in.k)) ||
        (rc = need_tap(t, req->trace_path, ST_TAP_INDEXER_WEIGHTS, req->layer, &in.w)))
      goto out;
    in.scores = st_trace_find_tap_id(t, ST_TAP_INDEXER_SCORES, req->layer);
    in.topk = st_trace_find_tap_id(t, ST_TAP_INDEXER_TOPK, req->layer);
    in.q_used = st_trace_find_tap_id(t, ST_TAP_INDEXER_Q_USED, req->layer);
    in.k_used = st_trace_find_tap_id(t, ST_TAP_INDEXER_K_USED, req->layer);
    const st_trace_tap *optional[4] = {in.scores, in.topk, in.q_used, in.k_used};
    for (int i = 0; i < 4; i++)
      if (optional[i] && (rc = st_trace_check_tap(t, optional[i]))) goto out;
    in.n = in.q->shape[0];
    in.rows = in.k->shape[0];
    if (in.q->shape[1] != in.heads || in.q->shape[2] != in.dim || in.k->shape[1] != in.dim) {
      rc = st_fail(ST_EFORMAT, "%s: indexer taps of layer %d do not match %s (heads %d, dim %d)",
                   req->trace_path, req->layer, config_path, in.heads, in.dim);
      goto out;
    }
    if (in.n == 0) { /* issue 14 #9: nothing replayed is no pass */
      rc = st_fail(ST_EFORMAT, "%s: %s of layer %d holds 0 positions: nothing to replay (a replay "
                   "of no position proves nothing)", req->trace_path, in.q->name, req->layer);
      goto out;
    }
    if ((rc = read_positions(t, in.q, in.n, &in.positions))) goto out;
    rep->n_positions = in.n;
    rep->n_rows = in.rows;
    if (req->needle_end > req->needle_start)
      rep->n_needle_rows = st_replay_needle_rows(in.ratio, in.rows, req->needle_start, req->needle_end,
                                       rep->needle_rows, 64);
    rc = replay_indexer(&be, req, &cfg, &recorded, specs, n_cells, &in, rep);
    free(in.positions);
  } else {
    if (req->needle_end > req->needle_start && csa) {
      const st_trace_tap *input = st_trace_find_tap_id(t, ST_TAP_INPUT, req->layer);
      int64_t T = input ? input->shape[0] : 0;
      rep->n_needle_rows = st_replay_needle_rows(cfg.compress_ratio[req->layer], T / cfg.compress_ratio[req->layer],
                                       req->needle_start, req->needle_end, rep->needle_rows, 64);
    }
    const st_trace_tap *input0 = NULL;
    if ((rc = need_tap(t, req->trace_path, ST_TAP_INPUT, req->layer, &input0))) goto out;
    if (input0->shape[0] == 0) { /* issue 14 #9: nothing replayed is no pass */
      rc = st_fail(ST_EFORMAT, "%s: %s holds 0 positions: nothing to replay (a replay of no "
                   "position proves nothing)", req->trace_path, input0->name);
      goto out;
    }
    rc = replay_model(&be, req, t, &recorded, specs, n_cells, rep);
    const st_trace_tap *input = st_trace_find_tap_id(t, ST_TAP_INPUT, req->layer);
    rep->n_positions = input ? input->shape[0] : 0;
  }
out:
  free(specs);
  st_trace_close(t);
  st_backend_close(&be);
  rep->seconds = now() - t0;
  if (rc) {
    st_replay_report_free(rep);
    return rc;
  }
  *out = rep;
  return ST_OK;
}

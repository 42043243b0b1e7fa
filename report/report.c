/*
** report.c — the sections of `sparsetrace report` (report.h): which store rows and trace rows
** each figure draws, and through which library function (the one the text command prints with).
**
** Targets are resolved first (all of them, so a bad target fails before anything is drawn), then
** the page is written in target order: the runs, their comparison when there are two, the
** sweeps, the bisect. Nothing here writes to the store: the index is opened read-only.
*/
#include "report.h"
#include "common/build_info.h"
#include "needle/scoreboard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/config.h"
#include "engine/text/tokenizer.h"
#include "recorder/index.h"
#include "recorder/trace_reader.h"
#include "replayer/bisect.h"
#include "replayer/diff.h"
#include "replayer/needle.h"
#include "replayer/replay.h"
#include "report/html.h"

#define REPORT_MAX_TARGETS 16

/* One run target, resolved. */
typedef struct report_run {
  char target[512];
  char run_id[64];
  char trace_path[4096];
  int indexed;                   /* 1: the run has a row in the index */
  st_trace *trace;
  int64_t n_prompt, n_tokens;
  st_config *config;             /* from the trace's config attribute; NULL when it has none */
  char model_dir[4096];          /* "" when unknown */
  /* the needle: the index's latest needle of the run, else the trace's needle_start/end */
  int has_needle;
  int64_t needle_id;             /* -1: not from the index */
  int64_t needle_start, needle_end;
  char needle_text[1024];
  /* the run's own needle verdicts (replay_id NULL), ordered by layer then position */
  st_needle_verdict *verdicts;
  int *verdict_layer;
  int64_t n_verdicts;
} report_run;

typedef struct report_sweep {
  char sweep_id[64];
} report_sweep;

typedef struct report_ctx {
  const st_report_options *o;
  st_index *ix;                  /* NULL when the store has no index */
  sqlite3 *db;
  st_buf *out;
  report_run runs[REPORT_MAX_TARGETS];
  int n_runs;
  report_sweep sweeps[64];
  int n_sweeps;
  st_scoreboard boards[8];       /* scoreboard:NAME targets, as st_scoreboard_read gives them */
  int n_boards;
  st_tokenizer *tok;             /* the first run's model's tokenizer, NULL when none */
} report_ctx;

/* ---------------------------------------------------------------- helpers */

static const char *column_text(sqlite3_stmt *st, int i) {
  const unsigned char *s = sqlite3_column_text(st, i);
  return s ? (const char *)s : NULL;
}

static st_status sql_prepare(report_ctx *c, const char *sql, sqlite3_stmt **st) {
  if (sqlite3_prepare_v2(c->db, sql, -1, st, NULL) != SQLITE_OK)
    return st_fail(ST_ESQLITE, "%s: %s", st_index_path(c->ix), sqlite3_errmsg(c->db));
  return ST_OK;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Decoded text of ids (the run's answer, a token's text); NULL without a tokenizer. */
static char *decode(report_ctx *c, const int32_t *ids, size_t n) {
  char *text = NULL;
  size_t len = 0;
  if (!c->tok || !n) return NULL;
  if (st_tokenizer_decode(c->tok, ids, n, 0, &text, &len)) {
    st_clear_error();
    return NULL;
  }
  return text;
}

/* ---------------------------------------------------------------- resolving targets */

/* The run of `target` (a run id, a prefix of one, or a trace path) into r. */
static st_status resolve_run(report_ctx *c, const char *target, report_run *r) {
  st_status rc = ST_OK;
  snprintf(r->target, sizeof r->target, "%s", target);
  r->needle_id = -1;
  struct stat sb;
  int is_path = ends_with(target, ".h5") || strchr(target, '/') || stat(target, &sb) == 0;
  if (is_path) {
    snprintf(r->trace_path, sizeof r->trace_path, "%s", target);
    char key[4096];
    int found = 0;
    if (c->ix && !st_index_trace_key(c->o->store_dir, target, key, sizeof key)) {
      char created[64];
      if ((rc = st_index_find_trace(c->ix, key, r->run_id, sizeof r->run_id, created, sizeof created, &found)))
        return rc;
    }
    st_clear_error();
    r->indexed = found;
  } else {
    if (!c->ix) return st_fail(ST_ENOTFOUND, "report target '%s': no index in %s to look the run up in",
                               target, c->o->store_dir);
    sqlite3_stmt *st = NULL;
    if ((rc = sql_prepare(c, "SELECT run_id, trace_path FROM runs WHERE substr(run_id, 1, length(?1)) = ?1 "
                             "ORDER BY run_id = ?1 DESC LIMIT 2", &st)))
      return rc;
    sqlite3_bind_text(st, 1, target, -1, SQLITE_TRANSIENT);
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
      if (n++ == 0) {
        snprintf(r->run_id, sizeof r->run_id, "%s", column_text(st, 0));
        if (st_index_resolve_trace(c->o->store_dir, column_text(st, 1), r->trace_path, sizeof r->trace_path) < 0)
          rc = st_fail(ST_EINVAL, "run %s: its trace path does not fit", r->run_id);
      } else if (strcmp(r->run_id, target)) {
        rc = st_fail(ST_EINVAL, "report target '%s': more than one run id starts so (give more of it)", target);
      }
    }
    sqlite3_finalize(st);
    if (rc) return rc;
    if (!n)
      return st_fail(ST_ENOTFOUND, "report target '%s': no run with that id in %s/index.sqlite (and no such file)",
                     target, c->o->store_dir);
    r->indexed = 1;
  }
  if ((rc = st_trace_open(r->trace_path, 0, &r->trace)))
    return st_fail_context(rc, "report target '%s': ", target);
  int64_t n_tokens = 0;
  st_trace_tokens(r->trace, &n_tokens);
  r->n_tokens = n_tokens;
  r->n_prompt = st_trace_n_prompt(r->trace);
  if (!r->run_id[0]) snprintf(r->run_id, sizeof r->run_id, "%s", st_trace_attr(r->trace, "run_id") ? st_trace_attr(r->trace, "run_id") : "");
  const char *config = st_trace_attr(r->trace, "config");
  if (config && (r->config = malloc(sizeof *r->config)) &&
      st_config_parse(config, r->trace_path, r->config) != ST_OK) {
    free(r->config);
    r->config = NULL;
    st_clear_error();
  }
  const char *model_dir = c->o->model_dir ? c->o->model_dir : st_trace_attr(r->trace, "model_dir");
  snprintf(r->model_dir, sizeof r->model_dir, "%s", model_dir ? model_dir : "");
  return ST_OK;
}

/* The run's needle and its recorded verdicts from the index (the trace's span when the index has
** none: verdicts then stay empty). */
static st_status load_needle(report_ctx *c, report_run *r) {
  st_status rc = ST_OK;
  if (c->ix && r->indexed) {
    sqlite3_stmt *st = NULL;
    if ((rc = sql_prepare(c, "SELECT needle_id, token_start, token_end, text FROM needles WHERE run_id = ? "
                             "ORDER BY needle_id DESC LIMIT 1", &st)))
      return rc;
    sqlite3_bind_text(st, 1, r->run_id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
      r->has_needle = 1;
      r->needle_id = sqlite3_column_int64(st, 0);
      r->needle_start = sqlite3_column_int64(st, 1);
      r->needle_end = sqlite3_column_int64(st, 2);
      snprintf(r->needle_text, sizeof r->needle_text, "%s", column_text(st, 3) ? column_text(st, 3) : "");
    }
    sqlite3_finalize(st);
  }
  if (!r->has_needle) {
    int64_t a = st_trace_attr_int(r->trace, "needle_start", -1), b = st_trace_attr_int(r->trace, "needle_end", -1);
    if (a >= 0 && b > a) r->has_needle = 1, r->needle_start = a, r->needle_end = b;
  }
  if (r->needle_id < 0) return ST_OK;
  sqlite3_stmt *st = NULL;
  if ((rc = sql_prepare(c, "SELECT layer, position, best_rank, best_row, score, in_topk, topk, n_visible "
                           "FROM needle_verdicts WHERE needle_id = ? AND replay_id IS NULL ORDER BY layer, position",
                        &st)))
    return rc;
  sqlite3_bind_int64(st, 1, r->needle_id);
  int64_t cap = 0;
  while ((rc == ST_OK) && sqlite3_step(st) == SQLITE_ROW) {
    if (r->n_verdicts == cap) {
      cap = cap ? cap * 2 : 256;
      st_needle_verdict *v = realloc(r->verdicts, sizeof *v * (size_t)cap);
      int *l = v ? realloc(r->verdict_layer, sizeof *l * (size_t)cap) : NULL;
      if (v) r->verdicts = v;
      if (l) r->verdict_layer = l;
      if (!v || !l) { rc = st_fail(ST_ENOMEM, "needle verdicts of run %s", r->run_id); break; }
    }
    st_needle_verdict *v = &r->verdicts[r->n_verdicts];
    r->verdict_layer[r->n_verdicts++] = sqlite3_column_int(st, 0);
    v->position = sqlite3_column_int64(st, 1);
    v->best_rank = sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 2);
    v->best_row = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 3);
    v->score = (float)sqlite3_column_double(st, 4);
    v->in_topk = sqlite3_column_int(st, 5);
    v->topk = sqlite3_column_int(st, 6);
    v->n_visible = sqlite3_column_int64(st, 7);
  }
  sqlite3_finalize(st);
  return rc;
}

static st_status resolve_sweeps(report_ctx *c, const char *target) {
  const char *id = target + strlen("sweep:");
  if (!c->ix) return st_fail(ST_ENOTFOUND, "report target '%s': no index in %s", target, c->o->store_dir);
  sqlite3_stmt *st = NULL;
  st_status rc = sql_prepare(c, !strcmp(id, "all")
      ? "SELECT sweep_id FROM needle_attempts GROUP BY sweep_id ORDER BY min(created_at)"
      : "SELECT sweep_id FROM needle_attempts WHERE substr(sweep_id, 1, length(?1)) = ?1 "
        "GROUP BY sweep_id ORDER BY min(created_at)", &st);
  if (rc) return rc;
  if (strcmp(id, "all")) sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  int n = 0;
  while (sqlite3_step(st) == SQLITE_ROW && c->n_sweeps < 64) {
    snprintf(c->sweeps[c->n_sweeps++].sweep_id, sizeof c->sweeps[0].sweep_id, "%s", column_text(st, 0));
    n++;
  }
  sqlite3_finalize(st);
  if (!n) return st_fail(ST_ENOTFOUND, "report target '%s': no needle sweep %s in %s/index.sqlite", target,
                         strcmp(id, "all") ? "with that id" : "at all", c->o->store_dir);
  if (n > 1 && strcmp(id, "all")) return st_fail(ST_EINVAL, "report target '%s': more than one sweep id starts so", target);
  return ST_OK;
}

/* scoreboard:NAME or scoreboard:NAME@VERSION (default: the highest stored version). */
static st_status resolve_scoreboard(report_ctx *c, const char *target) {
  const char *spec = target + strlen("scoreboard:");
  if (!c->ix) return st_fail(ST_ENOTFOUND, "report target '%s': no index in %s", target, c->o->store_dir);
  if (c->n_boards == (int)(sizeof c->boards / sizeof c->boards[0]))
    return st_fail(ST_EINVAL, "report target '%s': at most %d scoreboards per page", target,
                   (int)(sizeof c->boards / sizeof c->boards[0]));
  char name[64];
  int version = 0;
  const char *at = strchr(spec, '@');
  size_t len = at ? (size_t)(at - spec) : strlen(spec);
  if (!len || len >= sizeof name)
    return st_fail(ST_EINVAL, "report target '%s': expected scoreboard:NAME or scoreboard:NAME@VERSION", target);
  memcpy(name, spec, len);
  name[len] = 0;
  if (at) {
    char *end;
    long v = strtol(at + 1, &end, 10);
    if (*end || v < 1 || v > 1000000)
      return st_fail(ST_EINVAL, "report target '%s': the version after @ must be a positive number", target);
    version = (int)v;
  }
  st_status rc = st_scoreboard_read(c->ix, name, version, &c->boards[c->n_boards]);
  if (rc == ST_ENOTFOUND)
    return st_fail(ST_ENOTFOUND, "report target '%s': no scoreboard of corpus %s%s in %s/index.sqlite", target,
                   name, at ? at : "", c->o->store_dir);
  if (rc) return rc;
  c->n_boards++;
  return ST_OK;
}

/* ---------------------------------------------------------------- run: identity */

static void section_identity(report_ctx *c, report_run *r, int index) {
  st_buf *b = c->out;
  char id[32];
  st_buf title = {0}; /* a trace path may be as long as the system allows: never cut */
  snprintf(id, sizeof id, "run-%d", index);
  st_buf_printf(&title, "Run %s", r->run_id[0] ? r->run_id : r->trace_path);
  st_html_section_begin(b, id, title.data ? title.data : "Run");
  st_buf_free(&title);
  const char *revision = st_trace_attr(r->trace, "build_revision"), *compiler = st_trace_attr(r->trace, "compiler"),
             *build_type = st_trace_attr(r->trace, "build_type");
  char build[512], tokens[128], needle[1400] = "", threads[32] = "";
  snprintf(build, sizeof build, "%s (%s, %s)", revision ? revision : "?", compiler ? compiler : "?",
           build_type ? build_type : "?");
  snprintf(tokens, sizeof tokens, "%lld prompt + %lld generated", (long long)r->n_prompt,
           (long long)(r->n_tokens - r->n_prompt));
  if (r->has_needle)
    snprintf(needle, sizeof needle, "tokens %lld:%lld%s%s%s", (long long)r->needle_start, (long long)r->needle_end,
             r->needle_text[0] ? " \"" : "", r->needle_text, r->needle_text[0] ? "\"" : "");
  int64_t th = st_trace_attr_int(r->trace, "threads", -1);
  if (th > 0) snprintf(threads, sizeof threads, "%lld", (long long)th);
  char backend[128];
  const char *be = st_trace_attr(r->trace, "backend"), *km = st_trace_attr(r->trace, "kernel_mode");
  snprintf(backend, sizeof backend, "%s (%s)", be ? be : "?", km ? km : "?");
  int64_t n_tokens = 0;
  const int32_t *ids = st_trace_tokens(r->trace, &n_tokens);
  char *answer = ids && n_tokens > r->n_prompt ? decode(c, ids + r->n_prompt, (size_t)(n_tokens - r->n_prompt)) : NULL;
  const char *request_id = st_trace_attr(r->trace, "request_id");
  char request[2048] = "";
  if (request_id && request_id[0]) {
    snprintf(request, sizeof request, "%s (not in this store's requests)", request_id);
    sqlite3_stmt *st = NULL;
    if (c->ix && !sql_prepare(c, "SELECT received_at, method, endpoint, api, model, state, status FROM requests "
                                 "WHERE id = ?", &st)) {
      sqlite3_bind_text(st, 1, request_id, -1, SQLITE_TRANSIENT);
      if (sqlite3_step(st) == SQLITE_ROW)
        snprintf(request, sizeof request, "%s: %s %s (%s, model %s), %s, HTTP %s, received %s", request_id,
                 column_text(st, 1), column_text(st, 2), column_text(st, 3),
                 column_text(st, 4) ? column_text(st, 4) : "-", column_text(st, 5),
                 column_text(st, 6) ? column_text(st, 6) : "-", column_text(st, 0));
      sqlite3_finalize(st);
    }
    st_clear_error();
  }
  const char *keys[] = {"run id", "trace", "indexed", "model", "model dir", "created", "settings", "build",
                        "backend", "threads", "positions", "tokens", "needle", "command", "request", "answer"};
  const char *values[] = {r->run_id, r->trace_path, r->indexed ? "yes" : "no (not in this store's index)",
                          st_trace_attr(r->trace, "model"), r->model_dir[0] ? r->model_dir : NULL,
                          st_trace_attr(r->trace, "created_at"), st_trace_attr(r->trace, "settings"), build,
                          backend, threads[0] ? threads : NULL, st_trace_attr(r->trace, "positions"), tokens,
                          needle[0] ? needle : "none marked", st_trace_attr(r->trace, "command_line"),
                          request[0] ? request : "none linked", answer ? answer : NULL};
  snprintf(id, sizeof id, "identity-%d", index);
  st_html_key_values(b, id, keys, values, (int)(sizeof keys / sizeof keys[0]));
  free(answer);
}

/* ---------------------------------------------------------------- run: needle verdicts */

/* The distinct layers and positions of r's verdicts (ascending). Caller frees both. */
static st_status verdict_axes(report_run *r, int **layers, int *n_layers, int64_t **positions, int *n_positions) {
  *layers = malloc(sizeof **layers * (size_t)(r->n_verdicts + 1));
  *positions = malloc(sizeof **positions * (size_t)(r->n_verdicts + 1));
  *n_layers = *n_positions = 0;
  if (!*layers || !*positions) return st_fail(ST_ENOMEM, "heat map axes");
  for (int64_t i = 0; i < r->n_verdicts; i++) {
    if (!*n_layers || (*layers)[*n_layers - 1] != r->verdict_layer[i]) (*layers)[(*n_layers)++] = r->verdict_layer[i];
    int64_t p = r->verdicts[i].position;
    int lo = 0, hi = *n_positions;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if ((*positions)[mid] < p) lo = mid + 1; else hi = mid;
    }
    if (lo < *n_positions && (*positions)[lo] == p) continue;
    memmove(*positions + lo + 1, *positions + lo, sizeof **positions * (size_t)(*n_positions - lo));
    (*positions)[lo] = p;
    (*n_positions)++;
  }
  return ST_OK;
}

/* The heat map of r's verdicts: the needle's best rank per layer x position, top-k as the line. */
static st_status draw_rank_heatmap(report_ctx *c, report_run *r, const char *id, const char *title) {
  int *layers = NULL, n_layers = 0, n_positions = 0;
  int64_t *positions = NULL, *layer_keys = NULL;
  double *values = NULL;
  char **row_names = NULL, **col_notes = NULL;
  st_status rc = verdict_axes(r, &layers, &n_layers, &positions, &n_positions);
  if (!rc) {
    values = malloc(sizeof *values * (size_t)(n_layers * n_positions + 1));
    layer_keys = malloc(sizeof *layer_keys * (size_t)(n_layers + 1));
    row_names = calloc((size_t)n_layers + 1, sizeof *row_names);
    col_notes = calloc((size_t)n_positions + 1, sizeof *col_notes);
    if (!values || !layer_keys || !row_names || !col_notes) rc = st_fail(ST_ENOMEM, "heat map");
  }
  int topk = 0;
  if (!rc) {
    for (int i = 0; i < n_layers * n_positions; i++) values[i] = -1;
    int li = -1;
    for (int64_t i = 0; i < r->n_verdicts; i++) {
      while (li < 0 || layers[li] != r->verdict_layer[i]) li++;
      int lo = 0, hi = n_positions;
      while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (positions[mid] < r->verdicts[i].position) lo = mid + 1; else hi = mid;
      }
      values[(size_t)li * n_positions + lo] = (double)r->verdicts[i].best_rank;
      if (!topk) topk = r->verdicts[i].topk;
    }
    for (int l = 0; l < n_layers; l++) {
      layer_keys[l] = layers[l];
      row_names[l] = malloc(32);
      if (row_names[l]) snprintf(row_names[l], 32, "layer %d", layers[l]);
    }
    int64_t n_tokens = 0;
    const int32_t *ids = st_trace_tokens(r->trace, &n_tokens);
    int64_t answer_first, answer_end;
    st_needle_answer_positions(r->n_prompt, r->needle_start, r->needle_end, &answer_first, &answer_end);
    for (int p = 0; p < n_positions && ids; p++) {
      int64_t pos = positions[p];
      char *tok = pos < n_tokens ? decode(c, ids + pos, 1) : NULL;
      st_buf note = {0};
      st_buf_printf(&note, "%s", pos >= answer_first && pos < answer_end ? "answer position, " : "");
      st_buf_printf(&note, "token %d", pos < n_tokens ? ids[pos] : -1);
      if (tok) st_buf_printf(&note, " \"%s\"", tok);
      free(tok);
      col_notes[p] = st_buf_take(&note, NULL);
    }
    char line_name[32];
    st_html_heatmap h = {.id = id, .title = title, .row_axis = "layer", .col_axis = "query position",
                         .n_rows = n_layers, .n_cols = n_positions, .row_names = (const char *const *)row_names,
                         .row_keys = layer_keys, .col_keys = positions, .values = values,
                         .line = topk > 0 && topk != INT32_MAX ? topk : 0,
                         .line_name = st_needle_topk_name(topk, line_name, sizeof line_name), .value_name = "rank",
                         .col_notes = (const char *const *)col_notes};
    st_html_heatmap_svg(c->out, &h);
  }
  for (int l = 0; row_names && l < n_layers; l++) free(row_names[l]);
  for (int p = 0; col_notes && p < n_positions; p++) free(col_notes[p]);
  free(row_names); free(col_notes); free(values); free(layer_keys); free(layers); free(positions);
  return rc;
}

/* The verdict table: one st_needle_judge per layer over the run's verdicts. */
static void verdict_table(report_ctx *c, report_run *r, const char *id) {
  const char *headers[] = {"layer", "retrieves", "kept", "answer positions", "rank best", "rank worst", "top-k"};
  st_html_table_begin(c->out, id, headers, 7);
  for (int64_t i = 0; i < r->n_verdicts;) {
    int64_t j = i;
    while (j < r->n_verdicts && r->verdict_layer[j] == r->verdict_layer[i]) j++;
    st_needle_judgement jd = st_needle_judge(r->verdicts + i, j - i, r->n_prompt, r->needle_start, r->needle_end);
    char layer[16], kept[32], answer[48], best[32], worst[32], k[32];
    snprintf(layer, sizeof layer, "%d", r->verdict_layer[i]);
    snprintf(kept, sizeof kept, "%d of %d", jd.kept, jd.positions);
    snprintf(answer, sizeof answer, "%lld-%lld", (long long)jd.answer_first, (long long)jd.answer_end - 1);
    snprintf(best, sizeof best, "%lld", (long long)jd.best_rank);
    snprintf(worst, sizeof worst, "%lld", (long long)jd.worst_rank);
    const char *cells[] = {layer, st_needle_retrieves_word(&jd), kept, answer, best, worst,
                           jd.positions ? st_needle_topk_name(jd.topk, k, sizeof k) : NULL};
    st_html_table_row(c->out, cells, 7);
    i = j;
  }
  st_html_table_end(c->out);
}

static st_status section_verdicts(report_ctx *c, report_run *r, int index) {
  st_buf *b = c->out;
  char id[48];
  st_buf_str(b, "<h3>Needle verdicts</h3>\n");
  if (!r->n_verdicts) {
    st_html_paragraph(b, "note", r->has_needle
        ? "The index holds no needle verdicts for this run (record with run --needle, or replay --needle)."
        : "No needle marked for this run: nothing to judge (run --needle TEXT marks one).");
    return ST_OK;
  }
  st_html_paragraph(b, "note", "A layer keeps the needle at a position when the best rank of a compressed row "
                               "covering it is inside the top-k; it retrieves the needle when it keeps it at most "
                               "of the answer positions (schemas/needle-verdicts.md).");
  snprintf(id, sizeof id, "verdicts-%d", index);
  verdict_table(c, r, id);
  snprintf(id, sizeof id, "rank-%d", index);
  return draw_rank_heatmap(c, r, id, "needle rank per layer and query position");
}

/* ---------------------------------------------------------------- run: score histograms */

static st_status section_scores(report_ctx *c, report_run *r, int index) {
  st_buf *b = c->out;
  int64_t position = c->o->position >= 0 ? c->o->position : r->n_prompt - 1;
  int drawn = 0;
  st_status rc = ST_OK;
  float *scores = NULL;
  int32_t *topk = NULL;
  for (int layer = 0; r->config && layer < r->config->num_hidden_layers && !rc; layer++) {
    if (r->config->layer_kind[layer] != ST_LAYER_CSA) continue;
    char name[96];
    snprintf(name, sizeof name, "layers.%d.indexer.scores", layer);
    const st_trace_tap *ts = st_trace_find_tap(r->trace, name);
    snprintf(name, sizeof name, "layers.%d.indexer.topk", layer);
    const st_trace_tap *tk = st_trace_find_tap(r->trace, name);
    int64_t row = -1, row_k = -1;
    if (!ts || st_trace_find_position(r->trace, ts, position, &row)) { st_clear_error(); continue; }
    if (tk && st_trace_find_position(r->trace, tk, position, &row_k)) { st_clear_error(); row_k = -1; }
    if (!drawn++) {
      char text[256];
      snprintf(text, sizeof text, "Indexer scores at query position %lld", (long long)position);
      st_buf_str(b, "<h3>");
      st_html_text(b, text);
      st_buf_str(b, "</h3>\n<div class=\"pair\">\n");
    }
    size_t width = st_trace_row_elements(ts), kw = tk ? st_trace_row_elements(tk) : 0;
    float *s = realloc(scores, sizeof *s * (width + 1));
    if (!s) { rc = st_fail(ST_ENOMEM, "scores row"); break; }
    scores = s;
    if ((rc = st_trace_read_f32(r->trace, ts, row, 1, scores))) break;
    double line = NAN;
    if (row_k >= 0 && kw) {
      int32_t *k = realloc(topk, sizeof *k * (kw + 1));
      if (!k) { rc = st_fail(ST_ENOMEM, "top-k row"); break; }
      topk = k;
      if ((rc = st_trace_read_i32(r->trace, tk, row_k, 1, topk))) break;
      for (size_t i = 0; i < kw; i++) /* the k-th best: the lowest score the indexer selected */
        if (topk[i] >= 0 && (size_t)topk[i] < width && isfinite(scores[topk[i]]) &&
            (isnan(line) || scores[topk[i]] < line))
          line = scores[topk[i]];
    }
    int32_t needle_rows[64];
    int n_needle = r->has_needle && r->config->compress_ratio[layer] > 0
        ? st_replay_needle_rows(r->config->compress_ratio[layer], (int64_t)width, r->needle_start, r->needle_end,
                                needle_rows, 64)
        : 0;
    double marks[64];
    char mark_text[64][32];
    const char *mark_names[64];
    for (int i = 0; i < n_needle; i++) {
      marks[i] = scores[needle_rows[i]];
      snprintf(mark_text[i], sizeof mark_text[i], "row %d", needle_rows[i]);
      mark_names[i] = mark_text[i];
    }
    char id[48], title[128], line_name[64];
    snprintf(id, sizeof id, "scores-%d-layer-%d", index, layer);
    snprintf(title, sizeof title, "layer %d (%d needle row%s)", layer, n_needle, n_needle == 1 ? "" : "s");
    snprintf(line_name, sizeof line_name, "lowest score in the top-%zu", kw);
    st_html_histogram h = {.id = id, .title = title, .value_axis = "index score", .values = scores,
                           .n = (int64_t)width, .n_bins = 40, .marks = marks, .mark_names = mark_names,
                           .n_marks = n_needle, .line = line, .line_name = line_name};
    st_buf_str(b, "<div>");
    st_html_histogram_svg(b, &h);
    st_buf_str(b, "</div>\n");
  }
  if (drawn) st_buf_str(b, "</div>\n");
  free(scores);
  free(topk);
  return rc;
}

/* ---------------------------------------------------------------- run: stored replays */

static st_status section_replays(report_ctx *c, report_run *r, int index) {
  if (!c->ix || !r->indexed) return ST_OK;
  sqlite3_stmt *st = NULL, *vs = NULL;
  st_status rc = sql_prepare(c, "SELECT replay_id, layer, stage, json_extract(metrics, '$.label'), bit_exact, "
                                "json_extract(metrics, '$.topk_jaccard_mean'), "
                                "json_extract(metrics, '$.score_difference'), created_at "
                                "FROM replays WHERE run_id = ? ORDER BY created_at, rowid", &st);
  if (!rc) rc = sql_prepare(c, "SELECT position, best_rank, best_row, score, in_topk, topk, n_visible "
                               "FROM needle_verdicts WHERE replay_id = ? ORDER BY position", &vs);
  if (rc) { sqlite3_finalize(st); return rc; }
  sqlite3_bind_text(st, 1, r->run_id, -1, SQLITE_TRANSIENT);
  int n = 0;
  char id[48];
  st_needle_verdict *v = NULL;
  int64_t v_cap = 0;
  /* the cells' verdict counts, drawn as bars after the table */
  double bar_values[256];
  int bar_flags[256], n_bars = 0;
  char bar_labels[256][96];
  while (!rc && sqlite3_step(st) == SQLITE_ROW) {
    if (!n++) {
      st_buf_str(c->out, "<h3>Replays stored for this run</h3>\n");
      const char *headers[] = {"layer", "stage", "cell", "bit exact", "retrieves", "kept", "needle rank",
                               "top-k Jaccard", "score diff", "replay"};
      snprintf(id, sizeof id, "replays-%d", index);
      st_html_table_begin(c->out, id, headers, 10);
    }
    int64_t nv = 0;
    sqlite3_reset(vs);
    sqlite3_bind_text(vs, 1, column_text(st, 0), -1, SQLITE_TRANSIENT);
    while (sqlite3_step(vs) == SQLITE_ROW) {
      if (nv == v_cap) {
        st_needle_verdict *grown = realloc(v, sizeof *v * (size_t)(v_cap = v_cap ? v_cap * 2 : 256));
        if (!grown) { rc = st_fail(ST_ENOMEM, "replay verdicts"); break; }
        v = grown;
      }
      st_needle_verdict *x = &v[nv++];
      x->position = sqlite3_column_int64(vs, 0);
      x->best_rank = sqlite3_column_type(vs, 1) == SQLITE_NULL ? -1 : sqlite3_column_int64(vs, 1);
      x->best_row = sqlite3_column_int(vs, 2);
      x->score = (float)sqlite3_column_double(vs, 3);
      x->in_topk = sqlite3_column_int(vs, 4);
      x->topk = sqlite3_column_int(vs, 5);
      x->n_visible = sqlite3_column_int64(vs, 6);
    }
    char layer[16], kept[32] = "-", rank[48] = "-", jac[32] = "-", diff[32] = "-";
    const char *retrieves = "-";
    snprintf(layer, sizeof layer, "%d", sqlite3_column_int(st, 1));
    if (nv && r->has_needle) {
      st_needle_judgement j = st_needle_judge(v, nv, r->n_prompt, r->needle_start, r->needle_end);
      retrieves = st_needle_retrieves_word(&j);
      if (j.positions) {
        snprintf(kept, sizeof kept, "%d of %d", j.kept, j.positions);
        snprintf(rank, sizeof rank, "%lld..%lld", (long long)j.best_rank, (long long)j.worst_rank);
        if (n_bars < 256) {
          snprintf(bar_labels[n_bars], sizeof bar_labels[n_bars], "layer %d %s", sqlite3_column_int(st, 1),
                   column_text(st, 3) ? column_text(st, 3) : "?");
          bar_values[n_bars] = j.kept;
          bar_flags[n_bars++] = j.retrieves != 1;
        }
      }
    }
    if (sqlite3_column_type(st, 5) != SQLITE_NULL) snprintf(jac, sizeof jac, "%.4f", sqlite3_column_double(st, 5));
    if (sqlite3_column_type(st, 6) != SQLITE_NULL) snprintf(diff, sizeof diff, "%.3g", sqlite3_column_double(st, 6));
    const char *exact = sqlite3_column_type(st, 4) == SQLITE_NULL ? "-" : sqlite3_column_int(st, 4) ? "yes" : "NO";
    char replay[16];
    snprintf(replay, sizeof replay, "%.8s", column_text(st, 0));
    const char *cells[] = {layer, column_text(st, 2), column_text(st, 3), exact, retrieves, kept, rank, jac, diff,
                           replay};
    st_html_table_row(c->out, cells, 10);
  }
  if (n) st_html_table_end(c->out);
  if (!rc && n_bars) {
    const char *names[256];
    for (int i = 0; i < n_bars; i++) names[i] = bar_labels[i];
    snprintf(id, sizeof id, "replay-kept-%d", index);
    st_html_bars h = {.id = id, .title = "answer positions where the replayed layer keeps the needle",
                      .value_axis = "positions kept (red: the layer does not retrieve the needle)", .n = n_bars,
                      .names = names, .values = bar_values, .flag = bar_flags,
                      .max = (double)(r->needle_end - r->needle_start)};
    st_html_bars_svg(c->out, &h);
  }
  free(v);
  sqlite3_finalize(st);
  sqlite3_finalize(vs);
  return rc;
}

/* ---------------------------------------------------------------- two runs: the diff */

static st_status section_compare(report_ctx *c, report_run *a, report_run *b) {
  st_buf *out = c->out;
  st_status rc = ST_OK;
  st_html_section_begin(out, "compare", "The two runs compared");
  if (a->n_verdicts || b->n_verdicts) {
    st_buf_str(out, "<div class=\"pair\"><div>\n");
    rc = draw_rank_heatmap(c, a, "rank-pair-0", a->run_id);
    st_buf_str(out, "</div><div>\n");
    if (!rc) rc = draw_rank_heatmap(c, b, "rank-pair-1", b->run_id);
    st_buf_str(out, "</div></div>\n");
  }
  st_diff_options opt = {.all = 1};
  st_diff_report rep = {0};
  if (!rc && (rc = st_diff_traces(a->trace, b->trace, &opt, &rep))) {
    st_html_section_end(out);
    return st_fail_context(rc, "diff of %s and %s: ", a->trace_path, b->trace_path);
  }
  char text[1024];
  const st_diff_tokens *tk = &rep.tokens;
  if (tk->first_difference >= 0)
    snprintf(text, sizeof text, "tokens differ from position %lld (%s): %d -> %d; positions from there on "
             "are not compared (they follow from different tokens)", (long long)tk->first_difference,
             tk->in_prompt ? "in the prompt" : "generated", tk->token_a, tk->token_b);
  else
    snprintf(text, sizeof text, "tokens identical (%lld)", (long long)tk->n_a);
  st_html_paragraph(out, "note", text);
  if (rep.first_divergence >= 0) {
    const st_diff_tap_result *t = &rep.taps[rep.first_divergence];
    snprintf(text, sizeof text, "first divergence: %s (layer %d): %s %.6g against %.6g, worst at position %lld",
             t->name, t->layer, t->metric, t->value, t->threshold, (long long)t->worst_position);
  } else {
    snprintf(text, sizeof text, rep.tokens_first ? "no compared tap diverges; the tokens do"
                                                 : "no tap diverges");
  }
  st_buf_str(out, "<p class=\"sentence\" id=\"first-divergence\"");
  if (rep.first_divergence >= 0) {
    st_buf_str(out, " data-tap=\"");
    st_html_text(out, rep.taps[rep.first_divergence].name);
    st_buf_str(out, "\"");
  }
  st_buf_str(out, ">");
  st_html_text(out, text);
  st_buf_str(out, "</p>\n");
  /* per-tap difference metric of the float taps, in forward order; top-k Jaccard per layer */
  const char **names = calloc((size_t)rep.n_taps + 1, sizeof *names);
  double *values = calloc((size_t)rep.n_taps + 1, sizeof *values);
  int *flags = calloc((size_t)rep.n_taps + 1, sizeof *flags);
  const char **jnames = calloc((size_t)rep.n_taps + 1, sizeof *jnames);
  char (*jlabels)[48] = calloc((size_t)rep.n_taps + 1, sizeof *jlabels);
  char (*jnotes)[96] = calloc((size_t)rep.n_taps + 1, sizeof *jnotes);
  const char **jnote_ptr = calloc((size_t)rep.n_taps + 1, sizeof *jnote_ptr);
  double *jvalues = calloc((size_t)rep.n_taps + 1, sizeof *jvalues);
  if (!names || !values || !flags || !jnames || !jlabels || !jnotes || !jnote_ptr || !jvalues)
    rc = st_fail(ST_ENOMEM, "diff figures");
  int nf = 0, nj = 0;
  for (int i = 0; !rc && i < rep.n_taps; i++) {
    const st_diff_tap_result *t = &rep.taps[i];
    int compared = st_diff_verdict_compared(t->verdict);
    if (compared && t->kind == ST_DIFF_KIND_FLOAT) {
      names[nf] = t->name;
      values[nf] = st_tensor_difference(&t->tensor);
      flags[nf++] = t->verdict == ST_DIFF_DIVERGES;
    }
    if (compared && t->kind == ST_DIFF_KIND_INDEX_SET && !strcmp(t->suffix, "indexer.topk")) {
      snprintf(jlabels[nj], sizeof jlabels[nj], "layer %d", t->layer);
      jnames[nj] = jlabels[nj];
      jvalues[nj] = st_index_set_mean_jaccard(&t->sets);
      snprintf(jnotes[nj], sizeof jnotes[nj], "mean over %lld positions; min %.4f at position %lld",
               (long long)t->sets.rows, t->sets.min_jaccard, (long long)t->worst_position);
      jnote_ptr[nj] = jnotes[nj];
      nj++;
    }
  }
  if (!rc && nj) {
    st_html_bars j = {.id = "topk-jaccard", .title = "top-k Jaccard per CSA layer (1 = the same rows selected)",
                      .value_axis = "mean Jaccard of the top-k sets", .n = nj, .names = jnames, .values = jvalues,
                      .notes = jnote_ptr, .max = 1};
    st_html_bars_svg(out, &j);
  }
  if (!rc && nf) {
    st_html_bars f = {.id = "tap-difference", .title = "difference per float tap, forward order",
                      .value_axis = "1 - 2 sum(xy) / (sum(x^2) + sum(y^2))", .n = nf, .names = names,
                      .values = values, .flag = flags, .log = 1};
    st_html_bars_svg(out, &f);
  }
  if (!rc) {
    const char *headers[] = {"tap", "verdict", "metric", "value", "threshold", "rows compared", "worst position"};
    st_html_table_begin(out, "diff-taps", headers, 7);
    for (int i = 0; i < rep.n_taps; i++) {
      const st_diff_tap_result *t = &rep.taps[i];
      char value[32] = "-", threshold[32] = "-", rows[32], worst[32] = "-";
      int compared = st_diff_verdict_compared(t->verdict);
      if (compared) {
        snprintf(value, sizeof value, "%.6g", t->value);
        snprintf(threshold, sizeof threshold, "%.6g", t->threshold);
      }
      snprintf(rows, sizeof rows, "%lld", (long long)t->rows_compared);
      if (t->worst_position >= 0) snprintf(worst, sizeof worst, "%lld", (long long)t->worst_position);
      const char *cells[] = {t->name, st_diff_verdict_name(t->verdict), compared ? t->metric : NULL, value,
                             threshold, rows, worst};
      st_html_table_row(out, cells, 7);
    }
    st_html_table_end(out);
  }
  free(names); free(values); free(flags); free(jnames); free(jlabels); free(jnotes); free(jnote_ptr); free(jvalues);
  st_diff_report_free(&rep);
  st_html_section_end(out);
  return rc;
}

/* ---------------------------------------------------------------- needle sweeps */

static st_status section_sweep(report_ctx *c, const report_sweep *s, int index) {
  st_buf *b = c->out;
  sqlite3_stmt *cells = NULL, *attempts = NULL, *head = NULL;
  st_status rc = sql_prepare(c, "SELECT tokens_requested, position, passed, attempts, errors FROM needle_sweep_cells "
                                "WHERE sweep_id = ? ORDER BY tokens_requested, position", &cells);
  if (!rc) rc = sql_prepare(c, "SELECT tokens_requested, position, seed, pass, expected, answer, error, tokens_actual, "
                               "run_id FROM needle_attempts WHERE sweep_id = ? ORDER BY tokens_requested, position, "
                               "seed, attempt_id", &attempts);
  if (!rc) rc = sql_prepare(c, "SELECT target, api, kind, settings, min(created_at), count(*), sum(pass) "
                               "FROM needle_attempts WHERE sweep_id = ?", &head);
  if (rc) goto out;
  sqlite3_bind_text(cells, 1, s->sweep_id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(attempts, 1, s->sweep_id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(head, 1, s->sweep_id, -1, SQLITE_TRANSIENT);
  char id[48], title[256];
  snprintf(id, sizeof id, "sweep-%d", index);
  snprintf(title, sizeof title, "Needle sweep %s", s->sweep_id);
  st_html_section_begin(b, id, title);
  if (sqlite3_step(head) == SQLITE_ROW) {
    char passed[64];
    snprintf(passed, sizeof passed, "%d of %d", sqlite3_column_int(head, 6), sqlite3_column_int(head, 5));
    const char *keys[] = {"target", "api", "kind", "settings", "started", "passed"};
    const char *values[] = {column_text(head, 0), column_text(head, 1), column_text(head, 2), column_text(head, 3),
                            column_text(head, 4), passed};
    snprintf(id, sizeof id, "sweep-identity-%d", index);
    st_html_key_values(b, id, keys, values, 6);
  }
  /* the grid's axes: distinct lengths (rows) and positions (columns) */
  int64_t lengths[64];
  double positions[64];
  int nl = 0, np = 0;
  while (sqlite3_step(cells) == SQLITE_ROW) {
    int64_t l = sqlite3_column_int64(cells, 0);
    double p = sqlite3_column_double(cells, 1);
    int seen = 0;
    for (int i = 0; i < nl; i++) seen |= lengths[i] == l;
    if (!seen && nl < 64) lengths[nl++] = l;
    seen = 0;
    for (int i = 0; i < np; i++) seen |= positions[i] == p;
    if (!seen && np < 64) {
      int at = np++;
      while (at > 0 && positions[at - 1] > p) positions[at] = positions[at - 1], at--;
      positions[at] = p;
    }
  }
  int n = nl * np;
  int *state = malloc(sizeof *state * (size_t)(n + 1));
  char **label = calloc((size_t)n + 1, sizeof *label);
  st_buf *hover = calloc((size_t)n + 1, sizeof *hover);
  char row_text[64][32], col_text[64][32];
  const char *row_names[64], *col_names[64];
  if (!state || !label || !hover) { rc = st_fail(ST_ENOMEM, "sweep grid"); goto grid_out; }
  for (int i = 0; i < n; i++) state[i] = -1;
  for (int i = 0; i < nl; i++) {
    snprintf(row_text[i], sizeof row_text[i], "%lld tokens", (long long)lengths[i]);
    row_names[i] = row_text[i];
  }
  for (int i = 0; i < np; i++) {
    snprintf(col_text[i], sizeof col_text[i], "%.2f", positions[i]);
    col_names[i] = col_text[i];
  }
  sqlite3_reset(cells);
  while (sqlite3_step(cells) == SQLITE_ROW) {
    int64_t l = sqlite3_column_int64(cells, 0);
    double p = sqlite3_column_double(cells, 1);
    int r = 0, k = 0;
    while (r < nl && lengths[r] != l) r++;
    while (k < np && positions[k] != p) k++;
    if (r == nl || k == np) continue;
    int passed = sqlite3_column_int(cells, 2), total = sqlite3_column_int(cells, 3);
    size_t i = (size_t)r * np + k;
    state[i] = passed == total ? 1 : passed == 0 ? 0 : 2;
    label[i] = malloc(32);
    if (label[i]) snprintf(label[i], 32, "%d/%d", passed, total);
    st_buf_printf(&hover[i], "%lld tokens, position %.2f: %d of %d passed", (long long)l, p, passed, total);
  }
  /* hover texts: every attempt's answer, in its cell */
  while (sqlite3_step(attempts) == SQLITE_ROW) {
    int64_t l = sqlite3_column_int64(attempts, 0);
    double p = sqlite3_column_double(attempts, 1);
    int r = 0, k = 0;
    while (r < nl && lengths[r] != l) r++;
    while (k < np && positions[k] != p) k++;
    const char *answer = column_text(attempts, 5), *error = column_text(attempts, 6);
    if (r < nl && k < np)
      st_buf_printf(&hover[(size_t)r * np + k], "\nseed %lld %s: %s", (long long)sqlite3_column_int64(attempts, 2),
                    sqlite3_column_int(attempts, 3) ? "PASS" : "FAIL", answer ? answer : error ? error : "-");
  }
  {
    const char **hover_text = calloc((size_t)n + 1, sizeof *hover_text);
    if (!hover_text) { rc = st_fail(ST_ENOMEM, "sweep grid"); goto grid_out; }
    for (int i = 0; i < n; i++) hover_text[i] = hover[i].data;
    snprintf(id, sizeof id, "sweep-grid-%d", index);
    st_html_grid g = {.id = id, .title = "pass/fail per context length and needle position",
                      .row_axis = "context", .col_axis = "needle position (fraction of the prompt)", .n_rows = nl,
                      .n_cols = np, .row_names = row_names, .col_names = col_names, .state = state,
                      .label = (const char *const *)label, .hover = hover_text};
    st_html_grid_svg(b, &g);
    free(hover_text);
  }
  snprintf(id, sizeof id, "sweep-attempts-%d", index);
  const char *headers[] = {"tokens", "actual", "position", "seed", "pass", "expected", "answer", "error", "run"};
  st_html_table_begin(b, id, headers, 9);
  sqlite3_reset(attempts);
  while (sqlite3_step(attempts) == SQLITE_ROW) {
    char tokens[32], actual[32], position[32], seed[32], run[16] = "";
    snprintf(tokens, sizeof tokens, "%lld", (long long)sqlite3_column_int64(attempts, 0));
    snprintf(actual, sizeof actual, "%lld", (long long)sqlite3_column_int64(attempts, 7));
    snprintf(position, sizeof position, "%.2f", sqlite3_column_double(attempts, 1));
    snprintf(seed, sizeof seed, "%lld", (long long)sqlite3_column_int64(attempts, 2));
    if (column_text(attempts, 8)) snprintf(run, sizeof run, "%.8s", column_text(attempts, 8));
    const char *row[] = {tokens, actual, position, seed, sqlite3_column_int(attempts, 3) ? "pass" : "FAIL",
                         column_text(attempts, 4), column_text(attempts, 5), column_text(attempts, 6),
                         run[0] ? run : NULL};
    st_html_table_row(b, row, 9);
  }
  st_html_table_end(b);
grid_out:
  for (int i = 0; label && i < n; i++) free(label[i]);
  for (int i = 0; hover && i < n; i++) st_buf_free(&hover[i]);
  free(label); free(hover); free(state);
  st_html_section_end(b);
out:
  sqlite3_finalize(cells);
  sqlite3_finalize(attempts);
  sqlite3_finalize(head);
  return rc;
}

/* ---------------------------------------------------------------- bisect */

static st_status section_bisect(report_ctx *c, report_run *r) {
  st_buf *b = c->out;
  if (!r->has_needle) return st_fail(ST_EINVAL, "report --good/--bad: run %s has no needle marked to bisect on", r->run_id);
  if (!r->model_dir[0]) return st_fail(ST_EINVAL, "report --good/--bad: run %s names no model directory (give --model)", r->run_id);
  st_bisect_request req = {.trace_path = r->trace_path, .model_dir = r->model_dir, .good = c->o->good,
                           .bad = c->o->bad, .needle_start = r->needle_start, .needle_end = r->needle_end};
  st_bisect_report *rep = calloc(1, sizeof *rep);
  if (!rep) return st_fail(ST_ENOMEM, "bisect report");
  st_status rc = st_bisect_run(&req, rep);
  if (rc) { free(rep); return st_fail_context(rc, "bisect of %s: ", r->trace_path); }
  char title[300];
  snprintf(title, sizeof title, "Bisect: good %s, bad %s", c->o->good, c->o->bad);
  st_html_section_begin(b, "bisect", title);
  st_buf_str(b, "<p class=\"sentence\" id=\"bisect-sentence\">");
  st_html_text(b, rep->explanation);
  st_buf_str(b, "</p>\n");
  char text[200];
  snprintf(text, sizeof text, "answer positions %lld-%lld; %d indexer replays in %.2f s",
           (long long)rep->first_position, (long long)rep->last_position, rep->replays, rep->seconds);
  st_html_paragraph(b, "note", text);
  const char *headers[] = {"layer", "good retrieves", "good kept", "good worst rank", "bad retrieves", "bad kept",
                           "bad worst rank", ""};
  st_html_table_begin(b, "bisect-layers", headers, 8);
  for (int i = 0; i < rep->n_layers; i++) {
    char layer[16], gk[32], gr[32], bk[32], br[32];
    snprintf(layer, sizeof layer, "%d", rep->layers[i]);
    snprintf(gk, sizeof gk, "%d of %d", rep->good[i].kept, rep->good[i].positions);
    snprintf(gr, sizeof gr, "%lld", (long long)rep->good[i].rank);
    snprintf(bk, sizeof bk, "%d of %d", rep->bad[i].kept, rep->bad[i].positions);
    snprintf(br, sizeof br, "%lld", (long long)rep->bad[i].rank);
    const char *cells[] = {layer, rep->good[i].retrieves ? "yes" : "no", gk, gr, rep->bad[i].retrieves ? "yes" : "no",
                           bk, br, st_bisect_layer_note(rep, i)};
    st_html_table_row(b, cells, 8);
  }
  st_html_table_end(b);
  const char *ch[] = {"setting", "good", "bad", "alone flips layer", "alone changes counts at", "setting it back restores"};
  st_html_table_begin(b, "bisect-changes", ch, 6);
  for (int i = 0; i < rep->n_changes; i++) {
    const st_bisect_change *x = &rep->changes[i];
    char flips[16] = "none", changes[16] = "none";
    if (x->alone_flips_at >= 0) snprintf(flips, sizeof flips, "%d", x->alone_flips_at);
    if (x->alone_changes_at >= 0) snprintf(changes, sizeof changes, "%d", x->alone_changes_at);
    const char *cells[] = {x->key, x->good, x->bad, flips, changes, x->restores ? "every layer" : "no"};
    st_html_table_row(b, cells, 6);
  }
  st_html_table_end(b);
  st_html_section_end(b);
  free(rep);
  return ST_OK;
}

/* ---------------------------------------------------------------- the page */

/* The target kinds, tried in order; the last (runs) takes anything. A new kind (a scoreboard) is a
** row here with its resolver; its section is written in st_report_write after the others. */
typedef struct target_kind {
  const char *prefix;
  st_status (*resolve)(report_ctx *c, const char *target);
} target_kind;

static st_status resolve_run_target(report_ctx *c, const char *target) {
  if (c->n_runs == REPORT_MAX_TARGETS) return st_fail(ST_EINVAL, "report: at most %d runs", REPORT_MAX_TARGETS);
  report_run *r = &c->runs[c->n_runs++];
  st_status rc = resolve_run(c, target, r);
  if (!rc) rc = load_needle(c, r);
  return rc;
}

static const target_kind target_kinds[] = {
  {"sweep:", resolve_sweeps},
  {"scoreboard:", resolve_scoreboard},
  {"", resolve_run_target},
};

/* ---------------------------------------------------------------- scoreboard */

/* The board as `sparsetrace scoreboard` prints it: one row per target, one column per
** (length, position) cell of the corpus and "all", each cell's text from st_scoreboard_cell_text;
** then, against the first target, the sentences of st_scoreboard_compare. */
static st_status section_scoreboard(report_ctx *c, const st_scoreboard *sb, int index) {
  st_buf *b = c->out;
  char id[48], title[256];
  snprintf(id, sizeof id, "scoreboard-%d", index);
  snprintf(title, sizeof title, "Scoreboard %s v%d: %d cases, %d targets", sb->corpus, sb->version, sb->n_cases,
           sb->n_rows);
  st_html_section_begin(b, id, title);
  int cols = sb->n_tokens * sb->n_positions + 1, rows = sb->n_rows, n = rows * cols;
  int *state = malloc(sizeof *state * (size_t)(n + 1));
  char **label = calloc((size_t)n + 1, sizeof *label), **hover = calloc((size_t)n + 1, sizeof *hover);
  char **col_names = calloc((size_t)cols + 1, sizeof *col_names);
  const char **row_names = calloc((size_t)rows + 1, sizeof *row_names);
  st_status rc = ST_OK;
  if (!state || !label || !hover || !col_names || !row_names) { rc = st_fail(ST_ENOMEM, "scoreboard grid"); goto out; }
  for (int k = 0; k < cols; k++) {
    col_names[k] = malloc(48);
    if (!col_names[k]) { rc = st_fail(ST_ENOMEM, "scoreboard grid"); goto out; }
    if (k == cols - 1) snprintf(col_names[k], 48, "all");
    else snprintf(col_names[k], 48, "%lld @ %.2f", (long long)sb->tokens[k / sb->n_positions],
                  sb->positions[k % sb->n_positions]);
  }
  for (int r = 0; r < rows; r++) {
    const st_scoreboard_row *row = &sb->rows[r];
    row_names[r] = row->label;
    for (int k = 0; k < cols; k++) {
      const st_scoreboard_cell *cell = k == cols - 1 ? &row->total : &row->cells[k];
      size_t i = (size_t)r * cols + k;
      state[i] = cell->cases == 0 ? -1 : cell->passed == cell->cases ? 1 : cell->passed == 0 ? 0 : 2;
      if (!(label[i] = malloc(48)) || !(hover[i] = malloc(1400))) { rc = st_fail(ST_ENOMEM, "scoreboard grid"); goto out; }
      st_scoreboard_cell_text(cell, label[i], 48);
      snprintf(hover[i], 1400, "%s, %s: %d of %d passed, %d wrong, %d not made%s%s%s", row->label, col_names[k],
               cell->passed, cell->cases, cell->wrong, cell->errors, strcmp(row->status, "complete") ? "; target " : "",
               strcmp(row->status, "complete") ? row->status : "", row->error ? row->error : "");
    }
  }
  snprintf(id, sizeof id, "scoreboard-grid-%d", index);
  st_html_grid g = {.id = id, .title = "passed/cases per target and (context, needle position); ~D: mean edit distance of the wrong answers",
                    .row_axis = "target", .col_axis = "context @ needle position", .n_rows = rows, .n_cols = cols,
                    .row_names = row_names, .col_names = (const char *const *)col_names, .state = state,
                    .label = (const char *const *)label, .hover = (const char *const *)hover};
  st_html_grid_svg(b, &g);
  snprintf(id, sizeof id, "scoreboard-targets-%d", index);
  const char *headers[] = {"target", "kind", "spec", "status", "all", "error"};
  st_html_table_begin(b, id, headers, 6);
  for (int r = 0; r < rows; r++) {
    const st_scoreboard_row *row = &sb->rows[r];
    const char *cells[] = {row->label, row->kind, row->spec, row->status, label[(size_t)r * cols + cols - 1],
                           row->error ? row->error : ""};
    st_html_table_row(b, cells, 6);
  }
  st_html_table_end(b);
  for (int r = 1; r < rows && !rc; r++) {
    st_scoreboard_comparison cmp;
    if ((rc = st_scoreboard_compare(sb, sb->rows[0].label, sb->rows[r].label, &cmp))) break;
    char sentence[512];
    st_scoreboard_comparison_sentence(&cmp, sentence, sizeof sentence);
    st_html_paragraph(b, "comparison", sentence);
    st_scoreboard_comparison_free(&cmp);
  }
out:
  st_html_section_end(b);
  for (int i = 0; label && hover && i < n; i++) free(label[i]), free(hover[i]);
  for (int k = 0; col_names && k < cols; k++) free(col_names[k]);
  free(state), free(label), free(hover), free(col_names), free(row_names);
  return rc;
}

st_status st_report_write(const char *const *targets, int n, const st_report_options *o, st_buf *out) {
  report_ctx *c = calloc(1, sizeof *c);
  if (!c) return st_fail(ST_ENOMEM, "report");
  st_report_options opts = *o;
  if (!opts.store_dir) opts.store_dir = "traces";
  c->o = &opts;
  c->out = out;
  st_status rc = ST_OK;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", opts.store_dir, ST_INDEX_FILE);
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if ((rc = st_index_open(opts.store_dir, ST_INDEX_READ_ONLY, &c->ix))) goto out;
    c->db = st_index_db(c->ix);
  }
  if (!n) { rc = st_fail(ST_EINVAL, "report: no target (a run id, a trace .h5, sweep:ID, sweep:all or scoreboard:NAME)"); goto out; }
  for (int i = 0; i < n && !rc; i++)
    for (size_t k = 0; k < sizeof target_kinds / sizeof target_kinds[0]; k++)
      if (!strncmp(targets[i], target_kinds[k].prefix, strlen(target_kinds[k].prefix))) {
        rc = target_kinds[k].resolve(c, targets[i]);
        break;
      }
  if (rc) goto out;
  if (c->n_runs && c->runs[0].model_dir[0] && st_tokenizer_open(c->runs[0].model_dir, &c->tok)) {
    c->tok = NULL;
    st_clear_error();
  }
  char title[256];
  if (c->n_runs == 2) snprintf(title, sizeof title, "sparsetrace report: %.8s vs %.8s", c->runs[0].run_id, c->runs[1].run_id);
  else if (c->n_runs) snprintf(title, sizeof title, "sparsetrace report: run %.8s%s", c->runs[0].run_id,
                               c->n_runs > 2 ? " and others" : "");
  else if (c->n_sweeps) snprintf(title, sizeof title, "sparsetrace report: needle sweep%s", c->n_sweeps > 1 ? "s" : "");
  else snprintf(title, sizeof title, "sparsetrace report: scoreboard %s", c->n_boards ? c->boards[0].corpus : "");
  st_html_begin(out, title);
  for (int i = 0; i < c->n_runs && !rc; i++) {
    report_run *r = &c->runs[i];
    section_identity(c, r, i);
    if (!(rc = section_verdicts(c, r, i)) && !(rc = section_scores(c, r, i))) rc = section_replays(c, r, i);
    st_html_section_end(out);
  }
  if (!rc && c->n_runs == 2) rc = section_compare(c, &c->runs[0], &c->runs[1]);
  for (int i = 0; i < c->n_sweeps && !rc; i++) rc = section_sweep(c, &c->sweeps[i], i);
  for (int i = 0; i < c->n_boards && !rc; i++) rc = section_scoreboard(c, &c->boards[i], i);
  if (!rc && o->good && o->bad && c->n_runs) rc = section_bisect(c, &c->runs[0]);
  if (!rc) {
    char footer[8192], now[32];
    st_utc_now(now, sizeof now);
    snprintf(footer, sizeof footer, "written %s by sparsetrace %s from %s%s%s", now, st_build_revision,
             opts.store_dir, o->command_line ? ": " : "", o->command_line ? o->command_line : "");
    st_html_end(out, footer);
    rc = st_buf_status(out, "report page");
  }
out:
  for (int i = 0; i < c->n_runs; i++) {
    st_trace_close(c->runs[i].trace);
    free(c->runs[i].config);
    free(c->runs[i].verdicts);
    free(c->runs[i].verdict_layer);
  }
  for (int i = 0; i < c->n_boards; i++) st_scoreboard_free(&c->boards[i]);
  st_tokenizer_close(c->tok);
  st_index_close(c->ix);
  free(c);
  return rc;
}

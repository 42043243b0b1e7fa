/*
** cmd_inspect.c — `sparsetrace inspect TRACE.h5`: what a trace holds (run, model, settings,
** build, tokens, every tap with shape, dtype, axis 0 and statistics), whether it is complete,
** and which replay stages it can feed.
**
** Replay readiness. `replay --stage indexer` re-scores one CSA layer from its recorded
** indexer.q, indexer.k and indexer.weights; `--stage layer|rest` re-runs from layers.N.input.
** CSA layers are taken from the run's config (compress_ratios or layer_types); a config without
** either falls back to the layers that recorded any indexer tap.
*/
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "common/json_oom.h"
#include "recorder/trace_reader.h"

static const st_opt_use inspect_options[] = {
  {ST_OPT_TRACE, NULL, "the trace (the same as giving it as the argument)"},
  {ST_OPT_JSON, NULL, "one JSON object instead of text"},
  {ST_OPT_PARTIAL, NULL, "open an unfinished recording (a .part file, or one without the complete\n"
                         "mark) and show what it holds instead of refusing it"},
  {0}};

static const st_cmd_spec inspect_spec = {
  "inspect", "sparsetrace inspect TRACE.h5 [--json] [--partial]\n",
  "Shows what a trace holds: run id, model, settings, build, tokens, every tap with its shape,\n"
  "dtype, what axis 0 counts (token position or compressed row) and summary statistics\n"
  "(count, NaN, inf, min, max, mean, rms over finite values; \"-\" where there are none, as in\n"
  "a recording that never finished), whether the file is complete, and per CSA layer whether\n"
  "the trace can feed `replay --stage indexer` (needs indexer.q, indexer.k, indexer.weights)\n"
  "and `--stage layer|rest` (needs layers.N.input).\n",
  inspect_options, "Exit status: 0 shown, 1 unreadable trace, 2 usage error.\n"};

/* ---------------------------------------------------------------- CSA layers */

typedef struct readiness {
  int layer;
  int indexer_ready, layer_ready, filtered;
  char missing_indexer[128], missing_layer[64];
} readiness;

/* Marks csa[i] = 1 for CSA layers per the config JSON; returns 1 if the config said, -1 when
** memory ran out reading it (st_fail set). */
static int csa_from_config(const char *config, int *csa, int max_layers) {
  if (!config) return 0;
  errno = 0;
  json_t *root = json_loads(config, 0, NULL);
  if (!root && st_json_out_of_memory(NULL)) return st_fail(ST_ENOMEM, "reading the recorded config"), -1;
  if (!json_is_object(root)) {
    json_decref(root);
    return 0;
  }
  int n_layers = (int)json_integer_value(json_object_get(root, "num_hidden_layers"));
  if (n_layers <= 0 || n_layers > max_layers) n_layers = max_layers;
  json_t *ratios = json_object_get(root, "compress_ratios");
  json_t *types = json_object_get(root, "layer_types");
  json_t *rate = json_object_get(root, "compress_rate_csa");
  int csa_ratio = json_is_integer(rate) ? (int)json_integer_value(rate) : 4;
  int found = 0;
  if (json_is_array(types)) {
    for (size_t i = 0; i < json_array_size(types) && (int)i < n_layers; i++) {
      const char *t = json_string_value(json_array_get(types, i));
      csa[i] = t && !strcmp(t, "compressed_sparse_attention");
    }
    found = 1;
  } else if (json_is_array(ratios)) {
    for (size_t i = 0; i < json_array_size(ratios) && (int)i < n_layers; i++)
      csa[i] = json_integer_value(json_array_get(ratios, i)) == csa_ratio;
    found = 1;
  }
  json_decref(root);
  return found;
}

static void add_missing(char *buf, size_t size, const char *what) {
  size_t n = strlen(buf);
  snprintf(buf + n, size - n, "%s%s", n ? ", " : "", what);
}

/* Fills r[] for each CSA layer; returns the count, or -1 when memory ran out (st_fail set).
** *source says where CSA layers came from. */
static int replay_readiness(const st_trace *t, readiness *r, int max, const char **source) {
  enum { MAX_LAYERS = 1024 };
  int *csa = calloc(MAX_LAYERS, sizeof *csa);
  if (!csa) return st_fail(ST_ENOMEM, "the replay readiness table"), -1;
  *source = "config";
  int from_config = csa_from_config(st_trace_attr(t, "config"), csa, MAX_LAYERS);
  if (from_config < 0) {
    free(csa);
    return -1;
  }
  if (!from_config) {
    *source = "recorded indexer taps (the config names no layer types)";
    for (int i = 0; i < st_trace_tap_count(t); i++) {
      const st_trace_tap *tap = st_trace_tap_at(t, i);
      if (tap->layer >= 0 && tap->layer < MAX_LAYERS && tap->id < ST_TAP_COUNT &&
          !strncmp(st_tap_catalogue[tap->id].suffix, "indexer.", 8))
        csa[tap->layer] = 1;
    }
  }
  int n = 0;
  for (int layer = 0; layer < MAX_LAYERS && n < max; layer++) {
    if (!csa[layer]) continue;
    readiness *x = &r[n++];
    memset(x, 0, sizeof *x);
    x->layer = layer;
    static const st_tap_id need[] = {ST_TAP_INDEXER_Q, ST_TAP_INDEXER_K, ST_TAP_INDEXER_WEIGHTS};
    x->indexer_ready = 1;
    for (size_t k = 0; k < sizeof need / sizeof *need; k++) {
      const st_trace_tap *tap = st_trace_find_tap_id(t, need[k], layer);
      if (!tap) {
        x->indexer_ready = 0;
        add_missing(x->missing_indexer, sizeof x->missing_indexer, st_tap_catalogue[need[k]].suffix);
      } else if (tap->has_positions) {
        x->filtered = 1;
      }
    }
    const st_trace_tap *input = st_trace_find_tap_id(t, ST_TAP_INPUT, layer);
    x->layer_ready = input != NULL;
    if (!input) add_missing(x->missing_layer, sizeof x->missing_layer, "input");
    else if (input->has_positions) x->filtered = 1;
  }
  free(csa);
  return n;
}

/* ---------------------------------------------------------------- text output */

static void shape_text(const st_trace_tap *tap, char *buf, size_t size) {
  size_t k = (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < tap->rank && k < size; i++)
    k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? "," : "", (long long)tap->shape[i]);
  if (k < size) snprintf(buf + k, size - k, "]");
}

static void num_text(double v, int valid, char *buf, size_t size) {
  if (!valid) snprintf(buf, size, "-");
  else snprintf(buf, size, "%.6g", v);
}

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

/* An imported trace (sparsetrace import): its source, and per tap what could not be aligned. */
static void print_import_text(const st_trace *t) {
  const char *imp = st_trace_attr(t, "import");
  if (!imp) return;
  json_t *o = json_loads(imp, 0, NULL), *notes = NULL;
  json_t *src = json_object_get(o, "source");
  printf("imported    %s from %s (map %s)", json_string_value(json_object_get(o, "format")) ? json_string_value(json_object_get(o, "format")) : "?",
         json_string_value(json_object_get(o, "source_dir")) ? json_string_value(json_object_get(o, "source_dir")) : "?",
         json_string_value(json_object_get(o, "map")) ? json_string_value(json_object_get(o, "map")) : "?");
  const char *key;
  json_t *v;
  int first = 1;
  json_object_foreach(src, key, v) {
    char *text = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_ENCODE_ANY);
    printf("%s%s=%s", first ? "\n  source    " : ", ", key, text ? text : "?");
    free(text);
    first = 0;
  }
  putchar('\n');
  const char *text = st_trace_attr(t, "import_notes");
  notes = text ? json_loads(text, 0, NULL) : NULL;
  json_t *taps = json_object_get(notes, "taps"), *unmapped = json_object_get(notes, "unmapped");
  if (json_object_size(taps)) printf("  not aligned as-is (per tap):\n");
  json_object_foreach(taps, key, v) {
    size_t i;
    json_t *line;
    json_array_foreach(v, i, line) printf("    %-26s %s\n", key, json_string_value(line) ? json_string_value(line) : "?");
  }
  if (json_array_size(unmapped)) {
    printf("  source tensors not in the map (%zu%s):", json_array_size(unmapped), json_array_size(unmapped) >= 64 ? "+" : "");
    size_t i;
    json_t *name;
    json_array_foreach(unmapped, i, name) printf("%s%s", i ? ", " : " ", json_string_value(name) ? json_string_value(name) : "?");
    putchar('\n');
  }
  json_decref(notes);
  json_decref(o);
}

static void print_text(const st_trace *t, long long file_bytes, const readiness *r, int n_ready,
                       const char *source) {
  int64_t n_tokens = 0;
  st_trace_tokens(t, &n_tokens);
  int64_t n_prompt = st_trace_n_prompt(t);
  printf("trace       %s (%s, %.1f MiB, schema %lld)\n", st_trace_path(t),
         st_trace_is_complete(t) ? "complete" : "INCOMPLETE", (double)file_bytes / 1048576.0,
         (long long)st_trace_attr_int(t, "schema_version", 0));
  printf("run         %s  created %s", or_dash(st_trace_attr(t, "run_id")),
         or_dash(st_trace_attr(t, "created_at")));
  if (st_trace_attr(t, "request_id")) printf("  request %s", st_trace_attr(t, "request_id"));
  printf("\nmodel       %s (%s)\n", or_dash(st_trace_attr(t, "model")),
         or_dash(st_trace_attr(t, "model_dir")));
  printf("settings    %s\n", or_dash(st_trace_attr(t, "settings")));
  printf("build       %s, %s, %s; backend %s (%s), %lld threads\n",
         or_dash(st_trace_attr(t, "build_revision")), or_dash(st_trace_attr(t, "compiler")),
         or_dash(st_trace_attr(t, "build_type")), or_dash(st_trace_attr(t, "backend")),
         or_dash(st_trace_attr(t, "kernel_mode")), (long long)st_trace_attr_int(t, "threads", 0));
  if (st_trace_attr(t, "command_line")) printf("command     %s\n", st_trace_attr(t, "command_line"));
  if (!st_trace_is_complete(t) && n_tokens == 0)
    printf("tokens      none (written when a recording finishes)\n");
  else
    printf("tokens      %lld (%lld prompt + %lld generated)\n", (long long)n_tokens,
           (long long)n_prompt, (long long)(n_tokens - n_prompt));
  printf("positions   %s\n", or_dash(st_trace_attr(t, "positions")));
  print_import_text(t);
  int n = st_trace_tap_count(t);
  printf("taps        %d\n", n);
  size_t wn = 4, ws = 5;
  for (int i = 0; i < n; i++) {
    const st_trace_tap *tap = st_trace_tap_at(t, i);
    char shape[256];
    shape_text(tap, shape, sizeof shape);
    wn = ST_MAX(wn, strlen(tap->name));
    ws = ST_MAX(ws, strlen(shape) + (tap->has_positions ? 1 : 0));
  }
  if (n) {
    printf("  %-*s  %-*s  %-8s  %-14s  %10s  %10s  %6s  %8s  %8s  %12s  %12s  %12s  %12s\n", (int)wn, "name",
           (int)ws, "shape", "dtype", "axis0", "count", "finite", "nan", "+inf", "-inf", "min", "max", "mean", "rms");
  }
  for (int i = 0; i < n; i++) {
    const st_trace_tap *tap = st_trace_tap_at(t, i);
    const st_tap_stats *s = &tap->stats;
    char shape[256], mn[32], mx[32], mean[32], rms[32];
    shape_text(tap, shape, sizeof shape);
    if (tap->has_positions) strcat(shape, "*");
    num_text(s->min, s->has_range, mn, sizeof mn);
    num_text(s->max, s->has_range, mx, sizeof mx);
    num_text(s->mean, s->has_range, mean, sizeof mean);
    num_text(s->rms, s->has_rms, rms, sizeof rms);
    char count[24], finite[24], nan[24], pinf[24], ninf[24];
    snprintf(count, sizeof count, s->count < 0 ? "-" : "%lld", (long long)s->count);
    snprintf(finite, sizeof finite, s->count < 0 || s->finite_count < 0 ? "-" : "%lld", (long long)s->finite_count);
    snprintf(nan, sizeof nan, s->count < 0 ? "-" : "%lld", (long long)s->nan_count);
    snprintf(pinf, sizeof pinf, s->count < 0 || s->posinf_count < 0 ? "-" : "%lld", (long long)s->posinf_count);
    snprintf(ninf, sizeof ninf, s->count < 0 || s->neginf_count < 0 ? "-" : "%lld", (long long)s->neginf_count);
    printf("  %-*s  %-*s  %-8s  %-14s  %10s  %10s  %6s  %8s  %8s  %12s  %12s  %12s  %12s\n", (int)wn,
           tap->name, (int)ws, shape, st_dtype_name(tap->dtype), st_trace_axis0_name(tap->row_axis),
           count, finite, nan, pinf, ninf, mn, mx, mean, rms);
  }
  for (int i = 0; i < n; i++)
    if (st_trace_tap_at(t, i)->has_positions) {
      printf("  * rows are a subset of token positions: see /positions/<name>\n");
      break;
    }
  printf("replay readiness (CSA layers from %s):\n", source);
  if (n_ready == 0) printf("  no CSA layers\n");
  for (int i = 0; i < n_ready; i++) {
    const readiness *x = &r[i];
    printf("  layer %-4d --stage indexer: %s", x->layer, x->indexer_ready ? "ready" : "missing ");
    if (!x->indexer_ready) printf("%s", x->missing_indexer);
    printf("; --stage layer|rest: %s", x->layer_ready ? "ready" : "missing ");
    if (!x->layer_ready) printf("%s", x->missing_layer);
    if (x->filtered && (x->indexer_ready || x->layer_ready)) printf(" (kept positions only)");
    putchar('\n');
  }
}

/* ---------------------------------------------------------------- JSON output */

static json_t *json_text(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *json_num(double v, int valid) {
  return valid && isfinite(v) ? json_real(v) : json_null();
}

static int print_json(const st_trace *t, long long file_bytes, const readiness *r, int n_ready,
                      const char *source) {
  int64_t n_tokens = 0;
  st_trace_tokens(t, &n_tokens);
  json_t *o = json_object();
  json_object_set_new(o, "path", json_string(st_trace_path(t)));
  json_object_set_new(o, "complete", json_boolean(st_trace_is_complete(t)));
  json_object_set_new(o, "file_bytes", json_integer(file_bytes));
  json_object_set_new(o, "schema_version", json_integer(st_trace_attr_int(t, "schema_version", 0)));
  static const char *plain[] = {"run_id", "created_at", "model", "model_dir", "command_line",
                                "request_id", "positions"};
  for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
    json_object_set_new(o, plain[i], json_text(st_trace_attr(t, plain[i])));
  static const char *import_keys[] = {"import", "import_notes"};
  for (size_t i = 0; i < 2; i++) {
    const char *text = st_trace_attr(t, import_keys[i]);
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;
    json_object_set_new(o, import_keys[i], v ? v : json_text(text));
  }
  const char *settings = st_trace_attr(t, "settings");
  json_t *parsed = settings ? json_loads(settings, 0, NULL) : NULL;
  json_object_set_new(o, "settings", parsed ? parsed : json_text(settings));
  json_t *build = json_object();
  static const char *bkeys[][2] = {{"revision", "build_revision"}, {"compiler", "compiler"},
                                   {"build_type", "build_type"}, {"backend", "backend"},
                                   {"kernel_mode", "kernel_mode"}};
  for (size_t i = 0; i < sizeof bkeys / sizeof *bkeys; i++)
    json_object_set_new(build, bkeys[i][0], json_text(st_trace_attr(t, bkeys[i][1])));
  json_object_set_new(build, "threads", json_integer(st_trace_attr_int(t, "threads", 0)));
  json_object_set_new(o, "build", build);
  json_t *tok = json_object();
  json_object_set_new(tok, "n_tokens", json_integer(n_tokens));
  json_object_set_new(tok, "n_prompt", json_integer(st_trace_n_prompt(t)));
  json_object_set_new(tok, "n_generated", json_integer(n_tokens - st_trace_n_prompt(t)));
  json_object_set_new(o, "tokens", tok);
  json_t *taps = json_array();
  for (int i = 0; i < st_trace_tap_count(t); i++) {
    const st_trace_tap *tap = st_trace_tap_at(t, i);
    const st_tap_stats *s = &tap->stats;
    json_t *x = json_object(), *shape = json_array();
    for (int k = 0; k < tap->rank; k++) json_array_append_new(shape, json_integer(tap->shape[k]));
    json_object_set_new(x, "name", json_string(tap->name));
    json_object_set_new(x, "layer", tap->layer >= 0 ? json_integer(tap->layer) : json_null());
    json_object_set_new(x, "shape", shape);
    json_object_set_new(x, "dtype", json_string(st_dtype_name(tap->dtype)));
    json_object_set_new(x, "axis0", json_string(st_trace_axis0_name(tap->row_axis)));
    json_object_set_new(x, "has_positions", json_boolean(tap->has_positions));
    json_object_set_new(x, "count", s->count < 0 ? json_null() : json_integer(s->count));
    json_object_set_new(x, "nan_count", s->count < 0 ? json_null() : json_integer(s->nan_count));
    json_object_set_new(x, "finite_count", s->count < 0 || s->finite_count < 0 ? json_null() : json_integer(s->finite_count));
    json_object_set_new(x, "inf_count", s->count < 0 ? json_null() : json_integer(s->inf_count));
    json_object_set_new(x, "posinf_count", s->count < 0 || s->posinf_count < 0 ? json_null() : json_integer(s->posinf_count));
    json_object_set_new(x, "neginf_count", s->count < 0 || s->neginf_count < 0 ? json_null() : json_integer(s->neginf_count));
    json_object_set_new(x, "min", json_num(s->min, s->has_range));
    json_object_set_new(x, "max", json_num(s->max, s->has_range));
    json_object_set_new(x, "mean", json_num(s->mean, s->has_range));
    json_object_set_new(x, "rms", json_num(s->rms, s->has_rms));
    json_array_append_new(taps, x);
  }
  json_object_set_new(o, "taps", taps);
  json_t *ready = json_array();
  for (int i = 0; i < n_ready; i++) {
    json_t *x = json_object();
    json_object_set_new(x, "layer", json_integer(r[i].layer));
    json_object_set_new(x, "indexer", json_boolean(r[i].indexer_ready));
    json_object_set_new(x, "layer_rest", json_boolean(r[i].layer_ready));
    json_object_set_new(x, "missing", json_sprintf("%s%s%s", r[i].missing_indexer,
                                                   r[i].missing_indexer[0] && r[i].missing_layer[0] ? ", " : "",
                                                   r[i].missing_layer));
    json_object_set_new(x, "kept_positions_only", json_boolean(r[i].filtered));
    json_array_append_new(ready, x);
  }
  json_object_set_new(o, "replay_readiness", ready);
  json_object_set_new(o, "csa_layers_from", json_string(source));
  int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  putchar('\n');
  json_decref(o);
  return rc;
}

/* ---------------------------------------------------------------- command */

int st_cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  int json = 0, partial = 0, c;
  st_opts o;
  st_opts_init(&o, &inspect_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    if (c == ST_OPT_PARTIAL) {
      partial = 1;
    } else if (path) { /* ST_OPT_POSITIONAL, ST_OPT_TRACE */
      st_opts_error(&o, "one trace at a time ('%s' and '%s')", path, o.arg);
      c = ST_OPTS_EXIT;
      break;
    } else {
      path = o.arg;
    }
  }
  json = o.json;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return o.exit_code;
  if (!path) {
    fprintf(stderr, "sparsetrace inspect: no trace given\n(sparsetrace inspect --help lists the options)\n");
    return 2;
  }
  st_trace *t = NULL;
  st_status st = st_trace_open(path, partial ? ST_TRACE_OPEN_INCOMPLETE : 0, &t);
  if (st == ST_EFORMAT && !partial) {
    /* If the only problem is that the recording never finished, say how to look anyway. */
    char why[2048];
    snprintf(why, sizeof why, "%s", st_errmsg());
    st_trace *probe = NULL;
    if (st_trace_open(path, ST_TRACE_OPEN_INCOMPLETE, &probe) == ST_OK)
      st_fail(st, "%s; pass --partial to see what it holds", why);
    else
      st_fail(st, "%s", why);
    st_trace_close(probe);
  }
  if (st) return st_cli_report_error("inspect");
  struct stat sb;
  long long bytes = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
  readiness r[512];
  const char *source = "config";
  int n_ready = replay_readiness(t, r, 512, &source);
  if (n_ready < 0) {
    st_trace_close(t);
    return st_cli_report_error("inspect");
  }
  int rc = 0;
  if (json) rc = print_json(t, bytes, r, n_ready, source) ? 1 : 0;
  else print_text(t, bytes, r, n_ready, source);
  st_trace_close(t);
  if (fflush(stdout) != 0) rc = 1;
  return rc;
}

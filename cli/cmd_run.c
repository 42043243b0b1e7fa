/*
** cmd_run.c — `sparsetrace run`: run the reference engine on a prompt with taps armed and record
** one trace (HDF5) plus its row in the store's index.
*/
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "common/json_oom.h"
#include "options.h"
#include "progress.h"
#include "engine/model.h"
#include "engine/text/chat.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "recorder/capture/capture.h"
#include "recorder/recorder.h"
#include "replayer/needle.h"

static const st_opt_use run_options[] = {
  {ST_OPT_MODEL, NULL, "checkpoint directory (config.json + safetensors)"},
  {ST_OPT_PROMPT_TOKENS, NULL, NULL},
  {ST_OPT_REQUEST, "ID|FILE.json",
   "a captured request (sparsetrace capture): an id, a unique prefix or\n"
   "'last' in the store, or a file from 'sparsetrace requests export';\n"
   "rendered with the model's chat encoding and tokenizer, compared with\n"
   "the prompt token count the server reported, linked to the trace.\n"
   "When the record carries the prompt token ids the server returned\n"
   "(capture --ask-prompt-ids), they are used verbatim and the rendering\n"
   "is compared with them (first differing position)"},
  {ST_OPT_RENDER, NULL, "reference | sglang | vllm | atom (default reference)"},
  {ST_OPT_MAX_NEW_TOKENS, NULL, "greedy tokens to generate after the prompt, 0 to 1000000 (default 0)"},
  {ST_OPT_IGNORE_EOS, NULL, NULL},
  {ST_OPT_TAP, NULL, "arm the taps whose names match (repeatable; 'sparsetrace taps'\n"
                     "lists them), e.g. --tap 'layers.*.indexer.*' --tap logits"},
  {ST_OPT_POSITIONS, NULL, "token positions kept for armed taps: all | last | A:B (half-open)\n"
                           "(default all; compressed-row taps are always kept whole)"},
  {ST_OPT_SET, NULL, NULL},
  {ST_OPT_LAYER_SET, NULL, "a setting for the listed layers only, e.g. 3:rotate=q plants the\n"
                           "F1 fault in layer 3 alone (repeatable; recorded in the trace)"},
  {ST_OPT_NEEDLE, NULL, "the line the prompt must recall (found with the model's tokenizer):\n"
                        "arms the indexer taps and records, per CSA layer and position after\n"
                        "it, the needle's best rank and whether it is in the top-k\n"
                        "(index tables needles / needle_verdicts, view needle_rank_by_layer)"},
  {ST_OPT_NEEDLE_TOKENS, NULL, "the same by token span [A, B)"},
  {ST_OPT_OUT, "OUT.h5", "where to write the trace (default STORE/runs/<run id>.h5)"},
  {ST_OPT_TRACE, "OUT.h5", "the same as --out (the older spelling)"},
  {ST_OPT_FORCE, NULL, "overwrite an existing trace file, replacing the index row of the run\n"
                       "that held its path (a note on stderr and in store_notes says which);\n"
                       "without it such a run is refused before anything is computed"},
  {ST_OPT_STORE, NULL, NULL},
  {ST_OPT_THREADS, NULL, NULL},
  {ST_OPT_CHUNK, NULL, "tokens per internal prefill chunk, 1 to 1048576 (default 256 on the CPU\n"
                       "backends, 4096 on GPU backends; results identical)"},
  {ST_OPT_BACKEND, NULL, NULL},
  {ST_OPT_JSON, NULL, "print the result as one JSON object"},
  {ST_OPT_QUIET, NULL, "no progress line on stderr (shown only when stderr is a terminal)"},
  {0}};

static const st_cmd_spec run_spec = {
  "run", "sparsetrace run --model DIR (--prompt-tokens FILE.json | --request ID|FILE.json) [options]\n",
  "Runs the DeepSeek-V4 reference engine (cpu-ref) on a prompt, greedy-generates, and records a\n"
  "trace: one HDF5 file with the tokens, the run's settings and build, and every armed tap.\n",
  run_options, "Exit status: 0 recorded, 1 on error, 2 usage error.\n"};

typedef struct run_args {
  const char *model, *prompt_path, *trace, *store, *positions;
  int max_new, ignore_eos, threads, chunk, json, force, quiet;
  const char *backend;
  const char **taps;
  int n_taps;
  st_settings settings;
  const char **layer_sets; /* "L[,L..]:KEY=VALUE" */
  int n_layer_sets;
  const char *needle_text;
  int64_t needle_start, needle_end;
  const char *request, *render;
} run_args;

st_status st_cli_read_token_ids(const char *path, int32_t **out, int *n_out) {
  json_error_t jerr;
  errno = 0;
  json_t *root = strcmp(path, "-") ? json_load_file(path, JSON_REJECT_DUPLICATES, &jerr)
                                   : json_loadf(stdin, JSON_REJECT_DUPLICATES, &jerr);
  if (!root && st_json_out_of_memory(&jerr)) return st_fail(ST_ENOMEM, "reading %s", path);
  if (!root)
    return st_fail(ST_EFORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
  st_status rc = ST_OK;
  if (!json_is_array(root) || json_array_size(root) == 0) {
    rc = st_fail(ST_EFORMAT, "%s: expected a non-empty JSON array of token ids", path);
    goto out;
  }
  size_t n = json_array_size(root);
  int32_t *ids = malloc(sizeof(int32_t) * n);
  if (!ids) { rc = st_fail(ST_ENOMEM, "prompt of %zu tokens", n); goto out; }
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(root, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
      free(ids);
      rc = st_fail(ST_EFORMAT, "%s: element %zu is not a token id (a non-negative integer)", path, i);
      goto out;
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  *out = ids;
  *n_out = (int)n;
out:
  json_decref(root);
  return rc;
}

/* What prompt_from_request found out about a captured request's prompt. */
typedef struct request_prompt {
  char id[40], api[32];
  int64_t server_count; /* prompt tokens the server's usage reported; -1: none */
  int from_server;      /* the ids run are the ones the server returned (record.prompt_token_ids) */
  char from[64];        /* ... found there in its answer */
  int n_rendered;       /* length of our own rendering; -1: not rendered (render_error says why) */
  int64_t first_diff;   /* first position where the server's ids and ours differ; -1: none */
  char server_tok[96], rendered_tok[96]; /* the ids there, with their token text */
  char render_error[400];
} request_prompt;

/* "17 \"Ġthe\"" for id at position i of ids[n], or "(none: N ids)" past the end. */
static void describe_token(const st_tokenizer *tok, const int32_t *ids, size_t n, int64_t i,
                           char *out, size_t out_len) {
  if (i >= (int64_t)n) {
    snprintf(out, out_len, "(none: %zu ids)", n);
    return;
  }
  const char *text = st_tokenizer_token_text(tok, ids[i]);
  snprintf(out, out_len, "%d \"%s\"", ids[i], text ? text : "?");
  for (char *c = out; *c; c++)
    if ((unsigned char)*c < 0x20) *c = '?';
}

/* The generated ids as text, a JSON string (specials such as EOS spelled out), or NULL when the
** model directory has no tokenizer.json or the ids do not decode. Caller frees. */
static char *generated_text_json(const char *model_dir, const int32_t *ids, int n) {
  st_tokenizer *tok = NULL;
  char *text = NULL, *out = NULL;
  size_t len = 0;
  if (!st_tokenizer_open(model_dir, &tok) && !st_tokenizer_decode(tok, ids, (size_t)n, 0, &text, &len)) {
    st_buf t = {0};
    st_pyjson_string(&t, text, len, 0);
    if (!st_buf_status(&t, "text")) out = st_buf_take(&t, NULL);
    st_buf_free(&t);
  }
  st_clear_error();
  free(text);
  st_tokenizer_close(tok);
  return out;
}

/* The prompt of a captured request (the record: a file, or an id in the store). When the record
** carries the prompt token ids the server returned (capture --ask-prompt-ids), those are the
** prompt, verbatim; the request body is still rendered with the DeepSeek-V4 chat encoding and the
** model's tokenizer, and compared with them id for id, which is the point: a rendering that
** differs from what the server ran is the first suspect when a replay does not reproduce a bug.
** Without ids the rendering is the prompt, and its count is compared with the server's usage. */
static st_status prompt_from_request(const char *ref, const char *store, const char *model_dir,
                                     const char *render, int32_t **out, int *n_out,
                                     request_prompt *rp) {
  json_t *rec = NULL, *body = NULL;
  st_capture_db *db = NULL;
  st_tokenizer *tok = NULL;
  st_chat_prompt prompt = {0};
  st_token_ids ids = {0};
  int32_t *server_ids = NULL;
  size_t n_server = 0;
  st_status rc;
  memset(rp, 0, sizeof *rp);
  rp->server_count = -1;
  rp->n_rendered = -1;
  rp->first_diff = -1;
  FILE *probe = fopen(ref, "rb");
  if (probe) {
    fclose(probe);
    rc = st_capture_record_load(ref, &rec);
  } else {
    char id[40];
    rc = st_capture_db_open(store, &db);
    if (!rc) rc = st_capture_db_resolve(db, ref, id);
    if (!rc) rc = st_capture_db_export(db, id, &rec);
  }
  if (rc) goto out;
  const char *request_id = json_string_value(json_object_get(rec, "id")) ?: "";
  snprintf(rp->id, sizeof rp->id, "%s", request_id);
  const char *api = json_string_value(json_object_get(rec, "api"));
  snprintf(rp->api, sizeof rp->api, "%s", api ? api : "?");
  json_t *count = json_object_get(json_object_get(rec, "usage"), "input_tokens");
  rp->server_count = json_is_integer(count) ? json_integer_value(count) : -1;

  json_t *sids = json_object_get(rec, "prompt_token_ids");
  if (sids && !json_is_null(sids)) {
    n_server = json_array_size(sids);
    if (!json_is_array(sids) || n_server == 0) {
      rc = st_fail(ST_EFORMAT, "request %s: \"prompt_token_ids\" is not a non-empty array of ids", request_id);
      goto out;
    }
    if (!(server_ids = malloc(sizeof(int32_t) * n_server))) { rc = st_fail(ST_ENOMEM, "prompt ids"); goto out; }
    for (size_t i = 0; i < n_server; i++) {
      json_t *v = json_array_get(sids, i);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
        rc = st_fail(ST_EFORMAT, "request %s: prompt_token_ids[%zu] is not a token id", request_id, i);
        goto out;
      }
      server_ids[i] = (int32_t)json_integer_value(v);
    }
    rp->from_server = 1;
    snprintf(rp->from, sizeof rp->from, "%s",
             json_string_value(json_object_get(rec, "prompt_token_ids_from")) ?: "the record");
  }

  /* Our own rendering: the prompt without server ids, the comparison with them. */
  st_chat_options opt;
  st_chat_options_default(&opt);
  if (api && !strcmp(api, "anthropic.messages")) opt.api = ST_API_ANTHROPIC;
  else if (api && !strcmp(api, "openai.chat")) opt.api = ST_API_CHAT;
  else if (api && !strcmp(api, "openai.responses")) opt.api = ST_API_RESPONSES;
  else rc = st_fail(ST_EUNSUPPORTED, "request %s: api \"%s\" has no chat rendering (messages, chat, responses)", request_id, api ? api : "?");
  if (!rc && render) rc = st_render_profile_parse(render, &opt.profile);
  const char *text = json_string_value(json_object_get(json_object_get(rec, "request"), "body"));
  json_error_t jerr;
  if (!rc && !(body = text ? json_loads(text, 0, &jerr) : NULL))
    rc = st_fail(ST_EFORMAT, "request %s: the captured body is not JSON (%s)", request_id, text ? jerr.text : "missing");
  if (!rc && (rc = st_chat_render_request(body, &opt, &prompt))) st_fail_context(rc, "request %s: ", request_id);
  if (!rc) rc = st_tokenizer_open(model_dir, &tok);
  if (!rc) rc = st_chat_prompt_ids(tok, &prompt, &ids);
  if (!rc && !ids.n) rc = st_fail(ST_EINVAL, "request %s renders to no tokens", request_id);
  if (rc && !rp->from_server) goto out;
  if (rc) { /* the server's ids stand on their own; say why there is nothing to compare */
    snprintf(rp->render_error, sizeof rp->render_error, "%s", st_errmsg());
    rc = ST_OK;
  } else {
    rp->n_rendered = (int)ids.n;
  }
  if (rp->from_server && rp->n_rendered >= 0) {
    size_t common = n_server < ids.n ? n_server : ids.n, i = 0;
    while (i < common && server_ids[i] == ids.ids[i]) i++;
    if (i < common || n_server != ids.n) {
      rp->first_diff = (int64_t)i;
      describe_token(tok, server_ids, n_server, rp->first_diff, rp->server_tok, sizeof rp->server_tok);
      describe_token(tok, ids.ids, ids.n, rp->first_diff, rp->rendered_tok, sizeof rp->rendered_tok);
    }
  }
  if (rp->from_server) {
    *out = server_ids;
    *n_out = (int)n_server;
    server_ids = NULL;
  } else {
    *out = ids.ids;
    *n_out = (int)ids.n;
    ids.ids = NULL;
  }
out:
  free(server_ids);
  st_token_ids_free(&ids);
  st_chat_prompt_free(&prompt);
  st_tokenizer_close(tok);
  st_capture_db_close(db);
  json_decref(body);
  json_decref(rec);
  return rc;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* 0, or the exit code to return now (-1: 0 after --help). */
static int parse_args(int argc, char **argv, run_args *a) {
  memset(a, 0, sizeof *a);
  a->taps = calloc((size_t)argc + 1, sizeof(char *)); /* the --tap globs, and room for the needle's */
  a->layer_sets = calloc((size_t)argc + 1, sizeof(char *));
  if (!a->taps || !a->layer_sets) {
    st_fail(ST_ENOMEM, "the --tap and --layer-set tables for %d arguments", argc);
    return st_cli_report_error("run");
  }
  st_settings_default(&a->settings);
  int c, rc = 2;
  int64_t v;
  st_opts o;
  st_opts_init(&o, &run_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_PROMPT_TOKENS: a->prompt_path = o.arg; break;
    case ST_OPT_MAX_NEW_TOKENS:
      if (st_opt_int(o.name, o.arg, 0, 1000000, &v)) goto bad_value;
      a->max_new = (int)v;
      break;
    case ST_OPT_IGNORE_EOS: a->ignore_eos = 1; break;
    case ST_OPT_NEEDLE: a->needle_text = o.arg; break;
    case ST_OPT_REQUEST: a->request = o.arg; break;
    case ST_OPT_RENDER: a->render = o.arg; break;
    case ST_OPT_NEEDLE_TOKENS:
      if (st_opt_span(o.name, o.arg, &a->needle_start, &a->needle_end)) goto bad_value;
      break;
    case ST_OPT_OUT: case ST_OPT_TRACE: a->trace = o.arg; break;
    case ST_OPT_FORCE: a->force = 1; break;
    case ST_OPT_CHUNK:
      if (st_opt_int(o.name, o.arg, 1, 1048576, &v)) goto bad_value;
      a->chunk = (int)v;
      break;
    default:
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      goto out;
    }
  }
  if (c == ST_OPTS_EXIT) {
    rc = o.exit_code ? o.exit_code : -1;
    goto out;
  }
  if (!a->taps || !a->layer_sets) {
    rc = 1;
    goto out;
  }
  a->model = o.model;
  a->store = o.store ? o.store : ST_DEFAULT_STORE;
  a->positions = o.positions ? o.positions : "all";
  a->threads = o.threads;
  a->backend = o.backend;
  a->json = o.json;
  a->quiet = o.quiet;
  for (int i = 0; i < o.n_taps; i++) a->taps[a->n_taps++] = o.taps[i];
  for (int i = 0; i < o.n_layer_sets; i++) a->layer_sets[a->n_layer_sets++] = o.layer_sets[i];
  for (int i = 0; i < o.n_sets; i++)
    if (st_settings_set(&a->settings, o.sets[i])) goto bad_value;
  if (!a->model || !!a->prompt_path == !!a->request) {
    st_opts_error(&o, "--model and one of --prompt-tokens or --request are required");
    goto out;
  }
  rc = 0;
  goto out;
bad_value:
  st_opts_fail(&o);
out:
  st_opts_free(&o);
  return rc;
}

/* Positions the run forwards: the prompt and every generated token but the last. */
static int64_t forwarded_positions(int n_prompt, int max_new) {
  return (int64_t)n_prompt + (max_new > 0 ? max_new - 1 : 0);
}

/* --positions A:B (or A:) with A at or past the last forwarded position keeps nothing. */
static st_status check_positions(const char *spec, int n_prompt, int max_new) {
  const char *colon = spec ? strchr(spec, ':') : NULL;
  if (!colon || colon == spec) return ST_OK; /* all, last, :B; malformed specs: the recorder says */
  char *end;
  errno = 0;
  long long lo = strtoll(spec, &end, 10);
  if (errno || end != colon || lo < 0) return ST_OK;
  int64_t n = forwarded_positions(n_prompt, max_new);
  if (lo < n) return ST_OK;
  if (max_new > 0)
    return st_fail(ST_EINVAL, "--positions %s lies beyond the run's tokens: %d prompt tokens and up to %d "
                   "generated, positions 0 to %lld are recorded (nothing would be kept)", spec, n_prompt,
                   max_new, (long long)n - 1);
  return st_fail(ST_EINVAL, "--positions %s lies beyond the run's tokens: the prompt has %d tokens, "
                 "positions 0 to %d (nothing would be kept; --max-new-tokens adds positions)", spec,
                 n_prompt, n_prompt - 1);
}

static const char *layer_kind_name(st_layer_kind k) {
  return k == ST_LAYER_CSA ? "CSA" : k == ST_LAYER_HCA ? "HCA" : "sliding-window";
}

/* The layers of one kind, "2, 4, 6" (at most out_len bytes). */
static void layers_of_kind(const st_config *cfg, st_layer_kind kind, char *out, size_t out_len) {
  size_t n = 0;
  out[0] = 0;
  for (int l = 0; l < cfg->num_hidden_layers && n + 16 < out_len; l++)
    if (cfg->layer_kind[l] == kind) n += (size_t)snprintf(out + n, out_len - n, "%s%d", n ? ", " : "", l);
  if (!n) snprintf(out, out_len, "none");
}

/* --layer-set L:KEY=VALUE where the setting changes nothing on layer L: the indexer settings on a
** layer without an indexer (sliding, HCA), the compressed-RoPE settings on a sliding layer. A
** warning naming the layer and its kind, not an error (issue 13 #7). */
static void warn_layer_set(const st_config *cfg, const char *spec, const char *colon) {
  const char *kv = colon + 1, *eq = strchr(kv, '=');
  size_t klen = eq ? (size_t)(eq - kv) : strlen(kv);
  static const char *const indexer_keys[] = {"index_k", "index_q", "rotate", "topk", "index_rope"};
  static const char *const compressed_keys[] = {"compress_rope_theta", "yarn"};
  int indexer = 0, compressed = 0;
  for (size_t i = 0; i < sizeof indexer_keys / sizeof *indexer_keys; i++)
    if (strlen(indexer_keys[i]) == klen && !strncmp(kv, indexer_keys[i], klen)) indexer = 1;
  for (size_t i = 0; i < sizeof compressed_keys / sizeof *compressed_keys; i++)
    if (strlen(compressed_keys[i]) == klen && !strncmp(kv, compressed_keys[i], klen)) compressed = 1;
  if (!indexer && !compressed) return;
  for (const char *p = spec; p < colon;) {
    char *end;
    long layer = strtol(p, &end, 10);
    st_layer_kind kind = cfg->layer_kind[layer];
    if ((indexer && kind != ST_LAYER_CSA) || (compressed && kind == ST_LAYER_SLIDING)) {
      char csa[256];
      layers_of_kind(cfg, ST_LAYER_CSA, csa, sizeof csa);
      if (indexer)
        fprintf(stderr, "warning: --layer-set '%s': layer %ld is a%s %s layer, which has no indexer: "
                "%.*s changes nothing there (the CSA layers, with an indexer: %s)\n", spec, layer,
                kind == ST_LAYER_HCA ? "n" : "", layer_kind_name(kind), (int)klen, kv, csa);
      else
        fprintf(stderr, "warning: --layer-set '%s': layer %ld is a sliding-window layer, which has no "
                "compressor: %.*s changes nothing there\n", spec, layer, (int)klen, kv);
    }
    p = *end == ',' ? end + 1 : end;
  }
}

static int32_t argmax(const float *v, int n) { /* ties to the lower id, as st_generate_greedy */
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

/* st_generate_greedy, with the prompt fed in pieces (a multiple of the engine's chunk, about 1024
** tokens) so that a progress line can follow it: the engine's results are bit-identical for any
** chunking (tests/test_digests.c), and the pieces keep its chunk boundaries anyway. Logits are
** computed only for the last piece, as one call would. Generated ids follow the prompt in tokens. */
static st_status generate(st_session *s, const st_config *cfg, int32_t *tokens, int n_prompt, int max_new,
                          int stop_at_eos, int chunk, int quiet, int *n_out) {
  *n_out = 0;
  int V = cfg->vocab_size;
  float *last = malloc(sizeof(float) * (size_t)V);
  if (!last) return st_fail(ST_ENOMEM, "logits");
  int c = chunk > 0 ? chunk : st_session_max_chunk(s), piece = c >= 1024 ? c : (1024 + c - 1) / c * c;
  st_progress pr;
  st_progress_start(&pr, "run", "tokens", (int64_t)n_prompt + max_new, quiet);
  st_status rc = ST_OK;
  for (int done = 0; rc == ST_OK && done < n_prompt;) {
    int n = n_prompt - done < piece ? n_prompt - done : piece;
    rc = st_session_forward(s, tokens + done, n, done + n == n_prompt ? last : NULL, NULL);
    done += n;
    st_progress_update(&pr, done);
  }
  int32_t *out = tokens + n_prompt;
  for (int k = 0; rc == ST_OK && k < max_new; k++) {
    int32_t next = argmax(last, V);
    out[(*n_out)++] = next;
    st_progress_update(&pr, (int64_t)n_prompt + *n_out);
    if (stop_at_eos && next == cfg->eos_token_id) break;
    if (k + 1 < max_new) rc = st_session_forward(s, &next, 1, last, NULL);
  }
  st_progress_end(&pr);
  free(last);
  return rc;
}

int st_cmd_run(int argc, char **argv) {
  run_args a;
  int usage = parse_args(argc, argv, &a);
  if (usage) {
    free(a.taps);
    free(a.layer_sets);
    return usage < 0 ? 0 : usage;
  }
  int threads = st_opts_apply_threads(a.threads);
  int exit_code = 1;
  int32_t *tokens = NULL;
  int n_prompt = 0, n_generated = 0;
  st_model *model = NULL;
  st_backend backend = {0};
  st_session *session = NULL;
  st_recorder *recorder = NULL;
  st_taps taps = {0};
  char *config_text = NULL, *command_line = NULL, *model_copy = NULL;
  char trace_path[4096], settings_json[2048];
  uint8_t *alt_layers = NULL;
  st_needle_summary *needle_summary = NULL;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);

  request_prompt rq = {0};
  char *request_id = rq.id;
  int64_t server_count = -1;
  if (st_opts_backend_available(a.backend)) goto out;
  /* A trace path already taken is refused now, not after the run (issue 14 #1). */
  if (a.trace && st_recorder_check_target(a.trace, a.store, a.force)) goto out;
  if (a.request) {
    if (prompt_from_request(a.request, a.store, a.model, a.render, &tokens, &n_prompt, &rq))
      goto out;
    server_count = rq.server_count;
    const char *profile = a.render ? a.render : "reference";
    if (!a.json && rq.from_server) {
      printf("request %s (%s): using the %d prompt token ids the server returned (%s)\n",
             request_id, rq.api, n_prompt, rq.from);
      if (rq.n_rendered < 0)
        printf("  no rendering to compare them with: %s\n", rq.render_error);
      else if (rq.first_diff < 0)
        printf("  rendering with profile %s agrees with the server's ids: the same %d ids\n",
               profile, rq.n_rendered);
      else
        printf("  rendering with profile %s DIFFERS from the server's ids at position %lld: server "
               "%s, rendered %s (server %d ids, rendered %d)\n", profile,
               (long long)rq.first_diff, rq.server_tok, rq.rendered_tok, n_prompt, rq.n_rendered);
      if (server_count >= 0 && server_count != n_prompt)
        printf("  note: the server's usage counted %lld prompt tokens\n", (long long)server_count);
    } else if (!a.json) {
      printf("request %s (%s): %d prompt tokens rendered with profile %s", request_id, rq.api,
             n_prompt, profile);
      if (server_count >= 0)
        printf("; the server counted %lld: %s\n", (long long)server_count,
               server_count == n_prompt ? "they agree" : "they DIFFER");
      else
        printf("; the server reported no prompt token count\n");
    }
  } else if (st_cli_read_token_ids(a.prompt_path, &tokens, &n_prompt)) {
    goto out;
  }
  /* A token range that starts past every position the run forwards records nothing: refused,
  ** saying how many tokens there are (issue 13 #7). */
  if (check_positions(a.positions, n_prompt, a.max_new)) {
    exit_code = 2;
    goto out;
  }
  if (st_model_open(a.model, &model) || st_model_load_all(model)) goto out;
  if (st_backend_open(a.backend ? a.backend : ST_BACKEND_DEFAULT, &backend)) goto out;
  const st_config *cfg = model->cfg;
  int32_t *grown = realloc(tokens, sizeof(int32_t) * ((size_t)n_prompt + a.max_new));
  if (!grown) { st_fail(ST_ENOMEM, "token buffer"); goto out; }
  tokens = grown;
  for (int i = 0; i < n_prompt; i++)
    if (tokens[i] >= cfg->vocab_size) {
      st_fail(ST_EINVAL, "%s: token %d at position %d is outside the model's vocabulary [0, %d)",
              a.prompt_path ? a.prompt_path : a.request, tokens[i], i, cfg->vocab_size);
      goto out;
    }
  if (a.needle_text &&
      st_needle_locate(a.model, tokens, n_prompt, a.needle_text, &a.needle_start, &a.needle_end))
    goto out;
  if (a.needle_end > a.needle_start) {
    if (a.needle_end > n_prompt) {
      st_fail(ST_EINVAL, "--needle-tokens %lld:%lld reaches past the %d prompt tokens",
              (long long)a.needle_start, (long long)a.needle_end, n_prompt);
      goto out;
    }
    a.taps[a.n_taps++] = "layers.*.indexer.*"; /* the verdicts are computed from these */
  }
  if (st_taps_arm(&taps, cfg->num_hidden_layers, a.taps, a.n_taps)) goto out;

  /* per-layer settings: one alternate set over the listed layers */
  alt_layers = calloc((size_t)cfg->num_hidden_layers, 1);
  st_settings alt = a.settings;
  if (!alt_layers) { st_fail(ST_ENOMEM, "layer settings"); goto out; }
  for (int k = 0; k < a.n_layer_sets; k++) {
    const char *colon = strchr(a.layer_sets[k], ':');
    if (!colon) { st_fail(ST_EINVAL, "--layer-set '%s': expected LAYERS:KEY=VALUE", a.layer_sets[k]); goto out; }
    for (const char *p = a.layer_sets[k]; p < colon;) {
      char *end;
      long layer = strtol(p, &end, 10);
      if (end == p || layer < 0 || layer >= cfg->num_hidden_layers) {
        st_fail(ST_EINVAL, "--layer-set '%s': layers are 0..%d", a.layer_sets[k], cfg->num_hidden_layers - 1);
        goto out;
      }
      alt_layers[layer] = 1;
      p = *end == ',' ? end + 1 : end;
      if (p < colon && *end != ',') { st_fail(ST_EINVAL, "--layer-set '%s': expected LAYERS:KEY=VALUE", a.layer_sets[k]); goto out; }
    }
    if (st_settings_set(&alt, colon + 1)) goto out;
    warn_layer_set(cfg, a.layer_sets[k], colon);
  }

  st_settings resolved = a.settings;
  st_settings_resolve(&resolved, cfg);
  int n_json = st_settings_json(&resolved, settings_json, sizeof settings_json);
  if (a.n_layer_sets) { /* {"...":..., "alt_layers":[3], "alt_settings":{...}} */
    st_settings alt_resolved = alt;
    st_settings_resolve(&alt_resolved, cfg);
    n_json--; /* drop the closing brace */
    n_json += snprintf(settings_json + n_json, sizeof settings_json - (size_t)n_json, ",\"alt_layers\":[");
    for (int l = 0, first = 1; l < cfg->num_hidden_layers; l++)
      if (alt_layers[l]) {
        n_json += snprintf(settings_json + n_json, sizeof settings_json - (size_t)n_json, "%s%d", first ? "" : ",", l);
        first = 0;
      }
    n_json += snprintf(settings_json + n_json, sizeof settings_json - (size_t)n_json, "],\"alt_settings\":");
    n_json += st_settings_json(&alt_resolved, settings_json + n_json, sizeof settings_json - (size_t)n_json);
    snprintf(settings_json + n_json, sizeof settings_json - (size_t)n_json, "}");
  }
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", a.model);
  config_text = st_read_text_file(config_path);
  if (!(command_line = st_cli_join_args("sparsetrace", argc, argv))) { st_fail(ST_ENOMEM, "command line"); goto out; }
  model_copy = strdup(a.model);
  st_run_meta meta = {
    .model_dir = a.model, .model_name = basename(model_copy), .settings_json = settings_json,
    .config_json = config_text ? config_text : "{}", .backend = backend.ops->name,
    .kernel_mode = backend.ops->kernel_mode, .threads = threads,
    .command_line = command_line, .positions = a.positions, .n_layers = cfg->num_hidden_layers, .force = a.force,
    .request_id = request_id[0] ? request_id : NULL,
    .needle_start = a.needle_start, .needle_end = a.needle_end, .needle_text = a.needle_text};
  st_run_id_new(&meta);
  if (a.trace) snprintf(trace_path, sizeof trace_path, "%s", a.trace);
  else snprintf(trace_path, sizeof trace_path, "%s/runs/%s.h5", a.store, meta.run_id);
  if (st_recorder_open(trace_path, a.store, &meta, n_prompt, &recorder)) goto out;
  taps.sink = st_recorder_sink(recorder);

  st_session_options opt = {.max_tokens = (int64_t)n_prompt + a.max_new, .max_chunk = a.chunk,
                            .settings = a.settings, .taps = &taps,
                            .alt_layers = a.n_layer_sets ? alt_layers : NULL, .alt_settings = alt,
                            .backend = &backend};
  if (st_session_create(model, &opt, &session)) goto out;
  size_t session_bytes = st_session_backend_bytes(session);
  if (generate(session, cfg, tokens, n_prompt, a.max_new, !a.ignore_eos, a.chunk, a.quiet,
               &n_generated))
    goto out;
  /* non-finite weights (warned about at load) and activations: a warning and a trace attribute */
  int64_t nonfinite_logits = st_session_nonfinite_logits(session);
  if (nonfinite_logits)
    fprintf(stderr, "warning: the logits of %lld position%s held NaN or inf (greedy picks from them are "
            "meaningless)\n", (long long)nonfinite_logits, nonfinite_logits == 1 ? "" : "s");
  if (model->nonfinite_tensors)
    fprintf(stderr, "warning: %d weight tensor%s held NaN or inf (%llu values)\n", model->nonfinite_tensors,
            model->nonfinite_tensors == 1 ? "" : "s", (unsigned long long)model->nonfinite_values);
  st_recorder_note_nonfinite(recorder, model->nonfinite_tensors + nonfinite_logits);
  st_recorder *finishing = recorder;
  recorder = NULL; /* finish frees it, whatever happens */
  if (st_recorder_finish(finishing, tokens, (int64_t)n_prompt + n_generated, n_prompt)) goto out;

  if (a.needle_end > a.needle_start) {
    if (!a.json) printf("needle tokens %lld:%lld%s%s%s\n", (long long)a.needle_start, (long long)a.needle_end,
                        a.needle_text ? " (\"" : "", a.needle_text ? a.needle_text : "", a.needle_text ? "\")" : "");
    if (!(needle_summary = calloc(1, sizeof *needle_summary))) { st_fail(ST_ENOMEM, "needle verdicts"); goto out; }
    if (st_needle_record_verdicts(trace_path, a.model, a.store, a.needle_start, a.needle_end,
                                  a.needle_text, a.json, needle_summary))
      goto out;
  }
  double seconds = seconds_since(&t0);
  char *text = n_generated ? generated_text_json(a.model, tokens + n_prompt, n_generated) : NULL;
  if (a.json) { /* built with jansson: every string escaped, whatever the request id holds */
    json_t *o = json_object(), *gen = json_array();
    json_object_set_new(o, "run_id", json_string(meta.run_id));
    json_object_set_new(o, "trace", json_string(trace_path));
    json_object_set_new(o, "store", json_string(a.store));
    json_object_set_new(o, "n_prompt", json_integer(n_prompt));
    json_object_set_new(o, "n_generated", json_integer(n_generated));
    for (int i = 0; i < n_generated; i++) json_array_append_new(gen, json_integer(tokens[n_prompt + i]));
    json_object_set_new(o, "generated", gen);
    if (text) {
      json_t *t = json_loads(text, JSON_DECODE_ANY, NULL);
      if (t) json_object_set_new(o, "text", t);
    }
    json_t *settings = json_loads(settings_json, 0, NULL);
    json_object_set_new(o, "settings", settings ? settings : json_null());
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "seconds", json_real(round(seconds * 1000) / 1000));
    uint64_t checkpoint_bytes = 0; /* the checkpoint's own size: every tensor as stored */
    for (size_t k = 0; k < st_checkpoint_count(model->checkpoint); k++) {
      st_checkpoint_tensor_info info;
      if (st_checkpoint_info(model->checkpoint, st_checkpoint_name_at(model->checkpoint, k), &info) == ST_OK)
        checkpoint_bytes += info.n_bytes;
    }
    json_object_set_new(o, "backend", json_string(backend.ops->name));
    json_object_set_new(o, "kernel_mode", json_string(backend.ops->kernel_mode));
    json_object_set_new(o, "memory", json_pack("{s:I,s:I,s:I}", "weights", (json_int_t)st_model_weight_bytes(model),
                                               "checkpoint", (json_int_t)checkpoint_bytes,
                                               "session", (json_int_t)session_bytes));
    if (request_id[0]) {
      json_object_set_new(o, "request_id", json_string(request_id));
      json_object_set_new(o, "server_prompt_tokens", server_count >= 0 ? json_integer(server_count) : json_null());
      if (server_count >= 0) json_object_set_new(o, "token_count_agrees", json_boolean(server_count == n_prompt));
      json_object_set_new(o, "prompt_source", json_string(rq.from_server ? "server" : "rendered"));
      if (rq.from_server) {
        json_object_set_new(o, "rendered_prompt_tokens", rq.n_rendered >= 0 ? json_integer(rq.n_rendered) : json_null());
        json_object_set_new(o, "rendering_agrees", rq.n_rendered >= 0 ? json_boolean(rq.first_diff < 0) : json_null());
        json_object_set_new(o, "first_difference", rq.first_diff >= 0 ? json_integer(rq.first_diff) : json_null());
      }
    }
    if (needle_summary) { /* the needle verdict per CSA layer (schemas/needle-verdicts.md) */
      json_t *layers = json_array();
      for (int i = 0; i < needle_summary->n_layers; i++) {
        const st_needle_judgement *j = &needle_summary->judgements[i];
        json_array_append_new(layers, json_pack("{s:i,s:[I,I],s:i,s:i,s:o,s:I,s:I,s:i}",
            "layer", needle_summary->layers[i], "answer_positions", (json_int_t)j->answer_first,
            (json_int_t)j->answer_end, "positions", j->positions, "kept", j->kept, "retrieves",
            j->retrieves < 0 ? json_null() : json_boolean(j->retrieves), "best_rank",
            (json_int_t)j->best_rank, "worst_rank", (json_int_t)j->worst_rank, "topk", j->topk));
      }
      json_object_set_new(o, "needle", json_pack("{s:[I,I],s:o}", "tokens", (json_int_t)a.needle_start,
                                                 (json_int_t)a.needle_end, "layers", layers));
    }
    json_object_set_new(o, "nonfinite_warnings", json_integer(model->nonfinite_tensors + nonfinite_logits));
    char *dumped = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(o);
    if (!dumped) { free(text); st_fail(ST_ENOMEM, "run --json output"); goto out; }
    printf("%s\n", dumped);
    free(dumped);
  } else {
    printf("run %s: %d prompt tokens, %d generated", meta.run_id, n_prompt, n_generated);
    if (n_generated) {
      printf(" [");
      for (int i = 0; i < n_generated; i++) printf("%s%d", i ? " " : "", tokens[n_prompt + i]);
      printf("]");
    }
    printf(" in %.2f s (%s, %d threads)\n", seconds, backend.ops->name, threads);
    if (text) printf("text %s\n", text);
    printf("settings %s\ntrace: %s\nindex: %s/index.sqlite\n", settings_json, trace_path, a.store);
  }
  free(text);
  exit_code = 0;
out:
  if (exit_code) st_cli_report_error("run");
  st_recorder_abort(recorder);
  st_session_free(session);
  st_model_close(model);
  st_backend_close(&backend);
  st_taps_free(&taps);
  free(tokens);
  free(config_text);
  free(command_line);
  free(model_copy);
  free(a.taps);
  free(a.layer_sets);
  free(alt_layers);
  free(needle_summary);
  return exit_code;
}

/*
** harness.c — `needle sweep`: the grid of recall attempts against the engine or a server, and
** their rows in needle_attempts (harness.h).
*/
#define _GNU_SOURCE
#include "harness.h"
#include "common/build_info.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern char **environ;

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/model.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "recorder/index.h"
#include "recorder/recorder.h"
#include "replayer/needle.h"

/* ---------------------------------------------------------------- names, defaults */

static const char *const api_names[] = {"engine", "anthropic", "openai", "responses"};

const char *st_harness_api_name(st_harness_api api) {
  return api >= 0 && api <= ST_HARNESS_RESPONSES ? api_names[api] : "?";
}

st_status st_harness_api_parse(const char *name, st_harness_api *out) {
  for (int i = ST_HARNESS_ANTHROPIC; i <= ST_HARNESS_RESPONSES; i++)
    if (!strcmp(name, api_names[i])) return *out = (st_harness_api)i, ST_OK;
  if (!strcmp(name, "chat") || !strcmp(name, "openai-chat")) return *out = ST_HARNESS_OPENAI, ST_OK;
  return st_fail(ST_EINVAL, "--api \"%s\": expected anthropic, openai or responses", name);
}

void st_harness_options_default(st_harness_options *o) {
  memset(o, 0, sizeof *o);
  st_settings_default(&o->settings);
  st_chat_options_default(&o->render);
  o->thinking = 0;
  o->format = ST_NEEDLE_OPENAI_CHAT;
  o->kind = ST_NEEDLE_PATH;
  o->first_seed = 1;
  o->n_seeds = 3;
  o->max_new = 64;
  o->store = ST_DEFAULT_STORE;
  o->tap_positions = "last";
  o->timeout_s = 600;
}

/* ---------------------------------------------------------------- small helpers */

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* A copy of n bytes with invalid UTF-8 replaced by U+FFFD and NUL by U+2400, so that answers
** can go to SQLite text and JSON output. */
static char *utf8_clean(const char *s, size_t n) {
  st_buf t = {0};
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    unsigned c = *p;
    size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    int ok = len > 0 && (size_t)(end - p) >= len && !(len == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < len; k++) ok = (p[k] & 0xC0) == 0x80;
    if (ok && len == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0))) ok = 0;
    if (ok && len == 4 && ((c == 0xF0 && p[1] < 0x90) || c > 0xF4 || (c == 0xF4 && p[1] >= 0x90))) ok = 0;
    if (!ok) {
      st_buf_str(&t, "\xEF\xBF\xBD");
      p++;
    } else if (c == 0) {
      st_buf_str(&t, "\xE2\x90\x80");
      p++;
    } else {
      st_buf_add(&t, (const char *)p, len);
      p += len;
    }
  }
  if (t.failed) {
    st_buf_free(&t);
    return NULL;
  }
  return st_buf_take(&t, NULL);
}

static char *errdup(void) {
  const char *m = st_errmsg();
  return strdup(m && *m ? m : "unknown error");
}

/* ---------------------------------------------------------------- answers */

static json_t *get_path(json_t *v, const char *a, const char *b) {
  v = json_object_get(v, a);
  return b ? json_object_get(v, b) : v;
}

st_status st_harness_answer_text(st_harness_api api, const char *body, size_t len, char **text,
                                 int64_t *prompt_tokens) {
  *text = NULL;
  *prompt_tokens = -1;
  json_error_t e;
  json_t *root = json_loadb(body, len, 0, &e);
  if (!root) return st_fail(ST_EFORMAT, "the answer is not JSON (line %d: %s)", e.line, e.text);
  st_buf t = {0};
  int found = 0;
  size_t i, k;
  json_t *item, *part;
  if (api == ST_HARNESS_ANTHROPIC) {
    json_t *content = json_object_get(root, "content");
    found = json_is_array(content);
    json_array_foreach(content, i, part) {
      const char *type = json_string_value(json_object_get(part, "type"));
      json_t *s = json_object_get(part, "text");
      if (type && !strcmp(type, "text") && json_is_string(s)) st_buf_add(&t, json_string_value(s), json_string_length(s));
    }
    json_t *u = json_object_get(root, "usage");
    if (json_is_integer(json_object_get(u, "input_tokens")))
      *prompt_tokens = json_integer_value(json_object_get(u, "input_tokens")) +
                       json_integer_value(json_object_get(u, "cache_read_input_tokens")) +
                       json_integer_value(json_object_get(u, "cache_creation_input_tokens"));
  } else if (api == ST_HARNESS_OPENAI) {
    json_t *msg = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message");
    json_t *c = json_object_get(msg, "content");
    found = json_is_object(msg);
    if (json_is_string(c)) st_buf_add(&t, json_string_value(c), json_string_length(c));
    else if (json_is_array(c)) /* content parts */
      json_array_foreach(c, i, part) {
        json_t *s = json_object_get(part, "text");
        if (json_is_string(s)) st_buf_add(&t, json_string_value(s), json_string_length(s));
      }
    json_t *pt = get_path(root, "usage", "prompt_tokens");
    if (json_is_integer(pt)) *prompt_tokens = json_integer_value(pt);
  } else {
    json_t *ot = json_object_get(root, "output_text");
    if (json_is_string(ot)) {
      found = 1;
      st_buf_add(&t, json_string_value(ot), json_string_length(ot));
    } else {
      json_t *output = json_object_get(root, "output");
      found = json_is_array(output);
      json_array_foreach(output, i, item) {
        const char *type = json_string_value(json_object_get(item, "type"));
        if (!type || strcmp(type, "message")) continue;
        json_array_foreach(json_object_get(item, "content"), k, part) {
          const char *pt = json_string_value(json_object_get(part, "type"));
          json_t *s = json_object_get(part, "text");
          if (pt && !strcmp(pt, "output_text") && json_is_string(s)) st_buf_add(&t, json_string_value(s), json_string_length(s));
        }
      }
    }
    json_t *it = get_path(root, "usage", "input_tokens");
    if (json_is_integer(it)) *prompt_tokens = json_integer_value(it);
  }
  json_decref(root);
  if (!found) {
    st_buf_free(&t);
    return st_fail(ST_EFORMAT, "the answer holds no %s", api == ST_HARNESS_ANTHROPIC ? "content list"
                   : api == ST_HARNESS_OPENAI ? "choices[0].message" : "output");
  }
  st_status rc = st_buf_status(&t, "answer");
  if (rc) return rc;
  *text = st_buf_take(&t, NULL);
  return ST_OK;
}

/* ---------------------------------------------------------------- the store */

struct st_harness {
  st_harness_options o;     /* a copy; its pointers are the caller's */
  st_index *ix;
  sqlite3_stmt *insert;
  char target[8192];        /* engine: model dir (or "BINARY (model DIR)"); server: the last URL */
  char settings_json[2048]; /* engine: resolved settings; server / binary: the --set pairs */
  /* engine */
  st_model *model;
  st_tokenizer *tok;
  st_taps taps;
  char *config_text;
  char *name_copy;
  const char *model_name;
  char url[8192];
  int threads;
  st_backend backend;
  st_needle_summary needle; /* the last engine attempt's needle verdicts */
};
typedef struct st_harness sweep;

/* The API an attempt speaks: the engine's, or for a server the one of the attempt's request
** format (a needle sweep's --api sets the format; a scoreboard's corpus names it per case). */
static st_harness_api attempt_api(const sweep *w, const st_harness_attempt *a) {
  if (w->o.api == ST_HARNESS_ENGINE) return ST_HARNESS_ENGINE;
  return a->format == ST_NEEDLE_ANTHROPIC ? ST_HARNESS_ANTHROPIC
       : a->format == ST_NEEDLE_OPENAI_CHAT ? ST_HARNESS_OPENAI : ST_HARNESS_RESPONSES;
}

st_needle_format st_harness_api_format(st_harness_api api) {
  return api == ST_HARNESS_ANTHROPIC ? ST_NEEDLE_ANTHROPIC
       : api == ST_HARNESS_RESPONSES ? ST_NEEDLE_OPENAI_RESPONSES : ST_NEEDLE_OPENAI_CHAT;
}

int st_harness_answer_passes(const char *answer, const char *expected) {
  return answer && expected && *expected && strstr(answer, expected) != NULL;
}

static const char insert_sql[] =
  "INSERT INTO needle_attempts (sweep_id, created_at, target, api, format, render, thinking, tokens_requested, "
  "tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind, needle, expected, "
  "answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s, shape, decoys, "
  "vocab_tokens_min, vocab_tokens_max) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";

st_status st_harness_store(st_harness *w, const char *sweep_id, st_harness_attempt *a) {
  const st_harness_options *o = &w->o;
  int has_prompt = a->needle[0] != 0;
  st_harness_api api = attempt_api(w, a);
  sqlite3_stmt *s = w->insert;
  char now[64];
  st_utc_now(now, sizeof now);
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  int i = 1;
  sqlite3_bind_text(s, i++, sweep_id, -1, SQLITE_STATIC);
  sqlite3_bind_text(s, i++, now, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, i++, a->target[0] ? a->target : w->target, -1, SQLITE_STATIC);
  sqlite3_bind_text(s, i++, st_harness_api_name(api), -1, SQLITE_STATIC);
  sqlite3_bind_text(s, i++, st_needle_format_name(a->format), -1, SQLITE_STATIC);
  if (api == ST_HARNESS_ENGINE) sqlite3_bind_text(s, i, st_render_profile_name(o->render.profile), -1, SQLITE_STATIC);
  i++;
  if (o->thinking >= 0) sqlite3_bind_int(s, i, o->thinking);
  i++;
  sqlite3_bind_int64(s, i++, a->tokens_requested);
  if (has_prompt) {
    sqlite3_bind_int64(s, i++, a->tokens_actual);
    sqlite3_bind_text(s, i++, a->measured ? "tokenizer" : "estimate", -1, SQLITE_STATIC);
  } else {
    i += 2;
  }
  if (a->tokens_reported >= 0) sqlite3_bind_int64(s, i, a->tokens_reported);
  i++;
  sqlite3_bind_double(s, i++, a->position);
  if (has_prompt) sqlite3_bind_double(s, i, a->position_actual);
  i++;
  sqlite3_bind_int64(s, i++, (int64_t)a->seed);
  sqlite3_bind_text(s, i++, st_needle_kind_name(a->kind), -1, SQLITE_STATIC);
  sqlite3_bind_text(s, i++, a->needle, -1, SQLITE_STATIC);
  sqlite3_bind_text(s, i++, a->expected, -1, SQLITE_STATIC);
  if (a->answer) sqlite3_bind_text(s, i, a->answer, -1, SQLITE_STATIC);
  i++;
  sqlite3_bind_int(s, i++, a->pass);
  if (a->run_id[0]) sqlite3_bind_text(s, i, a->run_id, -1, SQLITE_STATIC);
  i++;
  if (a->needle_end > a->needle_start && a->needle_start >= 0) {
    sqlite3_bind_int64(s, i, a->needle_start);
    sqlite3_bind_int64(s, i + 1, a->needle_end);
  }
  i += 2;
  sqlite3_bind_int(s, i++, o->max_new);
  sqlite3_bind_text(s, i++, w->settings_json, -1, SQLITE_STATIC);
  if (a->error) sqlite3_bind_text(s, i, a->error, -1, SQLITE_STATIC);
  i++;
  sqlite3_bind_double(s, i++, a->seconds);
  sqlite3_bind_text(s, i++, st_needle_shape_name(a->shape), -1, SQLITE_STATIC);
  sqlite3_bind_int(s, i++, a->decoys);
  if (a->vocab_tokens[0]) {
    sqlite3_bind_int(s, i, a->vocab_tokens[0]);
    sqlite3_bind_int(s, i + 1, a->vocab_tokens[1]);
  }
  i += 2;
  if (sqlite3_step(s) != SQLITE_DONE)
    return st_fail(ST_ESQLITE, "%s: storing a needle attempt: %s", st_index_path(w->ix), sqlite3_errmsg(st_index_db(w->ix)));
  a->attempt_id = sqlite3_last_insert_rowid(st_index_db(w->ix));
  sqlite3_reset(s);
  return ST_OK;
}

/* ---------------------------------------------------------------- one attempt */

static void spec_for(const sweep *w, st_harness_attempt *a, st_needle_format format, st_needle_spec *sp) {
  const st_harness_options *o = &w->o;
  st_needle_spec_default(sp);
  sp->tokens = a->tokens_requested;
  sp->position = a->position;
  sp->seed = a->seed;
  sp->kind = a->kind;
  sp->shape = a->shape;
  sp->decoys = a->decoys;
  sp->vocab_tokens[0] = a->vocab_tokens[0];
  sp->vocab_tokens[1] = a->vocab_tokens[1];
  sp->format = format;
  sp->tok = w->tok;
  sp->render = o->render;
  if (o->thinking >= 0) sp->render.thinking = o->thinking;
  sp->model_name = w->model_name;
  sp->max_tokens = o->max_new;
  sp->temperature = 0;
  sp->thinking = o->thinking;
}

static void take_prompt_facts(st_harness_attempt *a, const st_needle_prompt *np) {
  snprintf(a->needle, sizeof a->needle, "%s", np->line);
  snprintf(a->expected, sizeof a->expected, "%s", np->value);
  a->tokens_actual = np->tokens;
  a->measured = np->measured;
  a->position_actual = np->position;
}

/* Runs the engine on the prompt; the per-attempt failure message goes to a->error. */
static void engine_attempt(sweep *w, st_harness_attempt *a) {
  const st_harness_options *o = &w->o;
  const st_config *cfg = w->model->cfg;
  st_recorder *rec = NULL;
  st_session *session = NULL;
  int32_t *tokens = NULL;
  char *text = NULL;
  char trace_path[4096];
  int n_gen = 0;
  size_t n = 0;
  int n_prompt;
  st_needle_prompt np;
  st_needle_spec sp;
  spec_for(w, a, a->format, &sp);
  if (st_needle_make(&sp, &np)) goto fail;
  take_prompt_facts(a, &np);
  n = np.ids.n;
  if (n == 0 || n > INT32_MAX - (size_t)o->max_new) { st_fail(ST_EINVAL, "prompt of %zu tokens", n); goto fail; }
  for (size_t i = 0; i < n; i++)
    if (np.ids.ids[i] < 0 || np.ids.ids[i] >= cfg->vocab_size) {
      st_fail(ST_EINVAL, "token %d (\"%s\") at position %zu is outside the model's vocabulary [0, %d): "
              "the tokenizer does not fit the model", np.ids.ids[i],
              st_tokenizer_token_text(w->tok, np.ids.ids[i]) ? st_tokenizer_token_text(w->tok, np.ids.ids[i]) : "?",
              i, cfg->vocab_size);
      goto fail;
    }
  n_prompt = (int)n;
  a->needle_start = np.needle_token;
  a->needle_end = np.needle_token_end;
  tokens = malloc(sizeof(int32_t) * (n + (size_t)o->max_new));
  if (!tokens) { st_fail(ST_ENOMEM, "token buffer"); goto fail; }
  memcpy(tokens, np.ids.ids, sizeof(int32_t) * n);

  st_run_meta meta = {
    .model_dir = o->model_dir, .model_name = w->model_name, .settings_json = w->settings_json,
    .config_json = w->config_text ? w->config_text : "{}", .backend = w->backend.ops->name,
    .kernel_mode = w->backend.ops->kernel_mode, .threads = w->threads,
    .command_line = o->command_line ? o->command_line : "sparsetrace needle sweep",
    .positions = o->tap_positions, .n_layers = cfg->num_hidden_layers};
  st_run_id_new(&meta);
  snprintf(trace_path, sizeof trace_path, "%s/runs/%s.h5", o->store, meta.run_id);
  if (st_recorder_open(trace_path, o->store, &meta, n_prompt, &rec)) goto fail;
  w->taps.sink = st_recorder_sink(rec);
  st_session_options so = {.max_tokens = (int64_t)n_prompt + o->max_new, .settings = o->settings,
                           .taps = &w->taps, .backend = &w->backend};
  if (st_session_create(w->model, &so, &session)) goto fail;
  if (st_generate_greedy(session, tokens, n_prompt, o->max_new, 1, tokens + n_prompt, &n_gen)) goto fail;
  st_session_free(session);
  session = NULL;
  st_recorder *finishing = rec;
  rec = NULL;
  w->taps.sink = NULL;
  if (st_recorder_finish(finishing, tokens, (int64_t)n_prompt + n_gen, n_prompt)) goto fail;
  snprintf(a->run_id, sizeof a->run_id, "%s", meta.run_id);
  if (st_needle_record_verdicts(trace_path, o->model_dir, o->store, a->needle_start, a->needle_end, np.line, 1,
                                &w->needle))
    goto fail;
  a->needle_layers = w->needle.n_layers;
  a->needle_retrieving = w->needle.n_retrieving;
  for (int i = 0, len = 0; i < w->needle.n_layers; i++)
    if (w->needle.judgements[i].retrieves == 1 && len < (int)sizeof a->needle_retrieving_layers - 8)
      len += snprintf(a->needle_retrieving_layers + len, sizeof a->needle_retrieving_layers - (size_t)len, "%s%d",
                      len ? "," : "", w->needle.layers[i]);
  size_t len = 0;
  if (st_tokenizer_decode(w->tok, tokens + n_prompt, (size_t)n_gen, ST_TOK_SKIP_SPECIAL, &text, &len)) goto fail;
  a->answer = utf8_clean(text, len);
  if (!a->answer) { st_fail(ST_ENOMEM, "answer"); goto fail; }
  a->pass = st_harness_answer_passes(a->answer, a->expected);
  goto done;
fail:
  a->error = errdup();
  a->pass = 0;
done:
  w->taps.sink = NULL;
  st_recorder_abort(rec);
  st_session_free(session);
  free(tokens);
  free(text);
  st_needle_prompt_free(&np);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Base URL → the endpoint posted to: ".../v1/messages" etc. are kept, ".../v1" gets the path,
** anything else gets "/v1/" + path. */
static void endpoint_url(const char *base, st_harness_api api, char *out, size_t size) {
  const char *path = api == ST_HARNESS_ANTHROPIC ? "messages" : api == ST_HARNESS_OPENAI ? "chat/completions" : "responses";
  char b[4096];
  snprintf(b, sizeof b, "%s", base);
  size_t n = strlen(b);
  while (n > 0 && b[n - 1] == '/') b[--n] = 0;
  char full[64];
  snprintf(full, sizeof full, "/%s", path);
  if (ends_with(b, full)) snprintf(out, size, "%s", b);
  else if (ends_with(b, "/v1")) snprintf(out, size, "%s/%s", b, path);
  else snprintf(out, size, "%s/v1/%s", b, path);
}

static size_t collect(char *data, size_t size, size_t nmemb, void *ctx) {
  st_buf *t = ctx;
  st_buf_add(t, data, size * nmemb);
  return t->failed ? 0 : size * nmemb;
}

static void server_attempt(sweep *w, st_harness_attempt *a) {
  const st_harness_options *o = &w->o;
  st_harness_api api = attempt_api(w, a);
  st_needle_format format = a->format;
  endpoint_url(o->endpoint, api, w->url, sizeof w->url);
  snprintf(a->target, sizeof a->target, "%s", w->url);
  st_needle_prompt np;
  st_needle_spec sp;
  char *body = NULL, *text = NULL;
  st_buf reply = {0};
  CURL *curl = NULL;
  struct curl_slist *headers = NULL;
  spec_for(w, a, format, &sp);
  if (st_needle_make(&sp, &np)) goto fail;
  take_prompt_facts(a, &np);
  body = json_dumps(np.request, JSON_COMPACT | JSON_PRESERVE_ORDER);
  curl = curl_easy_init();
  if (!body || !curl) { st_fail(ST_ENOMEM, "request"); goto fail; }
  const char *key = getenv("ST_API_KEY");
  if (!key || !*key) key = getenv(api == ST_HARNESS_ANTHROPIC ? "ANTHROPIC_API_KEY" : "OPENAI_API_KEY");
  char auth[1024];
  headers = curl_slist_append(headers, "Content-Type: application/json");
  if (api == ST_HARNESS_ANTHROPIC) {
    headers = curl_slist_append(headers, "anthropic-version: 2023-06-01");
    if (key && *key) {
      snprintf(auth, sizeof auth, "x-api-key: %s", key);
      headers = curl_slist_append(headers, auth);
    }
  } else if (key && *key) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    headers = curl_slist_append(headers, auth);
  }
  curl_easy_setopt(curl, CURLOPT_URL, w->url);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s * 1000));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  char agent[64];
  snprintf(agent, sizeof agent, "sparsetrace-needle/%s", st_build_revision);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, agent);
  CURLcode cc = curl_easy_perform(curl);
  if (cc != CURLE_OK) {
    st_fail(cc == CURLE_OPERATION_TIMEDOUT ? ST_ETIMEOUT : ST_EUPSTREAM, "POST %s: %s", w->url, curl_easy_strerror(cc));
    goto fail;
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  if (reply.failed) { st_fail(ST_ENOMEM, "answer body"); goto fail; }
  if (status != 200) {
    char *clean = utf8_clean(reply.data ? reply.data : "", reply.len > 400 ? 400 : reply.len);
    st_fail(ST_EUPSTREAM, "POST %s: HTTP %ld: %s", w->url, status, clean ? clean : "");
    free(clean);
    goto fail;
  }
  if (st_harness_answer_text(api, reply.data ? reply.data : "", reply.len, &text, &a->tokens_reported)) goto fail;
  a->answer = utf8_clean(text, strlen(text));
  if (!a->answer) { st_fail(ST_ENOMEM, "answer"); goto fail; }
  a->pass = st_harness_answer_passes(a->answer, a->expected);
  goto done;
fail:
  a->error = errdup();
  a->pass = 0;
done:
  curl_slist_free_all(headers);
  if (curl) curl_easy_cleanup(curl);
  free(body);
  free(text);
  st_buf_free(&reply);
  st_needle_prompt_free(&np);
}

/* ---------------------------------------------------------------- the sweep */

static st_status settings_for_server(const st_harness_options *o, char *buf, size_t size) {
  json_t *obj = json_object();
  for (int i = 0; i < o->n_set; i++) {
    const char *eq = strchr(o->set_args[i], '=');
    if (!eq || eq == o->set_args[i]) {
      json_decref(obj);
      return st_fail(ST_EINVAL, "--set '%s': expected KEY=VALUE", o->set_args[i]);
    }
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - o->set_args[i]), o->set_args[i]);
    json_object_set_new(obj, key, json_string(eq + 1));
  }
  char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(obj);
  if (!s) return st_fail(ST_EINVAL, "--set values must be UTF-8");
  if (strlen(s) >= size) {
    free(s);
    return st_fail(ST_EINVAL, "--set values too long");
  }
  snprintf(buf, size, "%s", s);
  free(s);
  return ST_OK;
}

/* ---------------------------------------------------------------- another build */

/* The engine of another sparsetrace build: `BINARY needle sweep` for this one cell (one size,
** one position, one seed), its JSON read back. The other build records its run in its own store
** (binary_store: an older or newer build may have another index schema); this attempt row keeps
** the answer, and the pass is judged here again with st_harness_answer_passes, one rule for
** every target. */
static void binary_attempt(sweep *w, st_harness_attempt *a) {
  const st_harness_options *o = &w->o;
  char tokens[32], position[32], seed[32], max_new[32], err_path[4200];
  char *argv[64 + 2 * ST_HARNESS_MAX_SETS];
  int n = 0, out_pipe[2] = {-1, -1}, status = 0;
  st_buf reply = {0};
  json_t *root = NULL;
  pid_t pid = -1;
  posix_spawn_file_actions_t fa;
  int fa_ready = 0;
  snprintf(tokens, sizeof tokens, "%lld", (long long)a->tokens_requested);
  snprintf(position, sizeof position, "%.17g", a->position);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->seed);
  snprintf(max_new, sizeof max_new, "%d", o->max_new);
  snprintf(err_path, sizeof err_path, "%s/last-stderr.txt", o->binary_store);
  if (o->n_set > ST_HARNESS_MAX_SETS) { st_fail(ST_EINVAL, "more than %d settings", ST_HARNESS_MAX_SETS); goto fail; }
  argv[n++] = (char *)o->binary;
  argv[n++] = "needle";
  argv[n++] = "sweep";
  argv[n++] = "--model", argv[n++] = (char *)o->model_dir;
  argv[n++] = "--tokens", argv[n++] = tokens;
  argv[n++] = "--positions", argv[n++] = position;
  argv[n++] = "--seeds", argv[n++] = "1";
  argv[n++] = "--first-seed", argv[n++] = seed;
  argv[n++] = "--kind", argv[n++] = (char *)st_needle_kind_name(a->kind);
  if (a->shape != ST_NEEDLE_SHAPE_AGENT) argv[n++] = "--shape", argv[n++] = (char *)st_needle_shape_name(a->shape);
  char decoys[16];
  snprintf(decoys, sizeof decoys, "%d", a->decoys);
  if (a->decoys) argv[n++] = "--decoys", argv[n++] = decoys; /* a build older than decoys is asked for none */
  char vocab_tokens[32];
  snprintf(vocab_tokens, sizeof vocab_tokens, "%d-%d", a->vocab_tokens[0], a->vocab_tokens[1]);
  if (a->vocab_tokens[0]) argv[n++] = "--vocab-tokens", argv[n++] = vocab_tokens;
  argv[n++] = "--format", argv[n++] = (char *)st_needle_format_name(a->format);
  argv[n++] = "--render", argv[n++] = (char *)st_render_profile_name(o->render.profile);
  argv[n++] = "--thinking", argv[n++] = o->thinking < 0 ? "server" : o->thinking ? "on" : "off";
  argv[n++] = "--max-new-tokens", argv[n++] = max_new;
  argv[n++] = "--store", argv[n++] = (char *)o->binary_store;
  if (o->backend) argv[n++] = "--backend", argv[n++] = (char *)o->backend;
  if (o->tokenizer_dir) argv[n++] = "--tokenizer", argv[n++] = (char *)o->tokenizer_dir;
  for (int i = 0; i < o->n_set; i++) argv[n++] = "--set", argv[n++] = (char *)o->set_args[i];
  argv[n++] = "--json";
  argv[n++] = "--quiet";
  argv[n] = NULL;
  if (st_make_dirs(o->binary_store)) goto fail;
  if (pipe(out_pipe)) { st_fail(ST_EIO, "pipe: %s", strerror(errno)); goto fail; }
  posix_spawn_file_actions_init(&fa);
  fa_ready = 1;
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  posix_spawn_file_actions_addclose(&fa, out_pipe[1]);
  posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int e = posix_spawn(&pid, o->binary, &fa, NULL, argv, environ);
  if (e) { pid = -1; st_fail(ST_EIO, "%s: cannot start it: %s", o->binary, strerror(e)); goto fail; }
  close(out_pipe[1]);
  out_pipe[1] = -1;
  /* read its answer and wait for it, both within the case's timeout: a build that hangs is
  ** killed and the case stored with the reason; the scoreboard goes on with the next */
  struct timespec started;
  clock_gettime(CLOCK_MONOTONIC, &started);
  char chunk[65536];
  int timed_out = 0;
  for (;;) {
    int left_ms = (int)ST_MIN((o->timeout_s - seconds_since(&started)) * 1000 + 1, 60e3);
    if (left_ms <= 0) { timed_out = 1; break; }
    struct pollfd pfd = {.fd = out_pipe[0], .events = POLLIN};
    int ready = poll(&pfd, 1, left_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue; /* the deadline is checked above */
    ssize_t got = read(out_pipe[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    st_buf_add(&reply, chunk, (size_t)got);
  }
  for (;;) { /* its stdout is closed; it may still not exit */
    pid_t r = timed_out ? 0 : waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if (timed_out || seconds_since(&started) >= o->timeout_s) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      timed_out = 1;
      break;
    }
    struct timespec nap = {0, 10 * 1000000L};
    nanosleep(&nap, NULL);
  }
  pid = -1;
  if (timed_out) {
    st_fail(ST_ETIMEOUT, "%s needle sweep gave no answer within %g s (the case's timeout, --timeout): killed",
            o->binary, o->timeout_s);
    goto fail;
  }
  if (reply.failed) { st_fail(ST_ENOMEM, "%s's answer", o->binary); goto fail; }
  json_error_t je;
  root = reply.len ? json_loadb(reply.data, reply.len, 0, &je) : NULL;
  json_t *row = json_array_get(json_object_get(root, "attempt_rows"), 0);
  if (!json_is_object(row)) {
    char *tail = st_read_text_file(err_path);
    size_t tl = tail ? strlen(tail) : 0;
    while (tl && (tail[tl - 1] == '\n' || tail[tl - 1] == ' ')) tail[--tl] = 0;
    const char *shown = tail ? (tl > 300 ? tail + tl - 300 : tail) : "";
    if (WIFEXITED(status))
      st_fail(ST_EUPSTREAM, "%s needle sweep exited %d without an attempt: %s", o->binary, WEXITSTATUS(status), shown);
    else
      st_fail(ST_EUPSTREAM, "%s needle sweep was killed by signal %d: %s", o->binary,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0, shown);
    free(tail);
    goto fail;
  }
  const char *s;
  if ((s = json_string_value(json_object_get(row, "needle")))) snprintf(a->needle, sizeof a->needle, "%s", s);
  if ((s = json_string_value(json_object_get(row, "expected")))) snprintf(a->expected, sizeof a->expected, "%s", s);
  a->tokens_actual = json_integer_value(json_object_get(row, "tokens_actual"));
  a->measured = (s = json_string_value(json_object_get(row, "tokens_measure"))) && !strcmp(s, "tokenizer");
  a->position_actual = json_number_value(json_object_get(row, "position_actual"));
  json_t *span = json_object_get(row, "needle_tokens");
  if (json_array_size(span) == 2) {
    a->needle_start = json_integer_value(json_array_get(span, 0));
    a->needle_end = json_integer_value(json_array_get(span, 1));
  }
  if ((s = json_string_value(json_object_get(row, "run_id"))))
    snprintf(a->foreign_run_id, sizeof a->foreign_run_id, "%s", s);
  if ((s = json_string_value(json_object_get(row, "error")))) {
    st_fail(ST_EUPSTREAM, "%s: %s", o->binary, s);
    goto fail;
  }
  s = json_string_value(json_object_get(row, "answer"));
  a->answer = utf8_clean(s ? s : "", s ? strlen(s) : 0);
  if (!a->answer) { st_fail(ST_ENOMEM, "answer"); goto fail; }
  a->pass = st_harness_answer_passes(a->answer, a->expected);
  goto done;
fail:
  a->error = errdup();
  a->pass = 0;
done:
  if (pid > 0) while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (fa_ready) posix_spawn_file_actions_destroy(&fa);
  if (out_pipe[0] >= 0) close(out_pipe[0]);
  if (out_pipe[1] >= 0) close(out_pipe[1]);
  json_decref(root);
  st_buf_free(&reply);
}

/* ---------------------------------------------------------------- open, attempt, close */

st_status st_harness_open(const st_harness_options *o, st_harness **out) {
  *out = NULL;
  if (o->max_new < 1) return st_fail(ST_EINVAL, "--max-new-tokens must be at least 1");
  if (o->api == ST_HARNESS_ENGINE ? !o->model_dir : !o->endpoint)
    return st_fail(ST_EINVAL, o->api == ST_HARNESS_ENGINE ? "the engine needs --model DIR" : "a server sweep needs --endpoint URL");
  if (o->binary && (o->api != ST_HARNESS_ENGINE || !o->binary_store))
    return st_fail(ST_EINVAL, "another build's engine needs --model DIR and a store of its own");
  sweep *w = calloc(1, sizeof *w);
  if (!w) return st_fail(ST_ENOMEM, "the harness");
  w->o = *o;
  st_status rc = ST_OK;
#ifdef _OPENMP
  w->threads = omp_get_max_threads();
#else
  w->threads = 1;
#endif
  if (o->api == ST_HARNESS_ENGINE && o->binary) {
    /* the other build loads the model; here only its identity */
    if (access(o->binary, X_OK)) {
      rc = st_fail(ST_ENOTFOUND, "%s: not an executable sparsetrace binary (%s)", o->binary, strerror(errno));
      goto out;
    }
    snprintf(w->target, sizeof w->target, "%s (model %s)", o->binary, o->model_dir);
    if ((rc = settings_for_server(o, w->settings_json, sizeof w->settings_json))) goto out;
  } else if (o->api == ST_HARNESS_ENGINE) {
    snprintf(w->target, sizeof w->target, "%s", o->model_dir);
    const char *tdir = o->tokenizer_dir ? o->tokenizer_dir : o->model_dir;
    if ((rc = st_tokenizer_open(tdir, &w->tok))) {
      st_fail_context(rc, "the engine sweep renders prompts with the model's tokenizer (or --tokenizer DIR): ");
      goto out;
    }
    if ((rc = st_model_open(o->model_dir, &w->model)) || (rc = st_model_load_all(w->model))) goto out;
    if ((rc = st_backend_open(o->backend ? o->backend : ST_BACKEND_DEFAULT, &w->backend))) goto out;
    st_settings resolved = o->settings;
    st_settings_resolve(&resolved, w->model->cfg);
    st_settings_json(&resolved, w->settings_json, sizeof w->settings_json);
    const char *globs[] = {"layers.*.indexer.*"};
    if ((rc = st_taps_arm(&w->taps, w->model->cfg->num_hidden_layers, globs, 1))) goto out;
    w->taps.sink = NULL;
    char config_path[4200];
    snprintf(config_path, sizeof config_path, "%s/config.json", o->model_dir);
    w->config_text = st_read_text_file(config_path);
    w->name_copy = strdup(o->model_dir);
    if (!w->name_copy) { rc = st_fail(ST_ENOMEM, "model name"); goto out; }
    size_t n = strlen(w->name_copy);
    while (n > 1 && w->name_copy[n - 1] == '/') w->name_copy[--n] = 0;
    const char *slash = strrchr(w->name_copy, '/');
    w->model_name = o->model_name ? o->model_name : slash && slash[1] ? slash + 1 : w->name_copy;
  } else {
    endpoint_url(o->endpoint, o->api, w->url, sizeof w->url);
    snprintf(w->target, sizeof w->target, "%s", w->url);
    if (o->tokenizer_dir && (rc = st_tokenizer_open(o->tokenizer_dir, &w->tok))) goto out;
    if (o->kind == ST_NEEDLE_VOCAB && !w->tok) {
      rc = st_fail(ST_EINVAL, "needle kind vocab draws its needles from a tokenizer's vocabulary: give the "
                              "served model's (--tokenizer DIR)");
      goto out;
    }
    if ((rc = settings_for_server(o, w->settings_json, sizeof w->settings_json))) goto out;
    w->model_name = o->model_name ? o->model_name : "deepseek-v4";
    curl_global_init(CURL_GLOBAL_DEFAULT);
  }
  if ((rc = st_index_open(o->store, ST_INDEX_READ_WRITE, &w->ix))) goto out;
  if (sqlite3_prepare_v2(st_index_db(w->ix), insert_sql, -1, &w->insert, NULL) != SQLITE_OK) {
    rc = st_fail(ST_ESQLITE, "%s: %s", st_index_path(w->ix), sqlite3_errmsg(st_index_db(w->ix)));
    goto out;
  }
out:
  if (rc) st_harness_close(w);
  else *out = w;
  return rc;
}

void st_harness_make(st_harness *w, st_harness_attempt *a) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  a->tokens_reported = -1;
  a->needle_start = a->needle_end = -1;
  st_clear_error();
  if (w->o.api == ST_HARNESS_ENGINE && w->o.binary) binary_attempt(w, a);
  else if (w->o.api == ST_HARNESS_ENGINE) engine_attempt(w, a);
  else server_attempt(w, a);
  a->seconds = seconds_since(&t0);
}

st_index *st_harness_index(st_harness *w) { return w->ix; }
const char *st_harness_target(const st_harness *w) { return w->target; }
const char *st_harness_settings_json(const st_harness *w) { return w->settings_json; }

void st_harness_close(st_harness *w) {
  if (!w) return;
  sqlite3_finalize(w->insert);
  st_index_close(w->ix);
  st_model_close(w->model);
  st_backend_close(&w->backend);
  st_tokenizer_close(w->tok);
  st_taps_free(&w->taps);
  free(w->config_text);
  free(w->name_copy);
  free(w);
}

/* ---------------------------------------------------------------- the sweep */

st_status st_harness_sweep(const st_harness_options *o, st_harness_result *out) {
  memset(out, 0, sizeof *out);
  if (o->n_tokens < 1 || o->n_positions < 1 || o->n_seeds < 1)
    return st_fail(ST_EINVAL, "the grid is empty: give at least one size, one position and one seed");
  st_harness *w = NULL;
  st_status rc = st_harness_open(o, &w);
  if (rc) return rc;
  st_run_meta id = {0};
  st_run_id_new(&id);
  snprintf(out->sweep_id, sizeof out->sweep_id, "%s", id.run_id);
  snprintf(out->target, sizeof out->target, "%s", w->target);
  snprintf(out->settings_json, sizeof out->settings_json, "%s", w->settings_json);
  out->n_attempts = o->n_tokens * o->n_positions * o->n_seeds;
  out->attempts = calloc((size_t)out->n_attempts, sizeof *out->attempts);
  if (!out->attempts) {
    rc = st_fail(ST_ENOMEM, "%d attempts", out->n_attempts);
    goto out;
  }
  /* an engine attempt uses the sweep's --format; a server's follows its --api */
  st_needle_format format = o->api == ST_HARNESS_ENGINE ? o->format : st_harness_api_format(o->api);
  int done = 0;
  for (int t = 0; t < o->n_tokens; t++)
    for (int p = 0; p < o->n_positions; p++)
      for (int s = 0; s < o->n_seeds; s++) {
        st_harness_attempt *a = &out->attempts[done];
        a->tokens_requested = o->tokens[t];
        a->position = o->positions[p];
        a->seed = o->first_seed + (uint64_t)s;
        a->kind = o->kind;
        a->shape = o->shape;
        a->decoys = o->decoys;
        a->vocab_tokens[0] = o->vocab_tokens[0];
        a->vocab_tokens[1] = o->vocab_tokens[1];
        a->format = format;
        st_harness_make(w, a);
        if ((rc = st_harness_store(w, out->sweep_id, a))) goto out;
        done++;
        out->n_passed += a->pass;
        out->n_errors += a->error != NULL;
        if (o->progress) o->progress(o->progress_ctx, done, out->n_attempts, a);
      }
out:
  st_harness_close(w);
  if (rc) st_harness_result_free(out);
  return rc;
}

void st_harness_result_free(st_harness_result *r) {
  for (int i = 0; r->attempts && i < r->n_attempts; i++) {
    free(r->attempts[i].answer);
    free(r->attempts[i].error);
  }
  free(r->attempts);
  r->attempts = NULL;
  r->n_attempts = 0;
}

/* needle.c — locating a needle's tokens and recording its verdicts for a recorded run. */
#include "needle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/tokenizer.h"
#include "recorder/trace_reader.h"
#include "replay_store.h"

static int find_last(const int32_t *hay, int64_t n, const int32_t *needle, int64_t m, int64_t *at) {
  for (int64_t i = n - m; i >= 0; i--)
    if (!memcmp(hay + i, needle, sizeof(int32_t) * (size_t)m)) {
      *at = i;
      return 1;
    }
  return 0;
}

st_status st_needle_locate(const char *model_dir, const int32_t *tokens, int64_t n, const char *text,
                           int64_t *start, int64_t *end) {
  st_tokenizer *tok = NULL;
  st_status rc = st_tokenizer_open(model_dir, &tok);
  if (rc) return st_fail_context(rc, "--needle needs the model's tokenizer (or use --needle-tokens A:B): ");
  const char *prefixes[] = {"", " ", "\n"};
  for (int p = 0; p < 3 && rc == ST_OK; p++) {
    size_t len = strlen(prefixes[p]) + strlen(text);
    char *buf = malloc(len + 1);
    if (!buf) { rc = st_fail(ST_ENOMEM, "needle"); break; }
    snprintf(buf, len + 1, "%s%s", prefixes[p], text);
    st_token_ids ids = {0};
    rc = st_tokenizer_encode(tok, buf, len, 0, &ids);
    free(buf);
    int64_t skip = p ? 1 : 0; /* the prefix may merge into the first token: try with and without */
    int64_t at;
    for (int64_t drop = 0; rc == ST_OK && drop <= skip && (int64_t)ids.n - drop > 0; drop++)
      if (find_last(tokens, n, ids.ids + drop, (int64_t)ids.n - drop, &at)) {
        *start = at;
        *end = at + (int64_t)ids.n - drop;
        st_token_ids_free(&ids);
        st_tokenizer_close(tok);
        return ST_OK;
      }
    st_token_ids_free(&ids);
  }
  st_tokenizer_close(tok);
  if (rc) return rc;
  return st_fail(ST_ENOTFOUND, "the needle \"%s\" does not occur in the prompt's tokens", text);
}

st_status st_needle_locate_in_trace(const char *model_dir, const char *trace_path, const char *text,
                                    int64_t *start, int64_t *end) {
  st_trace *t = NULL;
  st_status rc = st_trace_open(trace_path, 0, &t);
  if (rc) return rc;
  int64_t n = 0;
  const int32_t *tokens = st_trace_tokens(t, &n);
  int64_t n_prompt = st_trace_n_prompt(t);
  if (!tokens) rc = st_fail(ST_EFORMAT, "%s holds no /tokens", trace_path);
  else if (n_prompt < 1 || n_prompt > n) rc = st_fail(ST_EFORMAT, "%s: /tokens has no valid n_prompt", trace_path);
  else rc = st_needle_locate(model_dir, tokens, n_prompt, text, start, end);
  st_trace_close(t);
  return rc;
}

st_status st_needle_record_verdicts(const char *trace_path, const char *model_dir,
                                    const char *store_dir, int64_t start, int64_t end,
                                    const char *text, int quiet) {
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", model_dir);
  st_config cfg;
  st_status rc = st_config_load(config_path, &cfg);
  if (rc) return rc;
  for (int layer = 0; layer < cfg.num_hidden_layers && !rc; layer++) {
    if (cfg.layer_kind[layer] != ST_LAYER_CSA) continue;
    st_replay_request req = {.trace_path = trace_path, .model_dir = model_dir, .layer = layer,
                             .stage = ST_REPLAY_INDEXER, .needle_start = start, .needle_end = end};
    st_replay_report *r = NULL;
    if ((rc = st_replay_run(&req, &r))) break;
    const st_replay_cell *c = &r->cells[0];
    int stored = 0;
    if (store_dir) rc = st_replay_store_verdicts(store_dir, r, start, end, text, &stored);
    if (!quiet && c->n_verdicts) {
      const st_needle_verdict *v = &c->verdicts[c->n_verdicts - 1];
      printf("needle layer %-3d rank %-5lld %s at position %lld; in the top-%d at %lld of %lld positions after it\n",
             layer, (long long)v->best_rank, v->in_topk ? "in top-k" : "LOST    ", (long long)v->position,
             v->topk, (long long)c->needle_positions_in_topk, (long long)c->n_verdicts);
    } else if (!quiet) {
      printf("needle layer %-3d no recorded query position after the needle\n", layer);
    }
    st_replay_report_free(r);
  }
  return rc;
}

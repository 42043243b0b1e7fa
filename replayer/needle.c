/* needle.c — locating a needle's tokens and recording its verdicts for a recorded run. */
#include "needle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/text/tokenizer.h"
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

void st_needle_answer_positions(int64_t n_prompt, int64_t needle_start, int64_t needle_end,
                                int64_t *first, int64_t *end) {
  *first = n_prompt - 1;
  *end = *first + (needle_end > needle_start ? needle_end - needle_start : 0);
}

int st_needle_keeps(const st_needle_verdict *v) { return v->in_topk != 0; }

st_needle_judgement st_needle_judge(const st_needle_verdict *v, int64_t n, int64_t n_prompt,
                                    int64_t needle_start, int64_t needle_end) {
  st_needle_judgement j = {.retrieves = -1, .best_rank = -1, .worst_rank = -1, .first = -1, .last = -1};
  st_needle_answer_positions(n_prompt, needle_start, needle_end, &j.answer_first, &j.answer_end);
  for (int64_t i = 0; i < n; i++) {
    const st_needle_verdict *x = &v[i];
    if (x->position < j.answer_first || x->position >= j.answer_end) continue;
    if (j.first < 0 || x->position < j.first) j.first = x->position, j.topk = x->topk;
    if (x->position > j.last) j.last = x->position;
    j.positions++;
    j.kept += st_needle_keeps(x);
    if (x->best_rank >= 0 && (j.best_rank < 0 || x->best_rank < j.best_rank)) j.best_rank = x->best_rank;
    if (x->best_rank > j.worst_rank) j.worst_rank = x->best_rank;
  }
  if (j.positions) j.retrieves = 2 * j.kept > j.positions;
  return j;
}

st_needle_judgement st_needle_judge_cell(const st_replay_report *r, const st_replay_cell *c) {
  return st_needle_judge(c->verdicts, c->verdicts ? c->n_verdicts : 0, r->n_prompt, r->needle_start,
                         r->needle_end);
}

const char *st_needle_topk_name(int topk, char *buf, size_t size) {
  if (topk == INT32_MAX) snprintf(buf, size, "top-all");
  else snprintf(buf, size, "top-%d", topk);
  return buf;
}

const char *st_needle_retrieves_word(const st_needle_judgement *j) {
  return j->retrieves < 0 ? "-" : j->retrieves ? "yes" : "no";
}

st_status st_needle_record_verdicts(const char *trace_path, const char *model_dir,
                                    const char *store_dir, int64_t start, int64_t end,
                                    const char *text, int quiet, st_needle_summary *summary) {
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", model_dir);
  st_config cfg;
  st_status rc = st_config_load(config_path, &cfg);
  if (rc) return rc;
  if (summary) memset(summary, 0, sizeof *summary);
  int header = 0;
  for (int layer = 0; layer < cfg.num_hidden_layers && !rc; layer++) {
    if (cfg.layer_kind[layer] != ST_LAYER_CSA) continue;
    st_replay_request req = {.trace_path = trace_path, .model_dir = model_dir, .layer = layer,
                             .stage = ST_REPLAY_INDEXER, .needle_start = start, .needle_end = end};
    st_replay_report *r = NULL;
    if ((rc = st_replay_run(&req, &r))) break;
    const st_replay_cell *c = &r->cells[0];
    int stored = 0;
    if (store_dir) rc = st_replay_store_verdicts(store_dir, r, start, end, text, &stored);
    st_needle_judgement j = st_needle_judge_cell(r, c);
    if (summary && summary->n_layers < ST_NEEDLE_MAX_LAYERS) {
      summary->layers[summary->n_layers] = layer;
      summary->judgements[summary->n_layers++] = j;
      summary->n_retrieving += j.retrieves == 1;
    }
    if (!quiet && !header++)
      printf("needle verdicts: a layer retrieves the needle when it keeps it in its top-k at most of the\n"
             "answer positions %lld-%lld (from the last prompt position, as many as the needle's %lld tokens)\n",
             (long long)j.answer_first, (long long)j.answer_end - 1, (long long)(end - start));
    char k[32];
    if (!quiet && j.positions)
      printf("needle layer %-3d retrieves %-3s in the %s at %d of %d answer positions; rank %lld best, %lld worst\n",
             layer, st_needle_retrieves_word(&j), st_needle_topk_name(j.topk, k, sizeof k), j.kept, j.positions,
             (long long)j.best_rank, (long long)j.worst_rank);
    else if (!quiet)
      printf("needle layer %-3d not judged: the trace recorded none of the answer positions %lld-%lld "
             "(record with --positions last)\n", layer, (long long)j.answer_first, (long long)j.answer_end - 1);
    st_replay_report_free(r);
  }
  return rc;
}

/*
** bisect.c — explain a lost needle by the smallest change of settings.
**
** Given a good and a bad set of settings and the needle's span: replay every CSA layer's indexer
** under both (from the recorded q, k and weights) and take, per layer, the needle verdict of
** schemas/needle-verdicts.md (st_needle_judge): the answer positions that can copy the needle
** (from the last prompt position on, as many as the needle has tokens), the ones among them at
** which the needle is in the top-k, and whether that is most of them (the layer retrieves it).
**
** A layer flips when its verdict differs between good and bad, in either direction: it loses the
** needle (retrieves under good, not under bad) or gains it (the reverse). The first flip is the
** first such layer. A layer whose counts change while its verdict stays is a change in counts,
** and the sentence calls it that, never a loss. Then bisect tries each differing setting alone on
** top of the good ones (which change flips which layer first), each setting set back on top of
** the bad ones (which change restores good's counts at every layer), and the smallest subset of
** changes that reproduces bad's counts at every layer. The differing settings are few (at most
** 8), so the subsets are enumerated outright.
*/
#include "bisect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/config.h"
#include "engine/settings.h"
#include "recorder/trace_reader.h"
#include "needle.h"
#include "replay.h"
#include "schemas/catalogue.h"

typedef struct kv {
  char key[64], value[64];
} kv;

static st_status parse_list(const char *list, kv *out, int *n) {
  *n = 0;
  if (!list || !*list) return ST_OK;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(p, '=');
    if (!eq || eq == p) return st_fail(ST_EINVAL, "'%s': expected KEY=VALUE", p);
    if (*n == ST_BISECT_MAX_CHANGES * 2) return st_fail(ST_EINVAL, "too many settings in '%s'", list);
    *eq = 0;
    if (st_setting_find(p) < 0) return st_fail(ST_EINVAL, "'%s': unknown setting", p);
    snprintf(out[*n].key, sizeof out[*n].key, "%.63s", p);
    snprintf(out[*n].value, sizeof out[*n].value, "%.63s", eq + 1);
    (*n)++;
  }
  return ST_OK;
}

static const char *lookup(const kv *list, int n, const char *key) {
  for (int i = n - 1; i >= 0; i--)
    if (!strcmp(list[i].key, key)) return list[i].value;
  return NULL;
}

typedef struct bisector {
  const char *trace, *model;
  const char *backend;       /* of every replay; NULL: the one that recorded the trace */
  int64_t needle_start, needle_end;
  const int *layers;
  int n_layers;
  int replays;
  int64_t first, last;       /* the positions judged */
} bisector;

/* Verdicts of every examined layer under the settings sets[0..n). */
static st_status verdicts(bisector *b, const char *const *sets, int n, st_bisect_verdict *out) {
  for (int i = 0; i < b->n_layers; i++) {
    st_replay_request req = {.trace_path = b->trace, .model_dir = b->model, .layer = b->layers[i],
                             .stage = ST_REPLAY_INDEXER, .sets = sets, .n_sets = n,
                             .needle_start = b->needle_start, .needle_end = b->needle_end,
                             .backend = b->backend};
    st_replay_report *r = NULL;
    st_status rc = st_replay_run(&req, &r);
    if (rc) return rc;
    b->replays++;
    st_needle_judgement j = st_needle_judge_cell(r, &r->cells[0]);
    st_replay_report_free(r);
    if (!j.positions)
      return st_fail(ST_EINVAL, "%s: layer %d has no verdict at the answer positions %lld-%lld (the last "
                     "prompt position on, as many as the needle's tokens): record them with --positions last "
                     "or all", b->trace, b->layers[i], (long long)j.answer_first, (long long)j.answer_end - 1);
    out[i] = (st_bisect_verdict){.retrieves = j.retrieves, .kept = j.kept, .positions = j.positions,
                                 .rank = j.worst_rank, .topk = j.topk};
    b->first = j.first;
    b->last = j.last;
  }
  return ST_OK;
}

/* The first layer whose counts differ, -1 when every layer keeps the needle at as many positions. */
static int first_difference(const bisector *b, const st_bisect_verdict *x, const st_bisect_verdict *y) {
  for (int i = 0; i < b->n_layers; i++)
    if (x[i].kept != y[i].kept) return b->layers[i];
  return -1;
}

/* The first layer whose verdict differs between x and y, in either direction; else -1. */
static int first_flip(const bisector *b, const st_bisect_verdict *x, const st_bisect_verdict *y) {
  for (int i = 0; i < b->n_layers; i++)
    if (x[i].retrieves != y[i].retrieves) return b->layers[i];
  return -1;
}

/* "rotate=q alone" phrasing: for rotate, name the side added or removed. */
static void describe_restore(const st_bisect_change *c, const char *verb, char *buf, size_t size) {
  if (!strcmp(c->key, "rotate")) {
    static const char *names[] = {"none", "q", "k", "both"};
    int g = 0, b = 0;
    for (int i = 0; i < 4; i++) {
      if (!strcmp(c->good, names[i])) g = i;
      if (!strcmp(c->bad, names[i])) b = i;
    }
    int add = g & ~b, remove = b & ~g;
    if (add && !remove) { snprintf(buf, size, "adding %s (rotate=%s) %s", add == 1 ? "q" : add == 2 ? "k" : "q and k", c->good, verb); return; }
    if (remove && !add) { snprintf(buf, size, "removing %s (rotate=%s) %s", remove == 1 ? "q" : remove == 2 ? "k" : "q and k", c->good, verb); return; }
  }
  snprintf(buf, size, "setting %s=%s again %s", c->key, c->good, verb);
}

st_status st_bisect_run(const st_bisect_request *req, st_bisect_report *out) {
  const char *trace_path = req->trace_path, *model_dir = req->model_dir, *good = req->good, *bad = req->bad;
  int64_t needle_start = req->needle_start, needle_end = req->needle_end;
  memset(out, 0, sizeof *out);
  out->first_flip_layer = out->first_change_layer = -1;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (needle_end <= needle_start) return st_fail(ST_EINVAL, "bisect needs the needle's span (--needle-tokens A:B)");
  kv g[2 * ST_BISECT_MAX_CHANGES], bd[2 * ST_BISECT_MAX_CHANGES];
  int ng, nb;
  st_status rc;
  if ((rc = parse_list(good, g, &ng))) return st_fail_context(rc, "--good: ");
  if ((rc = parse_list(bad, bd, &nb))) return st_fail_context(rc, "--bad: ");
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", model_dir);
  st_config cfg;
  if ((rc = st_config_load(config_path, &cfg))) return rc;
  for (int l = 0; l < cfg.num_hidden_layers && out->n_layers < ST_BISECT_MAX_LAYERS; l++)
    if (cfg.layer_kind[l] == ST_LAYER_CSA) out->layers[out->n_layers++] = l;
  if (!out->n_layers) return st_fail(ST_EINVAL, "%s has no CSA layer: no indexer to bisect", config_path);
  bisector b = {.trace = trace_path, .model = model_dir, .needle_start = needle_start,
                .needle_end = needle_end, .layers = out->layers, .n_layers = out->n_layers,
                .backend = req->backend};

  /* the differing settings: a key set on one side only keeps the recorded value on the other */
  for (int side = 0; side < 2; side++) {
    kv *list = side ? bd : g;
    int n = side ? nb : ng;
    for (int i = 0; i < n; i++) {
      int seen = 0;
      for (int c = 0; c < out->n_changes; c++) seen |= !strcmp(out->changes[c].key, list[i].key);
      if (seen) continue;
      const char *gv = lookup(g, ng, list[i].key), *bv = lookup(bd, nb, list[i].key);
      if (gv && bv && !strcmp(gv, bv)) continue;
      if (out->n_changes == ST_BISECT_MAX_CHANGES) return st_fail(ST_EINVAL, "at most %d differing settings", ST_BISECT_MAX_CHANGES);
      st_bisect_change *c = &out->changes[out->n_changes++];
      snprintf(c->key, sizeof c->key, "%.63s", list[i].key);
      snprintf(c->good, sizeof c->good, "%.63s", gv ? gv : "recorded");
      snprintf(c->bad, sizeof c->bad, "%.63s", bv ? bv : "recorded");
    }
  }
  if (!out->n_changes) return st_fail(ST_EINVAL, "--good and --bad set the same values: nothing to bisect");

  const char *sets[4 * ST_BISECT_MAX_CHANGES];
  char storage[4 * ST_BISECT_MAX_CHANGES][140];
  int n = 0;
#define PUSH(k, v) (snprintf(storage[n], sizeof storage[n], "%s=%s", k, v), sets[n] = storage[n], n++)
  for (int i = 0; i < ng; i++) PUSH(g[i].key, g[i].value);
  if ((rc = verdicts(&b, sets, n, out->good))) return rc;
  n = 0;
  for (int i = 0; i < nb; i++) PUSH(bd[i].key, bd[i].value);
  if ((rc = verdicts(&b, sets, n, out->bad))) return rc;
  out->first_flip_layer = first_flip(&b, out->good, out->bad);
  out->first_change_layer = first_difference(&b, out->good, out->bad);

  st_bisect_verdict v[ST_BISECT_MAX_LAYERS];
  for (int c = 0; c < out->n_changes; c++) {
    st_bisect_change *ch = &out->changes[c];
    /* good plus this one change */
    n = 0;
    for (int i = 0; i < ng; i++) PUSH(g[i].key, g[i].value);
    if (strcmp(ch->bad, "recorded")) PUSH(ch->key, ch->bad);
    else return st_fail(ST_EINVAL, "--bad must give a value for %s (set on --good)", ch->key);
    if ((rc = verdicts(&b, sets, n, v))) return rc;
    ch->alone_flips_at = first_flip(&b, out->good, v);
    ch->alone_changes_at = first_difference(&b, out->good, v);
    /* bad with this key set back */
    n = 0;
    for (int i = 0; i < nb; i++) PUSH(bd[i].key, bd[i].value);
    if (strcmp(ch->good, "recorded")) PUSH(ch->key, ch->good);
    else return st_fail(ST_EINVAL, "--good must give a value for %s (set on --bad)", ch->key);
    if ((rc = verdicts(&b, sets, n, v))) return rc;
    ch->restores = first_difference(&b, out->good, v) < 0;
  }
  /* the smallest subset of changes that reproduces bad's counts everywhere */
  if (out->first_change_layer >= 0) {
    for (int size = 1; size <= out->n_changes && !out->n_minimal; size++)
      for (unsigned mask = 1; mask < (1u << out->n_changes) && !out->n_minimal; mask++) {
        if (__builtin_popcount(mask) != size) continue;
        n = 0;
        for (int i = 0; i < ng; i++) PUSH(g[i].key, g[i].value);
        for (int c = 0; c < out->n_changes; c++)
          if (mask & (1u << c)) PUSH(out->changes[c].key, out->changes[c].bad);
        if (size == 1) { /* already known */
          int c = __builtin_ctz(mask);
          if (out->changes[c].alone_changes_at < 0) continue;
        }
        if ((rc = verdicts(&b, sets, n, v))) return rc;
        if (first_difference(&b, out->bad, v) < 0)
          for (int c = 0; c < out->n_changes; c++)
            if (mask & (1u << c)) out->minimal[out->n_minimal++] = c;
      }
  }
#undef PUSH

  /* the sentence: a flip is a flip of the verdict; a change in counts is called one */
  char *e = out->explanation;
  size_t size = sizeof out->explanation;
  int len = 0;
#define SAY(...) (len += snprintf(e + len, size > (size_t)len ? size - (size_t)len : 0, __VA_ARGS__))
  int at = out->first_flip_layer >= 0 ? out->first_flip_layer : out->first_change_layer;
  if (at < 0) {
    SAY("no CSA layer's verdict or counts differ between good and bad (answer positions %lld-%lld)",
        (long long)b.first, (long long)b.last);
  } else {
    int i = 0;
    while (out->layers[i] != at) i++;
    const st_bisect_verdict *gv = &out->good[i], *bv = &out->bad[i];
    int flip = out->first_flip_layer >= 0, lost = gv->retrieves && !bv->retrieves;
    char what[200], counts[160], k[32];
    snprintf(counts, sizeof counts, "in the %s at %d of %d answer positions vs %d",
             st_needle_topk_name(bv->topk, k, sizeof k), bv->kept, bv->positions, gv->kept);
    if (flip && lost) snprintf(what, sizeof what, "loses the needle at layer %d", at);
    else if (flip) snprintf(what, sizeof what, "makes layer %d retrieve the needle", at);
    else snprintf(what, sizeof what, "changes no layer's verdict; at layer %d it changes the counts", at);
    const char *kind = flip ? (lost ? "retrieves yes -> no" : "retrieves no -> yes")
                            : (gv->retrieves ? "retrieves yes either way: a change in counts, not of the verdict"
                                             : "retrieves no either way: a change in counts, not of the verdict");
    if (out->n_minimal == 1) {
      const st_bisect_change *c = &out->changes[out->minimal[0]];
      SAY("%s=%s alone %s (%s with %s=%s; %s)", c->key, c->bad, what, counts, c->key, c->good, kind);
      if (c->restores) {
        char restore[160];
        describe_restore(c, "restores every layer", restore, sizeof restore);
        SAY("; %s", restore);
      }
    } else {
      SAY("good -> bad %s (%s; %s) only when ", what, counts, kind);
      for (int k = 0; k < out->n_minimal; k++)
        SAY("%s%s=%s", k ? " and " : "", out->changes[out->minimal[k]].key, out->changes[out->minimal[k]].bad);
      if (!out->n_minimal) SAY("all the changes are made together");
    }
    /* the other layers whose counts change without a flip */
    int other[ST_BISECT_MAX_LAYERS], n_other = 0;
    for (int k = 0; k < out->n_layers; k++)
      if (out->layers[k] != at && out->good[k].retrieves == out->bad[k].retrieves &&
          out->good[k].kept != out->bad[k].kept)
        other[n_other++] = k;
    for (int k = 0; k < n_other; k++) {
      const st_bisect_verdict *g = &out->good[other[k]], *x = &out->bad[other[k]];
      SAY("%s%d (%d -> %d of %d)", !k ? (n_other > 1 ? "; counts change without a flip at layers " : "; counts change without a flip at layer ")
                                      : k == n_other - 1 ? " and " : ", ",
          out->layers[other[k]], g->kept, x->kept, x->positions);
    }
  }
#undef SAY
  out->first_position = b.first;
  out->last_position = b.last;
  out->replays = b.replays;
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return ST_OK;
}

const char *st_bisect_layer_note(const st_bisect_report *r, int i) {
  if (r->layers[i] == r->first_flip_layer) return "first flip";
  if (r->good[i].retrieves != r->bad[i].retrieves) return "flips";
  if (r->good[i].kept != r->bad[i].kept) return "counts change, no flip";
  return "";
}

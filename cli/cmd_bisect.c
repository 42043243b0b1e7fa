/*
** cmd_bisect.c — `sparsetrace bisect`: which single setting change flips the needle verdict, and
** the first layer where it flips (replayer/bisect.c).
*/
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "replayer/bisect.h"
#include "replayer/needle.h"

static const st_opt_use bisect_options[] = {
  {ST_OPT_TRACE, NULL, "the recorded run (run --tap 'layers.*.indexer.*')"},
  {ST_OPT_MODEL, NULL, "its checkpoint directory (config.json; tokenizer.json for --needle)"},
  {ST_OPT_GOOD, NULL, "the settings that keep the needle, over the recorded ones"},
  {ST_OPT_BAD, NULL, "the settings that lose it"},
  {ST_OPT_NEEDLE, NULL, "the needle's text, found in the trace's tokens with the model's\n"
                        "tokenizer (tokenizer.json)"},
  {ST_OPT_NEEDLE_TOKENS, NULL, "the needle's token span [A, B)"},
  {ST_OPT_BACKEND, NULL, "compute backend of the replays: cpu-ref, cpu, cuda, hip (default: the\n"
                         "one that recorded the trace)"},
  {ST_OPT_JSON, NULL, "one JSON object: layers with both verdicts, changes, minimal set"},
  {0}};

static const st_cmd_spec bisect_spec = {
  "bisect",
  "sparsetrace bisect --trace T.h5 --model DIR --good K=V,... --bad K=V,...\n"
  "                         (--needle TEXT | --needle-tokens A:B) [--json]\n",
  "Explains a lost needle by settings, with the needle verdict of schemas/needle-verdicts.md: for\n"
  "every CSA layer it counts the answer positions at which the needle's best compressed row is in\n"
  "the indexer's top-k: the last prompt position (its query emits the answer's first token) and\n"
  "the generated ones after it, as many positions in all as the needle has tokens (record them with\n"
  "--positions last). A layer retrieves the needle when that is most of them. bisect replays every\n"
  "CSA layer's indexer from the trace under --good and --bad (each a comma-separated list over the\n"
  "recorded settings), finds the first layer whose verdict flips (either direction: it loses the\n"
  "needle, or gains it), else the first whose counts change (said to be a change in counts, not of\n"
  "the verdict), tries every differing setting alone, and prints the minimal explanation, e.g.\n"
  "  rotate=q alone loses the needle at layer 5 (...); removing q (rotate=none) restores every layer\n"
  "--needle TEXT is found in the recorded prompt (never in the answer).\n"
  "The trace must hold layers.N.indexer.{q,k,weights} of every CSA layer (run --tap 'layers.*.indexer.*').\n",
  bisect_options,
  "Exit status: 0 when a flip was explained, 1 on error or when no layer's verdict flips, 2 usage.\n"};

int st_cmd_bisect(int argc, char **argv) {
  const char *needle_text = NULL;
  st_bisect_request req = {0};
  int c;
  st_opts o;
  st_opts_init(&o, &bisect_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_TRACE: req.trace_path = o.arg; break;
    case ST_OPT_GOOD: req.good = o.arg; break;
    case ST_OPT_BAD: req.bad = o.arg; break;
    case ST_OPT_NEEDLE_TOKENS:
      if (st_opt_span(o.name, o.arg, &req.needle_start, &req.needle_end)) st_opts_fail(&o), c = ST_OPTS_EXIT;
      break;
    case ST_OPT_NEEDLE: needle_text = o.arg; break;
    default: st_opts_error(&o, "unexpected argument '%s'", o.arg), c = ST_OPTS_EXIT;
    }
    if (c == ST_OPTS_EXIT) break;
  }
  req.model_dir = o.model;
  req.backend = o.backend;
  int json = o.json;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return o.exit_code;
  if (!req.trace_path || !req.model_dir || !req.good || !req.bad || (!needle_text && req.needle_end <= req.needle_start)) {
    fprintf(stderr, "sparsetrace bisect: --trace, --model, --good, --bad and --needle or --needle-tokens are required\n"
                    "(sparsetrace bisect --help lists the options)\n");
    return 2;
  }
  if (st_opts_backend_available(req.backend)) return st_cli_report_error("bisect");
  if (needle_text &&
      st_needle_locate_in_trace(req.model_dir, req.trace_path, needle_text, &req.needle_start, &req.needle_end))
    return st_cli_report_error("bisect");
  st_bisect_report *r = calloc(1, sizeof *r);
  if (!r) return 1;
  if (st_bisect_run(&req, r)) {
    free(r);
    return st_cli_report_error("bisect");
  }
  if (json) { /* built with jansson: every string escaped */
    json_t *o = json_object(), *layers = json_array(), *changes = json_array(), *minimal = json_array();
    json_object_set_new(o, "first_position", json_integer(r->first_position));
    json_object_set_new(o, "last_position", json_integer(r->last_position));
    json_object_set_new(o, "first_flip_layer", r->first_flip_layer >= 0 ? json_integer(r->first_flip_layer) : json_null());
    json_object_set_new(o, "first_change_layer", r->first_change_layer >= 0 ? json_integer(r->first_change_layer) : json_null());
    json_object_set_new(o, "explanation", json_string(r->explanation));
    json_object_set_new(o, "replays", json_integer(r->replays));
    json_object_set_new(o, "seconds", json_real(round(r->seconds * 1000) / 1000));
    for (int i = 0; i < r->n_layers; i++)
      json_array_append_new(layers, json_pack("{s:i,s:b,s:b,s:{s:b,s:i,s:i,s:I},s:{s:b,s:i,s:i,s:I},s:i}",
          "layer", r->layers[i], "flips", r->good[i].retrieves != r->bad[i].retrieves,
          "counts_change", r->good[i].kept != r->bad[i].kept,
          "good", "retrieves", r->good[i].retrieves != 0, "kept", r->good[i].kept, "positions", r->good[i].positions,
          "rank", (json_int_t)r->good[i].rank,
          "bad", "retrieves", r->bad[i].retrieves != 0, "kept", r->bad[i].kept, "positions", r->bad[i].positions,
          "rank", (json_int_t)r->bad[i].rank, "topk", r->bad[i].topk));
    json_object_set_new(o, "layers", layers);
    for (int i = 0; i < r->n_changes; i++) {
      const st_bisect_change *x = &r->changes[i];
      json_array_append_new(changes, json_pack("{s:s,s:s,s:s,s:o,s:o,s:b}", "setting", x->key, "good", x->good,
          "bad", x->bad, "alone_flips_at", x->alone_flips_at >= 0 ? json_integer(x->alone_flips_at) : json_null(),
          "alone_changes_at", x->alone_changes_at >= 0 ? json_integer(x->alone_changes_at) : json_null(),
          "restores", x->restores != 0));
    }
    json_object_set_new(o, "changes", changes);
    for (int i = 0; i < r->n_minimal; i++) json_array_append_new(minimal, json_string(r->changes[r->minimal[i]].key));
    json_object_set_new(o, "minimal", minimal);
    char *dumped = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    json_decref(o);
    if (dumped) printf("%s\n", dumped);
    free(dumped);
  } else {
    printf("needle over answer positions %lld-%lld (retrieves?  positions in the top-k  worst rank):\n",
           (long long)r->first_position, (long long)r->last_position);
    printf("  %-6s  %-24s %-24s\n", "layer", "good", "bad");
    for (int i = 0; i < r->n_layers; i++) {
      char gs[48], bs[48];
      snprintf(gs, sizeof gs, "%-5s %3d/%-3d %6lld", r->good[i].retrieves ? "yes" : "no", r->good[i].kept,
               r->good[i].positions, (long long)r->good[i].rank);
      snprintf(bs, sizeof bs, "%-5s %3d/%-3d %6lld", r->bad[i].retrieves ? "yes" : "no", r->bad[i].kept,
               r->bad[i].positions, (long long)r->bad[i].rank);
      const char *note = st_bisect_layer_note(r, i);
      printf("  %-6d  %-24s %-24s%s%s\n", r->layers[i], gs, bs, *note ? "  <- " : "", note);
    }
    printf("changes:\n");
    for (int i = 0; i < r->n_changes; i++) {
      const st_bisect_change *x = &r->changes[i];
      printf("  %s: %s -> %s", x->key, x->good, x->bad);
      if (x->alone_flips_at >= 0) printf("; alone flips layer %d", x->alone_flips_at);
      else if (x->alone_changes_at >= 0) printf("; alone flips no layer (changes the counts at layer %d)", x->alone_changes_at);
      else printf("; alone flips no layer");
      printf("%s\n", x->restores ? "; setting it back restores every layer" : "");
    }
    printf("\n%s\n(%d indexer replays in %.2f s)\n", r->explanation, r->replays, r->seconds);
  }
  int flipped = r->first_flip_layer >= 0;
  free(r);
  return flipped ? 0 : 1;
}

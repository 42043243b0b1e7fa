/*
** cmd_bisect.c — `sparsetrace bisect`: which single setting change flips the needle verdict, and
** the first layer where it flips (replayer/bisect.c).
*/
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "replayer/bisect.h"
#include "replayer/needle.h"

static const char bisect_help[] =
  "usage: sparsetrace bisect --trace T.h5 --model DIR --good K=V,... --bad K=V,...\n"
  "                         (--needle TEXT | --needle-tokens A:B) [--json]\n"
  "\n"
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
  "The trace must hold layers.N.indexer.{q,k,weights} of every CSA layer (run --tap 'layers.*.indexer.*').\n"
  "\n"
  "Exit status: 0 when a flip was explained, 1 on error or when no layer's verdict flips, 2 usage.\n";

int st_cmd_bisect(int argc, char **argv) {
  enum { O_TRACE = 256, O_MODEL, O_GOOD, O_BAD, O_NEEDLE, O_JSON, O_HELP, O_NEEDLE_TEXT };
  static const struct option options[] = {
    {"trace", required_argument, 0, O_TRACE}, {"model", required_argument, 0, O_MODEL},
    {"good", required_argument, 0, O_GOOD}, {"bad", required_argument, 0, O_BAD},
    {"needle-tokens", required_argument, 0, O_NEEDLE}, {"json", no_argument, 0, O_JSON},
    {"help", no_argument, 0, O_HELP}, {"needle", required_argument, 0, O_NEEDLE_TEXT}, {0, 0, 0, 0}};
  const char *needle_text = NULL;
  const char *trace = NULL, *model = NULL, *good = NULL, *bad = NULL;
  int64_t a = 0, b = 0;
  int json = 0;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    switch (c) {
    case O_TRACE: trace = optarg; break;
    case O_MODEL: model = optarg; break;
    case O_GOOD: good = optarg; break;
    case O_BAD: bad = optarg; break;
    case O_NEEDLE:
      if (st_cli_parse_span(optarg, &a, &b)) { fprintf(stderr, "sparsetrace bisect: --needle-tokens '%s': expected A:B\n", optarg); return 2; }
      break;
    case O_NEEDLE_TEXT: needle_text = optarg; break;
    case O_JSON: json = 1; break;
    case 'h': case O_HELP: printf("%s", bisect_help); return 0;
    default: fprintf(stderr, "sparsetrace bisect: unknown or incomplete option '%s'\n\n%s", argv[optind - 1], bisect_help); return 2;
    }
  }
  if (needle_text && trace && model && st_needle_locate_in_trace(model, trace, needle_text, &a, &b))
    return st_cli_report_error("bisect");
  if (!trace || !model || !good || !bad || b <= a || optind < argc) {
    fprintf(stderr, "sparsetrace bisect: --trace, --model, --good, --bad and --needle-tokens are required\n\n%s", bisect_help);
    return 2;
  }
  st_bisect_report *r = calloc(1, sizeof *r);
  if (!r) return 1;
  if (st_bisect_run(trace, model, good, bad, a, b, r)) {
    free(r);
    return st_cli_report_error("bisect");
  }
  if (json) {
    printf("{\"first_position\":%lld,\"last_position\":%lld,\"first_flip_layer\":",
           (long long)r->first_position, (long long)r->last_position);
    if (r->first_flip_layer >= 0) printf("%d", r->first_flip_layer); else printf("null");
    printf(",\"first_change_layer\":");
    if (r->first_change_layer >= 0) printf("%d", r->first_change_layer); else printf("null");
    printf(",\"explanation\":\"%s\",\"replays\":%d,\"seconds\":%.3f,\"layers\":[", r->explanation, r->replays, r->seconds);
    for (int i = 0; i < r->n_layers; i++)
      printf("%s{\"layer\":%d,\"flips\":%s,\"counts_change\":%s,\"good\":{\"retrieves\":%s,\"kept\":%d,\"positions\":%d,\"rank\":%lld},"
             "\"bad\":{\"retrieves\":%s,\"kept\":%d,\"positions\":%d,\"rank\":%lld},\"topk\":%d}",
             i ? "," : "", r->layers[i], r->good[i].retrieves != r->bad[i].retrieves ? "true" : "false",
             r->good[i].kept != r->bad[i].kept ? "true" : "false", r->good[i].retrieves ? "true" : "false", r->good[i].kept,
             r->good[i].positions, (long long)r->good[i].rank, r->bad[i].retrieves ? "true" : "false",
             r->bad[i].kept, r->bad[i].positions, (long long)r->bad[i].rank, r->bad[i].topk);
    printf("],\"changes\":[");
    for (int i = 0; i < r->n_changes; i++) {
      const st_bisect_change *x = &r->changes[i];
      printf("%s{\"setting\":\"%s\",\"good\":\"%s\",\"bad\":\"%s\",\"alone_flips_at\":", i ? "," : "", x->key, x->good, x->bad);
      if (x->alone_flips_at >= 0) printf("%d", x->alone_flips_at); else printf("null");
      printf(",\"alone_changes_at\":");
      if (x->alone_changes_at >= 0) printf("%d", x->alone_changes_at); else printf("null");
      printf(",\"restores\":%s}", x->restores ? "true" : "false");
    }
    printf("],\"minimal\":[");
    for (int i = 0; i < r->n_minimal; i++) printf("%s\"%s\"", i ? "," : "", r->changes[r->minimal[i]].key);
    printf("]}\n");
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
      printf("  %-6d  %-24s %-24s%s\n", r->layers[i], gs, bs,
             r->layers[i] == r->first_flip_layer ? "  <- first flip"
             : r->good[i].retrieves != r->bad[i].retrieves ? "  <- flips"
             : r->good[i].kept != r->bad[i].kept ? "  <- counts change, no flip" : "");
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

/*
** cmd_replay.c — `sparsetrace replay`: re-execute one layer of a recorded run under alternate
** settings, sweep settings, and say where the needle is lost (replayer/replay.c does the work).
*/
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "commands.h"
#include "engine/pyjson.h"
#include "engine/tokenizer.h"
#include "recorder/recorder.h"
#include "replayer/replay.h"
#include "replayer/needle.h"
#include "replayer/replay_store.h"

static const char replay_help[] =
  "usage: sparsetrace replay --trace T.h5 --model DIR --layer N [options]\n"
  "\n"
  "Re-executes layer N of a recorded run from the inputs the trace holds, under the recorded\n"
  "settings changed by --set, once per cell of the --sweep cross product, and compares each cell\n"
  "with the recording. A cell with the recorded settings must reproduce the recorded tensors bit\n"
  "for bit: that is the determinism check (bit_exact). The alternate settings apply to layer N.\n"
  "\n"
  "  --stage indexer|attention|layer|rest   what to re-execute (default indexer):\n"
  "      indexer    scores and top-k from layers.N.indexer.{q,k,weights} (no weights needed)\n"
  "      attention  the attention block from layers.N.input (recorded at every position)\n"
  "      layer      the whole layer from layers.N.input\n"
  "      rest       layers N..last and the logits (KL, greedy agreement vs recorded logits)\n"
  "  --set KEY=VALUE         change a setting (repeatable; 'sparsetrace settings')\n"
  "  --sweep KEY=V1,V2,...   one cell per value; several --sweep give the cross product\n"
  "  --needle TEXT           the needle's text, found in the recorded prompt (its last occurrence\n"
  "                          there, never in the answer) with the model's tokenizer\n"
  "  --needle-tokens A:B     the needle's token span [A, B): per query position after it, the best\n"
  "                          rank of a compressed row covering it and whether it is in the top-k\n"
  "  --continue N            rest: also greedy-generate N tokens (a full run with layer N changed)\n"
  "                          and report whether the continuation contains the needle\n"
  "  --store DIR             index to record replays and needle verdicts in (default ./traces;\n"
  "                          skipped with a note when the run is not in that index)\n"
  "  --threads N             OpenMP threads (results identical for any N)\n"
  "  --json                  one JSON object: recorded settings, cells with metrics, bit_exact\n"
  "                          (null when no cell ran the recorded settings: nothing was checked)\n"
  "\n"
  "Exit status: 0 when the replay ran (and every recorded-settings cell was bit-exact), 1 on error\n"
  "or when a recorded-settings cell was NOT bit-exact, 2 on usage errors.\n";

/* A rest-stage continuation as a JSON string (decoded with the model's tokenizer, as `run`
** prints its answer), or NULL when the model has no tokenizer. Caller frees. */
static char *continuation_text_json(const char *model_dir, const st_replay_cell *x) {
  st_tokenizer *tok = NULL;
  char *text = NULL, *out = NULL;
  size_t len = 0;
  if (x->n_continuation && !st_tokenizer_open(model_dir, &tok) &&
      !st_tokenizer_decode(tok, x->continuation, (size_t)x->n_continuation, 0, &text, &len)) {
    st_text t = {0};
    st_pyjson_string(&t, text, len, 0);
    if (!st_text_status(&t, "text")) out = st_text_take(&t, NULL);
    st_text_free(&t);
  }
  st_clear_error();
  free(text);
  st_tokenizer_close(tok);
  return out;
}

static void print_table(const st_replay_report *r, const char *trace, const char *model_dir) {
  printf("replay of %s, layer %d, stage %s: %lld positions", trace, r->layer,
         st_replay_stage_name(r->stage), (long long)r->n_positions);
  if (r->stage == ST_REPLAY_INDEXER) printf(", %lld compressed rows", (long long)r->n_rows);
  printf(", %d cell%s in %.2f s\nrecorded settings %s\n", r->n_cells, r->n_cells == 1 ? "" : "s",
         r->seconds, r->recorded_settings);
  if (r->n_needle_rows) {
    printf("needle rows:");
    for (int i = 0; i < r->n_needle_rows; i++) printf(" %d", r->needle_rows[i]);
    int64_t first, end;
    st_needle_answer_positions(r->n_prompt, r->needle_start, r->needle_end, &first, &end);
    printf("; judged at the answer positions %lld-%lld (retrieves: kept in the top-k at most of them)\n",
           (long long)first, (long long)end - 1);
  }
  printf("\n%-34s %-9s", "cell", "bit_exact");
  if (r->n_needle_rows) printf(" %-9s %-7s %-11s", "retrieves", "kept", "needle_rank");
  printf(" %-9s %-9s %-8s", "jaccard", "overlap", "same");
  if (r->stage == ST_REPLAY_INDEXER) printf(" %-11s %-10s %-26s", "score_diff", "cosine", "max_abs (pos,row)");
  else printf(" %-11s %-10s %-10s", "out_diff", "cosine", "max_abs");
  if (r->stage == ST_REPLAY_REST) printf(" %-10s %-8s", "KL_mean", "greedy");
  printf(" %s\n", "seconds");
  for (int c = 0; c < r->n_cells; c++) {
    const st_replay_cell *x = &r->cells[c];
    char label[300];
    snprintf(label, sizeof label, "%s%s", x->label, x->same_as_recorded ? " (=rec)" : "");
    printf("%-34s %-9s", label, x->bit_exact < 0 ? "-" : x->bit_exact ? "yes" : "NO");
    if (r->n_needle_rows) {
      st_needle_judgement j = st_needle_judge_cell(r, x);
      if (j.positions) {
        char kept[32], rank[48];
        snprintf(kept, sizeof kept, "%d/%d", j.kept, j.positions);
        snprintf(rank, sizeof rank, "%lld..%lld", (long long)j.best_rank, (long long)j.worst_rank);
        printf(" %-9s %-7s %-11s", st_needle_retrieves_word(&j), kept, rank);
      } else {
        printf(" %-9s %-7s %-11s", "-", "-", "-");
      }
    }
    if (x->has_topk) {
      char same[32];
      if (x->topk_identical_rows == x->topk_rows) snprintf(same, sizeof same, "all");
      else snprintf(same, sizeof same, "%lld/%lld", (long long)x->topk_identical_rows, (long long)x->topk_rows);
      printf(" %-9.4f %-9.4f %-8s", x->topk_jaccard_mean, x->topk_overlap_mean, same);
    } else {
      printf(" %-9s %-9s %-8s", "-", "-", "");
    }
    if (r->stage == ST_REPLAY_INDEXER) {
      if (x->has_scores) {
        char at[48];
        snprintf(at, sizeof at, "%.3g (%lld,%lld)", x->score_max_abs, (long long)x->score_max_abs_position,
                 (long long)x->score_max_abs_row);
        printf(" %-11.3g %-10.6f %-26s", x->score_difference, x->score_cosine, at);
      } else printf(" %-11s %-10s %-26s", "-", "-", "-");
    } else if (x->has_output) {
      printf(" %-11.3g %-10.6f %-10.3g", x->output_difference, x->output_cosine, x->output_max_abs);
    } else printf(" %-11s %-10s %-10s", "-", "-", "-");
    if (r->stage == ST_REPLAY_REST) {
      if (x->has_logits) printf(" %-10.3g %7.1f%%", x->kl_mean, 100 * x->greedy_agreement);
      else printf(" %-10s %-8s", "-", "-");
    }
    printf(" %.3f\n", x->seconds);
    if (x->n_continuation) {
      printf("    continuation:");
      for (int i = 0; i < x->n_continuation; i++) printf(" %d", x->continuation[i]);
      if (x->continuation_has_needle >= 0) printf("  (needle %s)", x->continuation_has_needle ? "recalled" : "NOT recalled");
      printf("\n");
      char *text = continuation_text_json(model_dir, x);
      if (text) printf("    text %s\n", text);
      free(text);
    }
  }
  int no_logits = 0;
  for (int c = 0; c < r->n_cells; c++) no_logits |= r->stage == ST_REPLAY_REST && !r->cells[c].has_logits;
  if (no_logits)
    printf("KL_mean and greedy are '-': %s holds no logits tap to compare with (record the run with "
           "--tap logits)\n", trace);
}

int st_cmd_replay(int argc, char **argv) {
  enum { O_TRACE = 256, O_MODEL, O_LAYER, O_STAGE, O_SET, O_SWEEP, O_NEEDLE_TOKENS, O_CONTINUE,
         O_STORE, O_THREADS, O_JSON, O_HELP, O_NEEDLE };
  static const struct option options[] = {
    {"trace", required_argument, 0, O_TRACE}, {"model", required_argument, 0, O_MODEL},
    {"layer", required_argument, 0, O_LAYER}, {"stage", required_argument, 0, O_STAGE},
    {"set", required_argument, 0, O_SET}, {"sweep", required_argument, 0, O_SWEEP},
    {"needle-tokens", required_argument, 0, O_NEEDLE_TOKENS}, {"continue", required_argument, 0, O_CONTINUE},
    {"store", required_argument, 0, O_STORE}, {"threads", required_argument, 0, O_THREADS},
    {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, O_HELP},
    {"needle", required_argument, 0, O_NEEDLE}, {0, 0, 0, 0}};
  const char *needle_text = NULL;
  st_replay_request req = {.layer = -1, .stage = ST_REPLAY_INDEXER};
  const char **sets = calloc((size_t)argc + 1, sizeof(char *));
  const char **sweeps = calloc((size_t)argc + 1, sizeof(char *));
  const char *store = ST_DEFAULT_STORE;
  int json = 0, exit_code = 2;
  st_replay_report *rep = NULL;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    char *end;
    switch (c) {
    case O_TRACE: req.trace_path = optarg; break;
    case O_MODEL: req.model_dir = optarg; break;
    case O_LAYER:
      req.layer = (int)strtol(optarg, &end, 10);
      if (*end || req.layer < 0) { fprintf(stderr, "sparsetrace replay: --layer '%s' is not a layer number\n", optarg); goto done; }
      break;
    case O_STAGE: {
      int s = st_replay_stage_parse(optarg);
      if (s < 0) { fprintf(stderr, "sparsetrace replay: --stage '%s': use indexer, attention, layer or rest\n", optarg); goto done; }
      req.stage = (st_replay_stage)s;
      break;
    }
    case O_SET: sets[req.n_sets++] = optarg; break;
    case O_SWEEP: sweeps[req.n_sweeps++] = optarg; break;
    case O_NEEDLE_TOKENS:
      if (st_cli_parse_span(optarg, &req.needle_start, &req.needle_end)) {
        fprintf(stderr, "sparsetrace replay: --needle-tokens '%s': expected A:B with A < B\n", optarg);
        goto done;
      }
      break;
    case O_NEEDLE: needle_text = optarg; break;
    case O_CONTINUE:
      req.continue_tokens = (int)strtol(optarg, &end, 10);
      if (*end || req.continue_tokens < 0) { fprintf(stderr, "sparsetrace replay: --continue '%s' is not a count\n", optarg); goto done; }
      break;
    case O_STORE: store = optarg; break;
    case O_THREADS: {
      int n = (int)strtol(optarg, &end, 10);
      if (*end || n < 1) { fprintf(stderr, "sparsetrace replay: --threads '%s' is not a positive count\n", optarg); goto done; }
#ifdef _OPENMP
      omp_set_num_threads(n);
#endif
      break;
    }
    case O_JSON: json = 1; break;
    case 'h': case O_HELP: printf("%s", replay_help); exit_code = 0; goto done;
    default:
      fprintf(stderr, "sparsetrace replay: unknown or incomplete option '%s'\n\n%s", argv[optind - 1], replay_help);
      goto done;
    }
  }
  if (!req.trace_path || !req.model_dir || req.layer < 0 || optind < argc) {
    fprintf(stderr, "sparsetrace replay: --trace, --model and --layer are required\n\n%s", replay_help);
    goto done;
  }
  req.sets = sets;
  req.sweeps = sweeps;
  if (needle_text &&
      st_needle_locate_in_trace(req.model_dir, req.trace_path, needle_text, &req.needle_start, &req.needle_end)) {
    exit_code = st_cli_report_error("replay");
    goto done;
  }
  if (st_replay_run(&req, &rep)) {
    exit_code = st_cli_report_error("replay");
    goto done;
  }
  char *command_line = st_cli_join_args("sparsetrace", argc, argv);
  int stored = 0;
  st_status src = st_replay_store(store, rep, command_line, req.needle_start, req.needle_end, needle_text, &stored);
  free(command_line);
  int all_exact = 1, checked = 0; /* checked: some recorded-settings cell compared its tensors */
  for (int i = 0; i < rep->n_cells; i++) {
    all_exact &= rep->cells[i].bit_exact != 0;
    checked |= rep->cells[i].bit_exact >= 0;
  }
  if (json) {
    char *metrics = malloc(8192);
    printf("{\"trace\":\"%s\",\"run_id\":\"%s\",\"layer\":%d,\"stage\":\"%s\",\"positions\":%lld,"
           "\"recorded_settings\":%s,\"stored\":%s,\"seconds\":%.4f,\"bit_exact\":%s",
           req.trace_path, rep->run_id, rep->layer, st_replay_stage_name(rep->stage),
           (long long)rep->n_positions, rep->recorded_settings, stored ? "true" : "false", rep->seconds,
           !checked ? "null" : all_exact ? "true" : "false");
    if (req.needle_end > req.needle_start)
      printf(",\"needle_tokens\":[%lld,%lld]", (long long)req.needle_start, (long long)req.needle_end);
    printf(",\"cells\":[");
    for (int i = 0; i < rep->n_cells; i++) {
      const st_replay_cell *x = &rep->cells[i];
      st_replay_metrics_json(rep, x, metrics, 8192);
      printf("%s{\"settings\":%s,\"same_as_recorded\":%s,\"bit_exact\":%s,\"metrics\":%s", i ? "," : "",
             x->settings_json, x->same_as_recorded ? "true" : "false",
             x->bit_exact < 0 ? "null" : x->bit_exact ? "true" : "false", metrics);
      char *text = continuation_text_json(req.model_dir, x);
      if (text) printf(",\"continuation_text\":%s", text);
      free(text);
      printf("}");
    }
    printf("]}\n");
    free(metrics);
  } else {
    print_table(rep, req.trace_path, req.model_dir);
    if (src) printf("\nnot stored in the index: %s\n", st_errmsg());
    else if (stored) printf("\nstored %d replay%s in %s/index.sqlite\n", rep->n_cells, rep->n_cells == 1 ? "" : "s", store);
    else printf("\nnot stored: run %s is not in %s/index.sqlite (use --store)\n", rep->run_id, store);
    for (int i = 0; i < rep->n_cells; i++)
      if (rep->cells[i].same_as_recorded && rep->cells[i].bit_exact >= 0)
        printf("determinism check: the recorded settings %s the recorded tensors bit for bit\n",
               rep->cells[i].bit_exact ? "reproduce" : "do NOT reproduce");
    if (!checked) printf("determinism check: not run (no cell has the recorded settings)\n");
  }
  exit_code = all_exact ? 0 : 1;
done:
  st_replay_report_free(rep);
  free(sets);
  free(sweeps);
  return exit_code;
}

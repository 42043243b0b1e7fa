/*
** cmd_replay.c — `sparsetrace replay`: re-execute one layer of a recorded run under alternate
** settings, sweep settings, and say where the needle is lost (replayer/replay.c does the work).
*/
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "progress.h"
#include "engine/text/pyjson.h"
#include "engine/text/tokenizer.h"
#include "recorder/recorder.h"
#include "replayer/replay.h"
#include "replayer/needle.h"
#include "replayer/replay_store.h"

static const st_opt_use replay_options[] = {
  {ST_OPT_TRACE, NULL, "the recorded run"},
  {ST_OPT_MODEL, NULL, "its checkpoint directory (indexer: config.json only)"},
  {ST_OPT_LAYER, NULL, "the layer to re-execute (0 to 65535; the model decides which exist)"},
  {ST_OPT_STAGE, "STAGE", "what to re-execute (default indexer):\n"
                          "indexer    scores and top-k from layers.N.indexer.{q,k,weights} (no weights needed)\n"
                          "attention  the attention block from layers.N.input (recorded at every position)\n"
                          "layer      the whole layer from layers.N.input\n"
                          "rest       layers N..last and the logits (KL, greedy agreement vs recorded logits)"},
  {ST_OPT_SET, NULL, "change a setting (repeatable; 'sparsetrace settings')"},
  {ST_OPT_SWEEP, NULL, "one cell per value; several --sweep give the cross product"},
  {ST_OPT_NEEDLE, NULL, "the needle's text, found in the recorded prompt (its last occurrence\n"
                        "there, never in the answer) with the model's tokenizer"},
  {ST_OPT_NEEDLE_TOKENS, NULL, "the needle's token span [A, B): per query position after it, the best\n"
                               "rank of a compressed row covering it and whether it is in the top-k"},
  {ST_OPT_CONTINUE, NULL, "rest: also greedy-generate N tokens (a full run with layer N changed)\n"
                          "and report whether the continuation contains the needle (0 to 1000000)"},
  {ST_OPT_STORE, NULL, "index to record replays and needle verdicts in (default ./traces;\n"
                       "skipped with a note when the run is not in that index)"},
  {ST_OPT_THREADS, NULL, NULL},
  {ST_OPT_BACKEND, NULL, "compute backend: cpu-ref, cpu, cuda, hip (default: the one that\n"
                         "recorded the trace)"},
  {ST_OPT_JSON, NULL, "one JSON object: recorded settings, cells with metrics, bit_exact\n"
                      "(null when no cell ran the recorded settings: nothing was checked)"},
  {ST_OPT_QUIET, NULL, "no progress line on stderr (shown only when stderr is a terminal)"},
  {0}};

static const st_cmd_spec replay_spec = {
  "replay", "sparsetrace replay --trace T.h5 --model DIR --layer N [options]\n",
  "Re-executes layer N of a recorded run from the inputs the trace holds, under the recorded\n"
  "settings changed by --set, once per cell of the --sweep cross product, and compares each cell\n"
  "with the recording. A cell with the recorded settings must reproduce the recorded tensors bit\n"
  "for bit: that is the determinism check (bit_exact). The alternate settings apply to layer N.\n",
  replay_options,
  "Exit status: 0 when the replay ran (and every recorded-settings cell was bit-exact), 1 on error\n"
  "or when a recorded-settings cell was NOT bit-exact, 2 on usage errors.\n"};

/* A rest-stage continuation as a JSON string (decoded with the model's tokenizer, as `run`
** prints its answer), or NULL when the model has no tokenizer. Caller frees. */
static char *continuation_text_json(const char *model_dir, const st_replay_cell *x) {
  st_tokenizer *tok = NULL;
  char *text = NULL, *out = NULL;
  size_t len = 0;
  if (x->n_continuation && !st_tokenizer_open(model_dir, &tok) &&
      !st_tokenizer_decode(tok, x->continuation, (size_t)x->n_continuation, 0, &text, &len)) {
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

/* st_replay_request.progress: the cells done, on the progress line. */
static void replay_progress(void *ctx, int cells_done, int n_cells) {
  st_progress *p = ctx;
  p->total = n_cells;
  st_progress_update(p, cells_done);
}

int st_cmd_replay(int argc, char **argv) {
  const char *needle_text = NULL;
  st_replay_request req = {.layer = -1, .stage = ST_REPLAY_INDEXER};
  const char **sweeps = calloc((size_t)argc + 1, sizeof(char *));
  int json = 0, exit_code = 2, c;
  st_replay_report *rep = NULL;
  int64_t v;
  st_opts o;
  st_opts_init(&o, &replay_spec, argc, argv);
  if (!sweeps) {
    st_fail(ST_ENOMEM, "the --sweep table for %d arguments", argc);
    exit_code = st_cli_report_error("replay");
    goto done;
  }
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_TRACE: req.trace_path = o.arg; break;
    case ST_OPT_LAYER:
      if (st_opt_int(o.name, o.arg, 0, 65535, &v)) goto bad_value;
      req.layer = (int)v;
      break;
    case ST_OPT_STAGE: {
      int s = st_replay_stage_parse(o.arg);
      if (s < 0) {
        st_opts_error(&o, "--stage '%s': use indexer, attention, layer or rest", o.arg);
        goto done;
      }
      req.stage = (st_replay_stage)s;
      break;
    }
    case ST_OPT_SWEEP: sweeps[req.n_sweeps++] = o.arg; break;
    case ST_OPT_NEEDLE_TOKENS:
      if (st_opt_span(o.name, o.arg, &req.needle_start, &req.needle_end)) goto bad_value;
      break;
    case ST_OPT_NEEDLE: needle_text = o.arg; break;
    case ST_OPT_CONTINUE:
      if (st_opt_int(o.name, o.arg, 0, 1000000, &v)) goto bad_value;
      req.continue_tokens = (int)v;
      break;
    default:
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      goto done;
    }
  }
  if (c == ST_OPTS_EXIT) {
    exit_code = o.exit_code;
    goto done;
  }
  req.model_dir = o.model;
  req.backend = o.backend;
  const char *store = o.store ? o.store : ST_DEFAULT_STORE;
  json = o.json;
  st_opts_apply_threads(o.threads);
  if (!req.trace_path || !req.model_dir || req.layer < 0) {
    fprintf(stderr, "sparsetrace replay: --trace, --model and --layer are required\n"
                    "(sparsetrace replay --help lists the options)\n");
    goto done;
  }
  if (st_opts_backend_available(req.backend)) {
    exit_code = st_cli_report_error("replay");
    goto done;
  }
  req.sets = o.sets;
  req.n_sets = o.n_sets;
  req.sweeps = sweeps;
  req.store_dir = store;
  if (needle_text &&
      st_needle_locate_in_trace(req.model_dir, req.trace_path, needle_text, &req.needle_start, &req.needle_end)) {
    exit_code = st_cli_report_error("replay");
    goto done;
  }
  st_progress pr;
  st_progress_start(&pr, "replay", "cells", 0, o.quiet);
  req.progress = replay_progress;
  req.progress_ctx = &pr;
  st_status replay_rc = st_replay_run(&req, &rep);
  st_progress_end(&pr);
  if (replay_rc) {
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
  if (json) { /* built with jansson: the trace path and the run id (read from the trace) escaped */
    st_buf metrics = {0};
    json_t *o = json_object(), *cells = json_array();
    json_object_set_new(o, "trace", json_string(req.trace_path));
    json_object_set_new(o, "run_id", json_string(rep->run_id));
    json_object_set_new(o, "layer", json_integer(rep->layer));
    json_object_set_new(o, "stage", json_string(st_replay_stage_name(rep->stage)));
    json_object_set_new(o, "positions", json_integer(rep->n_positions));
    json_t *recorded = json_loads(rep->recorded_settings, 0, NULL);
    json_object_set_new(o, "recorded_settings", recorded ? recorded : json_null());
    json_object_set_new(o, "stored", json_boolean(stored));
    json_object_set_new(o, "seconds", json_real(round(rep->seconds * 10000) / 10000));
    json_object_set_new(o, "bit_exact", !checked ? json_null() : json_boolean(all_exact));
    if (req.needle_end > req.needle_start)
      json_object_set_new(o, "needle_tokens", json_pack("[I,I]", (json_int_t)req.needle_start,
                                                        (json_int_t)req.needle_end));
    for (int i = 0; i < rep->n_cells; i++) {
      const st_replay_cell *x = &rep->cells[i];
      st_buf_reset(&metrics);
      json_t *m = st_replay_metrics_json(rep, x, &metrics) ? NULL : json_loads(metrics.data, 0, NULL);
      json_t *cell = json_object(), *settings = json_loads(x->settings_json, 0, NULL);
      json_object_set_new(cell, "settings", settings ? settings : json_null());
      json_object_set_new(cell, "same_as_recorded", json_boolean(x->same_as_recorded));
      json_object_set_new(cell, "bit_exact", x->bit_exact < 0 ? json_null() : json_boolean(x->bit_exact));
      json_object_set_new(cell, "metrics", m ? m : json_null());
      char *text = continuation_text_json(req.model_dir, x);
      json_t *t = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
      if (t) json_object_set_new(cell, "continuation_text", t);
      free(text);
      json_array_append_new(cells, cell);
    }
    json_object_set_new(o, "cells", cells);
    /* default precision (%.17g): the metrics come back as the doubles they were */
    char *dumped = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (dumped) printf("%s\n", dumped);
    free(dumped);
    st_buf_free(&metrics);
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
  goto done;
bad_value:
  st_opts_fail(&o);
done:
  st_replay_report_free(rep);
  st_opts_free(&o);
  free(sweeps);
  return exit_code;
}

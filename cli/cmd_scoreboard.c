/*
** cmd_scoreboard.c — `sparsetrace scoreboard`: run a fixed needle corpus against several targets
** (needle/scoreboard.h), then print the matrix (targets x length and position) and what each
** target restores and breaks against the baseline, or the same as --json.
*/
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "needle/scoreboard.h"
#include "recorder/recorder.h"

#define MAX_TARGETS 32

static const st_opt_use scoreboard_options[] = {
  {ST_OPT_CORPUS, NULL, "the corpus (default demo): demo, small, standard, as defined in\n"
                        "schemas/scoreboard-corpora.json"},
  {ST_OPT_CORPUS_FILE, NULL, "take the corpus from FILE instead ({\"corpora\": [...]}, same shape)"},
  {ST_OPT_TARGET, NULL, "a target (repeatable): engine[:K=V,...] (settings, backend=NAME),\n"
                        "binary:PATH[,K=V,...] (another sparsetrace build), http://HOST:PORT (a\n"
                        "server; each case goes to its format's API). LABEL= names its row"},
  {ST_OPT_BASELINE, NULL, "compare every other target with this one (default: the first stored)"},
  {ST_OPT_MODEL, NULL, "the checkpoint of engine and binary targets (its tokenizer renders)"},
  {ST_OPT_TOKENIZER, NULL, "tokenizer.json to use instead (engine), or for sizes (server)"},
  {ST_OPT_MODEL_NAME, NULL, "the requests' \"model\""},
  {ST_OPT_TIMEOUT, NULL, "seconds per case (default 600): a server's request, or the run of a\n"
                         "binary: target (then killed); the case is stored as not made, with the reason"},
  {ST_OPT_RETRY_ERRORS, NULL, NULL},
  {ST_OPT_THREADS, NULL, "engine OpenMP threads, 1..1024"},
  {ST_OPT_STORE, NULL, "trace store (default ./traces)"},
  {ST_OPT_JSON, NULL, "print the scoreboard as JSON (cells, cases, comparisons)"},
  {ST_OPT_QUIET, NULL, "no progress lines on stderr"},
  {0}};

static const st_cmd_spec scoreboard_spec = {
  "scoreboard",
  "sparsetrace scoreboard [--corpus NAME] [--target [LABEL=]SPEC]... [--baseline LABEL] [options]\n",
  "Runs every case of a fixed needle corpus (kinds x lengths x positions x seeds x formats, each a\n"
  "'needle make' request) against each --target, stores one attempt per target and case\n"
  "(needle_attempts, scoreboard_results; view scoreboard_cells), and prints the matrix: per\n"
  "target, length and position, cases passed (the needle sweep's rule: the answer holds the\n"
  "needle's value verbatim) and how far the wrong answers are from the value (edit distance).\n"
  "Then, per target, the cases it restores and breaks against the baseline. Cases a target has\n"
  "answered are not run again: re-running adds targets and resumes interrupted ones. A target\n"
  "that cannot be used is marked 'error' and the others go on. Without --target the stored\n"
  "scoreboard is printed.\n",
  scoreboard_options,
  "Exit status: 0 when every target ran every case, 1 when a target is marked 'error' or some\n"
  "cases could not be made (stored, counted as '*'), 2 for usage errors.\n"};

/* ---------------------------------------------------------------- progress */

static void progress(void *ctx, const st_scoreboard_target *t, int done, int todo, const st_scoreboard_case *c,
                     const st_harness_attempt *a, int distance) {
  if (*(const int *)ctx) return;
  fprintf(stderr, "[%s %d/%d] case %d: %s %lld tokens at %.2f seed %llu %s: ", t->label, done, todo, c->index,
          st_needle_kind_name(c->kind), (long long)c->tokens, c->position, (unsigned long long)c->seed,
          st_needle_format_name(c->format));
  if (a->error) fprintf(stderr, "ERROR %s\n", a->error);
  else if (a->pass) fprintf(stderr, "pass (%.1f s)\n", a->seconds);
  else fprintf(stderr, "FAIL, %d edits from the needle (%.1f s)\n", distance, a->seconds);
}

/* ---------------------------------------------------------------- the matrix */

static const char *baseline_of(const st_scoreboard *sb, const char *asked) {
  if (asked) return asked;
  return sb->n_rows ? sb->rows[0].label : NULL;
}

static int print_matrix(const st_scoreboard *sb, const char *baseline) {
  printf("scoreboard %s v%d: %d cases\n\n", sb->corpus, sb->version, sb->n_cases);
  int width = 18;
  for (int i = 0; i < sb->n_rows; i++)
    if ((int)strlen(sb->rows[i].label) + 2 > width) width = (int)strlen(sb->rows[i].label) + 2;
  printf("%-*s", width, "tokens");
  for (int t = 0; t < sb->n_tokens; t++)
    for (int p = 0; p < sb->n_positions; p++) {
      char h[32];
      snprintf(h, sizeof h, "%lld", (long long)sb->tokens[t]);
      printf(" %9s", p == 0 ? h : "");
    }
  printf(" %9s\n%-*s", "", width, "target \\ position");
  for (int t = 0; t < sb->n_tokens; t++)
    for (int p = 0; p < sb->n_positions; p++) printf(" %9.2f", sb->positions[p]);
  printf(" %9s\n", "all");
  int any_error = 0, any_wrong = 0;
  for (int i = 0; i < sb->n_rows; i++) {
    const st_scoreboard_row *r = &sb->rows[i];
    printf("%-*s", width, r->label);
    char cell[48];
    for (int k = 0; k < sb->n_tokens * sb->n_positions; k++) {
      st_scoreboard_cell_text(&r->cells[k], cell, sizeof cell);
      printf(" %9s", cell);
    }
    st_scoreboard_cell_text(&r->total, cell, sizeof cell);
    printf(" %9s", cell);
    if (strcmp(r->status, "complete")) printf("  %s%s%s", r->status, r->error ? ": " : "", r->error ? r->error : "");
    printf("\n");
    any_error |= r->total.errors > 0;
    any_wrong |= r->total.wrong > 0;
  }
  printf("\n(cells: passed/cases");
  if (any_wrong) printf("; ~D: the wrong answers' mean edit distance from the needle's value");
  if (any_error) printf("; * some cases could not be made (their error is stored)");
  printf(")\n");
  const char *base = baseline_of(sb, baseline);
  if (sb->n_rows > 1 && base) {
    printf("\nagainst %s:\n", base);
    for (int i = 0; i < sb->n_rows; i++) {
      if (!strcmp(sb->rows[i].label, base)) continue;
      st_scoreboard_comparison c;
      if (st_scoreboard_compare(sb, base, sb->rows[i].label, &c)) return 1;
      char sentence[512];
      st_scoreboard_comparison_sentence(&c, sentence, sizeof sentence);
      printf("  %s\n", sentence);
      st_scoreboard_comparison_free(&c);
    }
  }
  return 0;
}

static json_t *cell_json(const st_scoreboard_cell *c) {
  json_t *o = json_pack("{s:i, s:i, s:i, s:i}", "cases", c->cases, "passed", c->passed, "errors", c->errors, "wrong",
                        c->wrong);
  json_object_set_new(o, "mean_distance", c->mean_distance >= 0 ? json_real(c->mean_distance) : json_null());
  return o;
}

static json_t *int_list(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static int print_json(const st_scoreboard *sb, const char *baseline) {
  static const char *const outcome_names[] = {"fail", "pass", "error"};
  json_t *root = json_pack("{s:s, s:i, s:i}", "corpus", sb->corpus, "version", sb->version, "cases", sb->n_cases);
  json_t *tokens = json_array(), *positions = json_array(), *targets = json_array(), *cmp = json_array();
  for (int t = 0; t < sb->n_tokens; t++) json_array_append_new(tokens, json_integer(sb->tokens[t]));
  for (int p = 0; p < sb->n_positions; p++) json_array_append_new(positions, json_real(sb->positions[p]));
  json_object_set_new(root, "tokens", tokens);
  json_object_set_new(root, "positions", positions);
  for (int i = 0; i < sb->n_rows; i++) {
    const st_scoreboard_row *r = &sb->rows[i];
    json_t *row = json_pack("{s:s, s:s, s:s, s:s}", "label", r->label, "spec", r->spec, "kind", r->kind, "status", r->status);
    json_object_set_new(row, "error", r->error ? json_string(r->error) : json_null());
    json_object_set_new(row, "total", cell_json(&r->total));
    json_t *cells = json_array(), *cases = json_array();
    for (int t = 0; t < sb->n_tokens; t++)
      for (int p = 0; p < sb->n_positions; p++) {
        json_t *c = cell_json(&r->cells[t * sb->n_positions + p]);
        json_object_set_new(c, "tokens", json_integer(sb->tokens[t]));
        json_object_set_new(c, "position", json_real(sb->positions[p]));
        json_array_append_new(cells, c);
      }
    for (int k = 0; k < sb->n_cases; k++) {
      const st_scoreboard_case *c = &sb->cases[k];
      json_t *o = json_pack("{s:i, s:s, s:I, s:f, s:I, s:s}", "case", k, "kind", st_needle_kind_name(c->kind), "tokens",
                            (json_int_t)c->tokens, "position", c->position, "seed", (json_int_t)c->seed, "format",
                            st_needle_format_name(c->format));
      json_object_set_new(o, "outcome", r->outcome[k] == ST_SCOREBOARD_NONE ? json_null()
                                        : json_string(outcome_names[r->outcome[k]]));
      json_object_set_new(o, "distance", r->distance[k] >= 0 ? json_integer(r->distance[k]) : json_null());
      json_array_append_new(cases, o);
    }
    json_object_set_new(row, "cells", cells);
    json_object_set_new(row, "case_results", cases);
    json_array_append_new(targets, row);
  }
  json_object_set_new(root, "targets", targets);
  const char *base = baseline_of(sb, baseline);
  json_object_set_new(root, "baseline", base ? json_string(base) : json_null());
  for (int i = 0; base && i < sb->n_rows; i++) {
    if (!strcmp(sb->rows[i].label, base)) continue;
    st_scoreboard_comparison c;
    if (st_scoreboard_compare(sb, base, sb->rows[i].label, &c)) {
      json_decref(root);
      json_decref(cmp);
      return 1;
    }
    char sentence[512];
    st_scoreboard_comparison_sentence(&c, sentence, sizeof sentence);
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "target", c.target, "baseline", c.baseline,
                          "compared", c.compared, "baseline_failed", c.baseline_failed, "restored", c.restored,
                          "baseline_passed", c.baseline_passed, "broken", c.broken, "not_compared", c.not_compared,
                          "sentence", sentence);
    json_object_set_new(o, "restored_cases", int_list(c.restored_cases, c.restored));
    json_object_set_new(o, "broken_cases", int_list(c.broken_cases, c.broken));
    json_array_append_new(cmp, o);
    st_scoreboard_comparison_free(&c);
  }
  json_object_set_new(root, "comparisons", cmp);
  char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (s) printf("%s\n", s);
  free(s);
  json_decref(root);
  return 0;
}

/* ---------------------------------------------------------------- the command */

int st_cmd_scoreboard(int argc, char **argv) {
  const char *corpus_name = "demo", *corpus_file = NULL, *baseline = NULL, *tokenizer = NULL, *model_name = NULL;
  const char *target_args[MAX_TARGETS];
  st_scoreboard_target *targets = NULL;
  int n_targets = 0, retry = 0, c, rc = 2;
  double timeout = 0;
  char *command_line = NULL;
  st_scoreboard_corpus corpus = {0};
  st_scoreboard sb = {0};
  st_index *ix = NULL;
  st_opts op;
  st_opts_init(&op, &scoreboard_spec, argc, argv);
  while ((c = st_opts_next(&op)) > 0) {
    switch (c) {
    case ST_OPT_CORPUS: corpus_name = op.arg; break;
    case ST_OPT_CORPUS_FILE: corpus_file = op.arg; break;
    case ST_OPT_TARGET:
      if (n_targets == MAX_TARGETS) { st_opts_error(&op, "at most %d --target", MAX_TARGETS); goto out; }
      target_args[n_targets++] = op.arg;
      break;
    case ST_OPT_BASELINE: baseline = op.arg; break;
    case ST_OPT_TOKENIZER: tokenizer = op.arg; break;
    case ST_OPT_MODEL_NAME: model_name = op.arg; break;
    case ST_OPT_RETRY_ERRORS: retry = 1; break;
    case ST_OPT_TIMEOUT:
      if (st_opt_double(op.name, op.arg, 1e-3, 86400.0 * 365, &timeout)) goto bad_value;
      break;
    default: st_opts_error(&op, "unexpected argument '%s'", op.arg); goto out;
    }
  }
  if (c == ST_OPTS_EXIT) {
    rc = op.exit_code;
    goto out;
  }
  const char *store = op.store ? op.store : ST_DEFAULT_STORE;
  int quiet = op.quiet;
  targets = calloc(MAX_TARGETS, sizeof *targets);
  if (!targets) { rc = st_cli_report_error("scoreboard"); goto out; }
  for (int i = 0; i < n_targets; i++)
    if (st_scoreboard_target_parse(target_args[i], &targets[i])) goto bad_value;
  for (int i = 0; i < n_targets; i++)
    if (targets[i].kind != ST_SCOREBOARD_SERVER && !op.model) {
      st_opts_error(&op, "--target %s: engine and binary targets need --model DIR", target_args[i]);
      goto out;
    }
  st_opts_apply_threads(op.threads);
  rc = 1;
  if (st_scoreboard_corpus_load(corpus_file, corpus_name, &corpus)) { rc = st_cli_report_error("scoreboard"); goto out; }
  int failed_targets = 0, case_errors = 0;
  if (n_targets > 0) {
    if (st_scoreboard_prepare(store, &corpus, targets, n_targets)) { rc = st_cli_report_error("scoreboard"); goto out; }
    command_line = st_cli_join_args("sparsetrace", argc, argv);
    st_scoreboard_run_options ro = {.store = store, .model_dir = op.model, .tokenizer_dir = tokenizer,
                                    .model_name = model_name, .timeout_s = timeout, .retry_errors = retry,
                                    .command_line = command_line, .progress = progress, .progress_ctx = &quiet};
    for (int i = 0; i < n_targets; i++) {
      st_scoreboard_run_summary sum;
      if (st_scoreboard_run_target(&ro, &corpus, &targets[i], &sum)) { rc = st_cli_report_error("scoreboard"); goto out; }
      if (!quiet)
        fprintf(stderr, "scoreboard: %s: %d of %d cases already done, %d run now (%d passed, %d could not be made)%s%s\n",
                targets[i].label, sum.skipped, sum.cases, sum.ran, sum.passed, sum.errors,
                sum.failed ? "; marked error: " : "", sum.failed ? sum.error : "");
      failed_targets += sum.failed;
    }
  }
  if (st_index_open(store, ST_INDEX_READ_ONLY, &ix) || st_scoreboard_read(ix, corpus.name, corpus.version, &sb)) {
    rc = st_cli_report_error("scoreboard");
    goto out;
  }
  if (baseline && !st_scoreboard_row_named(&sb, baseline)) {
    st_fail(ST_ENOTFOUND, "--baseline %s: the scoreboard %s v%d has no such target", baseline, sb.corpus, sb.version);
    rc = st_cli_report_error("scoreboard");
    goto out;
  }
  if (op.json ? print_json(&sb, baseline) : print_matrix(&sb, baseline)) {
    rc = st_cli_report_error("scoreboard");
    goto out;
  }
  for (int i = 0; i < sb.n_rows; i++) {
    case_errors += sb.rows[i].total.errors;
    failed_targets += n_targets == 0 && !strcmp(sb.rows[i].status, "error");
  }
  if (!op.json) printf("stored: %s/index.sqlite, view scoreboard_cells WHERE corpus = '%s' AND corpus_version = %d\n",
                       store, sb.corpus, sb.version);
  rc = failed_targets || case_errors ? 1 : 0;
  goto out;
bad_value:
  st_opts_fail(&op);
  rc = 2;
out:
  st_opts_free(&op);
  st_scoreboard_free(&sb);
  st_index_close(ix);
  st_scoreboard_corpus_free(&corpus);
  free(targets);
  free(command_line);
  return rc;
}

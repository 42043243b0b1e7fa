/*
** cmd_report.c — `sparsetrace report`: one self-contained HTML page for runs, their diff, needle
** sweeps and a bisect (report/report.c draws it; report/html.c is the writer).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "report/report.h"

static const st_opt_use report_options[] = {
  {ST_OPT_OUT, "FILE", "the page to write (default report.html; '-': standard output)"},
  {ST_OPT_STORE, NULL, "the store whose index the targets are looked up in (default ./traces)"},
  {ST_OPT_MODEL, NULL, "the checkpoint directory (answers and token texts, bisect; default: the\n"
                       "run's model_dir attribute)"},
  {ST_OPT_POSITION, "N", "query position of the indexer-score histograms (default: the last\n"
                         "prompt position, where the answer's first token is chosen)"},
  {ST_OPT_GOOD, NULL, "with --bad: also bisect the first run (as `sparsetrace bisect`)"},
  {ST_OPT_BAD, NULL, "the settings that lose the needle"},
  {0}};

static const st_cmd_spec report_spec = {
  "report",
  "sparsetrace report TARGET... [-o report.html] [--store DIR] [--model DIR] [--position N]\n"
  "                         [--good K=V,... --bad K=V,...]\n",
  "Writes one self-contained HTML page (inline SVG, CSS and a little JavaScript: no network, opens\n"
  "from file://, prints) of what the store knows about the targets. A TARGET is\n"
  "  RUN-ID, a unique prefix of one, or a trace path (.h5)\n"
  "      identity (model, settings, build, backend, command, linked request, answer), needle\n"
  "      verdicts per CSA layer with a heat map of the needle's rank per layer x query position\n"
  "      (the top-k marked), indexer-score histograms at --position with the needle's rows marked,\n"
  "      and the replays stored for the run\n"
  "  two runs: also side by side, their diff (first divergence, difference per tap in forward\n"
  "      order) and the top-k Jaccard per layer\n"
  "  sweep:ID (a unique prefix) or sweep:all: a needle sweep's pass/fail grid (answers on hover)\n"
  "  scoreboard:NAME[@VERSION]: a scoreboard's matrix, its targets, what each fixes and breaks\n"
  "With --good and --bad the first run is also bisected (computed: bisects are not stored).\n"
  "Every value is the one the text commands print (run, diff, bisect, needle sweep), from the same\n"
  "functions; each drawn element carries it in data- attributes.\n",
  report_options,
  "Exit status: 0 written, 1 error (a target not found, a trace unreadable), 2 usage.\n"};

int st_cmd_report(int argc, char **argv) {
  const char *out_path = "report.html";
  const char **targets = calloc((size_t)argc + 1, sizeof *targets);
  if (!targets) return 1;
  int n_targets = 0;
  st_report_options ro = {.position = -1};
  int c;
  st_opts o;
  st_opts_init(&o, &report_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_POSITIONAL: targets[n_targets++] = o.arg; break;
    case ST_OPT_OUT: out_path = o.arg; break;
    case ST_OPT_GOOD: ro.good = o.arg; break;
    case ST_OPT_BAD: ro.bad = o.arg; break;
    case ST_OPT_POSITION:
      if (st_opt_int(o.name, o.arg, 0, INT64_MAX / 2, &ro.position)) st_opts_fail(&o), c = ST_OPTS_EXIT;
      break;
    default: st_opts_error(&o, "unexpected argument '%s'", o.arg), c = ST_OPTS_EXIT;
    }
    if (c == ST_OPTS_EXIT) break;
  }
  ro.store_dir = o.store ? o.store : "traces";
  ro.model_dir = o.model;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) { free(targets); return o.exit_code; }
  if (!n_targets || (!ro.good != !ro.bad)) {
    fprintf(stderr, "sparsetrace report: %s\n(sparsetrace report --help lists the options)\n",
            !n_targets ? "at least one TARGET is required (a run id, a trace .h5, sweep:ID, sweep:all or scoreboard:NAME)"
                       : "--good and --bad go together");
    free(targets);
    return 2;
  }
  char *command_line = st_cli_join_args("sparsetrace", argc, argv);
  ro.command_line = command_line;
  st_buf page = {0};
  st_status rc = st_report_write(targets, n_targets, &ro, &page);
  free(targets);
  free(command_line);
  if (rc) { st_buf_free(&page); return st_cli_report_error("report"); }
  /* written beside the target under a temporary name and renamed: a failed write leaves no half page */
  int to_stdout = !strcmp(out_path, "-");
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.part", out_path);
  FILE *f = to_stdout ? stdout : fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "sparsetrace report: cannot write %s: %s\n", tmp, strerror(errno));
    st_buf_free(&page);
    return 1;
  }
  int bad = fwrite(page.data, 1, page.len, f) != page.len;
  bad |= to_stdout ? fflush(f) != 0 : fclose(f) != 0;
  if (!to_stdout && !bad && rename(tmp, out_path) != 0) bad = 1;
  if (bad) {
    fprintf(stderr, "sparsetrace report: writing %s: %s\n", out_path, strerror(errno));
    if (!to_stdout) unlink(tmp);
    st_buf_free(&page);
    return 1;
  }
  if (!to_stdout) fprintf(stderr, "report: %s (%zu bytes)\n", out_path, page.len);
  st_buf_free(&page);
  return 0;
}

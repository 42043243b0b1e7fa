/*
** report.h — `sparsetrace report`: one self-contained HTML page (report/html.h) of what a store
** knows about some targets.
**
** Targets, one kind per form (the table `target_kinds` in report.c; a new kind, e.g. a
** scoreboard, is one more row there: a prefix, a resolver and a section writer drawing with the
** html.h figures):
**   RUN-ID, a run-id prefix, or a trace path (*.h5)
**              the run's identity (model, settings, build, backend, command, linked request,
**              answer), its needle verdicts per CSA layer (table, and a heat map of the needle's
**              rank per layer x query position with the top-k marked), the indexer-score
**              histogram of every CSA layer at one position with the needle's rows marked, and
**              the replays stored for it (each cell's verdict and metrics)
**   two runs   each as above, the heat maps side by side, then their diff: the first divergence,
**              per-tap difference metrics in forward order, the top-k Jaccard per layer
**   sweep:ID | sweep:all
**              a `needle sweep`'s grid (context length x position, pass/fail, answers on hover)
**              and its attempts
**   scoreboard:NAME[@VERSION]
**              a `sparsetrace scoreboard` board (targets x (context, position) cells and all,
**              each "passed/cases~D" as the command prints it), its targets, and what each
**              restores and breaks against the first (st_scoreboard_read, st_scoreboard_cell_text,
**              st_scoreboard_compare: needle/scoreboard.c)
** With --good/--bad, a bisect of the first run (computed: bisect results are not stored).
**
** Where the values come from, so the page cannot disagree with the text commands: verdicts are
** st_needle_judge (replayer/needle.c) over the index's needle_verdicts rows; diff metrics are
** st_diff_traces (replayer/diff.c) with the defaults `sparsetrace diff` uses; the bisect is
** st_bisect_run (replayer/bisect.c); the sweep grid is the view needle_sweep_cells, which
** `needle sweep` fills; score histograms read the trace's layers.N.indexer.scores and .topk rows,
** and the needle rows are st_replay_needle_rows (replayer/replay.c).
*/
#ifndef ST_REPORT_H
#define ST_REPORT_H

#include <stdint.h>

#include "common/base.h"
#include "common/buf.h"

typedef struct st_report_options {
  const char *store_dir;   /* the index (NULL: "traces") */
  const char *model_dir;   /* the checkpoint (tokenizer for answers, bisect); NULL: the run's */
  int64_t position;        /* query position of the score histograms; -1: the last prompt one */
  const char *good, *bad;  /* both set: bisect the first run (KEY=VALUE,... over the recorded) */
  const char *command_line; /* shown in the footer (NULL: none) */
} st_report_options;

/* Appends the page for targets[0..n) to out. Errors name the target and what is missing
** (ST_ENOTFOUND: no such run or sweep in the index; ST_EINVAL: a target of no known form);
** out then holds nothing usable. */
st_status st_report_write(const char *const *targets, int n, const st_report_options *o, st_buf *out);

#endif

/*
** bisect.h — which single setting change flips the needle verdict, and at which layer.
**
** The verdict of a layer is the one of schemas/needle-verdicts.md (st_needle_judge in needle.h):
** it counts the answer positions that can copy the needle (from the last prompt position, whose
** query emits the answer's first token, as many as the needle has tokens) at which the needle
** (its best compressed row) is in the indexer's top-k, and the layer retrieves the needle when
** that is most of them. A layer flips when its verdict differs between good and bad, in either
** direction; a change of the count alone is a change in counts. Each candidate is an
** indexer-stage replay of every CSA layer from the recorded inputs (replay.h), never a re-run of
** the model.
*/
#ifndef ST_BISECT_H
#define ST_BISECT_H

#include <stdint.h>

#include "common/base.h"

#define ST_BISECT_MAX_LAYERS 256
#define ST_BISECT_MAX_CHANGES 8

typedef struct st_bisect_verdict {
  int retrieves;     /* in the top-k at most of the judged positions */
  int kept;          /* positions where it is in the top-k, of */
  int positions;     /* the positions judged */
  int64_t rank;      /* the needle's worst best-rank over them (-1: never visible) */
  int topk;
} st_bisect_verdict;

typedef struct st_bisect_change {
  char key[64], good[64], bad[64];
  int alone_flips_at;   /* good + this change alone: its first flip (as first_flip_layer), -1 none */
  int alone_changes_at; /* good + this change alone: the first layer whose counts change, -1 none */
  int restores;         /* bad with this key set back to good gives good's counts at every layer */
} st_bisect_change;

typedef struct st_bisect_report {
  int n_layers;                         /* CSA layers examined */
  int layers[ST_BISECT_MAX_LAYERS];
  st_bisect_verdict good[ST_BISECT_MAX_LAYERS], bad[ST_BISECT_MAX_LAYERS];
  int first_flip_layer;                 /* the first layer whose verdict differs between good and
                                           bad, either direction; -1: none */
  int first_change_layer;               /* the first layer whose counts differ; -1: none */
  int n_changes;
  st_bisect_change changes[ST_BISECT_MAX_CHANGES];
  int minimal[ST_BISECT_MAX_CHANGES];   /* indices into changes: the smallest set that gives bad's
                                           counts at every layer */
  int n_minimal;
  int64_t first_position, last_position; /* the query positions judged */
  char explanation[1024];
  double seconds;
  int replays;
} st_bisect_report;

typedef struct st_bisect_request {
  const char *trace_path, *model_dir;
  const char *good, *bad;           /* comma-separated KEY=VALUE lists over the recorded settings */
  int64_t needle_start, needle_end; /* the needle's token span [start, end) */
  const char *backend;              /* of the replays; NULL: the backend that recorded the trace */
} st_bisect_request;

st_status st_bisect_run(const st_bisect_request *req, st_bisect_report *out);

/* What layer i (an index into r->layers) shows between good and bad: "first flip", "flips",
** "counts change, no flip" or "" (the same verdict and counts). The text table and the report
** both say it with this. */
const char *st_bisect_layer_note(const st_bisect_report *r, int i);

#endif

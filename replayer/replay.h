/*
** replay.h — re-execute one layer of a recorded run under alternate settings (issue: "turn 'the
** model can't recall the line' into 'layer 12's indexer drops the needle when only q is
** rotated'").
**
** Stages, from what the trace recorded:
**   indexer    from layers.N.indexer.{q,k,weights}: rotation, quantisation, scores, top-k;
**              needs only the model's config.json, no weights
**   attention  the whole attention block from layers.N.input (all positions), only layer N loaded
**   layer      the whole layer (attention + MoE) likewise
**   rest       layers N..last and the logits, from layers.N.input; optionally a short greedy
**              continuation (a full run with layer N under the alternate settings)
** The alternate settings apply to layer N only; every other layer keeps the recorded ones.
** A cell whose settings equal the recorded ones must reproduce the recorded tensors bit for bit:
** that is the determinism check (bit_exact).
*/
#ifndef ST_REPLAY_H
#define ST_REPLAY_H

#include <stdint.h>

#include "common/base.h"
#include "engine/settings.h"

typedef enum st_replay_stage {
  ST_REPLAY_INDEXER = 0,
  ST_REPLAY_ATTENTION,
  ST_REPLAY_LAYER,
  ST_REPLAY_REST,
} st_replay_stage;

const char *st_replay_stage_name(st_replay_stage stage);
int st_replay_stage_parse(const char *name); /* -1 if unknown */

typedef struct st_replay_request {
  const char *trace_path;
  const char *model_dir;
  int layer;
  st_replay_stage stage;
  const char *const *sets;   /* "key=value", applied over the recorded settings */
  int n_sets;
  const char *const *sweeps; /* "key=v1,v2,..."; the cells are the cross product */
  int n_sweeps;
  int64_t needle_start, needle_end; /* token span [start, end); end <= start: no needle */
  int continue_tokens;       /* rest: greedy tokens after the prompt (0 = none) */
  const char *backend;       /* NULL: the backend that recorded the trace (its build attribute) */
  /* Called after each cell (or group of cells computed together) with the cells done so far,
  ** for a progress line (cli/progress.c); NULL: none. */
  void (*progress)(void *ctx, int cells_done, int n_cells);
  void *progress_ctx;
  const char *store_dir;     /* non-NULL: the trace's content digest must also match its run's
                             ** row in this store's index (when the store indexes that run) */
} st_replay_request;

/* One query position's needle verdict (docs/design.md "Needle verdicts"). */
typedef struct st_needle_verdict {
  int64_t position;
  int64_t best_rank;  /* -1: no needle row visible yet */
  int32_t best_row;
  float score;
  int in_topk;
  int topk;
  int64_t n_visible;
} st_needle_verdict;

typedef struct st_replay_cell {
  char label[256];          /* the sweep assignment, "rotate=q topk=64" ("recorded" if none) */
  char settings_json[512];  /* the cell's resolved settings */
  int same_as_recorded;     /* the cell's settings equal the recorded ones */
  int bit_exact;            /* 1/0 when recorded values were compared, -1 when nothing to compare */
  double seconds;
  /* indexer: top-k against the recorded top-k, scores against the recorded scores */
  int has_topk;
  int64_t topk_rows, topk_identical_rows;
  double topk_jaccard_mean, topk_jaccard_min, topk_overlap_mean;
  int has_scores;
  double score_difference, score_cosine, score_max_abs;
  int64_t score_max_abs_position, score_max_abs_row, score_mask_mismatch;
  /* attention / layer / rest: the stage's output against the recorded tap */
  int has_output;
  char output_tap[128];
  double output_difference, output_cosine, output_max_abs;
  /* rest: logits */
  int has_logits;
  int64_t logits_positions;
  double kl_mean, kl_max, greedy_agreement;
  int n_continuation;
  int32_t continuation[256];
  int continuation_has_needle; /* -1: no needle or no continuation */
  /* needle (positions >= needle end) */
  int64_t n_verdicts;
  st_needle_verdict *verdicts; /* owned */
  int64_t needle_positions_in_topk;
} st_replay_cell;

typedef struct st_replay_report {
  char run_id[64];
  char backend[32];          /* the backend the replay ran on */
  char recorded_settings[512];
  int layer;
  st_replay_stage stage;
  int64_t n_positions;       /* query positions replayed */
  int64_t n_rows;            /* compressed rows (indexer stage) */
  int64_t n_prompt;          /* the recorded prompt's tokens (the needle verdict's answer positions) */
  int64_t needle_start, needle_end; /* the needle span replayed (end <= start: none) */
  int n_needle_rows;
  int32_t needle_rows[64];
  int n_cells;
  st_replay_cell *cells;     /* owned */
  double seconds;
  char content_digest[32];   /* the trace's digest as recomputed before replaying */
} st_replay_report;

/* Runs every cell of the request. First recomputes the trace's content digest and refuses
** (ST_EFORMAT) a trace whose digest differs from its content_digest attribute or from its run's
** runs.content_digest in req->store_dir: a modified copy is never replayed as the recorded run.
** Errors name the trace, the tap that is missing and how to
** record it. The report is freed with st_replay_report_free. */
st_status st_replay_run(const st_replay_request *req, st_replay_report **out);
void st_replay_report_free(st_replay_report *r);

/* The compressed rows of a CSA layer (compress ratio m, `rows` rows, overlapping pools: row j
** pools tokens [m(j-1), m j + m - 1]) that pool any token of [start, end), ascending, at most cap
** into out; returns how many. The needle rows of every verdict and of `report`'s histograms. */
int st_replay_needle_rows(int m, int64_t rows, int64_t start, int64_t end, int32_t *out, int cap);

/* Parses a trace's "settings" attribute (JSON) into settings. */
st_status st_settings_from_json(const char *json, st_settings *out);

#endif

/*
** needle.h — the needle: the token span a long prompt must be able to recall, and its verdicts.
*/
#ifndef ST_NEEDLE_H
#define ST_NEEDLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/base.h"
#include "replay.h"

/* `--needle TEXT`, the one matcher used by run, replay and bisect: finds TEXT in the prompt
** tokens[0..n_prompt) using the model's tokenizer (model_dir/tokenizer.json): the last occurrence
** of its tokens in the prompt, tried as written, after a space and after a newline (BPE tokens
** differ at word starts). Never in the generated tokens: an answer that copies the needle back
** holds a second copy, and the verdict is about the prompt's. ST_ENOTFOUND names the text when
** the prompt does not hold it. */
st_status st_needle_locate(const char *model_dir, const int32_t *tokens, int64_t n_prompt,
                           const char *text, int64_t *start, int64_t *end);

/* Same, in the prompt of a recorded trace (its /tokens up to the attribute n_prompt). */
st_status st_needle_locate_in_trace(const char *model_dir, const char *trace_path, const char *text,
                                    int64_t *start, int64_t *end);

/* ---------------------------------------------------------------- the needle verdict
** The one rule (schemas/needle-verdicts.md), used by run, the views, replay, bisect and needle
** sweep alike:
**   rank      at a query position: the best rank of any compressed row covering the needle's
**             tokens (st_needle_verdict.best_rank)
**   keeps     a layer keeps the needle at a position when that rank is inside the top-k: a row
**             covering the needle is among the top-k rows the indexer selected there
**             (st_needle_verdict.in_topk; st_needle_keeps)
**   answer positions  the positions that can copy the needle: from the last prompt position
**             (its query emits the answer's first token) on, as many as the needle has tokens,
**             [n_prompt - 1, n_prompt - 1 + (needle_end - needle_start)); only those the trace
**             recorded are judged
**   retrieves a layer retrieves the needle when it keeps it at most (strictly more than half) of
**             the judged answer positions; with none judged there is no verdict */

/* The answer positions that can copy the needle: [*first, *end). */
void st_needle_answer_positions(int64_t n_prompt, int64_t needle_start, int64_t needle_end,
                                int64_t *first, int64_t *end);

/* 1 when the layer keeps the needle at this position. */
int st_needle_keeps(const st_needle_verdict *v);

/* One layer's verdict over its per-position verdicts v[0..n) (any order, any positions). */
typedef struct st_needle_judgement {
  int64_t answer_first, answer_end; /* the answer positions [first, end) */
  int positions;                    /* of those, the ones with a verdict (recorded): judged */
  int kept;                         /* judged positions where the layer keeps the needle */
  int retrieves;                    /* 1: 2 * kept > positions; 0: not; -1: nothing judged */
  int64_t best_rank, worst_rank;    /* over the judged positions (-1: none, or never visible) */
  int topk;                         /* k at the first judged position (0: none) */
  int64_t first, last;              /* first and last judged position (-1: none) */
} st_needle_judgement;

st_needle_judgement st_needle_judge(const st_needle_verdict *v, int64_t n, int64_t n_prompt,
                                    int64_t needle_start, int64_t needle_end);

/* The same for a replay cell (the report carries the prompt length and the needle span). */
st_needle_judgement st_needle_judge_cell(const st_replay_report *r, const st_replay_cell *c);

/* "top-32", or "top-all" for topk=all (k = INT32_MAX): how verdicts name the k in force. */
const char *st_needle_topk_name(int topk, char *buf, size_t size);

/* "yes" / "no" / "-" (nothing judged). */
const char *st_needle_retrieves_word(const st_needle_judgement *j);

/* What st_needle_record_verdicts found, per CSA layer. */
#define ST_NEEDLE_MAX_LAYERS 256
typedef struct st_needle_summary {
  int n_layers;                     /* CSA layers judged */
  int layers[ST_NEEDLE_MAX_LAYERS];
  st_needle_judgement judgements[ST_NEEDLE_MAX_LAYERS];
  int n_retrieving;                 /* layers whose verdict is "retrieves" */
} st_needle_summary;

/* Verdicts of the recorded run itself (replay_id NULL in needle_verdicts), one CSA layer each:
** the indexer replayed under the recorded settings (bit-exact) supplies scores and top-k. Prints
** one line per layer to stdout unless quiet (the verdict of st_needle_judge); fills summary
** (may be NULL). */
st_status st_needle_record_verdicts(const char *trace_path, const char *model_dir,
                                    const char *store_dir, int64_t start, int64_t end,
                                    const char *text, int quiet, st_needle_summary *summary);

#endif

/*
** needle.h — the needle: the token span a long prompt must be able to recall, and its verdicts.
*/
#ifndef ST_NEEDLE_H
#define ST_NEEDLE_H

#include <stdint.h>

#include "common/base.h"
#include "replay.h"

/* Finds TEXT in tokens[0..n) using the model's tokenizer (model_dir/tokenizer.json): the last
** occurrence of its tokens, tried as written, after a space and after a newline (BPE tokens differ
** at word starts). ST_ENOTFOUND names the text when it is not there. */
st_status st_needle_locate(const char *model_dir, const int32_t *tokens, int64_t n, const char *text,
                           int64_t *start, int64_t *end);

/* Same, over the tokens a trace recorded (prompt then generated). */
st_status st_needle_locate_in_trace(const char *model_dir, const char *trace_path, const char *text,
                                    int64_t *start, int64_t *end);

/* Verdicts of the recorded run itself (replay_id NULL in needle_verdicts), one CSA layer each:
** the indexer replayed under the recorded settings (bit-exact) supplies scores and top-k. Prints
** one line per layer to stdout unless quiet. */
st_status st_needle_record_verdicts(const char *trace_path, const char *model_dir,
                                    const char *store_dir, int64_t start, int64_t end,
                                    const char *text, int quiet);

#endif

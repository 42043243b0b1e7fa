/*
** needle.h — the needle: the token span a long prompt must be able to recall, and its verdicts.
*/
#ifndef ST_NEEDLE_H
#define ST_NEEDLE_H

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

/* Verdicts of the recorded run itself (replay_id NULL in needle_verdicts), one CSA layer each:
** the indexer replayed under the recorded settings (bit-exact) supplies scores and top-k. Prints
** one line per layer to stdout unless quiet. */
st_status st_needle_record_verdicts(const char *trace_path, const char *model_dir,
                                    const char *store_dir, int64_t start, int64_t end,
                                    const char *text, int quiet);

#endif

/* replay_store.h — replays and needle verdicts into the store's index.sqlite. */
#ifndef ST_REPLAY_STORE_H
#define ST_REPLAY_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "replay.h"

/* Appends one JSON object of a cell's metrics to out (its label and output tap escaped); ST_OK,
** or ST_ENOMEM with the message set when the buffer could not grow. */
st_status st_replay_metrics_json(const st_replay_report *r, const st_replay_cell *c, st_buf *out);

/* Stores every cell as a `replays` row and its needle verdicts, in one transaction. *stored = 0
** (and ST_OK) when the replayed run is not in this store's index. */
st_status st_replay_store(const char *store_dir, const st_replay_report *r, const char *command_line,
                          int64_t needle_start, int64_t needle_end, const char *needle_text,
                          int *stored);

/* Stores the verdicts of the report's first cell as the recorded run's own (replay_id NULL),
** with the needle. *stored = 0 when the run is not in this index. */
st_status st_replay_store_verdicts(const char *store_dir, const st_replay_report *r,
                                   int64_t needle_start, int64_t needle_end, const char *needle_text,
                                   int *stored);

#endif

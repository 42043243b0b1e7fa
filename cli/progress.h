/*
** progress.h — one progress line on stderr for long work (run's prefill and generation, replay's
** cells): "run: 4096/16384 tokens, 312 tokens/s, 39 s left", rewritten in place. Shown only when
** stderr is a terminal and --quiet was not given; otherwise every call does nothing, so stdout,
** traces and --json are the same either way.
*/
#ifndef ST_CLI_PROGRESS_H
#define ST_CLI_PROGRESS_H

#include <stdint.h>
#include <time.h>

typedef struct st_progress {
  int on;            /* stderr is a terminal and not --quiet */
  const char *what;  /* "run", "replay" */
  const char *unit;  /* "tokens", "cells" */
  int64_t total, done;
  struct timespec t0;
  double last_shown; /* seconds since t0 of the last line written */
  int shown;         /* a line is on the terminal */
  int rated;         /* a line with a rate was written */
} st_progress;

/* Starts a progress over total units (prints the 0/total line; total 0: not known yet, set
** p->total before an update). */
void st_progress_start(st_progress *p, const char *what, const char *unit, int64_t total, int quiet);
/* done units of total so far; rewritten at most ten times a second, but always at the first update
** (the first rate and time left, however quick the first piece) and at total. */
void st_progress_update(st_progress *p, int64_t done);
/* Ends the line with a summary ("run: 16384 tokens in 52.1 s, 314 tokens/s") and a newline. */
void st_progress_end(st_progress *p);

#endif

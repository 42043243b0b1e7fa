/* progress.c — the progress line of long commands (cli/progress.h). */
#include "progress.h"

#include <stdio.h>
#include <unistd.h>

static double elapsed(const st_progress *p) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - p->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - p->t0.tv_nsec);
}

static void show(st_progress *p, double now) {
  if (p->total <= 0) return; /* not known yet */
  fprintf(stderr, "\r%s: %lld/%lld %s", p->what, (long long)p->done, (long long)p->total, p->unit);
  if (p->done > 0 && now > 0) {
    double rate = (double)p->done / now;
    fprintf(stderr, ", %.*f %s/s", rate < 10 ? 2 : 0, rate, p->unit);
    if (p->done < p->total) {
      double left = (double)(p->total - p->done) / rate;
      if (left < 120) fprintf(stderr, ", %.0f s left", left);
      else fprintf(stderr, ", %.0f min left", left / 60);
    }
  }
  fprintf(stderr, "\033[K");
  fflush(stderr);
  p->last_shown = now;
  p->shown = 1;
  p->rated |= p->done > 0 && now > 0;
}

void st_progress_start(st_progress *p, const char *what, const char *unit, int64_t total, int quiet) {
  *p = (st_progress){.on = !quiet && isatty(STDERR_FILENO), .what = what, .unit = unit, .total = total};
  clock_gettime(CLOCK_MONOTONIC, &p->t0);
  if (p->on) show(p, 0);
}

void st_progress_update(st_progress *p, int64_t done) {
  if (!p->on) return;
  p->done = done;
  double now = elapsed(p);
  if (done >= p->total || !p->rated || now - p->last_shown >= 0.1) show(p, now);
}

void st_progress_end(st_progress *p) {
  if (!p->on || !p->shown) return;
  double now = elapsed(p);
  fprintf(stderr, "\r%s: %lld %s in %.1f s", p->what, (long long)p->done, p->unit, now);
  if (now > 0 && p->done > 0) fprintf(stderr, ", %.*f %s/s", p->done / now < 10 ? 2 : 0, p->done / now, p->unit);
  fprintf(stderr, "\033[K\n");
  fflush(stderr);
  p->on = 0;
}

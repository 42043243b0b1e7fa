/*
** taps.h — how the engine hands values to whoever records them.
**
** The forward pass asks st_tap_armed() at each tap point (one byte load when disarmed) and, when
** armed, calls the sink's emit with a borrowed pointer. The value exists only for the duration of
** the call: the sink copies what it keeps (recorder/recorder.c does, and hands the copy to the
** writer thread). Axis 0 of every value is the token position (pos0 = position of row 0), except
** for row taps (st_tap_catalogue[].row_axis), whose axis 0 is the compressed row (pos0 = index of
** the first row in the value).
**
** recorder/ includes this header and nothing else of engine/, and links none of it: the sink type
** is the whole contract between the two (st_taps_arm, in taps.c, is the engine's side).
*/
#ifndef ST_TAPS_H
#define ST_TAPS_H

#include <stdint.h>

#include "schemas/catalogue.h"
#include "common/base.h"

typedef struct st_tap_sink {
  void *ctx;
  st_status (*emit)(void *ctx, st_tap_id tap, int layer, int64_t pos0, st_dtype dtype, int rank,
                    const int64_t *shape, const void *data);
  /* Optional: the rows [*k0, *k1) of a block of n rows at pos0 that emit would keep (empty when
  ** *k1 <= *k0). A device session then downloads only those rows and skips a block it would
  ** drop; NULL: every row is handed over. */
  void (*kept)(void *ctx, st_tap_id tap, int64_t pos0, int64_t n, int64_t *k0, int64_t *k1);
} st_tap_sink;

typedef struct st_taps {
  const st_tap_sink *sink; /* NULL: nothing is recorded */
  int n_layers;
  uint8_t *armed; /* [(n_layers + 1) * ST_TAP_COUNT], row n_layers = model-scope taps; owned */
} st_taps;

static inline int st_tap_armed(const st_taps *t, st_tap_id id, int layer) {
  if (!t || !t->sink) return 0;
  int row = layer < 0 ? t->n_layers : layer;
  return t->armed[(size_t)row * ST_TAP_COUNT + id];
}

/* Arms every tap whose full name matches one of the shell globs (fnmatch). n_globs == 0 arms
** nothing. Returns ST_EINVAL (message names the glob) when a glob matches no tap at all. */
st_status st_taps_arm(st_taps *t, int n_layers, const char *const *globs, int n_globs);
void st_taps_free(st_taps *t);

#endif

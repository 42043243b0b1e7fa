/* taps.c — arming taps from user globs. */
#include "taps.h"

#include <fnmatch.h>
#include <stdlib.h>

st_status st_taps_arm(st_taps *t, int n_layers, const char *const *globs, int n_globs) {
  t->n_layers = n_layers;
  t->armed = calloc((size_t)(n_layers + 1) * ST_TAP_COUNT, 1);
  if (!t->armed) return st_fail(ST_ENOMEM, "arming taps");
  for (int g = 0; g < n_globs; g++) {
    int hits = 0;
    for (int layer = -1; layer < n_layers; layer++) {
      for (int id = 0; id < ST_TAP_COUNT; id++) {
        int model_scope = st_tap_catalogue[id].scope == ST_TAP_SCOPE_MODEL;
        if (model_scope != (layer < 0)) continue;
        char name[128];
        st_tap_full_name(name, sizeof name, (st_tap_id)id, layer);
        if (fnmatch(globs[g], name, 0) != 0) continue;
        t->armed[(size_t)(layer < 0 ? n_layers : layer) * ST_TAP_COUNT + id] = 1;
        hits++;
      }
    }
    if (hits == 0)
      return st_fail(ST_EINVAL, "--tap '%s' matches no tap (names look like layers.3.indexer.scores"
                                " or logits; see 'sparsetrace taps')", globs[g]);
  }
  return ST_OK;
}

void st_taps_free(st_taps *t) {
  free(t->armed);
  t->armed = NULL;
}

/*
** catalogue.h — C view of the tap catalogue (taps.def) and the settings catalogue
** (settings.def). Engine, recorder and replayer include this; none spells a tap name itself.
*/
#ifndef ST_CATALOGUE_H
#define ST_CATALOGUE_H

#include <stddef.h>

typedef enum st_tap_id {
#define ST_TAP(id, suffix, scope, shape, doc) id,
#include "taps.def"
#undef ST_TAP
  ST_TAP_COUNT
} st_tap_id;

typedef enum st_tap_scope { ST_TAP_SCOPE_LAYER, ST_TAP_SCOPE_MODEL } st_tap_scope;

typedef struct st_tap_info {
  const char *suffix; /* "indexer.scores" */
  st_tap_scope scope; /* LAYER: full name "layers.<i>.<suffix>"; MODEL: "<suffix>" */
  const char *shape;  /* documentation of the recorded shape */
  const char *doc;
  int row_axis;       /* 1 when axis 0 is the compressed row, not the token position */
} st_tap_info;

extern const st_tap_info st_tap_catalogue[ST_TAP_COUNT];

/* Writes the full tap name ("layers.3.indexer.q" or "logits") into buf. Returns its length. */
int st_tap_full_name(char *buf, size_t size, st_tap_id id, int layer);

/* Parses a full tap name. Returns 0 and fills id/layer (-1 for model taps), or -1 if unknown. */
int st_tap_parse_name(const char *name, st_tap_id *id, int *layer);

typedef enum st_setting_id {
#define ST_SETTING(id, name, values, def, doc) id,
#include "settings.def"
#undef ST_SETTING
  ST_SETTING_COUNT
} st_setting_id;

typedef struct st_setting_info {
  const char *name, *values, *default_value, *doc;
} st_setting_info;

extern const st_setting_info st_setting_catalogue[ST_SETTING_COUNT];

/* Index of the setting called name, or -1. */
int st_setting_find(const char *name);

#endif

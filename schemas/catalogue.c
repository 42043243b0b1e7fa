/* catalogue.c — tables generated from taps.def and settings.def, and name parsing. */
#include "catalogue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYER ST_TAP_SCOPE_LAYER
#define MODEL ST_TAP_SCOPE_MODEL
const st_tap_info st_tap_catalogue[ST_TAP_COUNT] = {
#define ST_TAP(id, suffix, scope, shape, doc) [id] = {suffix, scope, shape, doc, shape[1] == 'r'},
#include "taps.def"
#undef ST_TAP
};
#undef LAYER
#undef MODEL

const st_setting_info st_setting_catalogue[ST_SETTING_COUNT] = {
#define ST_SETTING(id, name, values, def, doc) [id] = {name, values, def, doc},
#include "settings.def"
#undef ST_SETTING
};

int st_tap_full_name(char *buf, size_t size, st_tap_id id, int layer) {
  const st_tap_info *info = &st_tap_catalogue[id];
  if (info->scope == ST_TAP_SCOPE_MODEL) return snprintf(buf, size, "%s", info->suffix);
  return snprintf(buf, size, "layers.%d.%s", layer, info->suffix);
}

int st_tap_parse_name(const char *name, st_tap_id *id, int *layer) {
  int l = -1;
  const char *suffix = name;
  if (strncmp(name, "layers.", 7) == 0) {
    char *end;
    long v = strtol(name + 7, &end, 10);
    if (end == name + 7 || *end != '.' || v < 0 || v > 100000) return -1;
    l = (int)v;
    suffix = end + 1;
  }
  for (int i = 0; i < ST_TAP_COUNT; i++) {
    const st_tap_info *info = &st_tap_catalogue[i];
    if (strcmp(info->suffix, suffix) != 0) continue;
    if ((info->scope == ST_TAP_SCOPE_LAYER) != (l >= 0)) return -1;
    *id = (st_tap_id)i;
    *layer = l;
    return 0;
  }
  return -1;
}

int st_setting_find(const char *name) {
  for (int i = 0; i < ST_SETTING_COUNT; i++)
    if (strcmp(st_setting_catalogue[i].name, name) == 0) return i;
  return -1;
}

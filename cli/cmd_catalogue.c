/* cmd_catalogue.c — `sparsetrace taps` and `sparsetrace settings`: print the catalogues. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "schemas/catalogue.h"

static const st_opt_use json_only[] = {{ST_OPT_JSON, NULL, "one JSON array of objects"}, {0}};

static const st_cmd_spec taps_spec = {
  "taps", "sparsetrace taps [--json]\n",
  "Lists every tap name (schemas/taps.def) in forward order; <i> is the layer.\n", json_only, NULL};

static const st_cmd_spec settings_spec = {
  "settings", "sparsetrace settings [--json]\n",
  "Lists every setting accepted by --set key=value (schemas/settings.def).\n", json_only, NULL};

/* 1 with --json, 0 without, -1 - exit code when the command must stop (help, usage error). */
static int wants_json(const st_cmd_spec *spec, int argc, char **argv) {
  st_opts o;
  int c;
  st_opts_init(&o, spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0)
    if (c == ST_OPT_POSITIONAL) {
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      c = ST_OPTS_EXIT;
      break;
    }
  int json = c == ST_OPTS_EXIT ? -1 - o.exit_code : o.json;
  st_opts_free(&o);
  return json;
}

/* Prints one JSON value through jansson and frees it. */
static void print_json(json_t *v) {
  char *text = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(v);
  if (text) printf("%s\n", text);
  free(text);
}

int st_cmd_taps(int argc, char **argv) {
  int json = wants_json(&taps_spec, argc, argv);
  if (json < 0) return -1 - json;
  json_t *list = json ? json_array() : NULL;
  for (int i = 0; i < ST_TAP_COUNT; i++) {
    const st_tap_info *t = &st_tap_catalogue[i];
    const char *prefix = t->scope == ST_TAP_SCOPE_LAYER ? "layers.<i>." : "";
    if (json) {
      char name[96];
      snprintf(name, sizeof name, "%s%s", prefix, t->suffix);
      json_array_append_new(list, json_pack("{s:s,s:s,s:s}", "name", name, "shape", t->shape, "doc", t->doc));
    } else {
      printf("%s%-22s %-18s %s\n", prefix, t->suffix, t->shape, t->doc);
    }
  }
  if (json) print_json(list);
  return 0;
}

int st_cmd_settings(int argc, char **argv) {
  int json = wants_json(&settings_spec, argc, argv);
  if (json < 0) return -1 - json;
  json_t *list = json ? json_array() : NULL;
  for (int i = 0; i < ST_SETTING_COUNT; i++) {
    const st_setting_info *s = &st_setting_catalogue[i];
    if (json) {
      json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:s}", "name", s->name, "values", s->values,
                                            "default", s->default_value, "doc", s->doc));
    } else {
      printf("%-20s %-44s default %-8s %s\n", s->name, s->values, s->default_value, s->doc);
    }
  }
  if (json) print_json(list);
  return 0;
}

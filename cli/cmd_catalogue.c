/* cmd_catalogue.c — `sparsetrace taps` and `sparsetrace settings`: print the catalogues. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "schemas/catalogue.h"

static int wants_json(int argc, char **argv, const char *help) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) return 1;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("%s", help);
      return -1;
    }
  }
  return 0;
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    putchar(*s);
  }
  putchar('"');
}

int st_cmd_taps(int argc, char **argv) {
  int json = wants_json(argc, argv,
                        "usage: sparsetrace taps [--json]\n\nLists every tap name (schemas/taps.def)"
                        " in forward order; <i> is the layer.\n");
  if (json < 0) return 0;
  if (json) putchar('[');
  for (int i = 0; i < ST_TAP_COUNT; i++) {
    const st_tap_info *t = &st_tap_catalogue[i];
    const char *prefix = t->scope == ST_TAP_SCOPE_LAYER ? "layers.<i>." : "";
    if (json) {
      char name[96];
      snprintf(name, sizeof name, "%s%s", prefix, t->suffix);
      printf("%s{\"name\":", i ? "," : "");
      json_string(name);
      printf(",\"shape\":");
      json_string(t->shape);
      printf(",\"doc\":");
      json_string(t->doc);
      putchar('}');
    } else {
      printf("%s%-22s %-18s %s\n", prefix, t->suffix, t->shape, t->doc);
    }
  }
  if (json) printf("]\n");
  return 0;
}

int st_cmd_settings(int argc, char **argv) {
  int json = wants_json(argc, argv,
                        "usage: sparsetrace settings [--json]\n\nLists every setting accepted by "
                        "--set key=value (schemas/settings.def).\n");
  if (json < 0) return 0;
  if (json) putchar('[');
  for (int i = 0; i < ST_SETTING_COUNT; i++) {
    const st_setting_info *s = &st_setting_catalogue[i];
    if (json) {
      printf("%s{\"name\":", i ? "," : "");
      json_string(s->name);
      printf(",\"values\":");
      json_string(s->values);
      printf(",\"default\":");
      json_string(s->default_value);
      printf(",\"doc\":");
      json_string(s->doc);
      putchar('}');
    } else {
      printf("%-20s %-44s default %-8s %s\n", s->name, s->values, s->default_value, s->doc);
    }
  }
  if (json) printf("]\n");
  return 0;
}

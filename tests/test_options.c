/*
** test_options.c — cli/options.c: the value parsers refuse wrapped, trailing and out-of-range
** numbers with a message naming the option, and the parser returns options and positional
** arguments in order, stops with 0 after --help and 2 on unknown options. The file is included
** whole (like llama2.c's test.c) because the CLI is not a library.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli/options.c"

static void test_int(void **state) {
  (void)state;
  int64_t v = -7;
  assert_int_equal(st_opt_int("layer", "5", 0, 65535, &v), ST_OK);
  assert_int_equal(v, 5);
  assert_int_equal(st_opt_int("layer", "-3", -5, 5, &v), ST_OK);
  assert_int_equal(v, -3);
  v = 42;
  /* 2^32 + 1: (int)strtol made this layer 1 */
  assert_int_not_equal(st_opt_int("layer", "4294967297", 0, 65535, &v), ST_OK);
  assert_non_null(strstr(st_errmsg(), "--layer '4294967297'"));
  assert_non_null(strstr(st_errmsg(), "0 to 65535"));
  assert_int_not_equal(st_opt_int("max-new-tokens", "99999999999999999999999", 0, 1000000, &v), ST_OK);
  assert_non_null(strstr(st_errmsg(), "--max-new-tokens"));
  assert_int_not_equal(st_opt_int("threads", "12abc", 1, 1024, &v), ST_OK);
  assert_int_not_equal(st_opt_int("threads", "", 1, 1024, &v), ST_OK);
  assert_int_not_equal(st_opt_int("threads", " 3", 1, 1024, &v), ST_OK);
  assert_int_not_equal(st_opt_int("threads", "0", 1, 1024, &v), ST_OK);
  assert_int_not_equal(st_opt_int("threads", "1025", 1, 1024, &v), ST_OK);
  assert_int_not_equal(st_opt_int("threads", "-1", 1, 1024, &v), ST_OK);
  assert_int_equal(v, 42); /* untouched on error */
  assert_int_equal(st_opt_int("n", "9223372036854775807", 0, INT64_MAX, &v), ST_OK);
  assert_int_equal(v, INT64_MAX);
}

static void test_uint64_double_span(void **state) {
  (void)state;
  uint64_t u = 0;
  assert_int_equal(st_opt_uint64("seed", "18446744073709551615", &u), ST_OK);
  assert_true(u == UINT64_MAX);
  assert_int_not_equal(st_opt_uint64("seed", "18446744073709551616", &u), ST_OK);
  assert_int_not_equal(st_opt_uint64("seed", "-1", &u), ST_OK); /* strtoull would wrap it */
  assert_non_null(strstr(st_errmsg(), "--seed '-1'"));
  double d = 0;
  assert_int_equal(st_opt_double("timeout", "2.5", 0.001, 100, &d), ST_OK);
  assert_true(d == 2.5);
  assert_int_not_equal(st_opt_double("timeout", "nan", 0.001, 100, &d), ST_OK);
  assert_int_not_equal(st_opt_double("timeout", "1e999", 0.001, 1e300, &d), ST_OK);
  int64_t a = -1, b = -1;
  assert_int_equal(st_opt_span("needle-tokens", "10:20", &a, &b), ST_OK);
  assert_int_equal(a, 10);
  assert_int_equal(b, 20);
  assert_int_not_equal(st_opt_span("needle-tokens", "20:10", &a, &b), ST_OK);
  assert_int_not_equal(st_opt_span("needle-tokens", "1:99999999999999999999", &a, &b), ST_OK);
  assert_int_not_equal(st_opt_span("needle-tokens", "1:2x", &a, &b), ST_OK);
  assert_int_not_equal(st_opt_span("needle-tokens", ":2", &a, &b), ST_OK);
  assert_non_null(strstr(st_errmsg(), "--needle-tokens"));
}

static const st_opt_use test_uses[] = {
  {ST_OPT_MODEL, NULL, NULL}, {ST_OPT_SET, NULL, NULL}, {ST_OPT_THREADS, NULL, NULL},
  {ST_OPT_BACKEND, NULL, NULL}, {ST_OPT_LAYER, NULL, NULL}, {ST_OPT_OUT, NULL, NULL},
  {ST_OPT_MAX_NEW_TOKENS, NULL, NULL}, {ST_OPT_JSON, NULL, NULL}, {0}};
static const st_cmd_spec test_spec = {"test", "sparsetrace test [options]\n", NULL, test_uses, NULL};

/* Parses argv (NULL-terminated) to the end; returns the exit code (-100 for "ran to the end")
** and the positional arguments and own options seen, as "P:x" / "layer=5" joined by spaces. */
static int parse(st_opts *o, char **argv, char *seen, size_t size) {
  int argc = 0, c;
  while (argv[argc]) argc++;
  seen[0] = 0;
  st_opts_init(o, &test_spec, argc, argv);
  while ((c = st_opts_next(o)) > 0) {
    size_t n = strlen(seen);
    if (c == ST_OPT_POSITIONAL) snprintf(seen + n, size - n, "%sP:%s", n ? " " : "", o->arg);
    else snprintf(seen + n, size - n, "%s%s=%s", n ? " " : "", o->name, o->arg ? o->arg : "");
  }
  return c == ST_OPTS_EXIT ? o->exit_code : -100;
}

static void test_parser(void **state) {
  (void)state;
  char seen[512];
  st_opts o;
  char *a1[] = {"test", "x", "--model", "M", "--layer=5", "y", "--set", "a=b", "--set=c=d", "-o", "-",
                "--threads", "8", "--backend", "cuda", "--max-tokens", "3", "--", "--json", NULL};
  assert_int_equal(parse(&o, a1, seen, sizeof seen), -100);
  assert_string_equal(seen, "P:x layer=5 P:y out=- max-new-tokens=3 P:--json");
  assert_string_equal(o.model, "M");
  assert_int_equal(o.n_sets, 2);
  assert_string_equal(o.sets[1], "c=d");
  assert_int_equal(o.threads, 8);
  assert_string_equal(o.backend, "cuda");
  assert_int_equal(o.json, 0);
  st_opts_free(&o);

  /* a second parse in the same process starts afresh */
  char *a2[] = {"test", "--json", "--lay", "7", NULL};
  assert_int_equal(parse(&o, a2, seen, sizeof seen), -100);
  assert_string_equal(seen, "layer=7");
  assert_int_equal(o.json, 1);
  st_opts_free(&o);

  char *bad[][4] = {{"test", "--bogus", NULL}, {"test", "--threads", "100000", NULL},
                    {"test", "--threads", "0", NULL}, {"test", "--backend", "metal", NULL},
                    {"test", "--set", "novalue", NULL}, {"test", "--model", NULL},
                    {"test", "--json=1", NULL}, {"test", "-z", NULL}, {"test", "--store", "x", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(&o, bad[i], seen, sizeof seen), 2);
    st_opts_free(&o);
  }
  char *help[] = {"test", "--layer", "1", "-h", "--bogus", NULL};
  assert_int_equal(parse(&o, help, seen, sizeof seen), 0);
  st_opts_free(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_int),
    cmocka_unit_test(test_uint64_double_span),
    cmocka_unit_test(test_parser),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
** test_common.c — common/: st_buf (growth, the NUL, the maximum, the sticky failure state, take
** and reset), the status names of common/base.h and st_make_dirs (checked with stat(2)).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/base.h"
#include "common/buf.h"

static void test_buf_grows_and_stays_terminated(void **state) {
  st_buf b = {0};
  assert_null(b.data);
  assert_int_equal(st_buf_add(&b, "", 0), ST_OK); /* allocates: data is "" */
  assert_non_null(b.data);
  assert_string_equal(b.data, "");
  for (int i = 0; i < 1000; i++) assert_int_equal(st_buf_printf(&b, "%d,", i % 10), ST_OK);
  assert_int_equal(b.len, 2000);
  assert_int_equal(b.data[b.len], 0);
  assert_true(b.cap > b.len);
  assert_memory_equal(b.data, "0,1,2,", 6);
  assert_int_equal(st_buf_add(&b, "a\0b", 3), ST_OK); /* binary bytes kept */
  assert_int_equal(b.len, 2003);
  assert_memory_equal(b.data + 2000, "a\0b", 4);
  st_buf_free(&b);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
}

static void test_buf_maximum_is_sticky_until_reset(void **state) {
  st_buf b;
  st_buf_init(&b, 8);
  assert_int_equal(st_buf_str(&b, "12345"), ST_OK);
  assert_int_equal(st_buf_str(&b, "678"), ST_OK); /* exactly the maximum */
  assert_int_equal(st_buf_add(&b, "9", 1), ST_ETOOBIG);
  assert_string_equal(b.data, "12345678"); /* left as it was */
  assert_int_equal(b.failed, ST_ETOOBIG);
  assert_true(b.cap <= 9);
  assert_int_equal(st_buf_add(&b, "", 0), ST_ETOOBIG); /* every later append fails too */
  assert_int_equal(st_buf_printf(&b, "%s", ""), ST_ETOOBIG);
  assert_int_equal(st_buf_status(&b, "test"), ST_ETOOBIG);
  assert_string_equal(st_errmsg(), "test: more than 8 bytes");
  assert_null(st_buf_take(&b, NULL)); /* a failed buffer hands nothing over */
  assert_null(b.data);
  assert_int_equal(b.max, 8);
  assert_int_equal(st_buf_str(&b, "abc"), ST_OK);
  assert_int_equal(st_buf_str(&b, "defghi"), ST_ETOOBIG);
  st_buf_reset(&b); /* empties and clears the failure, keeps the memory */
  assert_int_equal(b.failed, ST_OK);
  assert_int_equal(b.len, 0);
  assert_string_equal(b.data, "");
  assert_int_equal(st_buf_str(&b, "again"), ST_OK);
  assert_int_equal(st_buf_status(&b, "test"), ST_OK);
  st_buf_free(&b);
}

static void test_buf_overflowing_length_fails(void **state) {
  st_buf b = {0};
  assert_int_equal(st_buf_str(&b, "x"), ST_OK);
  assert_int_equal(st_buf_add(&b, "", SIZE_MAX), ST_ENOMEM); /* never reaches memcpy */
  assert_int_equal(st_buf_status(&b, "big"), ST_ENOMEM);
  assert_string_equal(st_errmsg(), "big: out of memory");
  assert_string_equal(b.data, "x");
  st_buf_free(&b);
}

static void test_buf_take(void **state) {
  st_buf b = {0};
  size_t len = 99;
  char *s = st_buf_take(&b, &len); /* empty: "" */
  assert_non_null(s);
  assert_string_equal(s, "");
  assert_int_equal(len, 0);
  free(s);
  assert_int_equal(st_buf_printf(&b, "%s=%d", "k", 42), ST_OK);
  s = st_buf_take(&b, &len);
  assert_string_equal(s, "k=42");
  assert_int_equal(len, 4);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  assert_int_equal(b.cap, 0);
  free(s);
}

static void test_status_names(void **state) {
  assert_string_equal(st_strerror(ST_ENOMEM), "out of memory");
  assert_string_equal(st_strerror(ST_ETOOBIG), "too large");
}

static int is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void test_make_dirs(void **state) {
  char root[] = "/tmp/st_test_common.XXXXXX", path[256], file[256];
  assert_non_null(mkdtemp(root));
  snprintf(path, sizeof path, "%s/a/b//c/", root); /* a doubled and a trailing slash */
  assert_int_equal(st_make_dirs(path), ST_OK);
  snprintf(path, sizeof path, "%s/a/b/c", root);
  assert_true(is_dir(path));
  assert_int_equal(st_make_dirs(path), ST_OK); /* there already: nothing to do */
  snprintf(file, sizeof file, "%s/a/f", root);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(path, sizeof path, "%s/a/f/g", root);
  assert_int_equal(st_make_dirs(path), ST_EIO);
  assert_non_null(strstr(st_errmsg(), file)); /* names the file in the way */
  assert_non_null(strstr(st_errmsg(), "in the way"));
  assert_int_equal(st_make_dirs(""), ST_EINVAL);
  char long_path[5000];
  memset(long_path, 'x', sizeof long_path - 1);
  long_path[sizeof long_path - 1] = 0;
  assert_int_equal(st_make_dirs(long_path), ST_EINVAL);
  unlink(file);
  const char *const dirs[] = {"a/b/c", "a/b", "a"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", root, dirs[i]);
    rmdir(path);
  }
  assert_int_equal(rmdir(root), 0); /* nothing else was made */
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_buf_grows_and_stays_terminated),
    cmocka_unit_test(test_buf_maximum_is_sticky_until_reset),
    cmocka_unit_test(test_buf_overflowing_length_fails),
    cmocka_unit_test(test_buf_take),
    cmocka_unit_test(test_status_names),
    cmocka_unit_test(test_make_dirs),
  };
  return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}

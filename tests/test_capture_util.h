/*
** test_capture_util.h — what test_capture_proxy.c and test_capture_failures.c share: the fake
** upstream as a child process (tests/fake_upstream, next to the test binary), an in-process
** proxy on a free port with a fresh store and its log kept in memory, a libcurl client that
** notes when each SSE event arrives, and readers for the records. Header-only, for tests.
*/
#ifndef ST_TEST_CAPTURE_UTIL_H
#define ST_TEST_CAPTURE_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "recorder/capture/capture_internal.h"

/* ---- the fake upstream -------------------------------------------------------------------- */

static pid_t fake_pid;
static int fake_port;
static char fake_url[64];

static inline int start_fake(void **state) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
  if (n <= 0) return -1;
  exe[n] = 0;
  *strrchr(exe, '/') = 0;
  strcat(exe, "/fake_upstream");
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fake_pid = fork();
  if (fake_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive a crashed test */
    dup2(fds[1], 1);
    close(fds[0]);
    execl(exe, exe, "--port", "0", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  if (!f || fscanf(f, "listening %d", &fake_port) != 1) {
    fprintf(stderr, "could not start %s\n", exe);
    return -1;
  }
  fclose(f);
  snprintf(fake_url, sizeof fake_url, "http://127.0.0.1:%d", fake_port);
  return 0;
}

static inline int stop_fake(void **state) {
  if (fake_pid > 0) {
    kill(fake_pid, SIGTERM);
    waitpid(fake_pid, NULL, 0);
  }
  return 0;
}

/* ---- proxy under test, with its log kept for the redaction grep --------------------------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static st_buf log_text;

static inline void log_line(void *user, const char *line) {
  pthread_mutex_lock(&log_mu);
  st_buf_str(&log_text, line);
  st_buf_str(&log_text, "\n");
  pthread_mutex_unlock(&log_mu);
}

typedef struct proxy {
  st_capture *p;
  char store[256];
  char url[256];
} proxy;

static inline void start_proxy_with(proxy *px, const char *upstream, void (*tweak)(st_capture_config *)) {
  snprintf(px->store, sizeof px->store, "/tmp/st_capture_test_XXXXXX");
  assert_non_null(mkdtemp(px->store));
  st_capture_config c;
  st_capture_config_init(&c);
  c.listen = "127.0.0.1:0";
  c.upstream = upstream;
  c.upstream_proxy = ""; /* loopback: never through an environment proxy */
  c.store_dir = px->store;
  c.log = log_line;
  if (tweak) tweak(&c);
  if (st_capture_start(&c, &px->p)) fail_msg("st_capture_start: %s", st_errmsg());
  snprintf(px->url, sizeof px->url, "%s", st_capture_url(px->p));
}
static inline void start_proxy(proxy *px) { start_proxy_with(px, fake_url, NULL); }

static inline void rm_rf(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline void stop_proxy(proxy *px) {
  if (px->p) assert_int_equal(st_capture_stop(px->p, 5000), ST_OK);
  px->p = NULL;
}

/* Waits (up to 10 s) until n exchanges are finished and committed. */
static inline void wait_recorded(proxy *px, uint64_t n) {
  st_capture_stats s;
  for (int i = 0; i < 1000; i++) {
    st_capture_get_stats(px->p, &s);
    if (s.recorded >= n && s.in_flight == 0) return;
    usleep(10000);
  }
  fail_msg("only %llu of %llu exchanges recorded", (unsigned long long)s.recorded, (unsigned long long)n);
}

/* All records of a store, exported. */
static inline json_t *records(const char *store) {
  st_capture_db *db = NULL;
  if (st_capture_db_open(store, &db)) fail_msg("%s", st_errmsg());
  json_t *list = NULL, *out = json_array();
  assert_int_equal(st_capture_db_list(db, 0, &list), ST_OK);
  size_t i;
  json_t *row;
  json_array_foreach(list, i, row) {
    json_t *r = NULL;
    if (st_capture_db_export(db, json_string_value(json_object_get(row, "id")), &r))
      fail_msg("%s", st_errmsg());
    json_array_append_new(out, r);
  }
  json_decref(list);
  st_capture_db_close(db);
  return out;
}

/* The record whose request body contains tag (exactly one must). */
static inline json_t *record_with(json_t *all, const char *tag) {
  json_t *found = NULL;
  size_t i;
  json_t *r;
  json_array_foreach(all, i, r) {
    const char *body = json_string_value(json_object_get(json_object_get(r, "request"), "body"));
    if (body && strstr(body, tag)) {
      if (found) fail_msg("two records carry %s", tag);
      found = r;
    }
  }
  if (!found) fail_msg("no record carries %s", tag);
  return found;
}

static inline const char *jstr(json_t *o, const char *path) { /* "a.b.c" */
  char key[64];
  const char *p = path;
  while (o && *p) {
    size_t n = strcspn(p, ".");
    snprintf(key, sizeof key, "%.*s", (int)n, p);
    o = json_object_get(o, key);
    p += n + (p[n] == '.');
  }
  return json_string_value(o);
}
static inline json_int_t jint(json_t *o, const char *path) {
  char key[64];
  const char *p = path;
  while (o && *p) {
    size_t n = strcspn(p, ".");
    snprintf(key, sizeof key, "%.*s", (int)n, p);
    o = json_object_get(o, key);
    p += n + (p[n] == '.');
  }
  return json_is_integer(o) ? json_integer_value(o) : -999;
}

/* ---- the client ----------------------------------------------------------------------------- */

typedef struct result {
  long status;
  st_buf head;      /* header lines of the final response, status line included */
  st_buf body;
  int64_t t_start, t_first, t_end;
  int64_t event_t[1024]; /* arrival time of each "\n\n" (end of an SSE event) */
  int n_events;
  char last;
  CURLcode rc;
  int abort_after_events;
  struct curl_slist *list;
  const char *upload;
  size_t upload_len, upload_off;
} result;

static inline size_t on_head(char *b, size_t size, size_t n, void *u) {
  result *r = u;
  if (n >= 5 && !memcmp(b, "HTTP/", 5)) r->head.len = 0; /* 100 Continue, then the real one */
  st_buf_add(&r->head, b, n);
  return n;
}

static inline size_t on_body(char *b, size_t size, size_t n, void *u) {
  result *r = u;
  int64_t now = capture_now_ns();
  if (r->body.len == 0) r->t_first = now;
  for (size_t i = 0; i < n; i++) {
    if (b[i] == '\n' && r->last == '\n' && r->n_events < 1024) r->event_t[r->n_events++] = now;
    r->last = b[i];
  }
  st_buf_add(&r->body, b, n);
  if (r->abort_after_events && r->n_events >= r->abort_after_events) return 0;
  return n;
}

static inline size_t on_upload(char *b, size_t size, size_t n, void *u) {
  result *r = u;
  size_t left = r->upload_len - r->upload_off, take = left < size * n ? left : size * n;
  memcpy(b, r->upload + r->upload_off, take);
  r->upload_off += take;
  return take;
}

/* Prepares an easy handle: POST body (GET when body is NULL), extra headers (NULL-terminated).
** chunked: send the body with Transfer-Encoding: chunked. */
static inline CURL *prepare(result *r, const char *url, const char *body, const char *const *headers,
                     int chunked) {
  memset(r, 0, sizeof *r);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_head);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  r->list = curl_slist_append(NULL, "Content-Type: application/json");
  for (int i = 0; headers && headers[i]; i++) r->list = curl_slist_append(r->list, headers[i]);
  if (body && chunked) {
    r->list = curl_slist_append(r->list, "Transfer-Encoding: chunked");
    r->upload = body;
    r->upload_len = strlen(body);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_upload);
    curl_easy_setopt(h, CURLOPT_READDATA, r);
  } else if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->list);
  r->t_start = capture_now_ns();
  return h;
}

static inline void finish(result *r, CURL *h, CURLcode rc) {
  r->rc = rc;
  r->t_end = capture_now_ns();
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  curl_easy_cleanup(h);
  curl_slist_free_all(r->list);
  r->list = NULL;
  if (!r->body.data) st_buf_add(&r->body, "", 0);
  if (!r->head.data) st_buf_add(&r->head, "", 0);
}

static inline void request(result *r, const char *base, const char *path, const char *body,
                    const char *const *headers) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  CURL *h = prepare(r, url, body, headers, 0);
  finish(r, h, curl_easy_perform(h));
}

static inline void result_free(result *r) {
  st_buf_free(&r->head);
  st_buf_free(&r->body);
}

/* Runs n prepared handles at once. */
static inline void perform_all(CURL **h, result *r, int n) {
  CURLM *m = curl_multi_init();
  curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
  for (int i = 0; i < n; i++) {
    curl_easy_setopt(h[i], CURLOPT_PRIVATE, &r[i]);
    curl_multi_add_handle(m, h[i]);
  }
  int running = n;
  while (running) {
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      result *res;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&res);
      curl_multi_remove_handle(m, msg->easy_handle);
      finish(res, msg->easy_handle, msg->data.result);
    }
    if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
  }
  curl_multi_cleanup(m);
}

/* Header lines without those a proxy may legitimately change (Connection, Keep-Alive). */
static inline void comparable_head(const st_buf *head, char *out, size_t n) {
  out[0] = 0;
  const char *p = head->data ? head->data : "";
  while (*p) {
    const char *e = strstr(p, "\r\n");
    size_t len = e ? (size_t)(e - p) + 2 : strlen(p);
    if (strncasecmp(p, "Connection:", 11) && strncasecmp(p, "Keep-Alive:", 11))
      strncat(out, p, len < n - strlen(out) - 1 ? len : n - strlen(out) - 1);
    p += len;
  }
}

/* Greps every regular file under dir for any of the needles; returns 1 and the first hit's
** path in hit when one is found. */
static inline int grep_tree(const char *dir, const char *const *needles, char *hit, size_t hit_len) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  int found = 0;
  while (!found && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) {
      found = grep_tree(path, needles, hit, hit_len);
      continue;
    }
    FILE *f = fopen(path, "rb");
    st_buf b = {0};
    char chunk[65536];
    size_t n;
    while (f && (n = fread(chunk, 1, sizeof chunk, f)) > 0) st_buf_add(&b, chunk, n);
    if (f) fclose(f);
    for (int i = 0; needles[i] && !found; i++)
      if (b.len && memmem(b.data, b.len, needles[i], strlen(needles[i]))) {
        snprintf(hit, hit_len, "%s holds %s", path, needles[i]);
        found = 1;
      }
    st_buf_free(&b);
  }
  closedir(d);
  return found;
}

static inline json_int_t fake_stat(const char *key) {
  result r;
  request(&r, fake_url, "/_fake/stats", NULL, NULL);
  json_t *j = json_loads(r.body.data, 0, NULL);
  json_int_t v = jint(j, key);
  json_decref(j);
  result_free(&r);
  return v;
}

/* Runs a cmocka group with the fake upstream around it; ST_TEST_FILTER selects tests. */
#define RUN_CAPTURE_TESTS(tests)                                                                 \
  do {                                                                                           \
    curl_global_init(CURL_GLOBAL_DEFAULT);                                                       \
    signal(SIGPIPE, SIG_IGN);                                                                    \
    if (getenv("ST_TEST_FILTER")) cmocka_set_test_filter(getenv("ST_TEST_FILTER"));              \
    int rc_ = cmocka_run_group_tests(tests, start_fake, stop_fake);                              \
    curl_global_cleanup();                                                                       \
    return rc_;                                                                                  \
  } while (0)

#endif

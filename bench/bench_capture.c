/*
** bench_capture.c — what `sparsetrace capture` costs: added latency and throughput through the
** proxy versus direct to the same local upstream, at several concurrency levels, in one run.
**
**   bench_capture [--fake PATH] [--sparsetrace PATH] [--levels 1,16,64] [--per-stream N]
**                 [--events E] [--delta-bytes B] [--rounds R]
**
** Starts tests/fake_upstream and `sparsetrace capture` (recording into a temporary store, as a
** user would run it) as child processes, then for each concurrency level c runs a closed loop of
** c concurrent Anthropic-style SSE streams (E text deltas of B bytes each, written by the fake as
** fast as it can) for N*c requests directly to the fake and N*c through the proxy, in R rounds
** that alternate the two paths (default 5; load from elsewhere then hits both alike). Each
** request's time to first byte (first body byte) and total time are measured by a libcurl multi
** client in this process; connections are kept alive on both paths, after a warm-up.
**
** Printed: p50/p99 of TTFB and total, direct and proxied, the ratios proxied/direct and the
** added milliseconds, throughput (requests/s, MiB/s) and its ratio; then the loss check: every
** proxied response must be 200 with the same length as direct, and the store must hold one
** 'complete' row per proxied request once the proxy has been stopped with SIGTERM.
**
** On one machine client, proxy and upstream share the cores, so the numbers are an upper bound
** on the proxy's cost and only meaningful as ratios (LIBRARIES.md §4).
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "recorder/capture/capture.h"

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pid_t spawn(char *const argv[], int out_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (out_fd >= 0) dup2(out_fd, 1);
    int devnull = open("/dev/null", 1);
    if (devnull >= 0) dup2(devnull, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

static int wait_file(const char *path, char *out, size_t n) {
  for (int i = 0; i < 400; i++) {
    FILE *f = fopen(path, "r");
    if (f) {
      int ok = fgets(out, (int)n, f) != NULL;
      fclose(f);
      if (ok) {
        out[strcspn(out, "\n")] = 0;
        return 0;
      }
    }
    usleep(25000);
  }
  return -1;
}

typedef struct sample {
  int64_t start, first, end;
  long status;
  size_t bytes;
  CURLcode rc;
} sample;

static size_t on_body(char *b, size_t size, size_t n, void *u) {
  sample *s = u;
  if (s->bytes == 0) s->first = now_ns();
  s->bytes += n;
  return n;
}

static struct curl_slist *headers;
static const char *body = "{\"model\":\"bench\",\"stream\":true,\"max_tokens\":64,"
                          "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

static CURL *make(CURLM *m, const char *url, sample *s) {
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
  curl_easy_setopt(h, CURLOPT_PRIVATE, s);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
  s->start = now_ns();
  curl_multi_add_handle(m, h);
  return h;
}

/* Closed loop: keep c requests in flight until n are done. Returns wall time in ns. */
static int64_t run_level(const char *url, int c, int n, sample *out) {
  CURLM *m = curl_multi_init();
  curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)(c * 2));
  int started = 0, done = 0, running = 0;
  int64_t t0 = now_ns();
  while (started < c && started < n) make(m, url, &out[started++]);
  while (done < n) {
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      sample *s;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
      s->end = now_ns();
      s->rc = msg->data.result;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &s->status);
      curl_multi_remove_handle(m, msg->easy_handle);
      curl_easy_cleanup(msg->easy_handle);
      done++;
      if (started < n) make(m, url, &out[started++]);
    }
    if (done < n) curl_multi_poll(m, NULL, 0, 50, NULL);
  }
  int64_t wall = now_ns() - t0;
  curl_multi_cleanup(m);
  return wall;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* p-th percentile (nearest rank) in ms of (first or end) - start. */
static double pct(const sample *s, int n, int use_first, double p) {
  double *v = malloc((size_t)n * sizeof *v);
  for (int i = 0; i < n; i++) v[i] = (double)((use_first ? s[i].first : s[i].end) - s[i].start) / 1e6;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int k = (int)(p / 100.0 * n + 0.999999) - 1;
  if (k < 0) k = 0;
  if (k >= n) k = n - 1;
  double r = v[k];
  free(v);
  return r;
}

int main(int argc, char **argv) {
  char self_dir[PATH_MAX], fake[PATH_MAX + 32], st[PATH_MAX + 32];
  ssize_t len = readlink("/proc/self/exe", self_dir, sizeof self_dir - 1);
  self_dir[len > 0 ? len : 0] = 0;
  if (strrchr(self_dir, '/')) *strrchr(self_dir, '/') = 0;
  snprintf(fake, sizeof fake, "%s/../tests/fake_upstream", self_dir);
  snprintf(st, sizeof st, "%s/../sparsetrace", self_dir);
  char levels_arg[128] = "1,16,64";
  int per_stream = 40, events = 20, delta_bytes = 64, rounds = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--fake") && i + 1 < argc) snprintf(fake, sizeof fake, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--sparsetrace") && i + 1 < argc) snprintf(st, sizeof st, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--levels") && i + 1 < argc) snprintf(levels_arg, sizeof levels_arg, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--per-stream") && i + 1 < argc) per_stream = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--events") && i + 1 < argc) events = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--delta-bytes") && i + 1 < argc) delta_bytes = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_capture [--fake PATH] [--sparsetrace PATH] [--levels 1,16,64] "
                      "[--per-stream N] [--events E] [--delta-bytes B] [--rounds R]\n");
      return 2;
    }
  }
  unsetenv("http_proxy");
  unsetenv("https_proxy");
  unsetenv("HTTP_PROXY");
  unsetenv("HTTPS_PROXY");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  signal(SIGPIPE, SIG_IGN);

  char dir[] = "/tmp/bench_capture_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char port_file[256], ready_file[256], store[256], up_url[128], proxy_url[256];
  snprintf(port_file, sizeof port_file, "%s/fake.port", dir);
  snprintf(ready_file, sizeof ready_file, "%s/proxy.ready", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  char *fake_argv[] = {fake, "--port-file", port_file, NULL};
  pid_t fake_pid = spawn(fake_argv, open("/dev/null", 1));
  char port[32];
  if (wait_file(port_file, port, sizeof port)) {
    fprintf(stderr, "bench_capture: %s did not start\n", fake);
    return 1;
  }
  snprintf(up_url, sizeof up_url, "http://127.0.0.1:%s", port);
  char *st_argv[] = {st, "capture", "--listen", "127.0.0.1:0", "--upstream", up_url, "--store", store,
                     "--upstream-proxy", "none", "--ready-file", ready_file, "--quiet", NULL};
  pid_t proxy_pid = spawn(st_argv, -1);
  if (wait_file(ready_file, proxy_url, sizeof proxy_url)) {
    fprintf(stderr, "bench_capture: %s capture did not start\n", st);
    kill(fake_pid, SIGTERM);
    return 1;
  }
  char direct_url[300], via_url[300], hdr[64], hdr2[64];
  snprintf(direct_url, sizeof direct_url, "%s/v1/messages", up_url);
  snprintf(via_url, sizeof via_url, "%s/v1/messages", proxy_url);
  snprintf(hdr, sizeof hdr, "x-fake-events: %d", events);
  snprintf(hdr2, sizeof hdr2, "x-fake-delta-bytes: %d", delta_bytes);
  headers = curl_slist_append(NULL, "content-type: application/json");
  headers = curl_slist_append(headers, "anthropic-version: 2023-06-01");
  headers = curl_slist_append(headers, "x-api-key: sk-bench-not-a-real-key");
  headers = curl_slist_append(headers, hdr);
  headers = curl_slist_append(headers, hdr2);

  int levels[8], n_levels = 0;
  for (char *tok = strtok(levels_arg, ","); tok && n_levels < 8; tok = strtok(NULL, ","))
    levels[n_levels++] = atoi(tok);

  if (rounds < 1) rounds = 1;
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  printf("bench_capture: %d-event SSE streams (%d-byte text deltas), %d requests per concurrent "
         "stream and path in %d alternating rounds, keep-alive, after warm-up; the proxy records "
         "into a fresh store. %ld CPUs online, load average %.2f at start\n\n",
         events, delta_bytes, per_stream, rounds, sysconf(_SC_NPROCESSORS_ONLN), load[0]);
  printf("| streams | path   | TTFB p50 ms | TTFB p99 ms | total p50 ms | total p99 ms | req/s | MiB/s |\n");
  printf("|--------:|--------|------------:|------------:|-------------:|-------------:|------:|------:|\n");
  long proxied = 0, lost = 0;
  char ratios[8][512];
  for (int li = 0; li < n_levels; li++) {
    int c = levels[li], n = per_stream * c;
    sample *d = calloc((size_t)n, sizeof *d), *p = calloc((size_t)n, sizeof *p);
    sample *warm = calloc((size_t)(c * 4), sizeof *warm);
    run_level(direct_url, c, c * 4, warm);
    run_level(via_url, c, c * 4, warm);
    /* Alternate direct and proxied rounds, so that a burst of load from elsewhere on the
    ** machine lands on both paths alike. */
    int64_t wall_d = 0, wall_p = 0;
    int per_round = n / rounds;
    for (int r = 0; r < rounds; r++) {
      int off = r * per_round, cnt = r == rounds - 1 ? n - off : per_round;
      wall_d += run_level(direct_url, c, cnt, d + off);
      wall_p += run_level(via_url, c, cnt, p + off);
    }
    proxied += n + c * 4;
    size_t bytes_d = 0, bytes_p = 0;
    for (int i = 0; i < n; i++) {
      bytes_d += d[i].bytes;
      bytes_p += p[i].bytes;
      if (p[i].rc != CURLE_OK || p[i].status != 200 || p[i].bytes != d[0].bytes) lost++;
    }
    for (int i = 0; i < c * 4; i++)
      if (warm[i].rc != CURLE_OK || warm[i].status != 200) lost++;
    double rps_d = n / ((double)wall_d / 1e9), rps_p = n / ((double)wall_p / 1e9);
    double mib_d = (double)bytes_d / (1 << 20) / ((double)wall_d / 1e9);
    double mib_p = (double)bytes_p / (1 << 20) / ((double)wall_p / 1e9);
    double v[2][4] = {{pct(d, n, 1, 50), pct(d, n, 1, 99), pct(d, n, 0, 50), pct(d, n, 0, 99)},
                      {pct(p, n, 1, 50), pct(p, n, 1, 99), pct(p, n, 0, 50), pct(p, n, 0, 99)}};
    printf("| %7d | direct | %11.3f | %11.3f | %12.3f | %12.3f | %5.0f | %5.1f |\n", c, v[0][0],
           v[0][1], v[0][2], v[0][3], rps_d, mib_d);
    printf("| %7d | proxy  | %11.3f | %11.3f | %12.3f | %12.3f | %5.0f | %5.1f |\n", c, v[1][0],
           v[1][1], v[1][2], v[1][3], rps_p, mib_p);
    snprintf(ratios[li], sizeof ratios[li],
             "| %7d | %.2fx (%+.3f ms) | %.2fx (%+.3f ms) | %.2fx (%+.3f ms) | %.2fx (%+.3f ms) | %.2fx |",
             c, v[1][0] / v[0][0], v[1][0] - v[0][0], v[1][1] / v[0][1], v[1][1] - v[0][1],
             v[1][2] / v[0][2], v[1][2] - v[0][2], v[1][3] / v[0][3], v[1][3] - v[0][3], rps_p / rps_d);
    free(d);
    free(p);
    free(warm);
  }
  printf("\nproxy / direct (added):\n\n");
  printf("| streams | TTFB p50 | TTFB p99 | total p50 | total p99 | throughput |\n");
  printf("|--------:|---------:|---------:|----------:|----------:|-----------:|\n");
  for (int li = 0; li < n_levels; li++) printf("%s\n", ratios[li]);

  /* Loss: stop the proxy the way a service manager would, then count the store's rows. */
  kill(proxy_pid, SIGTERM);
  int status = 0;
  waitpid(proxy_pid, &status, 0);
  kill(fake_pid, SIGTERM);
  waitpid(fake_pid, NULL, 0);
  st_capture_db *db = NULL;
  json_t *rows = NULL;
  long complete = 0, rows_n = -1;
  if (st_capture_db_open(store, &db) == ST_OK && st_capture_db_list(db, 0, &rows) == ST_OK) {
    rows_n = (long)json_array_size(rows);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) complete += !strcmp(json_string_value(json_object_get(r, "state")), "complete");
  }
  json_decref(rows);
  st_capture_db_close(db);
  printf("\nloss: %ld proxied requests, %ld failed or differed from direct; store holds %ld rows, "
         "%ld complete; proxy exit status %d after SIGTERM\n",
         proxied, lost, rows_n, complete, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "bench_capture: could not remove %s\n", dir);
  curl_slist_free_all(headers);
  curl_global_cleanup();
  return lost == 0 && rows_n == proxied && complete == proxied ? 0 : 1;
}

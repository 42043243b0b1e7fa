/*
** bench_prefill.c — prefill (and decode) speed and peak memory of the engine on one backend
** (--backend, default cpu-ref) at growing context, with the cost split into where it goes, and
** the recording overhead.
**
** Each measurement runs in its own child process, so the peak RSS reported is that size's alone.
** Peers in the same invocation: (1) the backend's own limit on this machine — the GFLOP/s of its
** fp32 matmul on a large square problem, measured here, first; (2) the
** dense-attention cost the same model would pay if every query attended every earlier token,
** computed from the same shapes. Cost model per token t (FLOP = 2 per multiply-add):
**   linear   every projection, router, experts (kE routed + shared), mHC mixing
**   attention 4 H d (window + compressed candidates)  — window <= w, CSA top-k, HCA all rows
**   indexer  2 hI dI (t+1)/m  (CSA layers: every visible compressed row is scored)
**
** --decode N: after each prefill, N more tokens one at a time (greedy on the logits), timed
** apart: the decode column gives milliseconds per token at that context.
**
** The peak is the backend's own fp32 matmul on a large square problem (host backends [256 x
** 1024] . [1024 x 1024]^T, device backends [4096 x 4096] . [4096 x 4096]^T, in backend memory,
** best of 5): "of peak" says how far the whole prefill runs from the rate of its own GEMM.
**
** usage: bench_prefill MODEL_DIR TOKENS[,TOKENS...] [--set K=V]... [--tap GLOB --store DIR
**                      [--positions SPEC]]
**                      [--backend NAME] [--decode N]
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/model.h"
#include "recorder/recorder.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct cost { double linear, attention, indexer, dense_attention; } cost;

static cost cost_model(const st_config *c, const st_settings *set, int64_t T) {
  cost k = {0};
  double D = c->hidden_size, H = c->num_attention_heads, d = c->head_dim, q = c->q_lora_rank;
  double G = c->o_groups, Ro = c->o_lora_rank, hI = c->index_n_heads, dI = c->index_head_dim;
  double F = c->moe_intermediate_size, E = c->n_routed_experts, kE = c->num_experts_per_tok;
  double hc = c->hc_mult, mixes = (2 + hc) * hc, w = c->sliding_window;
  int topk = st_settings_topk(set, c);
  for (int l = 0; l < c->num_hidden_layers; l++) {
    int m = c->compress_ratio[l];
    double per_token = D * q + q * H * d + D * d + H * d * Ro + G * Ro * D + D * E +
                       (kE + 1) * 3 * D * F + 2 * mixes * hc * D;
    if (m) per_token += 2 * D * (c->layer_kind[l] == ST_LAYER_CSA ? 2 : 1) * d;
    if (c->layer_kind[l] == ST_LAYER_CSA) per_token += q * hI * dI + D * hI + 2 * D * 2 * dI;
    k.linear += 2 * per_token * (double)T;
    for (int64_t t = 0; t < T; t++) {
      double window = (double)(t + 1 < w ? t + 1 : w), visible = m ? (double)((t + 1) / m) : 0;
      double compressed = c->layer_kind[l] == ST_LAYER_CSA ? fmin(topk, visible) : visible;
      k.attention += 4 * H * d * (window + compressed);
      k.dense_attention += 4 * H * d * (double)(t + 1);
      if (c->layer_kind[l] == ST_LAYER_CSA) k.indexer += 2 * hI * dI * visible;
    }
  }
  k.linear += 2 * D * c->vocab_size; /* logits of the last token */
  return k;
}

/* GFLOP/s of the backend's fp32 matmul on a square problem in its own memory, best of 5. */
static double matmul_peak(const char *backend) {
  st_backend be;
  if (st_backend_open(backend, &be)) return 0;
  int host = be.ops->host_memory;
  size_t n = host ? 256 : 4096, in = host ? 1024 : 4096, out = in;
  float *hx = malloc(sizeof(float) * n * in), *hw = malloc(sizeof(float) * in * out);
  for (size_t i = 0; i < n * in; i++) hx[i] = (float)((i * 7919) % 1000) / 1000.0f;
  for (size_t i = 0; i < in * out; i++) hw[i] = (float)((i * 104729) % 1000) / 1000.0f;
  void *x = NULL, *w = NULL, *y = NULL;
  double best = 1e30;
  if (hx && hw && !be.ops->alloc(be.ctx, sizeof(float) * n * in, &x) &&
      !be.ops->alloc(be.ctx, sizeof(float) * in * out, &w) &&
      !be.ops->alloc(be.ctx, sizeof(float) * n * out, &y) &&
      !be.ops->upload(be.ctx, x, hx, sizeof(float) * n * in) &&
      !be.ops->upload(be.ctx, w, hw, sizeof(float) * in * out)) {
    st_weight wt = {.dtype = ST_W_F32, .block = {1, 1}, .rows = (int64_t)out, .cols = (int64_t)in, .data = w};
    for (int r = 0; r < 5; r++) {
      double t0 = now();
      be.ops->matmul(be.ctx, y, x, &wt, (int)n);
      if (be.ops->synchronize(be.ctx)) break;
      best = fmin(best, now() - t0);
    }
  }
  be.ops->free(be.ctx, x);
  be.ops->free(be.ctx, w);
  be.ops->free(be.ctx, y);
  st_backend_close(&be);
  free(hx);
  free(hw);
  return best < 1e30 ? 2.0 * (double)n * (double)in * (double)out / best / 1e9 : 0;
}

typedef struct result { double seconds, peak_mib, weight_mib, backend_mib, decode_ms; } result;

static const char *backend_name = "cpu-ref";
static int decode_tokens; /* --decode N */
static const char *positions = "all"; /* --positions SPEC: the token positions armed taps keep */

static int measure(const char *model_dir, int64_t T, const st_settings *settings, const char *tap,
                   const char *store, result *out) {
  int pipefd[2];
  if (pipe(pipefd)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    st_model *m = NULL;
    st_session *s = NULL;
    st_taps taps = {0};
    st_recorder *rec = NULL;
    st_backend be;
    double t_start = now();
    if (st_model_open(model_dir, &m) || st_model_load_all(m)) goto fail;
    if (st_backend_open(backend_name, &be)) goto fail;
    fprintf(stderr, "bench_prefill: %lld tokens: model loaded in %.1f s\n", (long long)T, now() - t_start);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)T);
    unsigned seed = 99;
    for (int64_t i = 0; i < T; i++) {
      seed = seed * 1103515245u + 12345u;
      tokens[i] = (int32_t)((seed >> 8) % 256u);
    }
    if (tap) {
      const char *globs[] = {tap};
      if (st_taps_arm(&taps, m->cfg->num_hidden_layers, globs, 1)) goto fail;
      st_run_meta meta = {.model_dir = model_dir, .model_name = "bench", .settings_json = "{}",
                          .config_json = "{}", .backend = be.ops->name, .kernel_mode = be.ops->kernel_mode,
                          .threads = 1, .command_line = "bench_prefill", .positions = positions,
                          .n_layers = m->cfg->num_hidden_layers};
      st_run_id_new(&meta);
      char path[4096];
      snprintf(path, sizeof path, "%s/runs/%s.h5", store, meta.run_id);
      if (st_recorder_open(path, store, &meta, T, &rec)) goto fail;
      taps.sink = st_recorder_sink(rec);
    }
    st_session_options opt = {.max_tokens = T + decode_tokens, .settings = *settings, .taps = tap ? &taps : NULL,
                              .backend = &be};
    double t_session = now();
    if (st_session_create(m, &opt, &s)) goto fail;
    fprintf(stderr, "bench_prefill: %lld tokens: session created in %.1f s (backend memory %.0f MiB)\n",
            (long long)T, now() - t_session, st_session_backend_bytes(s) / 1048576.0);
    float *logits = malloc(sizeof(float) * (size_t)m->cfg->vocab_size);
    double t0 = now();
    if (st_session_forward(s, tokens, (int)T, logits, NULL)) goto fail;
    double prefill_s = now() - t0, t_decode = now();
    for (int k = 0; k < decode_tokens; k++) { /* greedy: the next token is the logits' argmax */
      int32_t next = 0;
      for (int v = 1; v < m->cfg->vocab_size; v++)
        if (logits[v] > logits[next]) next = v;
      if (st_session_forward(s, &next, 1, logits, NULL)) goto fail;
    }
    double decode_s = now() - t_decode;
    if (rec && st_recorder_finish(rec, tokens, T, T)) goto fail; /* the writer drains: counted */
    result r = {.seconds = prefill_s, .weight_mib = st_model_weight_bytes(m) / 1048576.0,
                .backend_mib = st_session_backend_bytes(s) / 1048576.0,
                .decode_ms = decode_tokens ? 1000.0 * decode_s / decode_tokens : 0};
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r.peak_mib = (double)ru.ru_maxrss / 1024.0;
    if (write(pipefd[1], &r, sizeof r) != sizeof r) _exit(1);
    st_session_free(s); /* closing the backend prints its ST_PROFILE table */
    st_backend_close(&be);
    _exit(0);
  fail:
    fprintf(stderr, "bench_prefill: %s\n", st_errmsg());
    _exit(1);
  }
  close(pipefd[1]);
  ssize_t got = read(pipefd[0], out, sizeof *out);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return got == sizeof *out && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_prefill MODEL_DIR TOKENS[,TOKENS...] [--set K=V]... [--tap GLOB --store DIR [--positions SPEC]] [--backend NAME] [--decode N]\n");
    return 2;
  }
  const char *model_dir = argv[1], *tap = NULL, *store = "/tmp/sparsetrace-bench";
  st_settings settings;
  st_settings_default(&settings);
  char settings_text[512] = "";
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc) {
      if (st_settings_set(&settings, argv[++i])) { fprintf(stderr, "%s\n", st_errmsg()); return 2; }
      strcat(strcat(settings_text, " "), argv[i]);
    } else if (!strcmp(argv[i], "--tap") && i + 1 < argc) tap = argv[++i];
    else if (!strcmp(argv[i], "--store") && i + 1 < argc) store = argv[++i];
    else if (!strcmp(argv[i], "--positions") && i + 1 < argc) positions = argv[++i];
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend_name = argv[++i];
    else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 0 || v > 100000) { fprintf(stderr, "bench_prefill: --decode %s: expected 0..100000\n", argv[i]); return 2; }
      decode_tokens = (int)v;
    }
    else { fprintf(stderr, "bench_prefill: unknown argument %s\n", argv[i]); return 2; }
  }
  /* The parent never starts OpenMP threads: libgomp does not survive fork(), so every
  ** measurement, the peak included, runs in a child, and the parent reads the config alone
  ** (st_model_open scans large weights for NaN with OpenMP). */
  st_config *cfg = calloc(1, sizeof *cfg);
  char config_path[4096];
  snprintf(config_path, sizeof config_path, "%s/config.json", model_dir);
  if (!cfg || st_config_load(config_path, cfg)) { fprintf(stderr, "%s\n", st_errmsg()); return 1; }
  st_settings resolved = settings;
  st_settings_resolve(&resolved, cfg);
  double peak_and_threads[2] = {0, 1};
  int pipefd[2];
  if (pipe(pipefd)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    double v[2] = {matmul_peak(backend_name), 1};
#ifdef _OPENMP
    v[1] = omp_get_max_threads();
#endif
    _exit(write(pipefd[1], v, sizeof v) == sizeof v ? 0 : 1);
  }
  close(pipefd[1]);
  if (read(pipefd[0], peak_and_threads, sizeof peak_and_threads) != sizeof peak_and_threads) return 1;
  close(pipefd[0]);
  waitpid(pid, NULL, 0);
  double peak = peak_and_threads[0];
  int threads = (int)peak_and_threads[1];
  printf("peak of the %s backend's fp32 matmul (%d host threads): %.2f GFLOP/s\n", backend_name, threads, peak);
  printf("backend: %s   settings:%s   taps: %s\n\n", backend_name,
         settings_text[0] ? settings_text : " (defaults)", tap ? tap : "none");
  printf("| tokens | seconds | tokens/s | decode ms/token | peak MiB | weights MiB | session MiB | GFLOP | GFLOP/s | of peak | attention GFLOP | indexer GFLOP | dense-attention GFLOP | sparse/dense attention |\n");
  printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  char *list = strdup(argv[2]);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    int64_t T = strtoll(tok, NULL, 10);
    if (tok[strlen(tok) - 1] == 'k') T *= 1024;
    result r;
    if (measure(model_dir, T, &settings, tap, store, &r)) { printf("| %lld | failed |\n", (long long)T); continue; }
    cost c = cost_model(cfg, &resolved, T);
    double total = c.linear + c.attention + c.indexer;
    char decode[32] = "-";
    if (decode_tokens) snprintf(decode, sizeof decode, "%.2f", r.decode_ms);
    printf("| %lld | %.2f | %.0f | %s | %.0f | %.1f | %.1f | %.1f | %.2f | %.0f%% | %.1f | %.1f | %.1f | %.3f |\n",
           (long long)T, r.seconds, (double)T / r.seconds, decode, r.peak_mib, r.weight_mib, r.backend_mib, total / 1e9,
           total / 1e9 / r.seconds, 100 * total / 1e9 / r.seconds / peak, c.attention / 1e9,
           c.indexer / 1e9, c.dense_attention / 1e9, c.attention / c.dense_attention);
    fflush(stdout);
  }
  free(list);
  free(cfg);
  return 0;
}

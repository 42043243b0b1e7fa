/*
** cmd_capture.c — `sparsetrace capture`: run the capture proxy (recorder/capture.h) until
** SIGINT or SIGTERM.
**
** Signals are handled synchronously: SIGINT, SIGTERM and SIGHUP are blocked before the proxy
** starts any thread (so every worker inherits the mask) and the main thread waits for them with
** sigwait(). The first one starts a graceful shutdown on a helper thread: no new connections,
** in-flight exchanges get --grace seconds to finish, then are cut and recorded as
** 'interrupted'. A second signal during the grace period cuts them at once. Either way the
** command returns only after every accepted request is in the store, which is what "stopped
** mid-stream, nothing lost" needs from a service manager's SIGTERM.
*/
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "recorder/capture/capture.h"
#include "recorder/recorder.h"

static const st_opt_use capture_options[] = {
  {ST_OPT_UPSTREAM, NULL, "the real server, e.g. https://api.anthropic.com or http://gpu:30000"},
  {ST_OPT_LISTEN, NULL, "where to listen (default 127.0.0.1:8787; port 0 picks a free one).\n"
                        "Binds to loopback unless given another address."},
  {ST_OPT_STORE, NULL, "trace store (default ./" ST_DEFAULT_STORE "); requests go to DIR/index.sqlite"},
  {ST_OPT_UPSTREAM_PROXY, NULL, "reach the upstream through this HTTP proxy; 'none' for no proxy\n"
                                "(default: curl's http_proxy/https_proxy/no_proxy environment)"},
  {ST_OPT_THREADS, NULL, "most exchanges at once, 1..1024 (default 256); more wait in a queue"},
  {ST_OPT_MAX_BODY, NULL, "larger request bodies get 413 (default 32M)"},
  {ST_OPT_RECORD_MAX, NULL, "response bytes recorded per request; relaying goes on (default 256M)"},
  {ST_OPT_INLINE_MAX, NULL, "bodies above this are stored in files beside the index (default 1M)"},
  {ST_OPT_CONNECT_TIMEOUT, NULL, "upstream connect timeout in seconds (default 10)"},
  {ST_OPT_IDLE_TIMEOUT, NULL, "upstream silent this long -> 504 or stream error event (default 600)"},
  {ST_OPT_GRACE, NULL, "on SIGINT/SIGTERM, let in-flight exchanges finish for S seconds\n"
                       "before cutting them (default 5); a second signal cuts at once"},
  {ST_OPT_ASK_PROMPT_IDS, NULL,
   "sglang | vllm (default: off). CHANGES THE FORWARDED REQUEST BODY: adds\n"
   "the engine's own field that makes it return the prompt token ids it\n"
   "ran -- sglang: \"return_prompt_token_ids\": true on /v1/chat/completions\n"
   "(not on streaming ones, which sglang refuses), \"return_token_ids\": true\n"
   "on /v1/completions; vllm: \"return_token_ids\": true on both. The server\n"
   "then also adds token id fields to its answer, which the client gets\n"
   "unchanged. The record keeps the body as the client sent it, notes the\n"
   "added field (request.modified) and stores the ids (prompt_token_ids),\n"
   "which `sparsetrace run --request` then replays verbatim. /v1/messages\n"
   "and /v1/responses are forwarded unchanged (no engine returns ids there)."},
  {ST_OPT_READY_FILE, NULL, "once listening, write the proxy's URL to FILE (for scripts)"},
  {ST_OPT_QUIET, NULL, "no per-request log lines"},
  {0}};

static const st_cmd_spec capture_spec = {
  "capture", "sparsetrace capture --upstream URL [--listen HOST:PORT] [--store DIR] [options]\n",
  "An HTTP proxy between an LLM client and its server that records every request and response\n"
  "(streams included, credentials redacted) into the trace store. Point the client at it:\n"
  "  ANTHROPIC_BASE_URL=http://127.0.0.1:8787        (Claude-Code-style clients, /v1/messages)\n"
  "  OPENAI_BASE_URL=http://127.0.0.1:8787/v1        (OpenAI SDKs: chat, completions, responses)\n"
  "then browse what it saw with `sparsetrace requests list`.\n",
  capture_options,
  "SIZE takes K, M or G suffixes (powers of 1024). Credentials (Authorization, x-api-key,\n"
  "api-key, cookies, proxy credentials, key=/token= query parameters) are forwarded to the\n"
  "upstream and never written to the store or the log. Accept-Encoding is sent upstream as\n"
  "'identity' so that streams are recorded as plaintext.\n"
  "\n"
  "Exit status: 0 after a clean shutdown, 1 on failure, 2 usage error.\n"};

static int quiet;

static void log_line(void *user, const char *line) {
  if (quiet && strncmp(line, "listening", 9) && strncmp(line, "stop", 4) &&
      strncmp(line, "warning", 7) && strncmp(line, "store", 5))
    return;
  fprintf(stderr, "sparsetrace capture: %s\n", line);
}

static int parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || v < 0) return -1;
  double mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v * mul > 1e15) return -1; /* a petabyte: past any body, and exact in a double */
  *out = (size_t)(v * mul);
  return 0;
}

static int parse_seconds_ms(const char *s, int *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || v < 0 || v > 86400.0 * 365) return -1;
  *out = (int)(v * 1000.0 + 0.5);
  return 0;
}

typedef struct stopper {
  st_capture *proxy;
  int grace_ms;
  st_status status;
  char message[1024];
  volatile int done;
} stopper;

static void *stop_main(void *arg) {
  stopper *s = arg;
  s->status = st_capture_shutdown(s->proxy, s->grace_ms);
  if (s->status) snprintf(s->message, sizeof s->message, "%s", st_errmsg());
  __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

int st_cmd_capture(int argc, char **argv) {
  st_capture_config cfg;
  st_capture_config_init(&cfg);
  cfg.log = log_line;
  int grace_ms = 5000, c;
  const char *ready_file = NULL;
  st_opts o;
  st_opts_init(&o, &capture_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    int bad = 0;
    switch (c) {
    case ST_OPT_UPSTREAM: cfg.upstream = o.arg; break;
    case ST_OPT_LISTEN: cfg.listen = o.arg; break;
    case ST_OPT_UPSTREAM_PROXY: cfg.upstream_proxy = !strcmp(o.arg, "none") ? "" : o.arg; break;
    case ST_OPT_MAX_BODY: bad = parse_size(o.arg, &cfg.max_request_bytes) || !cfg.max_request_bytes; break;
    case ST_OPT_RECORD_MAX: bad = parse_size(o.arg, &cfg.max_record_bytes) || !cfg.max_record_bytes; break;
    case ST_OPT_INLINE_MAX: bad = parse_size(o.arg, &cfg.inline_max_bytes) || !cfg.inline_max_bytes; break;
    case ST_OPT_CONNECT_TIMEOUT: bad = parse_seconds_ms(o.arg, &cfg.connect_timeout_ms) || !cfg.connect_timeout_ms; break;
    case ST_OPT_IDLE_TIMEOUT: bad = parse_seconds_ms(o.arg, &cfg.idle_timeout_ms) || !cfg.idle_timeout_ms; break;
    case ST_OPT_GRACE: bad = parse_seconds_ms(o.arg, &grace_ms); break;
    case ST_OPT_READY_FILE: ready_file = o.arg; break;
    case ST_OPT_ASK_PROMPT_IDS:
      if (st_capture_prompt_ids_parse(o.arg, &cfg.ask_prompt_ids)) {
        st_opts_fail(&o);
        c = ST_OPTS_EXIT;
      }
      break;
    default:
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      c = ST_OPTS_EXIT;
    }
    if (bad) {
      st_opts_error(&o, "bad value '%s' for --%s", o.arg, o.name);
      c = ST_OPTS_EXIT;
    }
    if (c == ST_OPTS_EXIT) break;
  }
  if (o.store) cfg.store_dir = o.store;
  if (o.threads) cfg.threads = o.threads;
  quiet = o.quiet;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return o.exit_code;
  if (!cfg.upstream) {
    fprintf(stderr, "sparsetrace capture: --upstream URL is required\n(sparsetrace capture --help lists the options)\n");
    return 2;
  }

  /* Before any thread exists: libcurl's global state, and the signal mask every thread inherits. */
  curl_global_init(CURL_GLOBAL_DEFAULT);
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

  st_capture *proxy = NULL;
  if (st_capture_start(&cfg, &proxy)) {
    int rc = st_cli_report_error("capture");
    curl_global_cleanup();
    return rc;
  }
  if (!quiet)
    fprintf(stderr,
            "sparsetrace capture: clients: ANTHROPIC_BASE_URL=%s  OPENAI_BASE_URL=%s/v1  "
            "(Ctrl-C to stop)\n",
            st_capture_url(proxy), st_capture_url(proxy));
  if (ready_file) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", ready_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n", st_capture_url(proxy)) < 0 || fclose(f) != 0 ||
        rename(tmp, ready_file) != 0) {
      fprintf(stderr, "sparsetrace capture: cannot write --ready-file %s: %s\n", ready_file,
              strerror(errno));
      st_capture_stop(proxy, 0);
      curl_global_cleanup();
      return 1;
    }
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  fprintf(stderr, "sparsetrace capture: %s received, shutting down\n", strsignal(sig));
  stopper s = {.proxy = proxy, .grace_ms = grace_ms};
  pthread_t thread;
  if (pthread_create(&thread, NULL, stop_main, &s) != 0) {
    stop_main(&s);
  } else {
    /* A second signal during the grace period cuts in-flight exchanges now. */
    struct timespec tick = {0, 100 * 1000000L};
    while (!__atomic_load_n(&s.done, __ATOMIC_ACQUIRE)) {
      if (sigtimedwait(&stop_signals, NULL, &tick) > 0) {
        fprintf(stderr, "sparsetrace capture: second signal, cutting in-flight exchanges now\n");
        st_capture_cut_now(proxy);
      }
    }
    pthread_join(thread, NULL);
  }
  st_capture_free(proxy);
  curl_global_cleanup();
  if (s.status) {
    fprintf(stderr, "sparsetrace capture: %s\n", s.message);
    return 1;
  }
  return 0;
}

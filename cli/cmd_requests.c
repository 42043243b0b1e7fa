/*
** cmd_requests.c — `sparsetrace requests`: browse what `sparsetrace capture` recorded.
**
**   list            newest first, one line per request (or a JSON array with --json)
**   show ID         one request for reading: who, what, timings, usage, the final message
**   export ID       the full record as JSON (schemas/capture.schema.json) in a file, which is
**                   what `sparsetrace run --request FILE.json` replays
**
** IDs are uuids; any unique prefix of 4 or more characters works, and so does "last".
** Everything is read through recorder/capture.h on a read-only connection.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "recorder/capture/capture.h"
#include "recorder/recorder.h"

static const st_opt_use requests_options[] = {
  {ST_OPT_STORE, NULL, "the trace store (default ./" ST_DEFAULT_STORE ")"},
  {ST_OPT_JSON, NULL, "JSON output (list: array of summaries; show: the full record)"},
  {ST_OPT_LIMIT, NULL, "list at most N requests (default 50; 0 = all)"},
  {ST_OPT_OUT, NULL, "export destination (default ./request-<id>.json; '-': standard output)"},
  {ST_OPT_BODY, NULL, "show: print request and response bodies too"},
  {0}};

static const st_cmd_spec requests_spec = {
  "requests",
  "sparsetrace requests [--store DIR] list [--limit N] [--json]\n"
  "       sparsetrace requests [--store DIR] show ID [--json] [--body]\n"
  "       sparsetrace requests [--store DIR] export ID [-o FILE|-]\n",
  "Browses the requests recorded by `sparsetrace capture` in DIR/index.sqlite.\n"
  "\n"
  "  list      newest first: id (first 8 characters), time, API, endpoint, model, stream,\n"
  "            HTTP status, state, prompt/completion tokens, time to first byte, total time\n"
  "  show ID   one request: headers (credentials redacted), timings, usage, errors and the\n"
  "            final message (text, tool calls, stop reason); --body adds the raw bodies\n"
  "  export ID the whole record as JSON (schemas/capture.schema.json) to FILE (default\n"
  "            ./request-<id>.json; '-' for standard output). `sparsetrace run --request\n"
  "            FILE.json` replays such a file through the engine.\n"
  "\n"
  "ID is a request id, any unique prefix of it (4+ characters), or 'last'.\n",
  requests_options,
  "SQL over the same data: sparsetrace query \"SELECT * FROM request_summary\"\n"};

static const char *str_or(json_t *o, const char *key, const char *dflt) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : dflt;
}

static void fmt_num(char *out, size_t n, json_t *v, const char *fmt) {
  if (json_is_integer(v)) snprintf(out, n, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v)) snprintf(out, n, fmt, json_real_value(v));
  else snprintf(out, n, "-");
}

static int print_json(json_t *j, FILE *f) {
  int rc = json_dumpf(j, f, JSON_INDENT(2));
  fputc('\n', f);
  return rc;
}

static int cmd_list(st_capture_db *db, int limit, int json) {
  json_t *rows = NULL;
  if (st_capture_db_list(db, limit, &rows)) return st_cli_report_error("requests list");
  if (json) {
    print_json(rows, stdout);
    json_decref(rows);
    return 0;
  }
  if (json_array_size(rows) == 0) {
    printf("no captured requests yet (run `sparsetrace capture --upstream URL` and point a "
           "client at it)\n");
    json_decref(rows);
    return 0;
  }
  printf("%-8s  %-23s  %-18s  %-22s  %-20s  %-3s  %-6s  %-14s  %7s  %7s  %9s  %9s\n", "ID",
         "RECEIVED (UTC)", "API", "ENDPOINT", "MODEL", "SSE", "STATUS", "STATE", "IN_TOK",
         "OUT_TOK", "TTFB_MS", "TOTAL_MS");
  size_t i;
  json_t *r;
  json_array_foreach(rows, i, r) {
    char status[16], in[24], out[24], ttfb[24], total[24];
    fmt_num(status, sizeof status, json_object_get(r, "status"), "%.0f");
    fmt_num(in, sizeof in, json_object_get(r, "input_tokens"), "%.0f");
    fmt_num(out, sizeof out, json_object_get(r, "output_tokens"), "%.0f");
    fmt_num(ttfb, sizeof ttfb, json_object_get(r, "ttfb_ms"), "%.1f");
    fmt_num(total, sizeof total, json_object_get(r, "total_ms"), "%.1f");
    const char *state = str_or(r, "state", "?");
    char state_text[32];
    snprintf(state_text, sizeof state_text, "%s%s%s", state,
             json_is_true(json_object_get(r, "request_malformed")) ? "*" : "",
             !strcmp(str_or(r, "origin", "proxied"), "served") ? "+" : "");
    printf("%-8.8s  %-23.23s  %-18.18s  %-22.22s  %-20.20s  %-3s  %-6s  %-14s  %7s  %7s  %9s  %9s\n",
           str_or(r, "id", "?"), str_or(r, "received_at", "?"), str_or(r, "api", "?"),
           str_or(r, "endpoint", "?"), str_or(r, "model", "-"),
           json_is_true(json_object_get(r, "stream")) ? "yes" : "no", status, state_text, in, out,
           ttfb, total);
  }
  printf("(%zu shown; * = request body was not valid JSON; + = answered by `sparsetrace serve`; "
         "`sparsetrace requests show ID`)\n",
         json_array_size(rows));
  json_decref(rows);
  return 0;
}

static void print_headers(json_t *headers) {
  size_t i;
  json_t *pair;
  json_array_foreach(headers, i, pair)
    printf("    %s: %s\n", json_string_value(json_array_get(pair, 0)) ? json_string_value(json_array_get(pair, 0)) : "?",
           json_string_value(json_array_get(pair, 1)) ? json_string_value(json_array_get(pair, 1)) : "");
}

static void print_body(const char *label, json_t *side) {
  const char *body = json_string_value(json_object_get(side, "body"));
  if (body) printf("  %s body:\n%s\n", label, body);
  else if (json_is_string(json_object_get(side, "body_base64")))
    printf("  %s body: (not UTF-8; %lld bytes; see the export's body_base64)\n", label,
           (long long)json_integer_value(json_object_get(side, "bytes")));
}

static int cmd_show(st_capture_db *db, const char *ref, int json, int bodies) {
  char id[40];
  json_t *r = NULL;
  if (st_capture_db_resolve(db, ref, id) || st_capture_db_export(db, id, &r))
    return st_cli_report_error("requests show");
  if (json) {
    print_json(r, stdout);
    json_decref(r);
    return 0;
  }
  json_t *req = json_object_get(r, "request"), *resp = json_object_get(r, "response");
  json_t *tim = json_object_get(r, "timings"), *fm = json_object_get(r, "final_message");
  json_t *usage = json_object_get(r, "usage"), *errs = json_object_get(r, "errors");
  char status[16], a[24], b[24], c[24], d[24], e[24];
  fmt_num(status, sizeof status, json_object_get(r, "status"), "%.0f");
  printf("request   %s\n", id);
  printf("received  %s from %s\n", str_or(r, "received_at", "?"), str_or(r, "client_addr", "?"));
  printf("endpoint  %s %s%s%s  (%s%s)\n", str_or(r, "method", "?"), str_or(r, "endpoint", "?"),
         json_is_string(json_object_get(r, "query")) ? "?" : "", str_or(r, "query", ""),
         str_or(r, "api", "?"), json_is_true(json_object_get(r, "stream")) ? ", streamed" : "");
  if (!strcmp(str_or(r, "origin", "proxied"), "served"))
    printf("served    by sparsetrace serve, model %s\n", str_or(r, "upstream", "?"));
  else
    printf("upstream  %s\n", str_or(r, "upstream", "?"));
  printf("model     %s\n", str_or(r, "model", "-"));
  printf("outcome   %s, HTTP %s\n", str_or(r, "state", "?"), status);
  fmt_num(a, sizeof a, json_object_get(tim, "headers_ms"), "%.1f");
  fmt_num(b, sizeof b, json_object_get(tim, "ttfb_ms"), "%.1f");
  fmt_num(c, sizeof c, json_object_get(tim, "total_ms"), "%.1f");
  printf("timings   head %s ms, first byte %s ms, total %s ms", a, b, c);
  if (json_is_integer(json_object_get(tim, "n_events"))) {
    fmt_num(d, sizeof d, json_object_get(tim, "n_events"), "%.0f");
    fmt_num(e, sizeof e, json_object_get(tim, "max_gap_ms"), "%.1f");
    printf("; %s events, largest gap %s ms", d, e);
  }
  printf("\n");
  fmt_num(a, sizeof a, json_object_get(usage, "input_tokens"), "%.0f");
  fmt_num(b, sizeof b, json_object_get(usage, "output_tokens"), "%.0f");
  printf("usage     %s prompt tokens, %s completion tokens (as the upstream reported)\n", a, b);
  fmt_num(a, sizeof a, json_object_get(req, "bytes"), "%.0f");
  printf("request   %s bytes", a);
  if (json_is_true(json_object_get(req, "malformed")))
    printf(", NOT valid JSON: %s", str_or(req, "json_error", "?"));
  printf("\n");
  print_headers(json_object_get(req, "headers"));
  fmt_num(a, sizeof a, json_object_get(resp, "bytes"), "%.0f");
  printf("response  %s bytes%s\n", a, json_is_true(json_object_get(resp, "truncated")) ? " (record truncated)" : "");
  print_headers(json_object_get(resp, "headers"));
  if (json_is_string(json_object_get(errs, "upstream")))
    printf("upstream error  %s\n", str_or(errs, "upstream", ""));
  if (json_is_string(json_object_get(errs, "client")))
    printf("client error    %s\n", str_or(errs, "client", ""));
  if (json_integer_value(json_object_get(r, "redactions")) > 0)
    printf("redactions      %lld credential occurrence(s) masked in the bodies\n",
           (long long)json_integer_value(json_object_get(r, "redactions")));
  if (json_is_object(fm)) {
    printf("final message (stop_reason %s%s):\n", str_or(fm, "stop_reason", "-"),
           json_is_true(json_object_get(fm, "complete")) ? "" : ", INCOMPLETE");
    const char *thinking = json_string_value(json_object_get(fm, "thinking"));
    if (thinking) printf("  [thinking] %s\n", thinking);
    printf("  %s\n", str_or(fm, "text", ""));
    size_t i;
    json_t *call;
    json_array_foreach(json_object_get(fm, "tool_calls"), i, call) {
      char *args = json_dumps(json_object_get(call, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY);
      printf("  tool call %s (%s): %s\n", str_or(call, "name", "?"), str_or(call, "id", "-"),
             json_is_true(json_object_get(call, "arguments_malformed"))
                 ? str_or(call, "arguments_text", "")
                 : args ? args : "null");
      free(args);
    }
    if (json_is_object(json_object_get(fm, "error"))) {
      char *err = json_dumps(json_object_get(fm, "error"), JSON_COMPACT);
      printf("  error in the answer: %s\n", err ? err : "?");
      free(err);
    }
  }
  if (bodies) {
    print_body("request", req);
    print_body("response", resp);
  }
  json_decref(r);
  return 0;
}

static int cmd_export(st_capture_db *db, const char *ref, const char *out_path) {
  char id[40];
  json_t *r = NULL;
  if (st_capture_db_resolve(db, ref, id) || st_capture_db_export(db, id, &r))
    return st_cli_report_error("requests export");
  char default_path[80];
  if (!out_path) {
    snprintf(default_path, sizeof default_path, "request-%s.json", id);
    out_path = default_path;
  }
  int rc = 0;
  if (!strcmp(out_path, "-")) {
    print_json(r, stdout);
  } else {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    if (json_dump_file(r, tmp, JSON_INDENT(2)) != 0 || rename(tmp, out_path) != 0) {
      st_fail(ST_EIO, "cannot write %s: %s", out_path, strerror(errno));
      remove(tmp);
      rc = st_cli_report_error("requests export");
    } else {
      printf("%s\n", out_path);
    }
  }
  json_decref(r);
  return rc;
}

int st_cmd_requests(int argc, char **argv) {
  const char *out = NULL;
  int limit = 50, bodies = 0, c;
  const char *positional[3] = {NULL, NULL, NULL};
  int n_pos = 0;
  int64_t v;
  st_opts o;
  st_opts_init(&o, &requests_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    switch (c) {
    case ST_OPT_POSITIONAL:
      if (n_pos == 3) {
        st_opts_error(&o, "too many arguments ('%s')", o.arg);
        c = ST_OPTS_EXIT;
        break;
      }
      positional[n_pos++] = o.arg;
      break;
    case ST_OPT_LIMIT:
      if (st_opt_int(o.name, o.arg, 0, INT32_MAX, &v)) {
        st_opts_fail(&o);
        c = ST_OPTS_EXIT;
      }
      limit = (int)v;
      break;
    case ST_OPT_OUT: out = o.arg; break;
    case ST_OPT_BODY: bodies = 1; break;
    }
    if (c == ST_OPTS_EXIT) break;
  }
  const char *store = o.store ? o.store : ST_DEFAULT_STORE;
  int json = o.json;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return o.exit_code;
  const char *action = positional[0] ? positional[0] : "list";
  int needs_id = !strcmp(action, "show") || !strcmp(action, "export");
  if (strcmp(action, "list") && !needs_id) {
    fprintf(stderr, "sparsetrace requests: unknown action '%s' (list, show or export)\n"
            "(sparsetrace requests --help lists the options)\n", action);
    return 2;
  }
  if (needs_id != (positional[1] != NULL) || positional[2]) {
    fprintf(stderr, "sparsetrace requests: %s\n(sparsetrace requests --help lists the options)\n",
            needs_id ? "give the request ID (or 'last')" : "list takes no argument");
    return 2;
  }
  st_capture_db *db = NULL;
  if (st_capture_db_open(store, &db)) return st_cli_report_error("requests");
  int rc = !strcmp(action, "list")   ? cmd_list(db, limit, json)
           : !strcmp(action, "show") ? cmd_show(db, positional[1], json, bodies)
                                     : cmd_export(db, positional[1], out);
  st_capture_db_close(db);
  return rc;
}

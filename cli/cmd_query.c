/*
** cmd_query.c — `sparsetrace query`: one read-only SQL statement over a store's index.sqlite,
** printed as an aligned table or as a JSON array of objects.
**
** Read-only twice over: the database is opened SQLITE_OPEN_READONLY (with query_only), and the
** statement must satisfy sqlite3_stmt_readonly() before it runs (recorder/index.c). One statement
** per call keeps --json a single array and makes "did anything run?" obvious when one fails.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/time.h>
#include <time.h>
#include <strings.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "common/buf.h"
#include "recorder/index.h"
#include "recorder/recorder.h"

#define CELL_MAX 80 /* on a terminal, table cells longer than this are cut (unless --full) */

/* Bounds on one query (issue 14 #12): a statement that would build a huge value, use unbounded
** memory, print without end or run forever stops with an error saying which bound it hit. */
#define QUERY_MAX_VALUE (64 << 20)        /* SQLITE_LIMIT_LENGTH: one string or blob, bytes */
#define QUERY_HEAP_LIMIT (1024LL << 20)   /* sqlite3_hard_heap_limit64: SQLite's memory, bytes */
#define QUERY_MAX_OUTPUT (256LL << 20)    /* bytes printed (JSON) or buffered (table) */
#define QUERY_TIMEOUT_S 20.0              /* default of --timeout */

static const st_opt_use query_options[] = {
  {ST_OPT_STORE, NULL, "the trace store (default ./" ST_DEFAULT_STORE ")"},
  {ST_OPT_JSON, NULL, "JSON output (never cut; shape columns as arrays)"},
  {ST_OPT_FULL, NULL, "print every table cell whole (the default when the output is not a\n"
                      "terminal)"},
  {ST_OPT_TIMEOUT, "S", "stop the statement after S seconds (default 20)"},
  {0}};

static const st_cmd_spec query_spec = {
  "query", "sparsetrace query [--store DIR] [--json] [--full] \"SQL\"\n",
  "Runs one read-only SQL statement against DIR/index.sqlite and prints the result as an\n"
  "aligned table (NULL prints as NULL; on a terminal, cells over 80 characters are cut with\n"
  "\"...\" unless --full; piped or redirected output is never cut) or, with --json, as a JSON\n"
  "array with one object per row (blobs as hex strings, non-finite reals as null, a column\n"
  "named shape holding a JSON array of integers as that array: \"shape\": [4, 128]).\n",
  query_options,
  "The index is opened read-only, and statements that would change it (INSERT, UPDATE, DELETE,\n"
  "CREATE, DROP, writing PRAGMAs, ...) are refused. One statement per call: a trailing ';' or\n"
  "comment is fine, a second statement is refused (nothing runs). SQL given as several\n"
  "arguments is joined with spaces; \"-\" reads the statement from standard input; options may\n"
  "come before or after it (after \"--\" everything is SQL).\n"
  "\n"
  "Tables: runs, builds, taps, needles, needle_verdicts, replays, requests (captures).\n"
  "Views: run_summary, tap_summary, needle_rank_by_layer, needle_position_verdicts (the needle\n"
  "verdict: schemas/needle-verdicts.md). Schema and column meanings:\n"
  "schemas/migrations/*.sql, or: sparsetrace query \"SELECT sql FROM sqlite_schema\"\n"
  "\n"
  "examples:\n"
  "  sparsetrace query \"SELECT run_id, model, precision, rotate, n_prompt FROM run_summary\n"
  "                     ORDER BY created_at DESC LIMIT 5\"\n"
  "  sparsetrace query \"SELECT layer, retrieves, answer_positions_kept, answer_positions FROM needle_rank_by_layer\n"
  "                     WHERE run_id = '...' ORDER BY layer\"\n"
  "  sparsetrace query --json \"SELECT run_id, name, nan_count FROM taps WHERE nan_count > 0\"\n"
  "\n"
  "Bounds: one value at most 64 MiB, SQLite's memory 1 GiB, output (or the table buffered before\n"
  "it is printed) 256 MiB, --timeout seconds (default 20); a statement past one stops with an\n"
  "error naming it.\n"
  "\n"
  "Exit status: 0 answered, 1 the statement failed or was refused, 2 usage error.\n"};

/* ---------------------------------------------------------------- JSON output */

static void json_string(FILE *out, const unsigned char *s, size_t n) {
  fputc('"', out);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    switch (c) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\n': fputs("\\n", out); break;
    case '\r': fputs("\\r", out); break;
    case '\t': fputs("\\t", out); break;
    default:
      if (c < 0x20) fprintf(out, "\\u%04x", c);
      else fputc(c, out);
    }
  }
  fputc('"', out);
}

/* A shape as the index stores it (taps.shape: JSON text "[4,4,128]"): '[' integers separated by
** commas (and blanks) ']'. Such text is valid JSON and is printed as the array it is. */
static int is_int_array(const unsigned char *t, size_t n) {
  size_t i = 0;
  while (i < n && t[i] == ' ') i++;
  if (i == n || t[i++] != '[') return 0;
  int want_value = 1, empty = 1;
  for (; i < n && t[i] != ']'; i++) {
    if (t[i] == ' ') continue;
    if (want_value) {
      if (t[i] == '-') i++;
      if (i >= n || t[i] < '0' || t[i] > '9') return 0;
      while (i + 1 < n && t[i + 1] >= '0' && t[i + 1] <= '9') i++;
      want_value = 0, empty = 0;
    } else if (t[i] == ',') {
      want_value = 1;
    } else {
      return 0;
    }
  }
  if (i == n || (want_value && !empty)) return 0;
  for (i++; i < n; i++)
    if (t[i] != ' ') return 0;
  return 1;
}

static int is_shape_column(const char *name) {
  size_t n = name ? strlen(name) : 0;
  return n >= 5 && !strcasecmp(name + n - 5, "shape") && (n == 5 || name[n - 6] == '_');
}

static void json_value(FILE *out, sqlite3_stmt *s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_TEXT && is_shape_column(sqlite3_column_name(s, col))) {
    const unsigned char *t = sqlite3_column_text(s, col);
    size_t n = (size_t)sqlite3_column_bytes(s, col);
    if (t && is_int_array(t, n)) {
      fwrite(t, 1, n, out);
      return;
    }
  }
  switch (sqlite3_column_type(s, col)) {
  case SQLITE_INTEGER: fprintf(out, "%lld", (long long)sqlite3_column_int64(s, col)); break;
  case SQLITE_FLOAT: {
    double v = sqlite3_column_double(s, col);
    if (isfinite(v)) fprintf(out, "%.17g", v);
    else fputs("null", out);
    break;
  }
  case SQLITE_TEXT:
    json_string(out, sqlite3_column_text(s, col), (size_t)sqlite3_column_bytes(s, col));
    break;
  case SQLITE_BLOB: {
    const unsigned char *p = sqlite3_column_blob(s, col);
    int n = sqlite3_column_bytes(s, col);
    fputc('"', out);
    for (int i = 0; i < n; i++) fprintf(out, "%02x", p[i]);
    fputc('"', out);
    break;
  }
  default: fputs("null", out); break;
  }
}

static st_status stopped(sqlite3 *db, int rc);

static st_status print_json(sqlite3_stmt *s, sqlite3 *db, FILE *out) {
  int cols = sqlite3_column_count(s);
  int rc, rows = 0;
  long long printed = 0; /* bytes of values printed so far (names and punctuation not counted) */
  fputc('[', out);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    for (int c = 0; c < cols; c++) printed += sqlite3_column_bytes(s, c) + 8;
    if (printed > QUERY_MAX_OUTPUT) {
      fputs("\n]\n", out);
      return st_fail(ST_EINVAL, "query output passed its limit of %lld MiB after %d rows (add "
                                "a LIMIT or select fewer columns)", QUERY_MAX_OUTPUT >> 20, rows);
    }
    fputs(rows++ ? ",\n  {" : "\n  {", out);
    for (int c = 0; c < cols; c++) {
      const char *name = sqlite3_column_name(s, c);
      if (c) fputs(", ", out);
      json_string(out, (const unsigned char *)(name ? name : ""), name ? strlen(name) : 0);
      fputs(": ", out);
      json_value(out, s, c);
    }
    fputc('}', out);
  }
  fputs(rows ? "\n]\n" : "]\n", out);
  if (rc != SQLITE_DONE) return stopped(db, rc);
  return ST_OK;
}

/* ---------------------------------------------------------------- table output */

/* Display width of UTF-8 text: code points, not bytes. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xC0) != 0x80) w++;
  return w;
}

/* The cell text of one value: one line; at most CELL_MAX code points when cut. */
static void cell_text(sqlite3_stmt *s, int col, int cut, st_buf *out) {
  char num[64];
  switch (sqlite3_column_type(s, col)) {
  case SQLITE_NULL: st_buf_str(out, "NULL"); return;
  case SQLITE_INTEGER:
    snprintf(num, sizeof num, "%lld", (long long)sqlite3_column_int64(s, col));
    st_buf_str(out, num);
    return;
  case SQLITE_FLOAT:
    snprintf(num, sizeof num, "%.10g", sqlite3_column_double(s, col));
    st_buf_str(out, num);
    return;
  case SQLITE_BLOB:
    snprintf(num, sizeof num, "<blob %d bytes>", sqlite3_column_bytes(s, col));
    st_buf_str(out, num);
    return;
  default: break;
  }
  const char *t = (const char *)sqlite3_column_text(s, col);
  size_t width = 0;
  for (size_t i = 0; t && t[i]; i++) {
    unsigned char c = (unsigned char)t[i];
    if (cut && (c & 0xC0) != 0x80 && ++width > CELL_MAX - 3) {
      st_buf_str(out, "...");
      return;
    }
    if (c == '\n' || c == '\r' || c == '\t') st_buf_add(out, " ", 1);
    else if (c < 0x20) st_buf_add(out, "?", 1);
    else st_buf_add(out, (const char *)&t[i], 1);
  }
}

static st_status print_table(sqlite3_stmt *s, sqlite3 *db, int cut, FILE *out) {
  int cols = sqlite3_column_count(s);
  if (cols == 0) { /* a statement without result columns */
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {}
    if (rc != SQLITE_DONE) return stopped(db, rc);
    return ST_OK;
  }
  /* Cells are kept as NUL-separated strings in one buffer; offsets index them. */
  st_buf cells = {0};
  size_t *offsets = NULL, n_cells = 0, cap_cells = 0;
  size_t *width = calloc((size_t)cols, sizeof *width);
  int *numeric = calloc((size_t)cols, sizeof *numeric);
  st_status st = ST_OK;
  if (!width || !numeric) {
    st = st_fail(ST_ENOMEM, "query result");
    goto out;
  }
  for (int c = 0; c < cols; c++) {
    const char *name = sqlite3_column_name(s, c);
    width[c] = text_width(name ? name : "");
    numeric[c] = 1;
  }
  int rc;
  long long rows = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    rows++;
    for (int c = 0; c < cols; c++) {
      if (n_cells == cap_cells) {
        cap_cells = cap_cells ? cap_cells * 2 : 256;
        size_t *grown = realloc(offsets, cap_cells * sizeof *grown);
        if (!grown) {
          st = st_fail(ST_ENOMEM, "query result");
          goto out;
        }
        offsets = grown;
      }
      int type = sqlite3_column_type(s, c);
      if (type != SQLITE_INTEGER && type != SQLITE_FLOAT && type != SQLITE_NULL) numeric[c] = 0;
      offsets[n_cells++] = cells.len;
      cell_text(s, c, cut, &cells);
      st_buf_add(&cells, "", 1); /* the NUL that ends this cell */
    }
    if (cells.failed) {
      st = st_fail(ST_ENOMEM, "query result");
      goto out;
    }
    if ((long long)(cells.len + n_cells * sizeof *offsets) > QUERY_MAX_OUTPUT) {
      st = st_fail(ST_EINVAL, "query result passed its limit of %lld MiB after %lld rows (add a "
                              "LIMIT, or aggregate)", QUERY_MAX_OUTPUT >> 20, rows);
      goto out;
    }
    for (int c = 0; c < cols; c++) {
      size_t w = text_width(cells.data + offsets[n_cells - (size_t)cols + (size_t)c]);
      if (w > width[c]) width[c] = w;
    }
  }
  if (rc != SQLITE_DONE) {
    st = stopped(db, rc);
    goto out;
  }
  for (int c = 0; c < cols; c++) {
    const char *name = sqlite3_column_name(s, c);
    name = name ? name : "";
    int pad = (int)(width[c] - text_width(name));
    if (numeric[c] && rows) fprintf(out, "%s%*s%s", c ? "  " : "", pad, "", name);
    else fprintf(out, "%s%s%*s", c ? "  " : "", name, c + 1 < cols ? pad : 0, "");
  }
  fputc('\n', out);
  for (int c = 0; c < cols; c++) {
    fputs(c ? "  " : "", out);
    for (size_t i = 0; i < width[c]; i++) fputc('-', out);
  }
  fputc('\n', out);
  for (size_t i = 0; i < n_cells; i++) {
    int c = (int)(i % (size_t)cols);
    const char *text = cells.data + offsets[i];
    int pad = (int)(width[c] - text_width(text));
    if (numeric[c]) fprintf(out, "%s%*s%s", c ? "  " : "", pad, "", text);
    else fprintf(out, "%s%s%*s", c ? "  " : "", text, c + 1 < cols ? pad : 0, "");
    if (c + 1 == cols) fputc('\n', out);
  }
  fprintf(out, "(%lld row%s)\n", rows, rows == 1 ? "" : "s");
out:
  free(cells.data);
  free(offsets);
  free(width);
  free(numeric);
  return st;
}

/* ---------------------------------------------------------------- bounds */

typedef struct deadline {
  struct timespec end;
  int expired;
} deadline;

static int past_deadline(void *ctx) {
  deadline *d = ctx;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (now.tv_sec > d->end.tv_sec || (now.tv_sec == d->end.tv_sec && now.tv_nsec >= d->end.tv_nsec))
    d->expired = 1;
  return d->expired;
}

static deadline query_deadline;
static double query_timeout_s = QUERY_TIMEOUT_S;

/* The hard stop, a second after the deadline: SQLite checks the progress handler between
** virtual-machine steps only, and one step can run long (printf('%.*c', 2e9, 'x') repeats a
** character two billion times inside one function call). */
static void hard_stop(int sig) {
  (void)sig;
  static const char msg[] = "sparsetrace query: query stopped after its time limit (--timeout S); "
                            "one SQL function call ran past it\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  _exit(1);
}

static void set_bounds(sqlite3 *db, double timeout_s) {
  sqlite3_limit(db, SQLITE_LIMIT_LENGTH, QUERY_MAX_VALUE);
  sqlite3_hard_heap_limit64(QUERY_HEAP_LIMIT);
  clock_gettime(CLOCK_MONOTONIC, &query_deadline.end);
  double whole = (double)(long long)timeout_s;
  query_deadline.end.tv_sec += (time_t)whole;
  query_deadline.end.tv_nsec += (long)((timeout_s - whole) * 1e9);
  if (query_deadline.end.tv_nsec >= 1000000000L) {
    query_deadline.end.tv_sec++;
    query_deadline.end.tv_nsec -= 1000000000L;
  }
  query_deadline.expired = 0;
  sqlite3_progress_handler(db, 10000, past_deadline, &query_deadline);
  signal(SIGALRM, hard_stop);
  double hard = timeout_s + 1.0;
  struct itimerval it = {{0, 0}, {(time_t)hard, (suseconds_t)((hard - (double)(time_t)hard) * 1e6)}};
  setitimer(ITIMER_REAL, &it, NULL);
}

/* The error of a statement that did not finish, naming the bound it hit. */
static st_status stopped(sqlite3 *db, int rc) {
  if (query_deadline.expired || (rc & 0xff) == SQLITE_INTERRUPT)
    return st_fail(ST_EINVAL, "query stopped after its time limit of %g s (--timeout S)",
                   query_timeout_s);
  if ((rc & 0xff) == SQLITE_TOOBIG)
    return st_fail(ST_EINVAL, "query failed: a value would exceed the limit of %d MiB (%s)",
                   QUERY_MAX_VALUE >> 20, sqlite3_errmsg(db));
  if ((rc & 0xff) == SQLITE_NOMEM)
    return st_fail(ST_ENOMEM, "query failed: it needs more than the memory limit of %lld MiB (%s)",
                   QUERY_HEAP_LIMIT >> 20, sqlite3_errmsg(db));
  return st_fail(ST_ESQLITE, "query failed: %s", sqlite3_errmsg(db));
}

/* ---------------------------------------------------------------- command */

static char *read_stdin(void) {
  st_buf b = {0};
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) st_buf_add(&b, chunk, n);
  if (b.failed) {
    free(b.data);
    return NULL;
  }
  if (!b.data) return strdup("");
  return b.data;
}

int st_cmd_query(int argc, char **argv) {
  st_buf sql = {0};
  int n_sql = 0, c, full = 0;
  st_opts o;
  st_opts_init(&o, &query_spec, argc, argv);
  int bad_timeout = 0;
  while ((c = st_opts_next(&o)) > 0) {
    if (c == ST_OPT_FULL) {
      full = 1;
      continue;
    }
    if (c == ST_OPT_TIMEOUT) {
      char *end;
      double v = strtod(o.arg, &end);
      if (end == o.arg || *end || !(v > 0 && v <= 86400)) bad_timeout = 1;
      else query_timeout_s = v;
      continue;
    }
    if (n_sql++) st_buf_add(&sql, " ", 1);
    st_buf_str(&sql, o.arg);
  }
  const char *store = o.store ? o.store : ST_DEFAULT_STORE;
  int json = o.json;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) {
    free(sql.data);
    return o.exit_code;
  }
  if (bad_timeout) {
    fprintf(stderr, "sparsetrace query: --timeout wants seconds in (0, 86400]\n"
                    "(sparsetrace query --help lists the options)\n");
    free(sql.data);
    return 2;
  }
  if (n_sql == 0) {
    fprintf(stderr, "sparsetrace query: no SQL given\n(sparsetrace query --help lists the options)\n");
    free(sql.data);
    return 2;
  }
  if (sql.failed) {
    free(sql.data);
    st_fail(ST_ENOMEM, "reading the SQL");
    return st_cli_report_error("query");
  }
  if (n_sql == 1 && !strcmp(sql.data, "-")) {
    free(sql.data);
    sql.data = read_stdin();
    if (!sql.data) {
      st_fail(ST_ENOMEM, "reading the SQL from standard input");
      return st_cli_report_error("query");
    }
  }
  st_index *ix = NULL;
  sqlite3_stmt *stmt = NULL;
  st_status st = st_index_open(store, ST_INDEX_READ_ONLY, &ix);
  if (!st) set_bounds(st_index_db(ix), query_timeout_s);
  if (!st) st = st_index_prepare_readonly(ix, sql.data, &stmt);
  if (!st) st = json ? print_json(stmt, st_index_db(ix), stdout)
                     : print_table(stmt, st_index_db(ix), !full && isatty(STDOUT_FILENO), stdout);
  sqlite3_finalize(stmt);
  st_index_close(ix);
  free(sql.data);
  if (st) return st_cli_report_error("query");
  return fflush(stdout) == 0 ? 0 : 1;
}

/*
** cmd_store.c — `sparsetrace store check [--store DIR] [--repair]`: is the index consistent with
** the trace files? (issue 14 #1; the path rule: schemas/trace-layout.md "Trace paths in the
** index").
**
** Reports rows whose trace file is missing (or holds another run, or is unreadable), rows whose
** trace's recomputed content digest differs from runs.content_digest or from the trace's own
** content_digest attribute (modified after recording: reported, never repaired), complete
** traces under the store that no row points at, and leftover .part files (a recorder that was
** killed leaves one). --repair deletes dangling rows, indexes orphan complete traces whose run id
** the index lacks (others are reported; a trace whose content digest differs from its
** content_digest attribute is never indexed), and deletes .part files not modified in the last
** PART_GRACE_S seconds (a live recorder flushes its .part at least once a second); each change
** is noted in store_notes.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "common/base.h"
#include "recorder/index.h"
#include "recorder/recorder.h"
#include "recorder/trace_reader.h"

#define PART_GRACE_S 30

static const st_opt_use store_options[] = {
  {ST_OPT_STORE, NULL, "the trace store (default ./" ST_DEFAULT_STORE ")"},
  {ST_OPT_REPAIR, NULL, "fix what is found: delete dangling rows and stale .part files, index\n"
                        "orphan complete traces"},
  {0}};

static const st_cmd_spec store_spec = {
  "store", "sparsetrace store check [--store DIR] [--repair]\n",
  "Checks a trace store: index rows without their trace file (or whose file holds another run),\n"
  "trace files under the store without a row, and leftover .part files of recordings that did\n"
  "not finish. With --repair: dangling rows are deleted (with their taps, needles, verdicts and\n"
  "replays), orphan complete traces are indexed (when their run id is not in the index already;\n"
  "otherwise reported), .part files not written to for 30 s are deleted; each change is noted\n"
  "in the store_notes table.\n",
  store_options,
  "Exit status: 0 consistent (after --repair: nothing left unfixed), 1 problems found (or an\n"
  "error), 2 usage error.\n"};

typedef struct row {
  char *run_id, *key, *digest; /* digest: runs.content_digest, NULL when none */
  int dangling;
} row;

typedef struct orphan {
  char *path, *key, *run_id;
} orphan;

static struct {
  const char *store;
  int repair, problems, fixed;
  int out_of_memory; /* the walk stopped for memory (st_fail set): the check is incomplete */
  st_index *ix;
  row *rows;
  int n_rows;
  orphan *orphans;
  int n_orphans;
  int failed;
} S;

static int key_indexed(const char *key) {
  for (int i = 0; i < S.n_rows; i++)
    if (!S.rows[i].dangling && !strcmp(S.rows[i].key, key)) return 1;
  return 0;
}

static int run_indexed(const char *run_id) {
  for (int i = 0; i < S.n_rows; i++)
    if (!S.rows[i].dangling && !strcmp(S.rows[i].run_id, run_id)) return 1;
  return 0;
}

static void note(const char *kind, const char *run_id, const char *key, const char *detail) {
  if (st_index_note(S.ix, kind, run_id, key, detail))
    fprintf(stderr, "sparsetrace store: %s\n", st_errmsg());
}

/* Indexes a complete trace that no row points at. Returns 1 when indexed. */
static int index_orphan(const char *path, const char *key, st_trace *t) {
  const char *run_id = st_trace_attr(t, "run_id");
  if (!run_id || run_indexed(run_id)) {
    printf("  not indexed: %s holds run %s, which the index has at another path\n", path,
           run_id ? run_id : "(none)");
    return 0;
  }
  int n = st_trace_tap_count(t);
  st_trace_tap *taps = calloc((size_t)(n ? n : 1), sizeof *taps);
  if (!taps) return 0;
  for (int i = 0; i < n; i++) taps[i] = *st_trace_tap_at(t, i);
  int64_t n_tokens = 0;
  st_trace_tokens(t, &n_tokens);
  char digest[32];
  if (st_trace_verify_digest(t, NULL, NULL, digest)) {
    printf("  not indexed: %s\n", st_errmsg());
    free(taps);
    return 0;
  }
  st_index_run run = {
    .run_id = run_id, .created_at = st_trace_attr(t, "created_at"),
    .model = st_trace_attr(t, "model"), .model_dir = st_trace_attr(t, "model_dir"),
    .trace_path = key, .n_prompt = st_trace_n_prompt(t), .n_tokens = n_tokens,
    .positions = st_trace_attr(t, "positions"), .settings_json = st_trace_attr(t, "settings"),
    .build = {st_trace_attr(t, "build_revision"), st_trace_attr(t, "compiler"),
              st_trace_attr(t, "build_type"), st_trace_attr(t, "backend"),
              st_trace_attr(t, "kernel_mode")},
    .threads = (int)st_trace_attr_int(t, "threads", 0),
    .command_line = st_trace_attr(t, "command_line"), .request_id = st_trace_attr(t, "request_id"),
    .duration_s = -1, .content_digest = digest,
  };
  if (!run.created_at) run.created_at = "unknown";
  if (!run.model) run.model = "unknown";
  if (!run.model_dir) run.model_dir = "unknown";
  st_status st = st_index_add_run(S.ix, &run, taps, n);
  free(taps);
  if (st) {
    printf("  not indexed: %s: %s\n", path, st_errmsg());
    return 0;
  }
  note("orphan_indexed", run_id, key, "store check --repair indexed a trace no row pointed at");
  printf("  indexed: %s as run %s\n", path, run_id);
  return 1;
}

static int visit(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
  if (type != FTW_F) return 0;
  size_t n = strlen(path);
  if (n > 8 && !strcmp(path + n - 8, ".h5.part")) {
    S.problems++;
    int young = time(NULL) - sb->st_mtime < PART_GRACE_S;
    printf("leftover .part: %s (%.1f MiB%s)\n", path, (double)sb->st_size / (1 << 20),
           young ? ", written to in the last 30 s: a recording may still be running" : "");
    if (S.repair && !young) {
      if (unlink(path) == 0) {
        S.fixed++;
        note("part_removed", NULL, path, "store check --repair deleted a leftover .part file");
        printf("  deleted\n");
      } else {
        printf("  cannot delete: %s\n", strerror(errno));
      }
    }
    return 0;
  }
  if (n < 3 || strcmp(path + n - 3, ".h5")) return 0;
  char key[PATH_MAX];
  if (st_index_trace_key(S.store, path, key, sizeof key)) return 0;
  if (key_indexed(key)) return 0;
  orphan *grown = realloc(S.orphans, (size_t)(S.n_orphans + 1) * sizeof *grown);
  if (!grown) {
    S.out_of_memory = 1;
    st_fail(ST_ENOMEM, "the table of files without rows");
    return 1; /* stops the walk */
  }
  S.orphans = grown;
  orphan *o = &S.orphans[S.n_orphans++];
  o->path = strdup(path);
  o->key = strdup(key);
  o->run_id = NULL;
  if (!o->path || !o->key) {
    S.out_of_memory = 1;
    st_fail(ST_ENOMEM, "the path of %s", path);
    return 1;
  }
  return 0;
}

/* Files without rows, once the walk is over: a run id found in two of them is indexed from
** neither (which copy is the recording cannot be told), both are reported. ST_ENOMEM when memory
** ran out before every file was looked at (nothing repaired then). */
static st_status check_orphans(void) {
  st_trace **traces = calloc((size_t)(S.n_orphans ? S.n_orphans : 1), sizeof *traces);
  if (!traces) return st_fail(ST_ENOMEM, "the table of files without rows");
  st_status st = ST_OK;
  for (int i = 0; i < S.n_orphans && !st; i++)
    if (!(st = st_trace_open(S.orphans[i].path, 0, &traces[i]))) {
      const char *id = st_trace_attr(traces[i], "run_id");
      S.orphans[i].run_id = id ? strdup(id) : NULL;
      if (id && !S.orphans[i].run_id) st = st_fail(ST_ENOMEM, "the run id of %s", S.orphans[i].path);
    } else if (st == ST_ENOMEM) { /* memory, not the file: stop, report nothing about it */
      st_fail_context(st, "opening %s: ", S.orphans[i].path);
    } else {
      st = ST_OK;
      printf("file without row: %s (not a complete trace: %s)\n", S.orphans[i].path, st_errmsg());
      S.problems++;
    }
  for (int i = 0; i < S.n_orphans && !st; i++) {
    orphan *o = &S.orphans[i];
    if (!traces[i]) continue;
    S.problems++;
    printf("file without row: %s (run %s)\n", o->path, o->run_id ? o->run_id : "?");
    int twin = -1;
    for (int j = 0; j < S.n_orphans && twin < 0; j++)
      if (j != i && o->run_id && S.orphans[j].run_id && !strcmp(o->run_id, S.orphans[j].run_id))
        twin = j;
    if (!S.repair) continue;
    if (twin >= 0)
      printf("  not indexed: %s holds the same run as %s; remove the copy that is not the "
             "recording and repair again\n", o->path, S.orphans[twin].path);
    else if (index_orphan(o->path, o->key, traces[i]))
      S.fixed++;
  }
  for (int i = 0; i < S.n_orphans; i++) st_trace_close(traces[i]);
  free(traces);
  return st;
}

static int check(void) {
  st_status st = st_index_open(S.store, S.repair ? ST_INDEX_READ_WRITE : ST_INDEX_READ_ONLY, &S.ix);
  if (st) return st_cli_report_error("store check");
  sqlite3_stmt *s = NULL;
  if (sqlite3_prepare_v2(st_index_db(S.ix), "SELECT run_id, trace_path, content_digest FROM runs "
                         "ORDER BY created_at",
                         -1, &s, NULL) != SQLITE_OK) {
    fprintf(stderr, "sparsetrace store check: %s\n", sqlite3_errmsg(st_index_db(S.ix)));
    return 1;
  }
  int step;
  while ((step = sqlite3_step(s)) == SQLITE_ROW) {
    row *grown = realloc(S.rows, (size_t)(S.n_rows + 1) * sizeof *grown);
    if (!grown) break;
    S.rows = grown;
    row *r = &S.rows[S.n_rows++];
    const char *id = (const char *)sqlite3_column_text(s, 0);
    const char *key = (const char *)sqlite3_column_text(s, 1);
    const char *digest = (const char *)sqlite3_column_text(s, 2);
    r->run_id = id ? strdup(id) : NULL;
    r->key = key ? strdup(key) : NULL;
    r->digest = digest ? strdup(digest) : NULL;
    r->dangling = 0;
    if (!r->run_id || !r->key || (!r->digest && sqlite3_column_type(s, 2) != SQLITE_NULL)) break;
  }
  if (step != SQLITE_DONE) { /* a row, or the step, ran out of memory: the check would be partial */
    if (step == SQLITE_ROW) st_fail(ST_ENOMEM, "the table of the index's runs");
    else st_fail(step == SQLITE_NOMEM ? ST_ENOMEM : ST_ESQLITE, "reading the index's runs: %s",
                 sqlite3_errmsg(st_index_db(S.ix)));
    sqlite3_finalize(s);
    return st_cli_report_error("store check");
  }
  sqlite3_finalize(s);
  int rows_checked = S.n_rows;
  for (int i = 0; i < S.n_rows; i++) {
    row *r = &S.rows[i];
    char path[PATH_MAX];
    struct stat sb;
    const char *why = NULL;
    char whybuf[512];
    st_trace *t = NULL;
    if (st_index_resolve_trace(S.store, r->key, path, sizeof path) || stat(path, &sb) != 0) {
      why = "its trace file is missing";
    } else if ((st = st_trace_open(path, 0, &t)) == ST_ENOMEM) {
      break; /* memory, not the file: nothing is reported or repaired about this row */
    } else if (st) {
      st = ST_OK;
      snprintf(whybuf, sizeof whybuf, "its trace file is unreadable: %s", st_errmsg());
      why = whybuf;
    } else {
      const char *id = st_trace_attr(t, "run_id");
      if (!id || strcmp(id, r->run_id)) {
        snprintf(whybuf, sizeof whybuf, "its trace file holds another run (%s)", id ? id : "none");
        why = whybuf;
      } else if ((st = st_trace_verify_digest(t, r->digest, NULL, NULL)) == ST_ENOMEM) {
        st_trace_close(t);
        break;
      } else if (st) {
        st = ST_OK;
        /* the file is there but is not what was recorded: reported, never repaired (which
        ** side is wrong cannot be told; restore the trace or delete the run) */
        S.problems++;
        printf("content differs from its row: run %s at %s: %s\n", r->run_id, r->key, st_errmsg());
        if (S.repair) printf("  not repaired: restore the recorded trace, or delete the run\n");
      }
    }
    st_trace_close(t);
    if (!why) continue;
    S.problems++;
    printf("row without its file: run %s at %s: %s\n", r->run_id, r->key, why);
    if (S.repair) {
      if (st_index_begin(S.ix) || st_index_delete_run(S.ix, r->run_id) ||
          st_index_note(S.ix, "dangling_row", r->run_id, r->key, why) || st_index_commit(S.ix)) {
        st_index_rollback(S.ix);
        printf("  cannot delete the row: %s\n", st_errmsg());
      } else {
        r->dangling = 1;
        S.fixed++;
        printf("  row deleted\n");
      }
    } else {
      r->dangling = 1; /* its file, if any, is then an orphan too: reported below */
    }
  }
  if (st) return st_cli_report_error("store check");
  nftw(S.store, visit, 16, FTW_PHYS);
  if (S.out_of_memory || check_orphans()) return st_cli_report_error("store check");
  int left = S.problems - S.fixed;
  printf("store %s: %d run%s indexed, %d problem%s%s\n", S.store, rows_checked,
         rows_checked == 1 ? "" : "s", S.problems, S.problems == 1 ? "" : "s",
         S.repair ? "" : (S.problems ? " (--repair fixes them)" : ""));
  if (S.repair) printf("repaired %d, %d left\n", S.fixed, left);
  return left ? 1 : 0;
}

int st_cmd_store(int argc, char **argv) {
  st_opts o;
  int c, n_pos = 0;
  const char *sub = NULL;
  memset(&S, 0, sizeof S);
  st_opts_init(&o, &store_spec, argc, argv);
  while ((c = st_opts_next(&o)) > 0) {
    if (c == ST_OPT_REPAIR) S.repair = 1;
    else if (c == ST_OPT_POSITIONAL && n_pos++ == 0) sub = o.arg;
    else {
      st_opts_error(&o, "unexpected argument '%s'", o.arg);
      c = ST_OPTS_EXIT;
      break;
    }
  }
  S.store = o.store ? o.store : ST_DEFAULT_STORE;
  int exit_code = o.exit_code;
  st_opts_free(&o);
  if (c == ST_OPTS_EXIT) return exit_code ? exit_code : 0;
  if (!sub || strcmp(sub, "check")) {
    fprintf(stderr, "sparsetrace store: expected 'check'\n(sparsetrace store --help lists the "
                    "options)\n");
    return 2;
  }
  int rc = check();
  for (int i = 0; i < S.n_rows; i++) {
    free(S.rows[i].run_id);
    free(S.rows[i].key);
    free(S.rows[i].digest);
  }
  free(S.rows);
  for (int i = 0; i < S.n_orphans; i++) {
    free(S.orphans[i].path);
    free(S.orphans[i].key);
    free(S.orphans[i].run_id);
  }
  free(S.orphans);
  st_index_close(S.ix);
  return rc;
}

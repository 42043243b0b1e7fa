/*
** test_index.c — the SQLite index: migrations (order, idempotence, rollback of a failed one,
** concurrent openers), connection settings (WAL, foreign keys), identity checks (foreign
** databases, newer schema), run and tap insertion with generated columns and views, read-only
** query preparation, and a writer waiting for another's lock instead of failing.
*/
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "recorder/index.h"

static char tmp_root[256];

static void make_tmp(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp_root, name);
  mkdir(out, 0777);
}

static int64_t scalar(sqlite3 *db, const char *sql) {
  sqlite3_stmt *s = NULL;
  int64_t v = -999;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return v;
}

static const char *text(sqlite3 *db, const char *sql, char *buf, size_t size) {
  sqlite3_stmt *s = NULL;
  buf[0] = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
  if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
    snprintf(buf, size, "%s", (const char *)sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  return buf;
}

static st_trace_tap make_tap(const char *name, int rows, int with_stats) {
  st_trace_tap t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "%s", name);
  if (st_tap_parse_name(name, &t.id, &t.layer) != 0) fail_msg("bad tap %s", name);
  t.dtype = t.id == ST_TAP_INDEXER_TOPK ? ST_I32 : ST_F32;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = 8;
  t.row_axis = st_tap_catalogue[t.id].row_axis;
  t.stats.count = rows * 8;
  if (with_stats) {
    t.stats.has_range = t.stats.has_rms = 1;
    t.stats.min = -1.5, t.stats.max = 2.5, t.stats.mean = 0.25, t.stats.rms = 1.0;
    t.stats.nan_count = 2;
  }
  return t;
}

static st_index_run make_run(const char *run_id, const char *settings) {
  st_index_run r = {
    .run_id = run_id, .created_at = "2025-01-01T00:00:00.000Z", .model = "tiny",
    .model_dir = "/m/tiny", .trace_path = "runs/x.h5", .n_prompt = 30, .n_tokens = 34,
    .positions = "all", .settings_json = settings,
    .build = {"abc123", "GNU-12.2.0", "Release", "cpu-ref", "deterministic"}, .threads = 4,
    .command_line = "sparsetrace run", .request_id = NULL, .duration_s = 1.5,
  };
  return r;
}

/* ------------------------------------------------------------------ tests */

static void test_create_and_settings(void **state) {
  char store[512];
  snprintf(store, sizeof store, "%s/new/deeper", tmp_root); /* created on demand */
  st_index *ix = NULL;
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  sqlite3 *db = st_index_db(ix);
  assert_true(st_index_latest_version() >= 1);
  assert_int_equal(st_index_schema_version(ix), st_index_latest_version());
  assert_int_equal(scalar(db, "PRAGMA application_id"), ST_INDEX_APPLICATION_ID);
  assert_int_equal(scalar(db, "PRAGMA foreign_keys"), 1);
  assert_int_equal(scalar(db, "PRAGMA synchronous"), 1); /* NORMAL */
  char buf[64];
  assert_string_equal(text(db, "PRAGMA journal_mode", buf, sizeof buf), "wal");
  const char *objects[] = {"builds", "runs", "taps", "needles", "needle_verdicts", "replays",
                           "run_summary", "tap_summary", "needle_rank_by_layer",
                           "needle_position_verdicts"};
  for (size_t i = 0; i < sizeof objects / sizeof *objects; i++) {
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM sqlite_schema WHERE name = '%s'", objects[i]);
    if (scalar(db, sql) != 1) fail_msg("schema lacks %s", objects[i]);
  }
  assert_non_null(strstr(st_index_path(ix), "new/deeper/index.sqlite"));
  st_index_close(ix);
  /* reopening applies nothing and changes nothing; read-only open works */
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  assert_int_equal(st_index_schema_version(ix), st_index_latest_version());
  st_index_close(ix);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_ONLY, &ix), ST_OK);
  /* a read-only connection cannot write, whatever the statement */
  assert_int_not_equal(sqlite3_exec(st_index_db(ix), "DELETE FROM runs", NULL, NULL, NULL), SQLITE_OK);
  st_index_run run = make_run("r0", "{}");
  assert_int_equal(st_index_add_run(ix, &run, NULL, 0), ST_EINVAL);
  st_index_close(ix);
  st_index_close(NULL);
}

static void test_missing_and_foreign(void **state) {
  char store[512], path[600];
  st_index *ix = NULL;
  make_tmp(store, sizeof store, "missing");
  assert_int_equal(st_index_open(store, ST_INDEX_READ_ONLY, &ix), ST_ENOTFOUND);
  assert_non_null(strstr(st_errmsg(), "no index at"));
  assert_non_null(strstr(st_errmsg(), "missing/index.sqlite"));
  assert_null(ix);

  /* not SQLite at all */
  make_tmp(store, sizeof store, "garbage");
  snprintf(path, sizeof path, "%s/index.sqlite", store);
  FILE *f = fopen(path, "w");
  for (int i = 0; i < 2000; i++) fputc('#', f);
  fclose(f);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_EFORMAT);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_ONLY, &ix), ST_EFORMAT);

  /* another application's database, and an unmarked database with tables */
  make_tmp(store, sizeof store, "foreign");
  snprintf(path, sizeof path, "%s/index.sqlite", store);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "PRAGMA application_id = 42; CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "another application"));
  make_tmp(store, sizeof store, "unmarked");
  snprintf(path, sizeof path, "%s/index.sqlite", store);
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_EFORMAT);
  assert_non_null(strstr(st_errmsg(), "not a sparsetrace index"));

  /* a store where a file blocks the directory */
  snprintf(path, sizeof path, "%s/plainfile", tmp_root);
  f = fopen(path, "w");
  fclose(f);
  snprintf(store, sizeof store, "%s/plainfile/store", tmp_root);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_EIO);
  assert_non_null(strstr(st_errmsg(), "plainfile"));
}

static void test_newer_schema(void **state) {
  char store[512];
  make_tmp(store, sizeof store, "newer");
  st_index *ix = NULL;
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", st_index_latest_version() + 1);
  assert_int_equal(sqlite3_exec(st_index_db(ix), sql, NULL, NULL, NULL), SQLITE_OK);
  st_index_close(ix);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_EUNSUPPORTED);
  assert_non_null(strstr(st_errmsg(), "newer"));
  assert_int_equal(st_index_open(store, ST_INDEX_READ_ONLY, &ix), ST_OK); /* reading is fine */
  st_index_close(ix);
}

static void test_migration_runner(void **state) {
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
  st_index_migration m[] = {
    {"0001_a.sql", "CREATE TABLE a (x INTEGER);"},
    {"0002_b.sql", "CREATE TABLE b (y INTEGER); INSERT INTO a VALUES (1);"},
    {"0003_bad.sql", "CREATE TABLE c (z INTEGER); THIS IS NOT SQL;"},
  };
  assert_int_equal(st_index_migrate(db, "mem", m, 2), ST_OK);
  assert_int_equal(scalar(db, "PRAGMA user_version"), 2);
  assert_int_equal(scalar(db, "PRAGMA application_id"), ST_INDEX_APPLICATION_ID);
  assert_int_equal(st_index_migrate(db, "mem", m, 2), ST_OK); /* idempotent */
  assert_int_equal(scalar(db, "SELECT count(*) FROM a"), 1);
  assert_int_equal(st_index_migrate(db, "mem", m, 3), ST_ESQLITE);
  assert_non_null(strstr(st_errmsg(), "0003_bad.sql"));
  assert_int_equal(scalar(db, "PRAGMA user_version"), 2); /* rolled back whole */
  assert_int_equal(scalar(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'c'"), 0);
  /* A migration may rebuild a table others reference (SQLite's procedure: foreign keys off while
  ** it runs), but not leave a reference dangling; foreign keys are on again either way. */
  assert_int_equal(sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), SQLITE_OK);
  st_index_migration fk[] = {
    {"0004_parent.sql", "CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE ch (pid INTEGER REFERENCES p (id));"
                        "INSERT INTO p VALUES (1); INSERT INTO ch VALUES (1);"},
    {"0005_rebuild.sql", "CREATE TABLE p_new (id INTEGER PRIMARY KEY, note TEXT); INSERT INTO p_new (id) SELECT id FROM p;"
                         "DROP TABLE p; ALTER TABLE p_new RENAME TO p;"},
    {"0006_dangle.sql", "DELETE FROM p;"},
  };
  assert_int_equal(st_index_migrate(db, "mem", fk, 2), ST_OK);
  assert_int_equal(scalar(db, "PRAGMA user_version"), 5);
  assert_int_equal(scalar(db, "SELECT count(*) FROM p JOIN ch ON ch.pid = p.id"), 1);
  assert_int_equal(scalar(db, "PRAGMA foreign_keys"), 1);
  assert_int_equal(st_index_migrate(db, "mem", fk, 3), ST_ESQLITE);
  assert_non_null(strstr(st_errmsg(), "0006_dangle.sql"));
  assert_int_equal(scalar(db, "PRAGMA user_version"), 5); /* rolled back */
  assert_int_equal(scalar(db, "SELECT count(*) FROM p"), 1);
  assert_int_equal(scalar(db, "PRAGMA foreign_keys"), 1);
  st_index_migration unordered[] = {{"0002_x.sql", ""}, {"0001_y.sql", ""}};
  assert_int_equal(st_index_migrate(db, "mem", unordered, 2), ST_EINVAL);
  st_index_migration unnamed[] = {{"core.sql", ""}};
  assert_int_equal(st_index_migrate(db, "mem", unnamed, 1), ST_EINVAL);
  sqlite3_close(db);
}

static void test_runs_taps_views(void **state) {
  char store[512], buf[256];
  make_tmp(store, sizeof store, "runs");
  st_index *ix = NULL;
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  sqlite3 *db = st_index_db(ix);
  st_trace_tap taps[3] = {make_tap("layers.2.indexer.scores", 34, 1),
                          make_tap("layers.2.indexer.k", 8, 1), make_tap("logits", 5, 0)};
  taps[0].has_positions = 1;
  st_index_run a = make_run("run-a", "{\"precision\":\"exact\",\"index_k\":\"fp8_e4m3fn\","
                                     "\"index_q\":\"bf16\",\"rotate\":\"q\",\"topk\":512}");
  assert_int_equal(st_index_add_run(ix, &a, taps, 3), ST_OK);
  st_index_run b = make_run("run-b", NULL);
  b.trace_path = "runs/y.h5";
  b.request_id = "req-1";
  b.build.backend = "cuda";
  b.duration_s = -1;
  assert_int_equal(st_index_add_run(ix, &b, taps, 1), ST_OK);
  /* generated columns */
  assert_string_equal(text(db, "SELECT precision || ',' || index_k || ',' || index_q || ',' || "
                               "rotate || ',' || topk FROM runs WHERE run_id = 'run-a'", buf, sizeof buf),
                      "exact,fp8_e4m3fn,bf16,q,512");
  assert_int_equal(scalar(db, "SELECT count(*) FROM runs WHERE topk = 512"), 1);
  assert_int_equal(scalar(db, "SELECT n_generated FROM runs WHERE run_id = 'run-b'"), 4);
  assert_int_equal(scalar(db, "SELECT duration_s IS NULL FROM runs WHERE run_id = 'run-b'"), 1);
  assert_int_equal(scalar(db, "SELECT count(*) FROM builds"), 2);
  /* taps */
  assert_string_equal(text(db, "SELECT shape FROM taps WHERE run_id = 'run-a' AND name = "
                               "'layers.2.indexer.scores'", buf, sizeof buf), "[34,8]");
  assert_int_equal(scalar(db, "SELECT count(*) FROM taps WHERE tap = 'indexer.k' AND layer = 2 "
                              "AND axis0 = 'compressed_row' AND rows = 8"), 1);
  assert_int_equal(scalar(db, "SELECT count(*) FROM taps WHERE name = 'logits' AND layer IS NULL "
                              "AND min IS NULL AND rms IS NULL AND count = 40"), 1);
  assert_int_equal(scalar(db, "SELECT nan_count FROM taps WHERE run_id = 'run-a' AND has_positions"), 2);
  /* views */
  assert_int_equal(scalar(db, "SELECT n_taps FROM run_summary WHERE run_id = 'run-a'"), 3);
  assert_string_equal(text(db, "SELECT backend FROM run_summary WHERE request_id = 'req-1'", buf,
                           sizeof buf), "cuda");
  assert_int_equal(scalar(db, "SELECT count(*) FROM tap_summary WHERE rotate = 'q'"), 3);
  /* needles and verdicts, and the per-layer view */
  assert_int_equal(sqlite3_exec(db,
    "INSERT INTO needles (needle_id, run_id, text, token_start, token_end, source, created_at) "
    "VALUES (1, 'run-a', '/home/u/proj', 10, 14, 'user', '2025-01-01T00:00:00Z');"
    "INSERT INTO replays (replay_id, run_id, layer, stage, settings, metrics, bit_exact, created_at) "
    "VALUES ('rp-1', 'run-a', 2, 'indexer', '{\"rotate\":\"both\"}', '{\"jaccard\":0.97}', 0, 'x');"
    "INSERT INTO needle_verdicts (needle_id, run_id, replay_id, layer, position, best_rank, in_topk) VALUES "
    "(1, 'run-a', NULL, 2, 28, 0, 1), (1, 'run-a', NULL, 2, 29, 5, 1), (1, 'run-a', NULL, 2, 30, 2, 1), "
    "(1, 'run-a', NULL, 2, 31, 700, 0), (1, 'run-a', NULL, 2, 32, 1, 1), (1, 'run-a', NULL, 2, 33, 900, 0), "
    "(1, 'run-a', NULL, 4, 29, NULL, 1), (1, 'run-a', NULL, 4, 30, NULL, 0), "
    "(1, 'run-a', NULL, 6, 20, 3, 1), (1, 'run-a', 'rp-1', 2, 29, 3, 1);",
    NULL, NULL, NULL), SQLITE_OK);
  /* the needle verdict (schemas/needle-verdicts.md): run-a has 30 prompt tokens and the needle 4,
  ** so the answer positions are 29..32; 28 (before) and 33 (after) do not count */
#define LAYER2 "FROM needle_rank_by_layer WHERE layer = 2 AND replay_id IS NULL"
  assert_int_equal(scalar(db, "SELECT answer_first || ':' || answer_end = '29:33' " LAYER2), 1);
  assert_int_equal(scalar(db, "SELECT answer_positions " LAYER2), 4);
  assert_int_equal(scalar(db, "SELECT answer_positions_kept " LAYER2), 3);
  assert_int_equal(scalar(db, "SELECT retrieves " LAYER2), 1);
  assert_int_equal(scalar(db, "SELECT best_rank " LAYER2), 1);
  assert_int_equal(scalar(db, "SELECT worst_rank " LAYER2), 700);
  assert_int_equal(scalar(db, "SELECT recorded_positions " LAYER2), 6);
  assert_int_equal(scalar(db, "SELECT recorded_positions_kept " LAYER2), 4);
#undef LAYER2
  /* kept at 1 of 2: not most of them */
  assert_int_equal(scalar(db, "SELECT retrieves FROM needle_rank_by_layer WHERE layer = 4"), 0);
  assert_int_equal(scalar(db, "SELECT best_rank IS NULL FROM needle_rank_by_layer WHERE layer = 4"), 1);
  /* no answer position recorded: no verdict */
  assert_int_equal(scalar(db, "SELECT retrieves IS NULL AND answer_positions = 0 FROM needle_rank_by_layer WHERE layer = 6"), 1);
  assert_int_equal(scalar(db, "SELECT retrieves FROM needle_rank_by_layer WHERE replay_id = 'rp-1'"), 1);
  assert_int_equal(scalar(db, "SELECT count(*) FROM needle_position_verdicts WHERE is_answer_position AND keeps"), 5);
  assert_int_equal(scalar(db, "SELECT answer_index FROM needle_position_verdicts WHERE position = 33"), 4);
  assert_int_equal(scalar(db, "SELECT json_extract(metrics, '$.jaccard') < 0.98 FROM replays"), 1);
  /* a verdict key is unique even with a NULL replay */
  assert_int_not_equal(sqlite3_exec(db, "INSERT INTO needle_verdicts (needle_id, run_id, layer, "
                                        "position, best_rank, in_topk) VALUES (1, 'run-a', 2, 30, 1, 1)",
                                    NULL, NULL, NULL), SQLITE_OK);
  /* foreign keys are enforced */
  assert_int_not_equal(sqlite3_exec(db, "INSERT INTO taps (run_id, name, tap, dtype, shape, rows, "
                                        "axis0, count) VALUES ('nope', 'logits', 'logits', "
                                        "'float32', '[1]', 1, 'position', 1)", NULL, NULL, NULL),
                       SQLITE_OK);
  /* a duplicate run fails whole: no extra taps, no half row */
  int64_t before = scalar(db, "SELECT count(*) FROM taps");
  st_index_run dup = make_run("run-c", NULL);
  dup.trace_path = "runs/z.h5";
  st_trace_tap twice[2] = {make_tap("logits", 1, 0), make_tap("logits", 1, 0)};
  assert_int_equal(st_index_add_run(ix, &dup, twice, 2), ST_ESQLITE);
  assert_non_null(strstr(st_errmsg(), "logits"));
  assert_int_equal(scalar(db, "SELECT count(*) FROM taps"), before);
  assert_int_equal(scalar(db, "SELECT count(*) FROM runs WHERE run_id = 'run-c'"), 0);
  assert_int_equal(st_index_add_run(ix, &a, taps, 0), ST_ESQLITE); /* same run id again */
  /* deleting a run cascades */
  assert_int_equal(sqlite3_exec(db, "DELETE FROM runs WHERE run_id = 'run-a'", NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(scalar(db, "SELECT count(*) FROM taps WHERE run_id = 'run-a'"), 0);
  assert_int_equal(scalar(db, "SELECT count(*) FROM needle_verdicts"), 0);
  st_index_close(ix);
}

static void test_prepare_readonly(void **state) {
  char store[512];
  make_tmp(store, sizeof store, "ro");
  st_index *ix = NULL;
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  st_index_close(ix);
  assert_int_equal(st_index_open(store, ST_INDEX_READ_ONLY, &ix), ST_OK);
  sqlite3_stmt *s = NULL;
  const char *ok[] = {
    "SELECT * FROM runs", "SELECT 1;", "  select 1 ; -- trailing comment\n",
    "WITH x AS (SELECT 1) SELECT * FROM x", "EXPLAIN QUERY PLAN SELECT * FROM taps",
    "PRAGMA table_info(runs)", "SELECT * FROM needle_rank_by_layer /* c */ ;",
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    if (st_index_prepare_readonly(ix, ok[i], &s) != ST_OK) fail_msg("%s: %s", ok[i], st_errmsg());
    sqlite3_finalize(s);
  }
  struct {
    const char *sql, *why;
  } bad[] = {
    {"DELETE FROM runs", "read-only"},
    {"INSERT INTO builds (revision) VALUES ('x')", "read-only"},
    {"DROP VIEW tap_summary", "read-only"},
    {"PRAGMA user_version = 7", "read-only"},
    {"CREATE TABLE t (x)", "read-only"},
    {"SELECT 1; DELETE FROM runs", "one SQL statement"},
    {"SELECT 1; SELECT 2", "one SQL statement"},
    {"SELEC 1", "SQL error"},
    {"SELECT * FROM no_such_table", "no such table"},
    {"", "no SQL statement"},
    {" -- only a comment", "no SQL statement"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    s = NULL;
    assert_int_equal(st_index_prepare_readonly(ix, bad[i].sql, &s), ST_EINVAL);
    assert_null(s);
    if (!strstr(st_errmsg(), bad[i].why)) fail_msg("%s: '%s' lacks '%s'", bad[i].sql, st_errmsg(), bad[i].why);
  }
  st_index_close(ix);
}

/* One connection holds the write lock for a while; another's add_run waits and then lands. */
typedef struct holder {
  const char *store;
  int ready;
  pthread_mutex_t m;
  pthread_cond_t c;
} holder;

static void *hold_lock(void *arg) {
  holder *h = arg;
  st_index *ix = NULL;
  if (st_index_open(h->store, ST_INDEX_READ_WRITE, &ix)) return NULL;
  st_index_begin(ix);
  pthread_mutex_lock(&h->m);
  h->ready = 1;
  pthread_cond_signal(&h->c);
  pthread_mutex_unlock(&h->m);
  usleep(400 * 1000);
  st_index_commit(ix);
  st_index_close(ix);
  return NULL;
}

static void test_waits_for_writer(void **state) {
  char store[512];
  make_tmp(store, sizeof store, "busy");
  st_index *ix = NULL;
  assert_int_equal(st_index_open(store, ST_INDEX_READ_WRITE, &ix), ST_OK);
  holder h = {store, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hold_lock, &h), 0);
  pthread_mutex_lock(&h.m);
  while (!h.ready) pthread_cond_wait(&h.c, &h.m);
  pthread_mutex_unlock(&h.m);
  st_index_run r = make_run("waited", NULL);
  st_trace_tap tap = make_tap("logits", 3, 1);
  assert_int_equal(st_index_add_run(ix, &r, &tap, 1), ST_OK);
  pthread_join(th, NULL);
  assert_int_equal(scalar(st_index_db(ix), "SELECT count(*) FROM runs"), 1);
  st_index_rollback(ix); /* no transaction open: harmless */
  st_index_close(ix);
}

static int setup(void **state) {
  const char *base = getenv("TMPDIR");
  snprintf(tmp_root, sizeof tmp_root, "%s/st_test_index.XXXXXX", base && *base ? base : "/tmp");
  return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_and_settings),
    cmocka_unit_test(test_missing_and_foreign),
    cmocka_unit_test(test_newer_schema),
    cmocka_unit_test(test_migration_runner),
    cmocka_unit_test(test_runs_taps_views),
    cmocka_unit_test(test_prepare_readonly),
    cmocka_unit_test(test_waits_for_writer),
  };
  return cmocka_run_group_tests_name("index", tests, setup, teardown);
}

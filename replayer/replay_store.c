/*
** replay_store.c — puts a replay report into the store's index: one `replays` row per cell
** (settings, metrics JSON, bit_exact), the needle in `needles`, and every per-position verdict
** in `needle_verdicts`, so `sparsetrace query` can ask which layer loses the needle.
*/
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/build_info.h"
#include "engine/text/pyjson.h"
#include "recorder/index.h"
#include "recorder/recorder.h"
#include "needle.h"
#include "replay_store.h"

/* The needle's row for (run, span), inserted or found; SQLITE_CONSTRAINT when the run is not in
** this index (foreign key). */
static int needle_upsert(sqlite3 *db, const char *run_id, const char *text, int64_t start,
                         int64_t end, const char *now, int64_t *needle_id) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "INSERT INTO needles (run_id, text, token_start, token_end, source, created_at) "
                                  "VALUES (?, ?, ?, ?, 'user', ?) ON CONFLICT (run_id, token_start, token_end) "
                                  "DO UPDATE SET text = coalesce(excluded.text, text) RETURNING needle_id",
                              -1, &st, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_text(st, 1, run_id, -1, SQLITE_STATIC);
  if (text) sqlite3_bind_text(st, 2, text, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 3, start);
  sqlite3_bind_int64(st, 4, end);
  sqlite3_bind_text(st, 5, now, -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *needle_id = sqlite3_column_int64(st, 0);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  return rc;
}

static const char insert_verdict_sql[] =
  "INSERT OR REPLACE INTO needle_verdicts (needle_id, run_id, replay_id, layer, position, best_rank, "
  "best_row, score, in_topk, topk, n_visible) VALUES (?,?,?,?,?,?,?,?,?,?,?)";

/* Inserts a cell's verdicts; replay_id NULL = the recorded run's own. Returns an SQLite code. */
static int insert_verdicts(sqlite3_stmt *st, int64_t needle_id, const char *run_id,
                           const char *replay_id, int layer, const st_replay_cell *cell) {
  for (int64_t v = 0; v < cell->n_verdicts; v++) {
    const st_needle_verdict *nv = &cell->verdicts[v];
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, needle_id);
    sqlite3_bind_text(st, 2, run_id, -1, SQLITE_STATIC);
    if (replay_id) sqlite3_bind_text(st, 3, replay_id, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 3);
    sqlite3_bind_int(st, 4, layer);
    sqlite3_bind_int64(st, 5, nv->position);
    if (nv->best_rank >= 0) {
      sqlite3_bind_int64(st, 6, nv->best_rank);
      sqlite3_bind_int(st, 7, nv->best_row);
      sqlite3_bind_double(st, 8, nv->score);
    } else {
      sqlite3_bind_null(st, 6);
      sqlite3_bind_null(st, 7);
      sqlite3_bind_null(st, 8);
    }
    sqlite3_bind_int(st, 9, nv->in_topk);
    sqlite3_bind_int(st, 10, nv->topk);
    sqlite3_bind_int64(st, 11, nv->n_visible);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) return rc;
  }
  return SQLITE_OK;
}

st_status st_replay_metrics_json(const st_replay_report *r, const st_replay_cell *c, st_buf *out) {
  st_buf *b = out;
  st_buf_str(b, "{\"label\":"); /* the sweep or --set text as the user wrote it: escaped */
  st_pyjson_string(b, c->label, strlen(c->label), 0);
  st_buf_printf(b, ",\"seconds\":%.4f", c->seconds);
  if (c->has_topk)
    st_buf_printf(b, ",\"topk_rows\":%lld,\"topk_identical_rows\":%lld,\"topk_jaccard_mean\":%.6f,"
                  "\"topk_jaccard_min\":%.6f,\"topk_overlap_mean\":%.6f", (long long)c->topk_rows,
                  (long long)c->topk_identical_rows, c->topk_jaccard_mean, c->topk_jaccard_min,
                  c->topk_overlap_mean);
  if (c->has_scores)
    st_buf_printf(b, ",\"score_difference\":%.9g,\"score_cosine\":%.9g,\"score_max_abs\":%.9g,"
                  "\"score_max_abs_at\":[%lld,%lld],\"score_mask_mismatch\":%lld", c->score_difference,
                  c->score_cosine, c->score_max_abs, (long long)c->score_max_abs_position,
                  (long long)c->score_max_abs_row, (long long)c->score_mask_mismatch);
  if (c->has_output) {
    st_buf_str(b, ",\"output_tap\":"); /* a dataset name read from the trace: escaped */
    st_pyjson_string(b, c->output_tap, strlen(c->output_tap), 0);
    st_buf_printf(b, ",\"output_difference\":%.9g,\"output_cosine\":%.9g,\"output_max_abs\":%.9g",
                  c->output_difference, c->output_cosine, c->output_max_abs);
  }
  if (c->has_logits)
    st_buf_printf(b, ",\"logits_positions\":%lld,\"kl_mean\":%.9g,\"kl_max\":%.9g,\"greedy_agreement\":%.6f",
                  (long long)c->logits_positions, c->kl_mean, c->kl_max, c->greedy_agreement);
  if (c->n_continuation) {
    st_buf_str(b, ",\"continuation\":[");
    for (int i = 0; i < c->n_continuation; i++) st_buf_printf(b, "%s%d", i ? "," : "", c->continuation[i]);
    st_buf_str(b, "]");
    if (c->continuation_has_needle >= 0)
      st_buf_printf(b, ",\"continuation_has_needle\":%s", c->continuation_has_needle ? "true" : "false");
  }
  if (c->verdicts && r->needle_end > r->needle_start) { /* the needle verdict (needle.h) */
    st_needle_judgement j = st_needle_judge_cell(r, c);
    st_buf_printf(b, ",\"needle\":{\"answer_positions\":[%lld,%lld],\"positions\":%d,\"kept\":%d,"
                  "\"retrieves\":%s,\"best_rank\":%lld,\"worst_rank\":%lld,\"topk\":%d,"
                  "\"recorded_positions\":%lld,\"recorded_positions_kept\":%lld}",
                  (long long)j.answer_first, (long long)j.answer_end, j.positions, j.kept,
                  j.retrieves < 0 ? "null" : j.retrieves ? "true" : "false", (long long)j.best_rank,
                  (long long)j.worst_rank, j.topk, (long long)c->n_verdicts,
                  (long long)c->needle_positions_in_topk);
  }
  st_buf_str(b, "}");
  return st_buf_status(b, "a replay cell's metrics");
}

st_status st_replay_store(const char *store_dir, const st_replay_report *r, const char *command_line,
                          int64_t needle_start, int64_t needle_end, const char *needle_text,
                          int *stored) {
  *stored = 0;
  st_index *ix = NULL;
  st_status rc = st_index_open(store_dir, ST_INDEX_READ_WRITE, &ix);
  if (rc) return rc;
  sqlite3 *db = st_index_db(ix);
  sqlite3_stmt *st = NULL;
  char now[64];
  st_utc_now(now, sizeof now);
  if ((rc = st_index_begin(ix))) goto out;
  /* the run must be in this index (foreign keys); otherwise nothing is stored */
  if (sqlite3_prepare_v2(db, "SELECT content_digest FROM runs WHERE run_id = ?", -1, &st, NULL) != SQLITE_OK) goto sql_error;
  sqlite3_bind_text(st, 1, r->run_id, -1, SQLITE_STATIC);
  int found = sqlite3_step(st) == SQLITE_ROW;
  char row_digest[64] = "";
  if (found && sqlite3_column_text(st, 0))
    snprintf(row_digest, sizeof row_digest, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  st = NULL;
  if (!found) {
    st_index_rollback(ix);
    goto out;
  }
  /* never store replays of another trace's content under this run (st_replay_run checks first) */
  if (row_digest[0] && strcmp(row_digest, r->content_digest) != 0) {
    rc = st_fail(ST_EFORMAT, "the replayed trace's content digest %s is not run %s's (%s)",
                 r->content_digest[0] ? r->content_digest : "(none)", r->run_id, row_digest);
    goto rollback;
  }
  int64_t build_id = 0;
  st_index_build b = {st_build_revision, st_build_compiler, st_build_type, r->backend[0] ? r->backend : "cpu-ref",
                      "deterministic"};
  if ((rc = st_index_build_id(ix, &b, &build_id))) goto rollback;
  int64_t needle_id = -1;
  if (needle_end > needle_start &&
      needle_upsert(db, r->run_id, needle_text, needle_start, needle_end, now, &needle_id) != SQLITE_OK)
    goto sql_error;
  sqlite3_stmt *ins_replay = NULL, *ins_verdict = NULL;
  if (sqlite3_prepare_v2(db, "INSERT INTO replays (replay_id, run_id, layer, stage, settings, metrics, bit_exact, "
                             "build_id, created_at, command_line, duration_s) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &ins_replay, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, insert_verdict_sql, -1, &ins_verdict, NULL) != SQLITE_OK) {
    sqlite3_finalize(ins_replay);
    goto sql_error;
  }
  st_buf metrics = {0};
  for (int c = 0; c < r->n_cells && !rc; c++) {
    const st_replay_cell *cell = &r->cells[c];
    st_run_meta id = {0};
    st_run_id_new(&id);
    st_buf_reset(&metrics);
    if ((rc = st_replay_metrics_json(r, cell, &metrics))) break;
    sqlite3_reset(ins_replay);
    sqlite3_bind_text(ins_replay, 1, id.run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(ins_replay, 2, r->run_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(ins_replay, 3, r->layer);
    sqlite3_bind_text(ins_replay, 4, st_replay_stage_name(r->stage), -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_replay, 5, cell->settings_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_replay, 6, metrics.data, (int)metrics.len, SQLITE_STATIC);
    if (cell->bit_exact >= 0) sqlite3_bind_int(ins_replay, 7, cell->bit_exact);
    else sqlite3_bind_null(ins_replay, 7);
    sqlite3_bind_int64(ins_replay, 8, build_id);
    sqlite3_bind_text(ins_replay, 9, now, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins_replay, 10, command_line, -1, SQLITE_STATIC);
    sqlite3_bind_double(ins_replay, 11, cell->seconds);
    if (sqlite3_step(ins_replay) != SQLITE_DONE) { rc = st_fail(ST_ESQLITE, "storing a replay: %s", sqlite3_errmsg(db)); break; }
    if (needle_id >= 0 && insert_verdicts(ins_verdict, needle_id, r->run_id, id.run_id, r->layer, cell) != SQLITE_OK)
      rc = st_fail(ST_ESQLITE, "storing a needle verdict: %s", sqlite3_errmsg(db));
  }
  st_buf_free(&metrics);
  sqlite3_finalize(ins_replay);
  sqlite3_finalize(ins_verdict);
  if (rc) goto rollback;
  if ((rc = st_index_commit(ix))) goto out;
  *stored = 1;
  goto out;
sql_error:
  rc = st_fail(ST_ESQLITE, "%s: %s", st_index_path(ix), sqlite3_errmsg(db));
  sqlite3_finalize(st);
rollback:
  st_index_rollback(ix);
out:
  st_index_close(ix);
  return rc;
}

st_status st_replay_store_verdicts(const char *store_dir, const st_replay_report *r,
                                   int64_t needle_start, int64_t needle_end, const char *needle_text,
                                   int *stored) {
  *stored = 0;
  st_index *ix = NULL;
  st_status rc = st_index_open(store_dir, ST_INDEX_READ_WRITE, &ix);
  if (rc) return rc;
  sqlite3 *db = st_index_db(ix);
  sqlite3_stmt *st = NULL;
  char now[64];
  st_utc_now(now, sizeof now);
  if ((rc = st_index_begin(ix))) goto out;
  int64_t needle_id;
  int step = needle_upsert(db, r->run_id, needle_text, needle_start, needle_end, now, &needle_id);
  if (step == SQLITE_CONSTRAINT) { /* the run is not in this index */
    st_index_rollback(ix);
    goto out;
  }
  if (step != SQLITE_OK) goto sql_error;
  if (sqlite3_prepare_v2(db, insert_verdict_sql, -1, &st, NULL) != SQLITE_OK ||
      insert_verdicts(st, needle_id, r->run_id, NULL, r->layer, &r->cells[0]) != SQLITE_OK)
    goto sql_error;
  sqlite3_finalize(st);
  st = NULL;
  if ((rc = st_index_commit(ix))) goto out;
  *stored = 1;
  goto out;
sql_error:
  rc = st_fail(ST_ESQLITE, "%s: %s", st_index_path(ix), sqlite3_errmsg(db));
  sqlite3_finalize(st);
  st_index_rollback(ix);
out:
  st_index_close(ix);
  return rc;
}

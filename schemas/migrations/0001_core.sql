-- 0001_core.sql — the core of the trace store's index (<store>/index.sqlite).
--
-- How migrations work (recorder/index.c): every file schemas/migrations/NNNN_name.sql is compiled
-- into the binary. A store's PRAGMA user_version is the number of the last migration applied;
-- opening a store for writing applies, in file-name order, each migration numbered above it, each
-- in its own BEGIN IMMEDIATE transaction that also sets user_version, so a store is never half
-- migrated. PRAGMA application_id is 0x53545243 ('STRC'); a database carrying another id is not a
-- sparsetrace index and is refused. Rules for migration files: never edit one that has shipped
-- (add a new number instead); no BEGIN/COMMIT inside; no PRAGMA journal_mode (set by the opener).
--
-- Conventions: STRICT tables; times are ISO 8601 UTC text ('2025-05-01T12:34:56.789Z'); JSON is
-- stored as text checked with json_valid; paths are relative to the store directory; layer is
-- NULL for model-scope taps (logits); token positions are 0-based, ranges half-open [start, end).
-- Bulk tensors live in the HDF5 traces (schemas/trace-layout.md), never here.

-- One row per distinct build that recorded or replayed something: the compiled revision
-- (git short hash, "-dirty" when the tree had changes), compiler, CMake build type, compute
-- backend and its kernel mode ("deterministic" or "fast").
CREATE TABLE builds (
  build_id    INTEGER PRIMARY KEY,
  revision    TEXT NOT NULL,
  compiler    TEXT NOT NULL,
  build_type  TEXT NOT NULL,
  backend     TEXT NOT NULL,
  kernel_mode TEXT NOT NULL,
  UNIQUE (revision, compiler, build_type, backend, kernel_mode)
) STRICT;

-- One row per recorded run, inserted only once its HDF5 trace is complete and renamed from
-- .part (DESIGN.md "Trace format"). settings is the resolved settings object the engine ran with
-- ({"precision":"exact","index_k":"fp32",...}); the common settings are exposed as generated
-- columns so that `WHERE rotate = 'q'` works and can be indexed.
CREATE TABLE runs (
  run_id       TEXT PRIMARY KEY,              -- uuid v4, also the trace's file attribute run_id
  created_at   TEXT NOT NULL,                 -- when recording started
  model        TEXT,                          -- basename of model_dir
  model_dir    TEXT,                          -- as the user gave it
  trace_path   TEXT NOT NULL UNIQUE,          -- relative to the store (absolute if outside it)
  n_prompt     INTEGER NOT NULL,              -- prompt tokens
  n_tokens     INTEGER NOT NULL,              -- prompt + generated tokens in /tokens
  n_generated  INTEGER GENERATED ALWAYS AS (n_tokens - n_prompt) VIRTUAL,
  positions    TEXT NOT NULL DEFAULT 'all',   -- the positions filter: all | last | A:B
  settings     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(settings)),
  precision    TEXT GENERATED ALWAYS AS (CAST(json_extract(settings, '$.precision') AS TEXT)) VIRTUAL,
  index_k      TEXT GENERATED ALWAYS AS (CAST(json_extract(settings, '$.index_k') AS TEXT)) VIRTUAL,
  index_q      TEXT GENERATED ALWAYS AS (CAST(json_extract(settings, '$.index_q') AS TEXT)) VIRTUAL,
  rotate       TEXT GENERATED ALWAYS AS (CAST(json_extract(settings, '$.rotate') AS TEXT)) VIRTUAL,
  topk         TEXT GENERATED ALWAYS AS (CAST(json_extract(settings, '$.topk') AS TEXT)) VIRTUAL,
  build_id     INTEGER NOT NULL REFERENCES builds (build_id),
  threads      INTEGER,
  status       TEXT NOT NULL DEFAULT 'complete' CHECK (status IN ('complete', 'failed')),
  command_line TEXT,
  request_id   TEXT,                          -- the captured request this run replays, if any
  duration_s   REAL                           -- wall time from recorder open to finish
) STRICT;
CREATE INDEX runs_by_created ON runs (created_at);
CREATE INDEX runs_by_build ON runs (build_id);
CREATE INDEX runs_by_request ON runs (request_id) WHERE request_id IS NOT NULL;

-- One row per recorded tap (= one HDF5 dataset /taps/<name>) of a run, with summary statistics
-- computed by the writer over every value it stored. For float taps nan_count/inf_count count
-- non-finite values and min/max/mean/rms are over the finite ones (NULL when there are none);
-- for integer taps only min/max (and mean) are set. count = number of elements written (fill
-- values of a growing second axis are not counted).
CREATE TABLE taps (
  run_id        TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  name          TEXT NOT NULL,                -- full tap name: layers.3.indexer.scores, logits
  layer         INTEGER,                      -- NULL for model-scope taps
  tap           TEXT NOT NULL,                -- name without the layer: indexer.scores
  dtype         TEXT NOT NULL,                -- float32, int32, ...
  shape         TEXT NOT NULL CHECK (json_valid(shape)), -- final dataset shape, JSON array
  rows          INTEGER NOT NULL,             -- shape[0]
  axis0         TEXT NOT NULL CHECK (axis0 IN ('position', 'compressed_row')),
  has_positions INTEGER NOT NULL DEFAULT 0,   -- 1: a /positions/<name> dataset maps rows to tokens
  count         INTEGER NOT NULL,
  nan_count     INTEGER NOT NULL DEFAULT 0,
  inf_count     INTEGER NOT NULL DEFAULT 0,
  min           REAL,
  max           REAL,
  mean          REAL,
  rms           REAL,
  PRIMARY KEY (run_id, name)
) STRICT, WITHOUT ROWID;
CREATE INDEX taps_by_tap ON taps (tap, layer);

-- Needles: token spans of a run's prompt that a later position must be able to attend to
-- (the working-directory line of an agentic system prompt). Added by the replayer / user.
CREATE TABLE needles (
  needle_id   INTEGER PRIMARY KEY,
  run_id      TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  text        TEXT,                           -- the needle's text as decoded, for reading
  token_start INTEGER NOT NULL,               -- first token of the span
  token_end   INTEGER NOT NULL,               -- one past the last token
  source      TEXT,                           -- how it was chosen: 'user', 'auto', ...
  created_at  TEXT NOT NULL,
  CHECK (token_end > token_start),
  UNIQUE (run_id, token_start, token_end)
) STRICT;

-- Replays: one layer (or the rest of the model from a layer) re-run from a recorded trace under
-- alternate settings, with its metrics (DESIGN.md "Metrics") as a JSON object.
CREATE TABLE replays (
  replay_id    TEXT PRIMARY KEY,              -- uuid v4
  run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  layer        INTEGER,                       -- first replayed layer (NULL: whole model)
  stage        TEXT NOT NULL,                 -- 'indexer' | 'layer' | 'rest'
  settings     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(settings)),
  metrics      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metrics)),
  bit_exact    INTEGER,                       -- 1: every compared tap identical to the recording
  build_id     INTEGER REFERENCES builds (build_id),
  created_at   TEXT NOT NULL,
  command_line TEXT,
  duration_s   REAL
) STRICT;
CREATE INDEX replays_by_run ON replays (run_id, layer);

-- Needle verdicts: per CSA layer and query position, where the needle ranks among the indexer's
-- scored compressed rows. replay_id NULL = the verdict on the recorded run itself.
-- best_rank: 0-based rank of the best-scoring compressed row covering any needle token (NULL
-- when no such row is visible yet); in_topk: 1 if that row was selected.
CREATE TABLE needle_verdicts (
  verdict_id INTEGER PRIMARY KEY,
  needle_id  INTEGER NOT NULL REFERENCES needles (needle_id) ON DELETE CASCADE,
  run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  replay_id  TEXT REFERENCES replays (replay_id) ON DELETE CASCADE,
  layer      INTEGER NOT NULL,
  position   INTEGER NOT NULL,                -- query token position
  best_rank  INTEGER,
  best_row   INTEGER,                         -- the compressed row achieving best_rank
  score      REAL,                            -- its index score
  in_topk    INTEGER NOT NULL CHECK (in_topk IN (0, 1)),
  topk       INTEGER,                         -- k in force at that position
  n_visible  INTEGER                          -- compressed rows visible at that position
) STRICT;
CREATE UNIQUE INDEX needle_verdicts_key
  ON needle_verdicts (needle_id, coalesce(replay_id, ''), layer, position);
CREATE INDEX needle_verdicts_by_run ON needle_verdicts (run_id, layer);

-- run_summary: a run with its build, the first thing to look at.
CREATE VIEW run_summary AS
SELECT r.run_id, r.created_at, r.model, r.n_prompt, r.n_generated, r.precision, r.index_k,
       r.index_q, r.rotate, r.topk, r.positions, b.revision, b.compiler, b.build_type, b.backend,
       b.kernel_mode, r.status, r.duration_s, r.request_id, r.trace_path,
       (SELECT count(*) FROM taps t WHERE t.run_id = r.run_id) AS n_taps
FROM runs r JOIN builds b USING (build_id);

-- tap_summary: every recorded tap with its run's identity and settings, for questions like
-- "which runs have NaN anywhere" or "rms of layers.*.output by build".
CREATE VIEW tap_summary AS
SELECT t.run_id, r.created_at, r.model, b.revision, r.precision, r.index_k, r.index_q, r.rotate,
       r.topk, r.positions, t.name, t.layer, t.tap, t.dtype, t.shape, t.rows, t.axis0, t.count, t.nan_count,
       t.inf_count, t.min, t.max, t.mean, t.rms
FROM taps t JOIN runs r USING (run_id) JOIN builds b USING (build_id);

-- needle_rank_by_layer: per run (or replay), needle and layer, the needle's rank over the query
-- positions examined: best_rank = best (lowest) rank at any position, worst_rank = worst,
-- in_topk = 1 only if the needle was in the top-k at every examined position.
CREATE VIEW needle_rank_by_layer AS
SELECT v.run_id, v.replay_id, v.needle_id, n.text AS needle, v.layer,
       min(v.best_rank) AS best_rank, max(v.best_rank) AS worst_rank, min(v.in_topk) AS in_topk,
       count(*) AS positions
FROM needle_verdicts v JOIN needles n USING (needle_id)
GROUP BY v.run_id, v.replay_id, v.needle_id, v.layer;

-- 0007_store_notes.sql — what changed a store's index other than recording (issue 14 #1).
--
-- runs.trace_path follows one rule (schemas/trace-layout.md "Trace paths in the index"): relative
-- to the store for a trace inside it, absolute otherwise. A run recorded with --force over a path
-- another run's row held deletes that row (its taps, needles, verdicts and replays go with it by
-- ON DELETE CASCADE) and leaves a note here; `sparsetrace store check --repair` notes each row it
-- deletes, each orphan trace it indexes and each leftover .part file it removes.
CREATE TABLE store_notes (
  note_id    INTEGER PRIMARY KEY,
  at         TEXT NOT NULL,               -- ISO 8601 UTC
  kind       TEXT NOT NULL,               -- replaced | dangling_row | orphan_indexed | part_removed
  run_id     TEXT,                        -- the run concerned (not a foreign key: it may be gone)
  trace_path TEXT,                        -- as stored (the path rule)
  detail     TEXT                         -- one human sentence
);

-- 0011_scoreboard.sql — `sparsetrace scoreboard`: one fixed corpus of needle cases run against
-- several targets, one row per target and case (needle/scoreboard.c).
--
-- A corpus (schemas/scoreboard-corpora.json) has a name and a version; `needle make`'s generator
-- expands it deterministically into cases (kinds x lengths x positions x seeds x request formats,
-- in that nesting order; case_index counts from 0). A target is a label for one way of answering:
-- the engine under settings or on a backend, another sparsetrace build, a live server. Each case a
-- target answers is one needle_attempts row (the request, the answer, pass and error: the needle
-- sweep's own rule, needle/harness.c st_harness_answer_passes) linked here with how far a wrong
-- answer is from the needle. A case with a scoreboard_results row is done for that target and is
-- not run again; the attempt row and its result are stored in one transaction, so a scoreboard
-- killed at any point resumes with no case lost and none done twice.

CREATE TABLE scoreboard_cases (
  corpus          TEXT NOT NULL,
  corpus_version  INTEGER NOT NULL,
  case_index      INTEGER NOT NULL CHECK (case_index >= 0),
  kind            TEXT NOT NULL CHECK (kind IN ('path', 'host', 'key', 'number')),
  tokens          INTEGER NOT NULL CHECK (tokens > 0), -- requested prompt size
  position        REAL NOT NULL CHECK (position >= 0 AND position <= 1),
  seed            INTEGER NOT NULL,
  format          TEXT NOT NULL CHECK (format IN ('anthropic', 'openai-chat', 'openai-responses')),
  PRIMARY KEY (corpus, corpus_version, case_index)
) STRICT;

-- One row per target of a corpus. status: 'running' while cases remain (or the run was
-- interrupted), 'complete' when every case has a result, 'error' when the target could not be
-- used at all (model, binary, settings) or every case it ran failed; error says why.
CREATE TABLE scoreboard_targets (
  corpus          TEXT NOT NULL,
  corpus_version  INTEGER NOT NULL,
  label           TEXT NOT NULL,                  -- what the matrix calls it
  spec            TEXT NOT NULL,                  -- the --target text (engine:..., URL, binary:...)
  target_kind     TEXT NOT NULL CHECK (target_kind IN ('engine', 'server', 'binary')),
  target          TEXT,                           -- needle_attempts.target of its attempts
  settings        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(settings)),
  sweep_id        TEXT NOT NULL,                  -- needle_attempts.sweep_id of its attempts
  status          TEXT NOT NULL CHECK (status IN ('running', 'complete', 'error')),
  error           TEXT,
  created_at      TEXT NOT NULL,
  updated_at      TEXT NOT NULL,
  PRIMARY KEY (corpus, corpus_version, label)
) STRICT;

CREATE TABLE scoreboard_results (
  corpus          TEXT NOT NULL,
  corpus_version  INTEGER NOT NULL,
  label           TEXT NOT NULL,
  case_index      INTEGER NOT NULL,
  attempt_id      INTEGER NOT NULL REFERENCES needle_attempts (attempt_id),
  distance        INTEGER,                        -- fewest character edits that make some part of
                                                  -- the answer equal the needle's value: 0 exactly
                                                  -- when it passes; NULL when the attempt failed
  foreign_store   TEXT,                           -- another build's store, its run there
  foreign_run_id  TEXT,
  PRIMARY KEY (corpus, corpus_version, label, case_index),
  FOREIGN KEY (corpus, corpus_version, label) REFERENCES scoreboard_targets (corpus, corpus_version, label),
  FOREIGN KEY (corpus, corpus_version, case_index) REFERENCES scoreboard_cases (corpus, corpus_version, case_index)
) STRICT;

-- scoreboard_case_results: one row per target and case answered, with the attempt's verdict.
CREATE VIEW scoreboard_case_results AS
SELECT r.corpus, r.corpus_version, r.label, r.case_index, c.kind, c.tokens, c.position, c.seed, c.format,
       a.pass, a.error, r.distance, a.expected, a.answer, a.run_id, r.foreign_run_id, a.attempt_id
FROM scoreboard_results r
JOIN scoreboard_cases c USING (corpus, corpus_version, case_index)
JOIN needle_attempts a ON a.attempt_id = r.attempt_id;

-- scoreboard_cells: the matrix `sparsetrace scoreboard` prints, one row per target, length and
-- position: cases answered, passed, errors (attempts that could not be made), wrong (answered but
-- not passed) and the mean distance of the wrong answers from the needle (NULL when none).
CREATE VIEW scoreboard_cells AS
SELECT corpus, corpus_version, label, tokens, position,
       count(*) AS cases, sum(pass) AS passed, sum(error IS NOT NULL) AS errors,
       sum(error IS NULL AND pass = 0) AS wrong,
       avg(CASE WHEN error IS NULL AND pass = 0 THEN distance END) AS mean_distance
FROM scoreboard_case_results
GROUP BY corpus, corpus_version, label, tokens, position;

-- 0014_needle_opt_in_kinds.sql — needle attempts of the two kinds `needle make --batch` draws only
-- when named (needle/needle_prompt.h st_needle_opt_in_kind), so that `needle sweep --kind assorted`
-- and `--kind vocab` can be stored (0012's CHECK allowed the other eleven, and the sweep refused
-- them), and the vocab kind's value length with each attempt.
--
-- kind:             0012's eleven, and
--                   assorted  16 value shapes no other kind has, each under its own label
--                   vocab     label and value of tokens drawn from the model's whole vocabulary
-- vocab_tokens_min, the vocab kind's value length asked for, LO to HI tokens (`needle sweep
-- vocab_tokens_max  --vocab-tokens LO-HI`, st_needle_spec.vocab_tokens); NULL for every other
--                   kind, and for vocab without the option (needle make's default: 6 to 14 tokens
--                   in at most 96 bytes)
--
-- scoreboard_cases keeps 0012's eleven kinds: a scoreboard corpus is drawn from them alone.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt under its own name, as
-- 0012 rebuilt it (recorder/index.c runs migrations with foreign keys off and checks them before
-- commit), with its indexes and the views that read it, which are as 0012 made them.

DROP VIEW needle_sweep_cells;
DROP VIEW scoreboard_cells;
DROP VIEW scoreboard_case_results;

CREATE TABLE needle_attempts_0014 (
  attempt_id       INTEGER PRIMARY KEY,
  sweep_id         TEXT NOT NULL,               -- uuid v4, one per `needle sweep`
  created_at       TEXT NOT NULL,               -- when the attempt finished
  target           TEXT NOT NULL,               -- engine: the model directory; server: the URL posted to
  api              TEXT NOT NULL CHECK (api IN ('engine', 'anthropic', 'openai', 'responses')),
  format           TEXT NOT NULL CHECK (format IN ('anthropic', 'openai-chat', 'openai-responses')),
  render           TEXT,                        -- engine: render profile the prompt was built with
  thinking         INTEGER CHECK (thinking IS NULL OR thinking IN (0, 1)), -- NULL: left to the server
  tokens_requested INTEGER NOT NULL,            -- the grid's context length
  tokens_actual    INTEGER,                     -- prompt tokens as built (see tokens_measure)
  tokens_measure   TEXT CHECK (tokens_measure IN ('tokenizer', 'estimate')), -- estimate: 3.25 bytes/token
  tokens_reported  INTEGER,                     -- prompt tokens the server's usage reported
  position         REAL NOT NULL,               -- requested fraction of the prompt
  position_actual  REAL,                        -- needle's first token / prompt tokens
  seed             INTEGER NOT NULL,
  kind             TEXT NOT NULL CHECK (kind IN ('path', 'host', 'key', 'number', 'ticket', 'branch', 'url',
                                                 'email', 'commit', 'env', 'random', 'assorted', 'vocab')),
  needle           TEXT NOT NULL,               -- the needle line
  expected         TEXT NOT NULL,               -- the value the answer must contain
  answer           TEXT,                        -- the model's text (NULL when the attempt failed)
  pass             INTEGER NOT NULL CHECK (pass IN (0, 1)),
  run_id           TEXT REFERENCES runs (run_id) ON DELETE SET NULL, -- the engine trace's run
  needle_start     INTEGER,                     -- engine: token span [start, end) of the needle line
  needle_end       INTEGER,
  max_new_tokens   INTEGER,
  settings         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(settings)), -- engine: resolved
                                                -- settings; server: the --set pairs as given
  error            TEXT,
  duration_s       REAL,
  shape            TEXT NOT NULL DEFAULT 'agent' CHECK (shape IN ('agent', 'toollist')), -- the request's shape
  decoys           INTEGER NOT NULL DEFAULT 0 CHECK (decoys BETWEEN 0 AND 64), -- as 0013 added it
  vocab_tokens_min INTEGER,                     -- kind vocab: its value's length asked for (see above)
  vocab_tokens_max INTEGER,
  CHECK ((vocab_tokens_min IS NULL AND vocab_tokens_max IS NULL) OR
         (kind = 'vocab' AND vocab_tokens_min BETWEEN 1 AND vocab_tokens_max))
) STRICT;
INSERT INTO needle_attempts_0014 (attempt_id, sweep_id, created_at, target, api, format, render, thinking,
  tokens_requested, tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind,
  needle, expected, answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s,
  shape, decoys)
SELECT attempt_id, sweep_id, created_at, target, api, format, render, thinking,
  tokens_requested, tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind,
  needle, expected, answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s,
  shape, decoys
FROM needle_attempts;
DROP TABLE needle_attempts;
ALTER TABLE needle_attempts_0014 RENAME TO needle_attempts;
CREATE INDEX needle_attempts_by_sweep ON needle_attempts (sweep_id, tokens_requested, position);
CREATE INDEX needle_attempts_by_run ON needle_attempts (run_id) WHERE run_id IS NOT NULL;

-- as 0012 made them
CREATE VIEW needle_sweep_cells AS
SELECT sweep_id, target, api, kind, tokens_requested, position,
       sum(pass) AS passed, count(*) AS attempts, sum(error IS NOT NULL) AS errors,
       round(avg(tokens_actual)) AS tokens_actual, min(created_at) AS started_at, shape
FROM needle_attempts
GROUP BY sweep_id, target, api, kind, shape, tokens_requested, position;

CREATE VIEW scoreboard_case_results AS
SELECT r.corpus, r.corpus_version, r.label, r.case_index, c.kind, c.tokens, c.position, c.seed, c.format,
       a.pass, a.error, r.distance, a.expected, a.answer, a.run_id, r.foreign_run_id, a.attempt_id
FROM scoreboard_results r
JOIN scoreboard_cases c USING (corpus, corpus_version, case_index)
JOIN needle_attempts a ON a.attempt_id = r.attempt_id;

CREATE VIEW scoreboard_cells AS
SELECT corpus, corpus_version, label, tokens, position,
       count(*) AS cases, sum(pass) AS passed, sum(error IS NOT NULL) AS errors,
       sum(error IS NULL AND pass = 0) AS wrong,
       avg(CASE WHEN error IS NULL AND pass = 0 THEN distance END) AS mean_distance
FROM scoreboard_case_results
GROUP BY corpus, corpus_version, label, tokens, position;

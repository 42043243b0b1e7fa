-- 0003_needle_attempts.sql — needle recall attempts made by `sparsetrace needle sweep`
-- (needle/harness.c; the requests come from needle/needle_prompt.c).
--
-- A sweep is a grid: context lengths × needle positions × seeds. Each cell of the grid is one
-- attempt: a synthetic agentic request of about tokens_requested tokens with one needle line at
-- fraction `position`, ending in a question that asks for the line verbatim. The attempt passes
-- when the answer contains `expected` (the needle's value) verbatim. Against the reference engine
-- the attempt's trace is a run (run_id), whose needle span is in `needles` with its verdicts in
-- `needle_verdicts`; against a server run_id is NULL. An attempt that could not be made (HTTP
-- error, render error, prompt outside the model's vocabulary) has pass = 0 and `error` set.

CREATE TABLE needle_attempts (
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
  kind             TEXT NOT NULL CHECK (kind IN ('path', 'host', 'key', 'number')),
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
  duration_s       REAL
) STRICT;
CREATE INDEX needle_attempts_by_sweep ON needle_attempts (sweep_id, tokens_requested, position);
CREATE INDEX needle_attempts_by_run ON needle_attempts (run_id) WHERE run_id IS NOT NULL;

-- needle_sweep_cells: the pass table, one row per sweep, context length and position
-- ("2/3" = passed/attempts), the table `needle sweep` prints.
CREATE VIEW needle_sweep_cells AS
SELECT sweep_id, target, api, kind, tokens_requested, position,
       sum(pass) AS passed, count(*) AS attempts, sum(error IS NOT NULL) AS errors,
       round(avg(tokens_actual)) AS tokens_actual, min(created_at) AS started_at
FROM needle_attempts
GROUP BY sweep_id, target, api, kind, tokens_requested, position;

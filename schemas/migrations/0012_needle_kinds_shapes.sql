-- 0012_needle_kinds_shapes.sql — needle attempts and scoreboard cases of every needle kind
-- `needle make` writes (0003 and 0011 allowed four: an attempt of any other kind could not be
-- stored), and the request shape of each attempt.
--
-- kind:  path, host, key, number, ticket, branch, url, email, commit, env, random
--        (needle/needle_prompt.h, st_needle_kind_name)
-- shape: agent    the coding-agent transcript (rules, JSON-schema tools, tool rounds, summary)
--        toollist one system string of one-line tool descriptions with the environment in the
--                 middle, and one question (the shape of a typical bug report's request)
--        Attempts stored before this migration were all agent-shaped.
--
-- SQLite cannot change a CHECK constraint in place: each table is rebuilt under its own name
-- (SQLite's documented procedure; recorder/index.c runs migrations with foreign keys off and
-- checks them before commit), with its indexes and the views that read it.

DROP VIEW needle_sweep_cells;
DROP VIEW scoreboard_cells;
DROP VIEW scoreboard_case_results;

CREATE TABLE needle_attempts_0012 (
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
                                                 'email', 'commit', 'env', 'random')),
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
  shape            TEXT NOT NULL DEFAULT 'agent' CHECK (shape IN ('agent', 'toollist')) -- the request's shape
) STRICT;
INSERT INTO needle_attempts_0012 (attempt_id, sweep_id, created_at, target, api, format, render, thinking,
  tokens_requested, tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind,
  needle, expected, answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s)
SELECT attempt_id, sweep_id, created_at, target, api, format, render, thinking,
  tokens_requested, tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind,
  needle, expected, answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s
FROM needle_attempts;
DROP TABLE needle_attempts;
ALTER TABLE needle_attempts_0012 RENAME TO needle_attempts;
CREATE INDEX needle_attempts_by_sweep ON needle_attempts (sweep_id, tokens_requested, position);
CREATE INDEX needle_attempts_by_run ON needle_attempts (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE scoreboard_cases_0012 (
  corpus          TEXT NOT NULL,
  corpus_version  INTEGER NOT NULL,
  case_index      INTEGER NOT NULL CHECK (case_index >= 0),
  kind            TEXT NOT NULL CHECK (kind IN ('path', 'host', 'key', 'number', 'ticket', 'branch', 'url',
                                                'email', 'commit', 'env', 'random')),
  tokens          INTEGER NOT NULL CHECK (tokens > 0), -- requested prompt size
  position        REAL NOT NULL CHECK (position >= 0 AND position <= 1),
  seed            INTEGER NOT NULL,
  format          TEXT NOT NULL CHECK (format IN ('anthropic', 'openai-chat', 'openai-responses')),
  PRIMARY KEY (corpus, corpus_version, case_index)
) STRICT;
INSERT INTO scoreboard_cases_0012 SELECT corpus, corpus_version, case_index, kind, tokens, position, seed, format
FROM scoreboard_cases;
DROP TABLE scoreboard_cases;
ALTER TABLE scoreboard_cases_0012 RENAME TO scoreboard_cases;

-- needle_sweep_cells: the pass table, one row per sweep, context length and position
-- ("2/3" = passed/attempts), the table `needle sweep` prints; a sweep has one kind and one shape.
CREATE VIEW needle_sweep_cells AS
SELECT sweep_id, target, api, kind, tokens_requested, position,
       sum(pass) AS passed, count(*) AS attempts, sum(error IS NOT NULL) AS errors,
       round(avg(tokens_actual)) AS tokens_actual, min(created_at) AS started_at, shape
FROM needle_attempts
GROUP BY sweep_id, target, api, kind, shape, tokens_requested, position;

-- as 0011 made them
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

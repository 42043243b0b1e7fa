-- 0002_capture.sql — requests captured by `sparsetrace capture` (recorder/capture/*.c).
--
-- One row per HTTP exchange the proxy accepted. The row is inserted with state 'open' once the
-- request has been read and before it is forwarded, and updated when the exchange ends, so a
-- request is never missing from the store: a proxy killed outright leaves 'open' rows behind,
-- one stopped with SIGTERM finishes them or marks them 'interrupted'.
--
-- Bodies are the raw bytes (never re-serialised), except that any credential value the request
-- carried in a header or query parameter is overwritten with '*' of the same length wherever it
-- appears. Bodies larger than the proxy's --inline-max are stored in files beside the index
-- (request_body_file / response_body_file, relative to the store) and the BLOB is NULL.
-- Headers are JSON arrays of [name, value] pairs in wire order; credential headers
-- (Authorization, x-api-key, api-key, *-key, cookies, Proxy-Authorization, ...) have the value
-- "[redacted]". Times are ISO 8601 UTC text; durations are milliseconds since the request head
-- arrived at the proxy. The exported form of a row is schemas/capture.schema.json.

CREATE TABLE requests (
  id                 TEXT PRIMARY KEY,              -- uuid v4; runs.request_id refers to it
  received_at        TEXT NOT NULL,                 -- when the request head arrived
  method             TEXT NOT NULL,                 -- GET, POST, ...
  endpoint           TEXT NOT NULL,                 -- request path without the query: /v1/messages
  query              TEXT,                          -- query string, secret parameters redacted
  api                TEXT NOT NULL CHECK (api IN ('anthropic.messages', 'openai.chat',
                       'openai.completions', 'openai.responses', 'other')),
  stream             INTEGER NOT NULL DEFAULT 0 CHECK (stream IN (0, 1)), -- SSE answer (or asked)
  state              TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'complete',
                       'upstream_error', 'client_aborted', 'interrupted', 'rejected')),
  status             INTEGER,                       -- HTTP status the client got; NULL: none
  upstream           TEXT,                          -- upstream base URL, without credentials
  client_addr        TEXT,                          -- ip:port of the client
  model              TEXT,                          -- the request's "model"
  request_headers    TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(request_headers)),
  request_body       BLOB,                          -- raw bytes (NULL when in request_body_file)
  request_body_file  TEXT,
  request_bytes      INTEGER NOT NULL DEFAULT 0,    -- body length (declared length if refused)
  request_malformed  INTEGER NOT NULL DEFAULT 0 CHECK (request_malformed IN (0, 1)),
  request_json_error TEXT,                          -- why the body is not JSON: line, column, text
  response_headers   TEXT CHECK (response_headers IS NULL OR json_valid(response_headers)),
  response_body      BLOB,                          -- the bytes the client got; raw SSE for streams
  response_body_file TEXT,
  response_bytes     INTEGER,                       -- all body bytes relayed to the client
  response_truncated INTEGER NOT NULL DEFAULT 0 CHECK (response_truncated IN (0, 1)),
  final_message      TEXT CHECK (final_message IS NULL OR json_valid(final_message)),
  stop_reason        TEXT,                          -- end_turn, tool_use, stop, tool_calls, ...
  input_tokens       INTEGER,                       -- prompt tokens the upstream reported (all,
                                                    -- cached included)
  output_tokens      INTEGER,
  n_events           INTEGER,                       -- SSE events (NULL for non-streams)
  headers_ms         REAL,                          -- response head sent to the client
  ttfb_ms            REAL,                          -- first response body byte sent
  total_ms           REAL,                          -- exchange over
  max_gap_ms         REAL,                          -- largest gap between consecutive events
  upstream_error     TEXT,                          -- down, reset, timed out: what and where
  client_error       TEXT,                          -- client went away: when
  redactions         INTEGER NOT NULL DEFAULT 0     -- credential occurrences masked in bodies
) STRICT;
CREATE INDEX requests_by_received ON requests (received_at);
CREATE INDEX requests_by_state ON requests (state) WHERE state <> 'complete';

-- The server-sent events of a streamed answer, in arrival order. t_ms is when the chunk that
-- completed the event reached the proxy; byte_offset/byte_length locate the event's block in
-- response_body (blocks tile the stream: comments and blank lines before an event belong to it).
-- event is the SSE event field, else the data's JSON "type", else 'message'; '[DONE]' for
-- OpenAI's terminator.
CREATE TABLE request_events (
  request_id  TEXT NOT NULL REFERENCES requests (id) ON DELETE CASCADE,
  seq         INTEGER NOT NULL,                     -- 0-based
  t_ms        REAL NOT NULL,
  byte_offset INTEGER NOT NULL,
  byte_length INTEGER NOT NULL,
  event       TEXT NOT NULL,
  PRIMARY KEY (request_id, seq)
) STRICT, WITHOUT ROWID;

-- request_event_gaps: inter-event gaps (gap_ms NULL for the first event, whose t_ms is the time
-- to first event).
CREATE VIEW request_event_gaps AS
SELECT request_id, seq, event, t_ms,
       t_ms - lag(t_ms) OVER (PARTITION BY request_id ORDER BY seq) AS gap_ms,
       byte_offset, byte_length
FROM request_events;

-- request_summary: the first thing to look at, one line per request, newest last.
CREATE VIEW request_summary AS
SELECT id, received_at, api, endpoint, model, stream, state, status,
       CAST(json_extract(final_message, '$.text') AS TEXT) AS text,
       json_array_length(final_message, '$.tool_calls') AS n_tool_calls,
       stop_reason, input_tokens, output_tokens, n_events, ttfb_ms, max_gap_ms, total_ms,
       request_malformed, upstream_error, client_error
FROM requests;

-- 0010_served.sql — requests answered by `sparsetrace serve` share the `requests` table with the
-- ones `sparsetrace capture` relayed.
--
-- requests.origin says which: 'proxied' (capture relayed the exchange to its upstream; every row
-- written before this migration) or 'served' (serve answered it with the reference engine; the
-- row's upstream column then names the model directory, and runs.request_id links the traced run
-- it produced, when taps were armed). Everything else in the row means the same for both.

ALTER TABLE requests ADD COLUMN origin TEXT NOT NULL DEFAULT 'proxied'
  CHECK (origin IN ('proxied', 'served'));

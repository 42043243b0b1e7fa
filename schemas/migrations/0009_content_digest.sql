-- 0009_content_digest.sql — a run's trace is identified by its content, not only by run_id.
--
-- runs.content_digest is the trace's file attribute content_digest as the writer computed it at
-- finish, before the file was marked complete (schemas/trace-layout.md, "Content digest":
-- "fnv1a64:<16 hex digits>" over every dataset's path, type, extents and bytes). `replay`
-- recomputes the digest of the trace it reads and refuses one that differs from its attribute or
-- from this column, so replays of a modified copy are never stored under the original run;
-- `store check` reports traces whose digest differs from their row. NULL for runs indexed before
-- this migration (their traces have no such attribute: nothing to compare).

ALTER TABLE runs ADD COLUMN content_digest TEXT;

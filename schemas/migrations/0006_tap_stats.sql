-- 0006_tap_stats.sql — the taps table's statistics describe the dataset as stored.
--
-- Until now count and inf_count left out the fill values of elements never written (the -inf of
-- an indexer.scores row narrower than the dataset, the -1 of a short indexer.topk row), so a tap
-- said "count 8244, inf 0" where numpy reading the dataset finds 8272 elements and 28 -inf.
-- From this version the writer (recorder/trace_writer.c) counts every element of the dataset's
-- final shape, fill values included, and keeps finite, +inf and -inf apart:
--   count          elements of the dataset (product of shape)
--   finite_count   finite elements (integer taps: all of them)
--   nan_count      NaN elements (float taps)
--   inf_count      +inf and -inf elements (float taps) = posinf_count + neginf_count
--   posinf_count, neginf_count
--   min, max, mean, rms   over the finite elements (float taps) or all elements (integer taps)
-- so finite_count + nan_count + inf_count = count. Rows of runs recorded before this version have
-- finite_count, posinf_count and neginf_count NULL (and the old count / inf_count).

ALTER TABLE taps ADD COLUMN finite_count INTEGER;
ALTER TABLE taps ADD COLUMN posinf_count INTEGER;
ALTER TABLE taps ADD COLUMN neginf_count INTEGER;

DROP VIEW tap_summary;
-- tap_summary: every recorded tap with its run's identity and settings, for questions like
-- "which runs have NaN anywhere" or "rms of layers.*.output by build".
CREATE VIEW tap_summary AS
SELECT t.run_id, r.created_at, r.model, b.revision, r.precision, r.index_k, r.index_q, r.rotate,
       r.topk, r.positions, t.name, t.layer, t.tap, t.dtype, t.shape, t.rows, t.axis0, t.count,
       t.finite_count, t.nan_count, t.inf_count, t.posinf_count, t.neginf_count, t.min, t.max,
       t.mean, t.rms
FROM taps t JOIN runs r USING (run_id) JOIN builds b USING (build_id);

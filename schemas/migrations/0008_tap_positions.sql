-- 0008_tap_positions.sql — one name per notion: the positions filter is runs.tap_positions.
--
-- 0001 called the positions filter of a run (`run --positions`: all | last | A:B, the trace's
-- file attribute `positions`) runs.positions, and its needle_rank_by_layer called a count of
-- query positions `positions`; joining the two was an "ambiguous column name: positions" error,
-- and `positions` read as a count in one place and a spec in the other. 0005 renamed the
-- counts (answer_positions, recorded_positions, ...); this renames the spec, in runs and in the
-- views that show it (run_summary, tap_summary), to tap_positions: which token positions the
-- run's taps kept. No column of the index is called plain `positions` any more; `position` is
-- always one query token position (needle_verdicts, needle_position_verdicts), `*_positions`
-- always a count, `tap_positions` the filter. Values are unchanged.

DROP VIEW run_summary;
DROP VIEW tap_summary;

ALTER TABLE runs RENAME COLUMN positions TO tap_positions;

-- run_summary: a run with its build, the first thing to look at.
CREATE VIEW run_summary AS
SELECT r.run_id, r.created_at, r.model, r.n_prompt, r.n_generated, r.precision, r.index_k,
       r.index_q, r.rotate, r.topk, r.tap_positions, b.revision, b.compiler, b.build_type,
       b.backend, b.kernel_mode, r.status, r.duration_s, r.request_id, r.trace_path,
       (SELECT count(*) FROM taps t WHERE t.run_id = r.run_id) AS n_taps
FROM runs r JOIN builds b USING (build_id);

-- tap_summary: every recorded tap with its run's identity and settings, for questions like
-- "which runs have NaN anywhere" or "rms of layers.*.output by build".
CREATE VIEW tap_summary AS
SELECT t.run_id, r.created_at, r.model, b.revision, r.precision, r.index_k, r.index_q, r.rotate,
       r.topk, r.tap_positions, t.name, t.layer, t.tap, t.dtype, t.shape, t.rows, t.axis0, t.count,
       t.finite_count, t.nan_count, t.inf_count, t.posinf_count, t.neginf_count, t.min, t.max,
       t.mean, t.rms
FROM taps t JOIN runs r USING (run_id) JOIN builds b USING (build_id);

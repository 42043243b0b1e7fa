-- 0005_needle_verdicts.sql — the needle verdict (schemas/needle-verdicts.md) as views.
--
-- 0001's needle_rank_by_layer took min(in_topk) over every recorded position, the answer's own
-- tokens and its end of sentence included, so it said 0 for a layer that keeps the needle at 14
-- of the 15 positions that can copy it. The rule is the one replayer/needle.c (st_needle_judge)
-- applies for run, replay, bisect and needle sweep: a layer KEEPS the needle at a position when
-- the best rank of a compressed row covering its tokens is inside the top-k (the row is among the
-- rows the indexer selected: needle_verdicts.in_topk); the positions that matter are the ANSWER
-- POSITIONS that can copy it, from the last prompt position (n_prompt - 1) on, as many as the
-- needle has tokens; a layer RETRIEVES the needle when it keeps it at strictly more than half of
-- the answer positions the trace recorded (NULL when it recorded none of them).

DROP VIEW needle_rank_by_layer;

-- needle_position_verdicts: one row per needle, layer and recorded query position, with what the
-- rule makes of it. answer_index: the position's index among the answer positions (0 = the last
-- prompt position; negative before, >= the needle's token count after them); is_answer_position:
-- 1 when it is one of the answer positions that can copy the needle; keeps: the layer keeps the
-- needle there.
CREATE VIEW needle_position_verdicts AS
SELECT v.verdict_id, v.run_id, v.replay_id, v.needle_id, n.text AS needle, n.token_start,
       n.token_end, v.layer, v.position, v.position - (r.n_prompt - 1) AS answer_index,
       (v.position >= r.n_prompt - 1 AND
        v.position < r.n_prompt - 1 + (n.token_end - n.token_start)) AS is_answer_position,
       v.best_rank, v.best_row, v.score, v.in_topk AS keeps, v.topk, v.n_visible
FROM needle_verdicts v JOIN needles n ON n.needle_id = v.needle_id JOIN runs r ON r.run_id = v.run_id;

-- needle_rank_by_layer: per run (replay_id NULL) or replay, needle and layer, the verdict:
--   answer_first, answer_end     the answer positions [answer_first, answer_end)
--   answer_positions             of those, the ones recorded (judged)
--   answer_positions_kept        judged positions where the layer keeps the needle
--   retrieves                    1: kept at more than half of answer_positions; 0: not; NULL: none judged
--   best_rank, worst_rank        the needle's rank over the judged positions (lowest, highest)
--   recorded_positions           every position with a verdict, answer positions or not
--   recorded_positions_kept      of those, where the layer keeps the needle (not the verdict)
CREATE VIEW needle_rank_by_layer AS
SELECT p.run_id, p.replay_id, p.needle_id, p.needle, p.layer,
       r.n_prompt - 1 AS answer_first,
       r.n_prompt - 1 + (p.token_end - p.token_start) AS answer_end,
       sum(p.is_answer_position) AS answer_positions,
       sum(p.is_answer_position AND p.keeps) AS answer_positions_kept,
       CASE WHEN sum(p.is_answer_position) > 0
            THEN 2 * sum(p.is_answer_position AND p.keeps) > sum(p.is_answer_position) END AS retrieves,
       min(CASE WHEN p.is_answer_position THEN p.best_rank END) AS best_rank,
       max(CASE WHEN p.is_answer_position THEN p.best_rank END) AS worst_rank,
       count(*) AS recorded_positions,
       sum(p.keeps) AS recorded_positions_kept
FROM needle_position_verdicts p JOIN runs r ON r.run_id = p.run_id
GROUP BY p.run_id, p.replay_id, p.needle_id, p.layer;

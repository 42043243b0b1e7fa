-- 0013_needle_decoys.sql — the decoys of a needle sweep's requests (`needle sweep --decoys N`,
-- needle/needle_prompt.h st_needle_spec.decoys): N more lines with the needle's label and other
-- values of its kind before the needle, and a question asking for the last of them. The number
-- asked for, as kind and shape are: a needle near the start of the prompt has fewer line
-- boundaries before it and gets fewer (`needle make --meta` says how many). Attempts stored
-- before this migration had none.
ALTER TABLE needle_attempts ADD COLUMN decoys INTEGER NOT NULL DEFAULT 0 CHECK (decoys BETWEEN 0 AND 64);

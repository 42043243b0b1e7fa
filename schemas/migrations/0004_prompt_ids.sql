-- 0004_prompt_ids.sql — the prompt token ids a serving engine returned for a captured request
-- (`sparsetrace capture --ask-prompt-ids sglang|vllm`, recorder/capture/capture_server.c and
-- recorder/capture/capture_message.c), so that `sparsetrace run --request` can replay exactly the
-- ids the server ran instead of re-rendering the chat.
--
-- With the flag, the proxy adds the engine's own request field to the JSON body it forwards
-- (sglang /v1/chat/completions: "return_prompt_token_ids": true, non-streaming only; sglang and
-- vLLM /v1/completions and vLLM /v1/chat/completions: "return_token_ids": true). request_body keeps
-- the body exactly as the client sent it; modified_request says what the forwarded body had in
-- addition, or why nothing was added. The ids are read from the answer the client got (which is
-- left byte for byte as the upstream sent it): vLLM chat puts them at the top level of the
-- response (of the first chunk when streaming), completions and sglang chat in choices[0].

ALTER TABLE requests ADD COLUMN modified_request TEXT
  CHECK (modified_request IS NULL OR json_valid(modified_request));
  -- NULL: forwarded unchanged (flag off, or not a JSON POST). Otherwise an object:
  -- {"engine": "sglang"|"vllm", "added": {"field": true} | null, "forwarded_bytes": N,
  --  "skipped": "why nothing was added" (only when added is null)}
ALTER TABLE requests ADD COLUMN prompt_token_ids TEXT
  CHECK (prompt_token_ids IS NULL OR (json_valid(prompt_token_ids)
                                      AND json_type(prompt_token_ids) = 'array'));
  -- JSON array of the prompt token ids the upstream returned; NULL when it returned none
ALTER TABLE requests ADD COLUMN prompt_token_ids_from TEXT;
  -- where in the answer they were: 'body.prompt_token_ids', 'body.choices[0].prompt_token_ids',
  -- 'event N.prompt_token_ids', 'event N.choices[0].prompt_token_ids'

-- request_prompt_ids: requests whose ids came back, with the count to compare with usage.
CREATE VIEW request_prompt_ids AS
SELECT id, received_at, api, model, json_array_length(prompt_token_ids) AS n_prompt_token_ids,
       input_tokens, prompt_token_ids_from, json_extract(modified_request, '$.engine') AS engine
FROM requests
WHERE prompt_token_ids IS NOT NULL;

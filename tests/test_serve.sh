#!/usr/bin/env bash
# test_serve.sh — `sparsetrace serve` on the bundled needle model (models/needle-v4), the way users
# point their clients at it: curl against every endpoint, streamed and not (the JSON bodies and SSE
# event sequences parsed with python3's json module and checked against each API's shape); the
# greedy answers token for token against `sparsetrace run` of the same rendered prompt; sampling
# (temperature/top_p with a seed: the same seed gives the same tokens, the seed in
# X-Sparsetrace-Seed); the prompt ids by vLLM's and sglang's fields; `capture --ask-prompt-ids` in
# front of serve and `run --request` of the captured row; a urllib "bug report" client (a long
# system prompt of one-line tool descriptions with a `Primary working directory:` line in the
# middle, asked to repeat it, temperature 0, stream false) as trained and with
# X-Sparsetrace-Set: rotate=q, both request rows with linked runs that `sparsetrace diff`
# compares; `needle sweep --endpoint` against serve giving the engine sweep's answers; malformed
# JSON, values out of range, unknown fields, non-text content, a prompt past --context, unknown
# paths and bad settings as 4xx in each API's error shape, each a rejected row; 429 with
# Retry-After on queue overflow; SIGTERM with a request in flight (it is answered, the server
# exits 0, every request is a row); no API key written anywhere. A failed check prints the end of
# serve's log (a crash report whole) to stderr and says whether serve died; a failed run keeps the
# whole log in $ST_BUILD_DIR/Testing/Temporary/test_serve.serve.log.
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
MODEL=$SRC/models/needle-v4
[ -f "$MODEL/model.safetensors" ] || { echo "skip: models/needle-v4 is not there"; exit 77; }
T=$(mktemp -d /tmp/st_serve_sh.XXXXXX)
PIDS=()
. "$SRC/tests/serve_checks.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  keep_server_log test_serve
  rm -rf "$T"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
PY=/usr/bin/python3
KEY_OPENAI=sk-SERVEPLANTED-openai-0123456789
KEY_ANTHROPIC=sk-ant-SERVEPLANTED-anthropic-9876543210

start_server() { # start_server NAME extra-args... -> URL, SERVER_PID
  rm -f "$T/$1.ready"
  "$BIN" serve --model "$MODEL" --store "$T/store" --port 0 --ready-file "$T/$1.ready" "${@:2}" \
    2> "$T/$1.log" &
  SERVER_PID=$!
  SERVER_LOG=$T/$1.log
  PIDS+=($SERVER_PID)
  for _ in $(seq 300); do [ -s "$T/$1.ready" ] && break; sleep 0.05; done
  URL=$(cat "$T/$1.ready" 2>/dev/null)
}

start_server main --queue 1 --context 8192 --tap logits --positions last
check "serve is listening on loopback" bash -c "[[ '$URL' == http://127.0.0.1:* ]]"

# ---- health and models ------------------------------------------------------------------------
curl -s "$URL/health" > "$T/health.json"
check "GET /health" $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["status"]=="ok" and d["model"]=="needle-v4"' "$T/health.json"
curl -s "$URL/v1/models" > "$T/models.json"
check "GET /v1/models (OpenAI list)" $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["object"]=="list" and d["data"][0]["id"]=="needle-v4" and d["data"][0]["object"]=="model"' "$T/models.json"
curl -s -H 'anthropic-version: 2023-06-01' "$URL/v1/models" > "$T/models.anthropic.json"
check "GET /v1/models (Anthropic list)" $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["data"][0]["type"]=="model" and d["has_more"] is False' "$T/models.anthropic.json"

# ---- the three APIs, whole and streamed -------------------------------------------------------
SYS='You are a coding agent.\nEnvironment:\nPrimary working directory: /home/erin/src/quarry\nShell: zsh'
Q='What is the primary working directory? Repeat that line verbatim.'
chat_body="{\"model\":\"needle\",\"max_tokens\":12,\"messages\":[{\"role\":\"system\",\"content\":\"$SYS\"},{\"role\":\"user\",\"content\":\"$Q\"}]"
msgs_body="{\"model\":\"needle\",\"max_tokens\":12,\"system\":\"$SYS\",\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}]"
resp_body="{\"model\":\"needle\",\"max_output_tokens\":12,\"instructions\":\"$SYS\",\"input\":\"$Q\""
post() { # post NAME PATH BODY extra-curl-args... -> $T/NAME.body, $T/NAME.head
  curl -sN -D "$T/$1.head" -o "$T/$1.body" -H 'content-type: application/json' "${@:4}" -d "$3" "$URL$2"
}
post chat /v1/chat/completions "$chat_body,\"return_token_ids\":true}" -H "Authorization: Bearer $KEY_OPENAI"
post chat_sse /v1/chat/completions "$chat_body,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" -H "Authorization: Bearer $KEY_OPENAI"
post msgs /v1/messages "$msgs_body}" -H "x-api-key: $KEY_ANTHROPIC" -H 'anthropic-version: 2023-06-01'
post msgs_sse /v1/messages "$msgs_body,\"stream\":true}" -H "x-api-key: $KEY_ANTHROPIC" -H 'anthropic-version: 2023-06-01'
post resp /v1/responses "$resp_body}" -H "Authorization: Bearer $KEY_OPENAI"
post resp_sse /v1/responses "$resp_body,\"stream\":true}" -H "Authorization: Bearer $KEY_OPENAI"

cat > "$T/shapes.py" <<'PY'
import json, sys
T = sys.argv[1]
def body(name): return json.load(open(f"{T}/{name}.body"))
def events(name):
    """(event field or None, parsed data) for each SSE event of a stream."""
    out = []
    for block in open(f"{T}/{name}.body").read().split("\n\n"):
        if not block.strip(): continue
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "): ev = line[7:]
            elif line.startswith("data: "): data.append(line[6:])
        d = "\n".join(data)
        out.append((ev, d if d == "[DONE]" else json.loads(d)))
    return out
which = sys.argv[2]
if which == "chat":
    b = body("chat")
    assert b["object"] == "chat.completion" and b["id"].startswith("chatcmpl-"), b
    c = b["choices"][0]
    assert c["index"] == 0 and c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert c["finish_reason"] in ("stop", "length")
    u = b["usage"]
    assert u["completion_tokens"] == len(c["token_ids"]) and u["prompt_tokens"] == len(b["prompt_token_ids"])
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
elif which == "chat_sse":
    ev = events("chat_sse")
    assert ev[-1] == (None, "[DONE]"), ev[-1]
    chunks = [d for _, d in ev[:-1]]
    assert all(d["object"] == "chat.completion.chunk" for d in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in chunks if d["choices"])
    fin = [d["choices"][0]["finish_reason"] for d in chunks if d["choices"] and d["choices"][0]["finish_reason"]]
    assert fin == [body("chat")["choices"][0]["finish_reason"]], fin
    assert text == body("chat")["choices"][0]["message"]["content"], (text, body("chat"))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body("chat")["usage"]
elif which == "msgs":
    b = body("msgs")
    assert b["type"] == "message" and b["role"] == "assistant" and b["id"].startswith("msg_")
    assert b["content"][-1]["type"] == "text" and b["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    assert set(b["usage"]) >= {"input_tokens", "output_tokens"}
elif which == "msgs_sse":
    ev = events("msgs_sse")
    names = [e for e, _ in ev]
    assert names[0] == "message_start" and names[-1] == "message_stop" and names[-2] == "message_delta", names
    assert all(d["type"] == e for e, d in ev), "event field and data type agree"
    text = "".join(d["delta"]["text"] for e, d in ev if e == "content_block_delta" and d["delta"]["type"] == "text_delta")
    b = body("msgs")
    assert text == b["content"][-1]["text"], (text, b)
    assert ev[-2][1]["delta"]["stop_reason"] == b["stop_reason"] and ev[-2][1]["usage"]["output_tokens"] == b["usage"]["output_tokens"]
    assert ev[0][1]["message"]["usage"]["input_tokens"] == b["usage"]["input_tokens"]
elif which == "resp":
    b = body("resp")
    assert b["object"] == "response" and b["id"].startswith("resp_") and b["status"] in ("completed", "incomplete")
    msg = [o for o in b["output"] if o["type"] == "message"][0]
    assert msg["content"][0]["type"] == "output_text"
    u = b["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
elif which == "resp_sse":
    ev = events("resp_sse")
    names = [e for e, _ in ev]
    assert names[:2] == ["response.created", "response.in_progress"], names
    assert names[-1] in ("response.completed", "response.incomplete"), names
    assert [d["sequence_number"] for _, d in ev] == list(range(len(ev)))
    assert all(d["type"] == e for e, d in ev)
    text = "".join(d["delta"] for e, d in ev if e == "response.output_text.delta")
    b = body("resp")
    final = ev[-1][1]["response"]
    msg = [o for o in b["output"] if o["type"] == "message"][0]
    assert text == msg["content"][0]["text"] == [o for o in final["output"] if o["type"] == "message"][0]["content"][0]["text"]
    assert final["usage"] == b["usage"] and final["status"] == b["status"]
PY
for w in chat chat_sse msgs msgs_sse resp resp_sse; do
  check "$w: the API's shape" $PY "$T/shapes.py" "$T" "$w"
done
check "the answers carry X-Sparsetrace-Run and X-Sparsetrace-Trace (--tap logits)" \
  bash -c "grep -qi '^X-Sparsetrace-Run: ' '$T/chat.head' && grep -qi '^X-Sparsetrace-Trace: ' '$T/msgs_sse.head'"
check "a streamed answer is text/event-stream" grep -qi '^content-type: text/event-stream' "$T/resp_sse.head"

# ---- served tokens == `sparsetrace run` of the same rendered prompt -----------------------------
same_as_run() { # same_as_run NAME API BODY: trace tokens of the served answer vs run on render's ids
  local name=$1 api=$2 body=$3
  printf '%s' "$body" | "$BIN" render --model "$MODEL" --request - --ids --api "$api" > "$T/$name.ids" || return 1
  local trace n_gen
  trace=$(grep -i '^X-Sparsetrace-Trace: ' "$T/$name.head" | cut -d' ' -f2 | tr -d '\r')
  [ -f "$trace" ] || return 1
  "$BIN" run --model "$MODEL" --prompt-tokens "$T/$name.ids" --max-new-tokens 12 --store "$T/runstore" \
    --json --quiet > "$T/$name.run.json" || return 1
  $PY - "$trace" "$T/$name.ids" "$T/$name.run.json" <<'PY'
import json, sys, h5py
f = h5py.File(sys.argv[1], "r")
ids, run = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
tokens = [int(t) for t in f["tokens"][:]]
n = int(f["tokens"].attrs["n_prompt"])
assert tokens[:n] == ids, "served prompt != rendered prompt"
assert tokens[n:] == run["generated"], (tokens[n:], run["generated"])
PY
}
check "chat: served tokens == run of the rendered prompt, token for token" same_as_run chat chat "$chat_body}"
check "messages: served tokens == run, token for token" same_as_run msgs anthropic "$msgs_body}"
check "responses (streamed): served tokens == run, token for token" same_as_run resp_sse responses "$resp_body}"
check "chat return_token_ids: token_ids == run's generated" $PY -c '
import json, sys
b, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert b["choices"][0]["token_ids"] == r["generated"] and b["prompt_token_ids"] == json.load(open(sys.argv[3]))' \
  "$T/chat.body" "$T/chat.run.json" "$T/chat.ids"

rid_chat=$(grep -i '^x-sparsetrace-request-id: ' "$T/chat.head" | cut -d' ' -f2 | tr -d '\r')
"$BIN" run --model "$MODEL" --request "$rid_chat" --store "$T/store" --max-new-tokens 12 --json --quiet \
  > "$T/rerun.json" 2> "$T/rerun.err"
check "run --request of a served request reproduces its answer token for token" $PY -c '
import json, sys
b, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["request_id"] == sys.argv[3] and r["generated"] == b["choices"][0]["token_ids"], (r, b)' \
  "$T/chat.body" "$T/rerun.json" "$rid_chat"

# ---- prompt ids by sglang's and vLLM's fields ----------------------------------------------------
post ids_sglang /v1/chat/completions "$chat_body,\"return_prompt_token_ids\":true}"
post ids_vllm_sse /v1/chat/completions "$chat_body,\"stream\":true,\"return_token_ids\":true}"
post ids_sglang_sse /v1/chat/completions "$chat_body,\"stream\":true,\"return_prompt_token_ids\":true}"
check "sglang's return_prompt_token_ids: choices[0].prompt_token_ids; vLLM's streamed: the first chunk's" $PY -c '
import json, sys
T = sys.argv[1]
want = json.load(open(f"{T}/chat.body"))["prompt_token_ids"]
assert json.load(open(f"{T}/ids_sglang.body"))["choices"][0]["prompt_token_ids"] == want
first = json.loads(open(f"{T}/ids_vllm_sse.body").read().split("\n\n")[0][6:])
assert first["prompt_token_ids"] == want, first' "$T"
check "sglang's field on a stream: 400, as sglang answers it" bash -c "grep -q '^HTTP/1.1 400' '$T/ids_sglang_sse.head' && grep -q 'not supported with streaming' '$T/ids_sglang_sse.body'"

# ---- capture in front of serve: the proxy records what a client sent to the reference ---------------
"$BIN" capture --listen 127.0.0.1:0 --upstream "$URL" --store "$T/cstore" --ready-file "$T/cap.ready" \
  --ask-prompt-ids vllm --grace 0 2> "$T/cap.log" &
CAP_PID=$!
PIDS+=($CAP_PID)
for _ in $(seq 200); do [ -s "$T/cap.ready" ] && break; sleep 0.05; done
CAP=$(cat "$T/cap.ready")
curl -s -D "$T/via.head" -o "$T/via.body" -H 'content-type: application/json' -H "Authorization: Bearer $KEY_OPENAI" \
  -d "$chat_body}" "$CAP/v1/chat/completions"
kill -TERM "$CAP_PID"
wait "$CAP_PID"
rid_via=$(sqlite3 "$T/cstore/index.sqlite" "SELECT id FROM requests WHERE origin = 'proxied' ORDER BY received_at DESC LIMIT 1")
check "capture in front of serve: the answer through the proxy is serve's, its row has serve's prompt ids" $PY -c '
import json, sys, sqlite3
T, rid = sys.argv[1], sys.argv[2]
direct, via = json.load(open(f"{T}/chat.body")), json.load(open(f"{T}/via.body"))
assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"], via
ids, = sqlite3.connect(f"{T}/cstore/index.sqlite").execute("SELECT prompt_token_ids FROM requests WHERE id = ?", (rid,)).fetchone()
assert json.loads(ids) == direct["prompt_token_ids"], ids' "$T" "$rid_via"
"$BIN" run --model "$MODEL" --request "$rid_via" --store "$T/cstore" --max-new-tokens 12 --json --quiet \
  > "$T/rerun_via.json" 2> "$T/rerun_via.err"
check "run --request of the captured request (serve's ids, verbatim) gives serve's tokens" $PY -c '
import json, sys
b, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert r["generated"] == b["choices"][0]["token_ids"], (r, b)' "$T/chat.body" "$T/rerun_via.json"

# ---- a client that leaves mid-stream cancels its generation ----------------------------------------
# The client leaves at a fixed point of the exchange, not of the clock: once it has read the
# stream's first event (the role chunk, sent before prefill) it closes the connection. The server
# is then still in the prefill of a ~1,800-token prompt with 400 tokens asked, so however fast the
# build, it finds the client gone before it could answer.
mid=$($PY -c 'print(" ".join("w%d" % i for i in range(900)))')
$PY - "$URL" "$mid $Q" "$T/gone.head" "$T/gone.body" <<'PY'
import http.client, json, socket, sys, urllib.parse
url, content, head_path, body_path = sys.argv[1:]
u = urllib.parse.urlsplit(url)
c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
c.request("POST", "/v1/chat/completions", json.dumps({"model": "x", "max_tokens": 400, "stream": True,
          "messages": [{"role": "user", "content": content}]}), {"content-type": "application/json"})
r = c.getresponse()
with open(head_path, "w") as f:
    f.write("".join("%s: %s\r\n" % kv for kv in r.getheaders()))
event = []
while True:  # one event: lines up to the blank line that ends it
    line = r.readline().decode()
    if not line or (line.strip() == "" and event):
        break
    if line.strip():
        event.append(line.strip())
open(body_path, "w").write("\n".join(event) + "\n")
c.sock.shutdown(socket.SHUT_RDWR)  # gone, after exactly one event (the FIN goes now)
r.close()
c.close()
PY
rid_gone=$(grep -i '^x-sparsetrace-request-id: ' "$T/gone.head" | cut -d' ' -f2 | tr -d '\r')
check "the leaving client read one event, the role chunk" $PY -c '
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0].startswith("data: ") and lines[1] == "", lines
assert json.loads(lines[0][6:])["choices"][0]["delta"]["role"] == "assistant", lines' "$T/gone.body"
# the row and the free engine follow the client's leaving within a chunk of prefill: up to a
# minute on a sanitizer build of a busy machine (seen in CI: 5 s was not enough)
for _ in $(seq 600); do
  [ "$(sqlite3 "$T/store/index.sqlite" "SELECT state FROM requests WHERE id = '$rid_gone'")" = client_aborted ] &&
    curl -s "$URL/health" | $PY -c 'import json,sys; sys.exit(json.load(sys.stdin)["busy"] != 0)' && break
  sleep 0.1
done
check "a client gone mid-stream: row client_aborted, the engine free again" bash -c "
  [ \"\$(sqlite3 '$T/store/index.sqlite' \"SELECT state FROM requests WHERE id = '$rid_gone'\")\" = client_aborted ] &&
  curl -s '$URL/health' | $PY -c 'import json,sys; assert json.load(sys.stdin)[\"busy\"] == 0'"

# ---- stop sequences ----------------------------------------------------------------------------
stop=$($PY -c 'import json,sys; t=json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]; print(t[2:5] if len(t) > 5 else "")' "$T/chat.body")
if [ -n "$stop" ]; then
  post stop /v1/chat/completions "$chat_body,\"stop\":[$($PY -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$stop")]}"
  check "chat stop sequence ends the answer before it (finish_reason stop)" $PY -c '
import json, sys
full = json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]
b = json.load(open(sys.argv[2]))["choices"][0]
assert b["finish_reason"] == "stop" and b["message"]["content"] == full[:full.index(sys.argv[3])], (b, full)' \
    "$T/chat.body" "$T/stop.body" "$stop"
  post stop_sse /v1/messages "$msgs_body,\"stream\":true,\"stop_sequences\":[$($PY -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$stop")]}"
  check "messages stream stop_sequences: stop_reason stop_sequence, text cut" $PY -c '
import json, sys
ev = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
text = "".join(e["delta"]["text"] for e in ev if e["type"] == "content_block_delta")
md = [e for e in ev if e["type"] == "message_delta"][0]
assert md["delta"]["stop_reason"] == "stop_sequence" and md["delta"]["stop_sequence"] == sys.argv[2], md
assert sys.argv[2] not in text' "$T/stop_sse.body" "$stop"
fi

# ---- sampling: seeded, deterministic ------------------------------------------------------------
warm_body="{\"model\":\"x\",\"max_tokens\":16,\"temperature\":1.3,\"top_p\":0.95,\"return_token_ids\":true,\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}]"
post warm1 /v1/chat/completions "$warm_body,\"seed\":7}"
post warm2 /v1/chat/completions "$warm_body,\"seed\":7}"
post warm3 /v1/chat/completions "$warm_body}"
check "temperature 1.3 / top_p 0.95 with seed 7, twice: the same tokens, X-Sparsetrace-Seed: 7" $PY -c '
import json, sys
T = sys.argv[1]
a, b = (json.load(open(f"{T}/warm{i}.body"))["choices"][0]["token_ids"] for i in (1, 2))
assert a == b and len(a) > 0, (a, b)
for i in (1, 2): assert "x-sparsetrace-seed: 7\n" in open(f"{T}/warm{i}.head").read().lower()' "$T"
check "without a seed the server picks one and names it (X-Sparsetrace-Seed)" grep -qi '^X-Sparsetrace-Seed: [0-9]' "$T/warm3.head"
check "greedy answers carry no seed" bash -c "! grep -qi '^X-Sparsetrace-Seed' '$T/chat.head'"

# ---- errors in each API's shape -----------------------------------------------------------------
post bad_chat /v1/chat/completions '{"model":"x","messages":[' 
post bad_msgs /v1/messages '{"model":"x",' -H "x-api-key: $KEY_ANTHROPIC"
post hot /v1/chat/completions '{"model":"x","temperature":2.5,"messages":[{"role":"user","content":"hi"}]}'
post hot_p /v1/messages '{"model":"x","max_tokens":4,"top_p":0,"messages":[{"role":"user","content":"hi"}]}'
post badset /v1/responses '{"model":"x","input":"hi"}' -H 'X-Sparsetrace-Set: rotate=sideways'
post notfound /v1/nothing '{}'
post unknown_chat /v1/chat/completions '{"model":"x","frobnicate":1,"messages":[{"role":"user","content":"hi"}]}'
post unknown_msgs /v1/messages '{"model":"x","max_tokens":4,"frobnicate":1,"messages":[{"role":"user","content":"hi"}]}'
post penalty /v1/chat/completions '{"model":"x","frequency_penalty":0.5,"messages":[{"role":"user","content":"hi"}]}'
post forced /v1/messages '{"model":"x","max_tokens":4,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"hi"}]}'
post image_msgs /v1/messages '{"model":"x","max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"what is it?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}'
post image_chat /v1/chat/completions '{"model":"x","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.invalid/a.png"}}]}]}'
post image_resp /v1/responses '{"model":"x","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.invalid/a.png"}]}]}'
long=$($PY -c 'print(" ".join("word%d" % i for i in range(6000)))')
post long /v1/messages "{\"model\":\"x\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}"
cat > "$T/errors.py" <<'PY'
import json, sys
T, name, status, shape, needle = sys.argv[1:6]
head = open(f"{T}/{name}.head").read().split("\r\n")[0]
assert head.split()[1] == status, head
b = json.load(open(f"{T}/{name}.body"))
if shape == "anthropic":
    assert b["type"] == "error" and b["error"]["type"] and needle in b["error"]["message"], b
else:
    assert set(b["error"]) == {"message", "type", "param", "code"} and needle in b["error"]["message"], b
PY
check "malformed JSON (chat): 400 in OpenAI's shape" $PY "$T/errors.py" "$T" bad_chat 400 openai "not valid JSON"
check "malformed JSON (messages): 400 in Anthropic's shape" $PY "$T/errors.py" "$T" bad_msgs 400 anthropic "not valid JSON"
check "temperature 2.5: 400 naming the range" $PY "$T/errors.py" "$T" hot 400 openai "temperature: expected a number from 0 to 2"
check "top_p 0: 400 in Anthropic's shape" $PY "$T/errors.py" "$T" hot_p 400 anthropic "top_p"
check "a bad X-Sparsetrace-Set: 400 naming the setting" $PY "$T/errors.py" "$T" badset 400 openai "rotate"
check "an unknown path: 404" $PY "$T/errors.py" "$T" notfound 404 openai "sparsetrace serve answers"
check "a prompt past --context: 400 in Anthropic's shape" $PY "$T/errors.py" "$T" long 400 anthropic "prompt is too long"
check "an unknown field (chat): 400 naming it, OpenAI's wording" $PY "$T/errors.py" "$T" unknown_chat 400 openai "Unrecognized request argument supplied: frobnicate"
check "an unknown field (messages): 400 naming it, Anthropic's wording" $PY "$T/errors.py" "$T" unknown_msgs 400 anthropic "frobnicate: Extra inputs are not permitted"
check "a penalty the engine does not apply: 400" $PY "$T/errors.py" "$T" penalty 400 openai "frequency_penalty"
check "a forced tool choice the engine does not apply: 400" $PY "$T/errors.py" "$T" forced 400 anthropic "tool_choice"
check "an image block (messages): 400 naming where" $PY "$T/errors.py" "$T" image_msgs 400 anthropic 'messages[0].content[1]: content of type "image" is not supported'
check "an image_url part (chat): 400 naming where" $PY "$T/errors.py" "$T" image_chat 400 openai 'messages[0].content[0]: content of type "image_url"'
check "an input_image part (responses): 400 naming where" $PY "$T/errors.py" "$T" image_resp 400 openai 'input[0].content[0]: content of type "input_image"'
check "each refused request is a logged row (rejected, 400, its reason)" bash -c "
  for n in unknown_chat unknown_msgs penalty forced image_msgs image_chat image_resp long; do
    rid=\$(grep -i '^x-sparsetrace-request-id: ' '$T/'\$n.head | cut -d' ' -f2 | tr -d '\r')
    [ \"\$(sqlite3 '$T/store/index.sqlite' \"SELECT state || ' ' || status FROM requests WHERE id = '\$rid' AND instr(CAST(response_body AS TEXT), 'error') > 0\")\" = 'rejected 400' ] || { echo \$n; exit 1; }
  done"

# ---- the bug report: as trained and with rotate=q ------------------------------------------------
# bench/bug_report.py: the reproduction a user attaches to a bug (200 one-line tool descriptions,
# the environment section with its `Primary working directory:` line in the middle, one question,
# temperature 0, stream false, Python's urllib); bench/serve-results.md has more lengths.
BUG_TOOLS=200
TAPS='X-Sparsetrace-Tap: layers.*.indexer.q_used,layers.*.indexer.topk,logits'
NEEDLE='X-Sparsetrace-Needle: Primary working directory: /home/devon/work/lanternfish'
AUTH="Authorization: Bearer sk-SERVEPLANTED-bug-report-1111"
$PY "$SRC/bench/bug_report.py" "$URL" $BUG_TOOLS "$AUTH" "$TAPS" "$NEEDLE" > "$T/bug.trained.json" 2> "$T/bug.trained.err"
$PY "$SRC/bench/bug_report.py" "$URL" $BUG_TOOLS "$AUTH" "$TAPS" "$NEEDLE" 'X-Sparsetrace-Set: rotate=q' > "$T/bug.rotq.json" 2> "$T/bug.rotq.err"
check "bug report as trained: answered" test -s "$T/bug.trained.json"
check "bug report under rotate=q: answered" test -s "$T/bug.rotq.json"
check "the bug report's two answers differ (rotate=q changes what the model copies)" $PY -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["text"] != b["text"] and a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] > 4000, (a, b)' \
  "$T/bug.trained.json" "$T/bug.rotq.json"
for m in trained rotq; do
  echo "bug report ($m): $($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["text"]), d["usage"]["prompt_tokens"], "prompt tokens")' "$T/bug.$m.json" 2>/dev/null)"
done
field() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
linked() { # linked FILE: the request row is served and complete, and its run is linked to it
  local rid run
  rid=$(field "$1" request) && run=$(field "$1" run) || return 1
  [ "$(sqlite3 "$T/store/index.sqlite" "SELECT count(*) FROM requests q JOIN runs r ON r.request_id = q.id
       WHERE q.id = '$rid' AND q.origin = 'served' AND q.state = 'complete' AND r.run_id = '$run'")" = 1 ]
}
check "the bug report as trained is a served request row with its run linked" linked "$T/bug.trained.json"
check "the bug report under rotate=q is a served request row with its run linked" linked "$T/bug.rotq.json"
check "the rotate=q run recorded rotate q, the trained one none" bash -c "
  [ \"\$(sqlite3 '$T/store/index.sqlite' \"SELECT json_extract(settings, '\$.rotate') FROM runs WHERE run_id = '$(field "$T/bug.rotq.json" run 2>/dev/null)'\")\" = q ] &&
  [ \"\$(sqlite3 '$T/store/index.sqlite' \"SELECT json_extract(settings, '\$.rotate') FROM runs WHERE run_id = '$(field "$T/bug.trained.json" run 2>/dev/null)'\")\" = none ]"
"$BIN" diff "$(field "$T/bug.trained.json" trace 2>/dev/null)" "$(field "$T/bug.rotq.json" trace 2>/dev/null)" > "$T/diff.out" 2>&1
diff_rc=$?
sed -n '1,/^first divergence/p' "$T/diff.out" | tail -3
check "sparsetrace diff compares the two served runs: they diverge at an indexer q_used" \
  bash -c "[ $diff_rc = 1 ] && grep -q '^first divergence: layers.1.indexer.q_used' '$T/diff.out'"
check "needle verdicts were recorded for both served runs" bash -c "
  [ \"\$(sqlite3 '$T/store/index.sqlite' \"SELECT count(DISTINCT run_id) FROM needles WHERE run_id IN ('$(field "$T/bug.trained.json" run 2>/dev/null)', '$(field "$T/bug.rotq.json" run 2>/dev/null)')\")\" = 2 ]"
check "requests show names a served request" bash -c "'$BIN' requests --store '$T/store' show '$(field "$T/bug.rotq.json" request 2>/dev/null)' | grep -q '^served    by sparsetrace serve'"

# ---- needle sweep against serve, and the same grid against the engine -------------------------------
"$BIN" needle sweep --endpoint "$URL" --tokenizer "$MODEL" --model-name needle-v4 --tokens 1k \
  --positions 0.5 --seeds 2 --store "$T/sweep_http" > "$T/sweep_http.out" 2>&1
"$BIN" needle sweep --model "$MODEL" --tokens 1k --positions 0.5 --seeds 2 --store "$T/sweep_engine" \
  > "$T/sweep_engine.out" 2>&1
check "needle sweep --endpoint serve: every attempt answered, the same answers as the engine's sweep" $PY -c '
import sqlite3, sys
def answers(store):
    rows = sqlite3.connect(f"{store}/index.sqlite").execute(
        "SELECT tokens_requested, seed, answer, pass, error FROM needle_attempts ORDER BY 1, 2").fetchall()
    assert len(rows) == 2 and all(r[4] is None and r[2] for r in rows), rows
    return [r[:4] for r in rows]
http, engine = answers(sys.argv[1]), answers(sys.argv[2])
assert http == engine, (http, engine)' "$T/sweep_http" "$T/sweep_engine"

# ---- queue overflow: 429 with Retry-After ------------------------------------------------------
for i in 1 2 3 4; do
  curl -s -D "$T/q$i.head" -o "$T/q$i.body" -H 'content-type: application/json' \
    -d "{\"model\":\"x\",\"max_tokens\":120,\"messages\":[{\"role\":\"system\",\"content\":\"$SYS\"},{\"role\":\"user\",\"content\":\"$Q\"}]}" \
    "$URL/v1/chat/completions" &
done
wait_curls() { for _ in $(seq 600); do [ "$(ls "$T"/q?.body 2>/dev/null | wc -l)" = 4 ] && ! pgrep -f "q[1-4].head" > /dev/null && return; sleep 0.1; done; }
wait_curls
n200=$(grep -l '^HTTP/1.1 200' "$T"/q?.head | wc -l)
n429=$(grep -l '^HTTP/1.1 429' "$T"/q?.head | wc -l)
echo "queue --queue 1, 4 at once: $n200 answered, $n429 refused"
check "serve is still running after 4 requests at once" alive "$SERVER_PID"
check "a full queue answers 429 (--queue 1: one runs, one waits, the rest refused)" bash -c "[ $n429 -ge 1 ] && [ $n200 -ge 2 ] && [ $((n200 + n429)) = 4 ]"
q429=$(grep -l '^HTTP/1.1 429' "$T"/q?.head | head -1)
check "429 carries Retry-After and the API's error shape" bash -c "grep -qi '^Retry-After: ' '$q429' && $PY -c 'import json,sys; assert json.load(open(sys.argv[1]))[\"error\"][\"code\"] == \"rate_limit_exceeded\"' '${q429%.head}.body'"

# ---- SIGTERM with a request in flight ---------------------------------------------------------------
curl -s -D "$T/inflight.head" -o "$T/inflight.body" -H 'content-type: application/json' \
  -d "{\"model\":\"x\",\"max_tokens\":200,\"messages\":[{\"role\":\"user\",\"content\":\"$Q\"}]}" "$URL/v1/chat/completions" &
CURL_PID=$!
for _ in $(seq 100); do [ "$(curl -s "$URL/health" | $PY -c 'import json,sys; print(json.load(sys.stdin)["busy"])')" = 1 ] && break; sleep 0.05; done
kill -TERM "$SERVER_PID"
sleep 0.2
curl -s -D "$T/late.head" -o "$T/late.body" -H 'content-type: application/json' \
  -d '{"model":"x","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}' "$URL/v1/chat/completions"
wait "$CURL_PID"
wait "$SERVER_PID"
server_rc=$?
SERVER_STOPPED=1
check "SIGTERM: the request in flight is answered whole" bash -c "grep -q '^HTTP/1.1 200' '$T/inflight.head' && $PY -c 'import json,sys; json.load(open(sys.argv[1]))[\"choices\"]' '$T/inflight.body'"
check "SIGTERM: a request arriving meanwhile gets 503 (or no connection)" bash -c "[ ! -s '$T/late.head' ] || grep -q '^HTTP/1.1 503' '$T/late.head'"
check "SIGTERM: the server exits 0" test "$server_rc" = 0
n_rows=$(sqlite3 "$T/store/index.sqlite" "SELECT count(*) FROM requests WHERE origin = 'served' AND state <> 'open'")
check "every request is a finished served row ($n_rows)" bash -c "[ $n_rows -ge 25 ] && [ \$(sqlite3 '$T/store/index.sqlite' \"SELECT count(*) FROM requests WHERE state = 'open'\") = 0 ]"
check "requests list shows served rows" bash -c "'$BIN' requests --store '$T/store' list | grep -q 'complete+'"
check "no API key was written anywhere (store, traces, log)" bash -c "! grep -rqa SERVEPLANTED '$T/store' '$T/main.log'"

echo "$fails failure(s)"
[ "$fails" = 0 ]

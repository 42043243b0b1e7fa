#!/usr/bin/env bash
# test_prompt_ids.sh — `capture --ask-prompt-ids sglang|vllm` and `run --request` on the ids it
# stored, the way a user runs them: curl -> the CLI proxy -> tests/fake_upstream, which answers
# the engines' own fields (vLLM "return_token_ids", sglang "return_prompt_token_ids") the way they
# do; then the store, the export, and a replay on the tiny model with the byte-level tokenizer
# fixture of tests/data/needle (as tests/test_run_request.sh).
#
# Checks: the upstream saw the injected field and the record kept the client's body; the client's
# answer is byte for byte what the upstream sends for the forwarded body (asked directly); the ids
# are read from a vLLM chat answer (top level), a vLLM chat stream (first chunk), a /v1/completions
# stream (choices[0]) and a sglang chat answer (choices[0]); a sglang chat stream is forwarded
# unchanged (sglang refuses the field there) and says why; a /v1/messages request too; the ids
# are in the index and the export (which validates against schemas/capture.schema.json when
# python3-jsonschema is there); run --request uses them verbatim and reports whether its own
# rendering agrees (the fake returns the rendered ids for one request, a perturbed list for
# another); a record without ids still compares counts.
set -uo pipefail
st=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
data=$(cd "${ST_TEST_DATA:?}" && pwd)
src=${ST_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
FAKE=${ST_BUILD_DIR:?}/tests/fake_upstream
py=/usr/bin/python3
work=$(mktemp -d /tmp/st_prompt_ids.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
failures=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; failures=$((failures + 1)); }
check() { # check "what" command...
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
jq_py() { # jq_py FILE EXPR -> prints the Python expression over the JSON in FILE (as d)
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); r=eval(sys.argv[2]); print(json.dumps(r) if not isinstance(r, str) else r)' "$1" "$2"
}

mkdir -p "$work/model"
for f in config.json model.safetensors; do ln -s "$data/oracle/tiny/$f" "$work/model/$f"; done
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$work/model/"

body='{"model":"dsv4","max_tokens":8,"messages":[{"role":"system","content":"Agent in /srv/atlas"},{"role":"user","content":"Which directory?"}]}'
sbody=${body%\}}',"stream":true}'
ids=$(printf '%s' "$body" | $st render --model "$work/model" --request - --ids --api chat) || { echo "FAIL: render"; exit 1; }
n=$($py -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$ids")
# the server's list with one id changed at position 5 (to another id of the fixture's vocabulary)
perturbed=$($py -c 'import json,sys; a=json.loads(sys.argv[1]); a[5]=(a[5]+1)%200 or 1; print(json.dumps(a,separators=(",",":")))' "$ids")
echo "rendered prompt: $n tokens"

"$FAKE" --port-file "$work/fake.port" >/dev/null &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$work/fake.port" ] && break; sleep 0.05; done
UP="http://127.0.0.1:$(cat "$work/fake.port")"

start_proxy() { # start_proxy NAME STORE extra-args... -> PROXY_PID
  rm -f "$work/$1.ready"
  $st capture --listen 127.0.0.1:0 --upstream "$UP" --store "$2" --ready-file "$work/$1.ready" \
    --threads 4 --grace 0 "${@:3}" 2>"$work/$1.log" &
  PROXY_PID=$!
  PIDS+=($PROXY_PID)
}
wait_ready() { # wait_ready NAME -> URL
  for _ in $(seq 200); do [ -s "$work/$1.ready" ] && break; sleep 0.05; done
  URL=$(cat "$work/$1.ready")
}
post() { # post URL PATH BODY OUT extra-curl-args...
  curl -sN --noproxy '*' -H 'content-type: application/json' -H 'x-api-key: sk-PLANTED-ids-0001' \
    "${@:5}" --data-binary "$3" "$1$2" >"$4"
}
# The body the proxy forwards: the field first in the object, every other byte as sent.
injected() { printf '{"%s":true,%s' "$1" "${2#\{}"; }

$st capture --help | grep -q 'CHANGES THE FORWARDED REQUEST BODY' && ok "--help says the flag changes the forwarded body" || bad "--help"
out=$($st capture --upstream "$UP" --ask-prompt-ids tgi 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "sglang and vllm" <<<"$out" && ok "an unknown engine is refused: $out" || bad "unknown engine: rc $rc $out"

# Three proxies at once (stopping one takes civetweb a while): asking vLLM, asking sglang, and
# with the flag off.
V="$work/vllm" S="$work/sglang" O="$work/off"
start_proxy vllm "$V" --ask-prompt-ids vllm; VPID=$PROXY_PID
start_proxy sglang "$S" --ask-prompt-ids sglang; SPID=$PROXY_PID
start_proxy off "$O"; OPID=$PROXY_PID
wait_ready vllm; VURL=$URL
wait_ready sglang; SURL=$URL
wait_ready off; OURL=$URL

# ---- vLLM: what goes up, what comes back --------------------------------------------------------
URL=$VURL
check "proxy with --ask-prompt-ids vllm is listening" test -n "$URL"
grep -q "asking the upstream (vllm) for prompt token ids" "$work/vllm.log" && ok "the proxy log says it modifies bodies" || bad "proxy log: $(cat "$work/vllm.log")"

# what the upstream received
post "$URL" /v1/chat/completions "$body" "$work/echo.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/echo.json" 'd["body"]')" = "$(injected return_token_ids "$body")" ] \
  && ok "the upstream saw \"return_token_ids\":true first, the rest of the body byte for byte" \
  || bad "echo: $(cat "$work/echo.json")"

post "$URL" /v1/chat/completions $' {\n}' "$work/empty.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/empty.json" 'd["body"]')" = $' {"return_token_ids":true\n}' ] \
  && ok "an empty object gets the field without a comma, its whitespace kept" || bad "empty: $(cat "$work/empty.json")"

# non-streaming chat, the server returns the ids we render
post "$URL" /v1/chat/completions "$body" "$work/v_chat.out" -H "x-fake-prompt-ids: $ids"
post "$UP" /v1/chat/completions "$(injected return_token_ids "$body")" "$work/v_chat.direct" -H "x-fake-prompt-ids: $ids"
check "vLLM chat answer relayed byte for byte (ids included)" cmp -s "$work/v_chat.out" "$work/v_chat.direct"
grep -q '"prompt_token_ids":\[' "$work/v_chat.out" && ok "the client got the server's prompt_token_ids" || bad "no ids in $(cat "$work/v_chat.out")"
# streaming chat, the server returns a perturbed list (first chunk, top level)
post "$URL" /v1/chat/completions "$sbody" "$work/v_stream.out" -H "x-fake-prompt-ids: $perturbed"
post "$UP" /v1/chat/completions "$(injected return_token_ids "$sbody")" "$work/v_stream.direct" -H "x-fake-prompt-ids: $perturbed"
check "vLLM chat stream relayed byte for byte" cmp -s "$work/v_stream.out" "$work/v_stream.direct"
# streaming completions (choices[0] of the first chunk)
cbody='{"model":"dsv4","prompt":"hello","max_tokens":4,"stream":true}'
post "$URL" /v1/completions "$cbody" "$work/v_cmpl.out" -H 'x-fake-prompt-ids: [5,6,7]'
post "$UP" /v1/completions "$(injected return_token_ids "$cbody")" "$work/v_cmpl.direct" -H 'x-fake-prompt-ids: [5,6,7]'
check "completions stream relayed byte for byte" cmp -s "$work/v_cmpl.out" "$work/v_cmpl.direct"
# a body that already asks is left alone; a messages request is forwarded unchanged
abody='{"model":"dsv4","max_tokens":8,"return_token_ids":true,"messages":[{"role":"user","content":"hi"}]}'
post "$URL" /v1/chat/completions "$abody" "$work/already.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/already.json" 'd["body"]')" = "$abody" ] && ok "a body that sets the field itself is forwarded as it is" || bad "already: $(cat "$work/already.json")"
mbody='{"model":"dsv4","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
post "$URL" /v1/messages "$mbody" "$work/msg.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/msg.json" 'd["body"]')" = "$mbody" ] && ok "/v1/messages forwarded unchanged" || bad "messages: $(cat "$work/msg.json")"
post "$URL" /v1/messages "$mbody" "$work/msg.out"

# ---- sglang: what goes up, what comes back ------------------------------------------------------
URL=$SURL
post "$URL" /v1/chat/completions "$body" "$work/s_echo.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/s_echo.json" 'd["body"]')" = "$(injected return_prompt_token_ids "$body")" ] \
  && ok "sglang: the upstream saw \"return_prompt_token_ids\":true" || bad "sglang echo: $(cat "$work/s_echo.json")"
post "$URL" /v1/chat/completions "$body" "$work/s_chat.out" -H "x-fake-prompt-ids: $ids"
post "$UP" /v1/chat/completions "$(injected return_prompt_token_ids "$body")" "$work/s_chat.direct" -H "x-fake-prompt-ids: $ids"
check "sglang chat answer relayed byte for byte" cmp -s "$work/s_chat.out" "$work/s_chat.direct"
code=$(curl -s --noproxy '*' -o "$work/s_stream.out" -w '%{http_code}' -H 'content-type: application/json' \
  --data-binary "${sbody%\}}"',"stream_options":{"include_usage":true}}' "$URL/v1/chat/completions")
[ "$code" = 200 ] && grep -q '\[DONE\]' "$work/s_stream.out" \
  && ok "sglang chat stream: not asked (sglang would answer 400), the stream works" || bad "sglang stream: $code"
post "$URL" /v1/completions "${cbody/,\"stream\":true/}" "$work/s_cmpl.json" -H 'x-fake-echo: 1'
grep -q '\\"return_token_ids\\":true' "$work/s_cmpl.json" && ok "sglang /v1/completions: asked with return_token_ids" || bad "sglang completions: $(cat "$work/s_cmpl.json")"

# ---- off by default: bodies forwarded unchanged, no note -------------------------------------
URL=$OURL
post "$URL" /v1/chat/completions "$body" "$work/o_echo.json" -H 'x-fake-echo: 1'
[ "$(jq_py "$work/o_echo.json" 'd["body"]')" = "$body" ] && ok "without the flag the body is forwarded unchanged" || bad "off: $(cat "$work/o_echo.json")"

# every exchange is in the store once its proxy has stopped
kill "$VPID" "$SPID" "$OPID"
wait "$VPID" "$SPID" "$OPID" 2>/dev/null

# ---- vLLM: the store, the export, run --request ---------------------------------------------------
q() { $st query --store "$1" --json "$2"; }
q "$V" "SELECT id, endpoint, stream, CAST(request_body AS TEXT) AS request_body, modified_request, prompt_token_ids, prompt_token_ids_from, input_tokens, json_extract(request_headers, '\$') AS h FROM requests ORDER BY received_at, rowid" >"$work/v_rows.json"
$py - "$work/v_rows.json" "$body" "$sbody" "$ids" "$perturbed" <<'PY' >"$work/v_check.txt" 2>&1
import json, sys
rows = json.load(open(sys.argv[1]))
body, sbody, ids, pert = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
assert len(rows) == 8, f"{len(rows)} rows"
echo, empty, chat, stream, cmpl, already, msg_echo, msg = rows
for r in rows:
    assert "sk-PLANTED" not in json.dumps(r), "a credential in the store"
assert chat["request_body"] == body, "request_body is not the client's body"
m = json.loads(chat["modified_request"])
assert m == {"engine": "vllm", "added": {"return_token_ids": True}, "forwarded_bytes": len(body) + 24}, m
assert json.loads(chat["prompt_token_ids"]) == ids and chat["prompt_token_ids_from"] == "body.prompt_token_ids", chat
assert chat["input_tokens"] == len(ids)
assert stream["request_body"] == sbody
assert json.loads(stream["prompt_token_ids"]) == pert and stream["prompt_token_ids_from"] == "event 0.prompt_token_ids", stream
assert json.loads(cmpl["prompt_token_ids"]) == [5, 6, 7] and cmpl["prompt_token_ids_from"] == "event 0.choices[0].prompt_token_ids", cmpl
ma = json.loads(already["modified_request"])
assert ma["added"] is None and "already sets" in ma["skipped"], ma
mm = json.loads(msg["modified_request"])
assert mm["added"] is None and "/v1/messages" in mm["skipped"] and msg["prompt_token_ids"] is None, mm
print("stored: vLLM chat ids (body.prompt_token_ids), stream ids (event 0), completions (event 0 choices[0]); notes for the rest")
PY
[ $? -eq 0 ] && ok "$(tail -1 "$work/v_check.txt")" || bad "store: $(cat "$work/v_check.txt")"
n_view=$($st query --store "$V" "SELECT count(*) FROM request_prompt_ids" | sed -n 3p | tr -d ' ')
[ "$n_view" = 3 ] && ok "view request_prompt_ids lists the 3 requests with ids" || bad "view: '$n_view'"

chat_id=$(jq_py "$work/v_rows.json" 'd[2]["id"]')
stream_id=$(jq_py "$work/v_rows.json" 'd[3]["id"]')
$st requests --store "$V" export "$chat_id" -o "$work/chat.json" >/dev/null
$st requests --store "$V" export "$stream_id" -o "$work/stream.json" >/dev/null
[ "$(jq_py "$work/chat.json" 'd["prompt_token_ids"]')" = "$($py -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])))' "$ids")" ] \
  && ok "export: prompt_token_ids" || bad "export ids: $(jq_py "$work/chat.json" 'd.get("prompt_token_ids")')"
[ "$(jq_py "$work/chat.json" 'd["request"]["modified"]["added"]')" = '{"return_token_ids": true}' ] \
  && [ "$(jq_py "$work/chat.json" 'd["request"]["body"]')" = "$body" ] \
  && ok "export: request.body as sent, request.modified names the added field" || bad "export modified"
if python3 -c 'import jsonschema' 2>/dev/null; then
  for id in $(jq_py "$work/v_rows.json" '" ".join(r["id"] for r in d)'); do
    $st requests --store "$V" export "$id" -o "$work/all-$id.json" >/dev/null
  done
  if python3 - "$src/schemas/capture.schema.json" "$work"/all-*.json <<'PY'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
for p in sys.argv[2:]:
    jsonschema.validate(json.load(open(p)), schema)
PY
  then ok "every export validates against schemas/capture.schema.json"; else bad "schema validation"; fi
else
  echo "skip export validation (python3 jsonschema not installed)"
fi

# ---- run --request on the server's ids -------------------------------------------------------
out=$($st run --model "$work/model" --request "$chat_id" --store "$V" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "using the $n prompt token ids the server returned" <<<"$out" &&
   grep -q "agrees with the server's ids" <<<"$out"; then
  ok "run --request: the server's ids, and the rendering agrees: $(sed -n 2p <<<"$out" | sed 's/^ *//')"
else bad "run agree: rc $rc $out"; fi
trace=$(ls "$V"/runs/*.h5 | head -1)
if $py - "$trace" "$ids" <<'PY'
import sys, json, h5py
f = h5py.File(sys.argv[1], "r")
ids = json.loads(sys.argv[2])
assert list(f["tokens"][: len(ids)]) == ids and f["tokens"].attrs["n_prompt"] == len(ids)
PY
then ok "the trace ran the server's ids"; else bad "trace tokens"; fi
out=$($st run --model "$work/model" --request "$work/stream.json" --store "$work/s2" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "using the $n prompt token ids the server returned" <<<"$out" &&
   grep -q "DIFFERS from the server's ids at position 5: server $($py -c 'import json,sys; print(json.loads(sys.argv[1])[5])' "$perturbed") " <<<"$out"; then
  ok "run --request FILE: a perturbed list is reported at its first differing position: $(sed -n 2p <<<"$out" | sed 's/^ *//')"
else bad "run differ: rc $rc $out"; fi
# ids need no rendering: a completions record replays them, saying why nothing is compared
cmpl_id=$(jq_py "$work/v_rows.json" 'd[4]["id"]')
out=$($st run --model "$work/model" --request "$cmpl_id" --store "$V" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "using the 3 prompt token ids" <<<"$out" && grep -q "no rendering to compare them with: .*no chat rendering" <<<"$out" \
  && ok "a completions record runs its 3 ids (nothing to render)" || bad "completions run: rc $rc $out"
out=$($st run --model "$work/model" --request "$cmpl_id" --store "$V" --json 2>&1)
grep -q '"n_prompt":3,.*"prompt_source":"server","rendered_prompt_tokens":null,"rendering_agrees":null,"first_difference":null' <<<"$out" \
  && ok "--json: prompt_source server, rendering_agrees null" || bad "json: $out"

# ---- sglang: the store, run --request without ids -------------------------------------------
q "$S" "SELECT id, stream, modified_request, prompt_token_ids, prompt_token_ids_from FROM requests ORDER BY received_at, rowid" >"$work/s_rows.json"
$py - "$work/s_rows.json" "$ids" <<'PY' >"$work/s_check.txt" 2>&1
import json, sys
rows = json.load(open(sys.argv[1]))
ids = json.loads(sys.argv[2])
echo, chat, stream, cmpl = rows
assert json.loads(chat["prompt_token_ids"]) == ids and chat["prompt_token_ids_from"] == "body.choices[0].prompt_token_ids", chat
ms = json.loads(stream["modified_request"])
assert ms["engine"] == "sglang" and ms["added"] is None and "streaming" in ms["skipped"] and stream["prompt_token_ids"] is None, ms
print("stored: sglang chat ids (body.choices[0]), the stream's note says why it was not asked")
PY
[ $? -eq 0 ] && ok "$(tail -1 "$work/s_check.txt")" || bad "sglang store: $(cat "$work/s_check.txt")"
sg_stream=$(jq_py "$work/s_rows.json" 'd[2]["id"]')
out=$($st run --model "$work/model" --request "$sg_stream" --store "$S" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "prompt tokens rendered with profile reference; the server counted" <<<"$out" \
  && ok "without ids run --request renders and compares counts: $(head -1 <<<"$out")" || bad "no-ids run: rc $rc $out"

# ---- off: no note ----------------------------------------------------------------------------
m=$($st query --store "$O" "SELECT coalesce(modified_request, 'NULL') FROM requests" | sed -n 3p | tr -d ' ')
[ "$m" = NULL ] && ok "flag off: the record has no modification note" || bad "off note: '$m'"

if [ $failures -ne 0 ]; then
  for f in "$work"/*.log; do echo "--- $f"; cat "$f"; done
fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]

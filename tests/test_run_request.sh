#!/usr/bin/env bash
# run --request: a captured request (an exported capture record) is rendered with the DeepSeek-V4
# chat encoding and the model's tokenizer, run through the engine, compared with the prompt token
# count the server reported, and linked to the trace in the index (runs.request_id). The tiny model
# gets the byte-level tokenizer fixture of tests/data/needle (its 264-token vocabulary).
set -uo pipefail
st=${ST_BIN:?}
data=$(cd "${ST_TEST_DATA:?}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }

mkdir -p "$work/model"
for f in config.json model.safetensors; do ln -s "$data/oracle/tiny/$f" "$work/model/$f"; done
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$work/model/"

body='{"model":"dsv4","max_tokens":64,"system":"You are a coding agent. Working directory: /home/dev/projects/atlas","messages":[{"role":"user","content":"What is the working directory? Answer with the path only."}]}'
ids=$(printf '%s' "$body" | $st render --model "$work/model" --request - --ids --api anthropic) || { echo "FAIL: render"; exit 1; }
n=$(/usr/bin/python3 -c 'import json,sys; print(len(json.loads(sys.stdin.read())))' <<<"$ids")
echo "rendered prompt: $n tokens"

record() { # record FILE INPUT_TOKENS
  /usr/bin/python3 - "$1" "$2" "$body" <<'PY'
import json, sys
path, count, body = sys.argv[1], int(sys.argv[2]), sys.argv[3]
json.dump({"schema": "sparsetrace.capture/1", "id": "3b7e1c2a-5d4f-4e8a-9b1c-2d3e4f5a6b7c",
           "received_at": "2026-11-29T12:00:00.000Z", "method": "POST", "endpoint": "/v1/messages",
           "api": "anthropic.messages", "stream": False, "state": "complete",
           "request": {"headers": {}, "body": body}, "response": {"status": 200, "body": "{}"},
           "usage": {"input_tokens": count}, "timings": {}, "errors": []}, open(path, "w"))
PY
}
record "$work/agree.json" "$n"
out=$($st run --model "$work/model" --request "$work/agree.json" --max-new-tokens 3 --ignore-eos --store "$work/s" --tap logits 2>&1)
if grep -q "the server counted $n: they agree" <<<"$out"; then ok "rendered count agrees with the server's ($n)"; else bad "agree: $out"; fi
rid=$($st query --store "$work/s" "SELECT request_id FROM runs" | sed -n 3p | tr -d ' ')
[ "$rid" = "3b7e1c2a-5d4f-4e8a-9b1c-2d3e4f5a6b7c" ] && ok "the run is linked to the request" || bad "runs.request_id = '$rid'"
trace=$(ls "$work"/s/runs/*.h5 | head -1)
if /usr/bin/python3 - "$trace" "$ids" <<'PY'
import sys, json, h5py
f = h5py.File(sys.argv[1], "r")
ids = json.loads(sys.argv[2])
assert list(f["tokens"][: len(ids)]) == ids and f["tokens"].attrs["n_prompt"] == len(ids)
assert f.attrs["request_id"] == "3b7e1c2a-5d4f-4e8a-9b1c-2d3e4f5a6b7c"
PY
then ok "the trace holds the rendered ids and the request id"; else bad "trace tokens or request_id"; fi

record "$work/differ.json" $((n + 7))
out=$($st run --model "$work/model" --request "$work/differ.json" --store "$work/s2" 2>&1)
grep -q "they DIFFER" <<<"$out" && ok "a different server count is reported" || bad "differ: $out"
out=$($st run --model "$work/model" --request "$work/differ.json" --store "$work/s2" --json 2>&1)
grep -q '"token_count_agrees":false' <<<"$out" && ok "--json says token_count_agrees false" || bad "json: $out"

# issue 14 defect 11: the request id is a JSON string in --json output, whatever it holds
inj='x","injected":true,"y":"'
/usr/bin/python3 - "$work/agree.json" "$work/inject.json" "$inj" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); r["id"] = sys.argv[3]; json.dump(r, open(sys.argv[2], "w"))
PY
out=$($st run --model "$work/model" --request "$work/inject.json" --max-new-tokens 1 --store "$work/s3" --json 2>/dev/null)
if /usr/bin/python3 - "$out" "$inj" <<'PY'
import json, sys
o = json.loads(sys.argv[1])
assert o["request_id"] == sys.argv[2], o["request_id"]
assert "injected" not in o and "y" not in o, sorted(o)
assert isinstance(o["generated"], list) and isinstance(o["settings"], dict) and isinstance(o["seconds"], float)
assert isinstance(o["memory"]["weights"], int) and o["server_prompt_tokens"] == o["n_prompt"]
assert o["token_count_agrees"] is True and o["prompt_source"] == "rendered"
PY
then ok "an id with quotes round-trips as one string and adds no key"; else bad "json injection: $out"; fi

# errors: not a record, unknown id, a model without a tokenizer
echo '{"hello": 1}' >"$work/not-a-record.json"
out=$($st run --model "$work/model" --request "$work/not-a-record.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "not a capture record" <<<"$out" && ok "a file that is not a record: $out" || bad "not a record: rc $rc $out"
out=$($st run --model "$work/model" --request nosuchid --store "$work/empty" 2>&1); rc=$?
[ $rc -eq 1 ] && ok "an id with no capture store: $out" || bad "unknown id: rc $rc $out"
out=$($st run --model "$data/oracle/tiny" --request "$work/agree.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "tokenizer" <<<"$out" && ok "a model without tokenizer.json: $out" || bad "no tokenizer: rc $rc $out"

# the way users get there: capture through the proxy (fake upstream on loopback), then
# `run --request last` from the same store
FAKE=${ST_BUILD_DIR:?}/tests/fake_upstream
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
"$FAKE" --port-file "$work/fake.port" >/dev/null &
fake_pid=$!
for _ in $(seq 100); do [ -s "$work/fake.port" ] && break; sleep 0.05; done
$st capture --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$(cat "$work/fake.port")" --store "$work/cap" \
  --ready-file "$work/ready" 2>"$work/proxy.log" &
proxy_pid=$!
for _ in $(seq 200); do [ -s "$work/ready" ] && break; sleep 0.05; done
curl -s --noproxy '*' -H 'x-api-key: sk-ant-PLANTED-0' -H 'content-type: application/json' -d "$body" \
  "$(cat "$work/ready")/v1/messages" >"$work/answer.json"
kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null
kill "$fake_pid"; wait "$fake_pid" 2>/dev/null
out=$($st run --model "$work/model" --request last --store "$work/cap" --max-new-tokens 2 --ignore-eos 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "prompt tokens rendered with profile reference" <<<"$out"; then
  ok "capture -> run --request last: $(head -1 <<<"$out")"
else bad "capture -> run --request last: rc $rc $out"; fi
n_linked=$($st query --store "$work/cap" "SELECT count(*) FROM runs r JOIN requests q ON q.id = r.request_id" | sed -n 3p | tr -d ' ')
[ "$n_linked" = "1" ] && ok "runs.request_id joins requests.id" || bad "linked runs: '$n_linked'"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

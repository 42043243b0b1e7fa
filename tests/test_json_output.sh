#!/usr/bin/env bash
# issue 14 defect 11: every --json output of the CLI is built by the JSON library, so strings the
# user or a file controls (a trace path with a quote, a request id) stay one string value.
# (run --request's id is held by test_run_request.sh.)
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
echo '[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]' >"$work/p.json"
trace="$work/x\",\"injected\":true,\"y\":\".h5"
out=$("$st" run --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 2 --tap 'layers.1.*' \
      --positions all --store "$work/s" --out "$trace" --json 2>/dev/null)
/usr/bin/python3 - "$out" "$trace" <<'PY' && ok "run --json: a trace path with quotes is one string" || bad "run --json: $out"
import json, sys
o = json.loads(sys.argv[1]); assert o["trace"] == sys.argv[2] and "injected" not in o, o
PY
out=$("$st" replay --trace "$trace" --model "$model" --layer 1 --store "$work/s" --sweep topk=32,4 --json 2>/dev/null)
/usr/bin/python3 - "$out" "$trace" <<'PY' && ok "replay --json: the trace path round-trips, cells intact" || bad "replay --json: $out"
import json, sys
o = json.loads(sys.argv[1])
assert o["trace"] == sys.argv[2] and "injected" not in o, o
assert isinstance(o["cells"], list) and len(o["cells"]) == 2 and all(isinstance(c["metrics"], dict) for c in o["cells"])
assert isinstance(o["recorded_settings"], dict) and isinstance(o["positions"], int)
PY
# a --sweep value with a blank in it ("topk=<tab>4", which strtol once accepted and whose label
# then broke the stored row's JSON) is refused before anything runs; the stored rows stay JSON
label=$'topk=\t4'
err=$("$st" replay --trace "$trace" --model "$model" --layer 1 --store "$work/s" --sweep "$label,32" --json 2>&1 >/dev/null)
rc=$?
[ $rc -ne 0 ] && grep -q "allowed values" <<<"$err" && ok "replay --sweep 'topk=<tab>4': refused (exit $rc): $(head -1 <<<"$err")" ||
  bad "replay --sweep 'topk=<tab>4': exit $rc: $err"
"$st" query --json "SELECT metrics FROM replays" --store "$work/s" 2>/dev/null >"$work/metrics.json"
/usr/bin/python3 - "$work/metrics.json" <<'PY' && ok "replays.metrics: every stored row is JSON, none of the refused sweep" || bad "replays.metrics: $(head -c 600 "$work/metrics.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
labels = [json.loads(r["metrics"])["label"] for r in rows]
assert len(labels) == 2 and not any("\t" in l for l in labels), labels
PY
# sweep keys whose assignments together pass the label's 255 bytes: the label is cut there (it
# overran its buffer from the fourth key on; the ASan build caught it)
theta=compress_rope_theta=1000000.$(printf '0%.0s' $(seq 50))
out=$("$st" replay --trace "$trace" --model "$model" --layer 1 --store "$work/s2" --sweep "$theta" --sweep "$theta" \
      --sweep "$theta" --sweep "$theta" --sweep "$theta" --json 2>/dev/null)
/usr/bin/python3 - "$out" "$theta" <<'PY' && ok "replay: a label longer than its buffer is cut, not overrun" || bad "replay long label: $out"
import json, sys
label = json.loads(sys.argv[1])["cells"][0]["metrics"]["label"]
assert len(label) == 255 and " ".join([sys.argv[2]] * 5).startswith(label), label
PY
for cmd in taps settings; do
  "$st" $cmd --json | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); assert isinstance(d, list) and d and all("name" in x and "doc" in x for x in d)' \
    && ok "$cmd --json parses" || bad "$cmd --json"
done
echo "$failures failure(s)"
[ $failures -eq 0 ]

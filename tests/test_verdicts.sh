#!/usr/bin/env bash
# Needle verdicts end to end on the needle model needle-v4 (a 2k-token agentic prompt with a
# "Working directory: ..." line at 55%, answered correctly), and the README walk-through's quotes
# on its own request (needle-v5, 16k tokens):
#  - --needle TEXT is matched in the prompt only, by one function, in run, replay and bisect;
#  - the one needle verdict (schemas/needle-verdicts.md): run's lines, the views, replay, bisect
#    and needle sweep give the same counts and the same verdict for every layer;
#  - bisect: a flip in either direction is a flip; a change of counts is called one;
#  - replay --json: bit_exact is null when no recorded-settings cell ran.
# Bounded: about 30 s.
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
# ---------------------------------------------------------------- 1. one needle verdict everywhere
# the reference: per CSA layer, from the recorded top-k sets alone, the answer positions
# [n_prompt - 1, n_prompt - 1 + needle tokens) the trace holds, where a row covering the needle is
# selected (kept), and retrieves = kept at more than half of them
cat >"$work/brute.py" <<'PY'
import sys, json, h5py, numpy as np
trace, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
f = h5py.File(trace, "r")
cfg = json.loads(f.attrs["config"])
n_prompt = int(f["tokens"].attrs["n_prompt"])
out = {}
for layer in range(cfg["num_hidden_layers"]):  # the CSA layers: those with an indexer
    name = f"layers.{layer}.indexer.topk"
    if name not in f["taps"]: continue
    m = cfg["compress_ratios"][layer] if "compress_ratios" in cfg else 4
    topk = f["taps"][name][()]
    pos = f[f"positions/{name}"][()] if f"positions/{name}" in f else np.arange(topk.shape[0])
    rows = {j for j in range(0, b // m + 2) if m * (j - 1) < b and m * j + m - 1 >= a}
    judged = [i for i, p in enumerate(pos) if n_prompt - 1 <= p < n_prompt - 1 + (b - a)]
    kept = sum(1 for i in judged if rows & set(int(x) for x in topk[i]))
    out[str(layer)] = {"kept": kept, "positions": len(judged), "retrieves": 2 * kept > len(judged)}
print(json.dumps(out))
PY
# consistent LABEL VERDICTS_JSON: {"layer": {"kept", "positions", "retrieves"}} must equal $ref
consistent() {
  if $py - "$ref" "$2" <<'PY'
import json, sys
ref, got = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert set(got) == set(ref), (sorted(got), sorted(ref))
for layer, r in ref.items():
    g = got[layer]
    assert (g["kept"], g["positions"], bool(g["retrieves"])) == (r["kept"], r["positions"], r["retrieves"]), (layer, g, r)
PY
  then ok "$1 gives the reference verdict"; else bad "$1: $2 vs reference $ref"; fi
}
# answered DIR QUERY_WHERE: the view's verdicts as {"layer": {...}}
viewed() {
  $st query --store "$1" --json "SELECT layer, answer_positions AS positions, answer_positions_kept AS kept, retrieves FROM needle_rank_by_layer WHERE $2" |
    $py -c 'import json,sys; print(json.dumps({str(r["layer"]): r for r in json.load(sys.stdin)}))' 2>&1
}
ref=$($py "$work/brute.py" "$work/t.h5" "$a" "$b") || bad "brute force"
# the walk-through's numbers: layer 5 keeps the needle at 14 of the 15 answer positions
consistent "the brute force (the README's numbers)" \
  '{"1": {"kept": 1, "positions": 15, "retrieves": false}, "3": {"kept": 4, "positions": 15, "retrieves": false}, "5": {"kept": 14, "positions": 15, "retrieves": true}}'
# run's printed lines: "needle layer L retrieves yes|no in the top-K at X of Y answer positions"
got=$($py - "$work/run.txt" <<'PY'
import re, sys, json
out = {}
for m in re.finditer(r"^needle layer (\d+) +retrieves (yes|no) +in the top-\d+ at (\d+) of (\d+) answer positions", open(sys.argv[1]).read(), re.M):
    out[m[1]] = {"kept": int(m[3]), "positions": int(m[4]), "retrieves": m[2] == "yes"}
print(json.dumps(out))
PY
)
consistent "run's lines" "$got"
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 32 --positions last \
  --needle "$needle" --store "$work/s2" --trace "$work/t2.h5" --json >"$work/run.json"
got=$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({str(L["layer"]): L for L in d["needle"]["layers"]}))' "$work/run.json" 2>&1)
consistent "run --json" "$got"
consistent "view needle_rank_by_layer over the run" "$(viewed "$work/s" "replay_id IS NULL")"
# replay of each CSA layer under the recorded settings: its cell, its table, the view over the replays
for layer in 1 3 5; do
  $st replay --trace "$work/t.h5" --model "$model" --layer $layer --store "$work/s" --needle-tokens "$a:$b" --json >"$work/r$layer.json"
done
got=$($py -c '
import json, sys
print(json.dumps({l: json.load(open(f"{sys.argv[1]}/r{l}.json"))["cells"][0]["metrics"]["needle"] for l in ("1", "3", "5")}))' "$work" 2>&1)
consistent "replay --json" "$got"
consistent "view needle_rank_by_layer over the replays" "$(viewed "$work/s" "replay_id IS NOT NULL")"
$st replay --trace "$work/t.h5" --model "$model" --layer 5 --store "$work/s2" --needle-tokens "$a:$b" >"$work/r5.txt"
if grep -qE "^recorded \(=rec\) +yes +yes +14/15 " "$work/r5.txt"; then ok "replay's table: layer 5 retrieves, 14/15"
else bad "replay's table: $(grep -A1 '^cell' "$work/r5.txt")"; fi
# bisect's good side is the recorded settings
$st bisect --trace "$work/t.h5" --model "$model" --good rotate=none --bad rotate=q --needle-tokens "$a:$b" --json >"$work/b.json"
got=$($py -c 'import json,sys; print(json.dumps({str(L["layer"]): L["good"] for L in json.load(open(sys.argv[1]))["layers"]}))' "$work/b.json" 2>&1)
consistent "bisect's table" "$got"
# needle sweep: the attempt's verdict is the view's and the reference's over the attempt's trace
$st needle sweep --model "$model" --tokens 2k --positions 0.55 --seeds 1 --first-seed 3 --store "$work/sw" --json >"$work/sw.json" 2>"$work/sw.err"
run_id=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["attempt_rows"][0]["run_id"])' "$work/sw.json" 2>&1)
read -r sa sb < <($py -c 'import json,sys; print(*json.load(open(sys.argv[1]))["attempt_rows"][0]["needle_tokens"])' "$work/sw.json")
ref=$($py "$work/brute.py" "$work/sw/runs/$run_id.h5" "$sa" "$sb") || bad "brute force of the sweep's trace"
consistent "needle sweep's stored verdicts" "$(viewed "$work/sw" "run_id = '$run_id'")"
if $py - "$ref" "$work/sw.json" <<'PY'
import json, sys
ref, a = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))["attempt_rows"][0]
assert a["needle_layers_retrieving"] == [int(l) for l, r in ref.items() if r["retrieves"]], (a, ref)
assert a["needle_layers_judged"] == len(ref), a
PY
then ok "needle sweep's attempt names the layers that retrieve the needle"; else bad "needle sweep: $(head -c 600 "$work/sw.json")"; fi

# ---------------------------------------------------------------- 3. bisect: a flip either way is a flip
# topk=all keeps every visible row: layers 1 and 3 go from "no" to "yes", layer 5 from 14/15 to 15/15
$st bisect --trace "$work/t.h5" --model "$model" --good topk=32 --bad topk=all --needle-tokens "$a:$b" --json >"$work/ball.json"
rc=$?
if [ $rc -eq 0 ] && $py - "$work/ball.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
L = {x["layer"]: x for x in d["layers"]}
assert (L[3]["good"]["retrieves"], L[3]["good"]["kept"], L[3]["bad"]["retrieves"], L[3]["bad"]["kept"]) == (False, 4, True, 15), L[3]
assert L[1]["flips"] and L[3]["flips"] and not L[5]["flips"] and L[5]["counts_change"], L
assert d["first_flip_layer"] == 1 and d["changes"][0]["alone_flips_at"] == 1, d
assert "makes layer 1 retrieve the needle" in d["explanation"], d["explanation"]
PY
then ok "bisect topk=32 -> all: layers 1 and 3 flip no -> yes (exit 0)"; else bad "bisect topk=32 -> all (exit $rc): $(cat "$work/ball.json")"; fi
# ---------------------------------------------------------------- 1. bisect's sentence: counts are counts
# rotate=q: layer 1 flips (1/15 -> 8/15); layer 5 keeps the needle at 11 of 15 instead of 14 and
# still retrieves it: the sentence must not call that lost, and must say it is a change in counts
$st bisect --trace "$work/t.h5" --model "$model" --good rotate=none --bad rotate=q --needle-tokens "$a:$b" >"$work/bq.txt"
rc=$?
sentence=$(tail -2 "$work/bq.txt" | head -1)
if [ $rc -eq 0 ] && grep -q "5 .* yes  *14/15 .* yes  *11/15 .*counts change, no flip" "$work/bq.txt" &&
   ! grep -q "loses the needle at layer 5" <<<"$sentence" && grep -q "without a flip at layers 3 (4 -> 6 of 15) and 5 (14 -> 11 of 15)" <<<"$sentence"; then
  ok "bisect rotate=q: layer 5's 14 -> 11 of 15 is called a change in counts"
else bad "bisect rotate=q: $(cat "$work/bq.txt")"; fi
$st bisect --trace "$work/t.h5" --model "$model" --good topk=32 --bad topk=16 --needle-tokens "$a:$b" >"$work/b16.txt"
rc=$?
if [ $rc -eq 1 ] && grep -q "changes no layer's verdict; at layer 3 it changes the counts .*a change in counts, not of the verdict" "$work/b16.txt"; then
  ok "bisect topk=16: no flip, a change in counts at layer 3, said so (exit 1)"
else bad "bisect topk=16 (exit $rc): $(tail -3 "$work/b16.txt")"; fi
# ---------------------------------------------------------------- 7. the README walk-through
# its request (models/needle-v5, 16k tokens, needle make's first seed, the path at 55%): the run's
# line for layer 5 and bisect's sentence are quoted as the commands print them
wmodel=$src/models/needle-v5
if [ -f "$wmodel/model.safetensors" ]; then
  $st needle make --model "$wmodel" --tokens 16k --position 0.55 --seed 1 --kind path --format openai-chat \
    --thinking off --out "$work/wreq.json" --meta "$work/wneedle.json" 2>/dev/null
  $st render --request "$work/wreq.json" --model "$wmodel" --thinking off --ids >"$work/wprompt.json"
  $st run --model "$wmodel" --prompt-tokens "$work/wprompt.json" --max-new-tokens 32 --positions last \
    --needle "$(field "$work/wneedle.json" needle)" --store "$work/w" --trace "$work/w.h5" >"$work/wrun.txt" || bad "the walk-through's run"
  line=$(grep "^needle layer 5 " "$work/wrun.txt")
  if [ -n "$line" ] && grep -qF -- "#   $line" "$src/README.md"; then ok "the README quotes run's line for layer 5"
  else bad "the README lacks run's line '$line'"; fi
  wa=$(field "$work/wneedle.json" needle_token) wb=$(field "$work/wneedle.json" needle_token_end)
  $st bisect --trace "$work/w.h5" --model "$wmodel" --good rotate=none --bad rotate=q --needle-tokens "$wa:$wb" >"$work/wb.txt"
  sentence=$(tail -2 "$work/wb.txt" | head -1)
  if $py - "$src/README.md" "$sentence" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
at = next(i for i, l in enumerate(lines) if l.startswith("$st bisect") and "--bad rotate=q" in l)
quoted = []
for l in lines[at + 1:]:
    if not l.startswith("#   "): break
    quoted.append(l[4:])
norm = lambda s: " ".join(s.split())
assert norm(" ".join(quoted)).startswith(norm(sys.argv[2])), (quoted, sys.argv[2])
PY
  then ok "the README quotes bisect's sentence"; else bad "the README's bisect sentence is not what bisect prints: $sentence"; fi
else bad "the walk-through's model $wmodel is missing"; fi

# ---------------------------------------------------------------- 6. replay --json bit_exact
# no recorded-settings cell ran: nothing was checked, so bit_exact is null (not true)
$st replay --trace "$work/t.h5" --model "$model" --layer 5 --store "$work/s2" --set rotate=q --json >"$work/x.json"
$st replay --trace "$work/t.h5" --model "$model" --layer 5 --store "$work/s2" --sweep rotate=none,q --json >"$work/y.json"
if $py - "$work/x.json" "$work/y.json" <<'PY'
import json, sys
x, y = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert x["bit_exact"] is None and x["cells"][0]["bit_exact"] is None, x
assert y["bit_exact"] is True and [c["bit_exact"] for c in y["cells"]] == [True, None], y
PY
then ok "replay --json: bit_exact null without a recorded-settings cell, true with one"; else bad "replay bit_exact: $(head -c 300 "$work/x.json")"; fi

[ $failures -eq 0 ] && echo "all verdict checks passed" || echo "$failures verdict check(s) FAILED"
exit $((failures > 0))

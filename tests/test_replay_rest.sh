#!/usr/bin/env bash
# `replay --stage rest` on the bundled needle model, from a run that recorded layer 5 at every
# position but no logits: the cell of a --set is named by its settings, the table says why KL and
# greedy are '-', the continuation stops after the end of sentence as `run` does, and is printed
# as text (the model has a tokenizer). Bounded: about 20 s.
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

$st needle make --model "$model" --tokens 1k --position 0.5 --seed 3 --kind path --format openai-chat \
  --thinking off --out "$work/req.json" --meta "$work/needle.json" 2>/dev/null
$st render --request "$work/req.json" --model "$model" --thinking off --ids >"$work/prompt.json"
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 32 --tap 'layers.5.*' --positions all \
  --store "$work/s" --trace "$work/all.h5" --json >"$work/run.json" || { echo "FAIL: run"; exit 1; }
expected=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["expected"])' "$work/needle.json")

# the recorded settings as a sweep cell: its continuation is the recorded answer, which ends at
# the end of sentence: the continuation must stop there too (--continue asks for up to 32)
$st replay --trace "$work/all.h5" --model "$model" --layer 5 --stage rest --sweep rotate=none,q --continue 32 \
  --store "$work/s" --json >"$work/rest.json" 2>"$work/rest.err"
if $py - "$work/run.json" "$work/rest.json" "$model/config.json" <<'PY'
import json, sys
run, rest, cfg = (json.load(open(p)) for p in sys.argv[1:4])
eos = cfg["eos_token_id"]
eos = set(eos if isinstance(eos, list) else [eos])
cells = {c["settings"]["rotate"]: c for c in rest["cells"]}
recorded = cells["none"]["metrics"]["continuation"]
assert recorded == run["generated"], (recorded, run["generated"])
for name, c in cells.items():
    ids = c["metrics"]["continuation"]
    assert not any(i in eos for i in ids[:-1]), (name, ids)  # nothing after the end of sentence
PY
then ok "the continuation stops after the end of sentence (the recorded cell's is the run's answer)"
else bad "continuation: $(head -c 600 "$work/rest.json") $(cat "$work/rest.err")"; fi
if $py - "$work/rest.json" "$expected" <<'PY'
import json, sys
rest, expected = json.load(open(sys.argv[1])), sys.argv[2]
cells = {c["settings"]["rotate"]: c for c in rest["cells"]}
assert expected in cells["none"]["continuation_text"], cells["none"].get("continuation_text")
PY
then ok "replay --json decodes the continuation (continuation_text)"; else bad "continuation_text: $(head -c 400 "$work/rest.json")"; fi

$st replay --trace "$work/all.h5" --model "$model" --layer 5 --stage rest --set rotate=q --continue 32 \
  --store "$work/s" >"$work/set.txt" 2>&1
if grep -qE '^rotate=q +' "$work/set.txt"; then ok "the --set cell is labelled rotate=q"; else bad "cell label: $(grep -A1 '^cell' "$work/set.txt")"; fi
if grep -q "KL_mean and greedy are '-': .* holds no logits tap" "$work/set.txt"; then ok "the table says why KL and greedy are '-'"
else bad "no reason for '-': $(cat "$work/set.txt")"; fi
if grep -qE '^    text "' "$work/set.txt"; then ok "the continuation is printed as text"; else bad "no text line: $(cat "$work/set.txt")"; fi

[ $failures -eq 0 ] && echo "all replay --stage rest checks passed" || echo "$failures check(s) FAILED"
exit $((failures > 0))

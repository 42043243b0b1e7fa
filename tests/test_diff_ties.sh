#!/usr/bin/env bash
# End to end: `sparsetrace diff`'s tie-aware top-k comparison and its tolerances for imported
# traces. Traces recorded by `sparsetrace run` on the bundled tiny model are edited with h5py so
# that the answer is known by construction: at one position of layer 1, B's top-k swaps A's
# lowest-scoring selected row (the boundary) for an unselected visible row. When the scores say
# the two rows tie (the unselected row's score set equal to the boundary), both sets are valid
# top-k selections: a tie, not a divergence. With the original scores, or with a second swap of a
# row that does not tie, it must still diverge. Then: a trace with an `import` attribute switches
# the defaults to the imported-engine profile, which diff names, and rotate=q still diverges at
# the rotated query under it. The report's diff table prints the same verdict. Last, real exact
# ties: a random model with one indexer head, re-selected with the other tie order.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
model=${ST_TEST_DATA:?}/oracle/tiny
PY_BIN=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then pass "$1"; else failed "$1"; fi; }
diff_rc() { # diff_rc DESCRIPTION WANT_RC ARGS...: diff --json into $work/out.json
  local rc
  $st diff --json "${@:3}" >"$work/out.json" 2>"$work/err.txt"; rc=$?
  if [ $rc -ne "$2" ]; then failed "$1: exit $rc, wanted $2: $(head -c 300 "$work/err.txt")"; return 1; fi
  pass "$1 (exit $rc)"
}
json_check() { # json_check DESCRIPTION PYTHON_EXPR (d = the JSON, t = taps by name)
  if /usr/bin/python3 -c "import json,sys; d = json.load(open('$work/out.json')); t = {x['name']: x for x in d['taps']}; sys.exit(0 if ($2) else 1)"; then
    pass "$1"
  else
    failed "$1: $(/usr/bin/python3 -c "import json; d = json.load(open('$work/out.json')); print(json.dumps([x for x in d['taps'] if x['tap'] == 'indexer.topk'])[:600])" 2>&1)"
  fi
}

awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 200; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/prompt.json"
record() {
  $st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 2 --ignore-eos \
    --tap 'layers.*' --tap logits --trace "$work/$1.h5" --store "$work/store" "${@:2}" >/dev/null \
    || failed "recording $1"
}
record a
record rotq --set rotate=q

# The edits. P = position 150 of layer 1 (a CSA layer; 37 visible rows, top-32). kth = A's
# selected row with the lowest score, out = the highest-scoring visible row not selected, far = the
# lowest-scoring visible unselected row, top = the highest-scoring selected row.
check "h5py builds the tie and non-tie copies" /usr/bin/python3 - "$work" <<'PY'
import sys, shutil, json, h5py, numpy as np
w = sys.argv[1]
P, L = 150, "taps/layers.1.indexer"
f = h5py.File(f"{w}/a.h5", "r")
s, k = f[L + ".scores"][P], f[L + ".topk"][P]
f.close()
sel = k[k >= 0]
vis = np.flatnonzero(np.isfinite(s))
rest = np.setdiff1d(vis, sel)
assert len(sel) == 32 and len(rest) >= 2, (len(sel), len(rest))
kth = sel[np.argmin(s[sel])]
out = rest[np.argmax(s[rest])]
far = rest[np.argmin(s[rest])]
top = sel[np.argmax(s[sel])]
assert s[out] < s[kth] and s[far] < s[out]  # no tie in the engine's own scores
def edit(name, scores=None, topk=None, drop_scores=False):
    shutil.copy(f"{w}/a.h5", f"{w}/{name}.h5")
    g = h5py.File(f"{w}/{name}.h5", "r+")
    if scores is not None:
        row = g[L + ".scores"][P]
        for j, v in scores.items(): row[j] = v
        g[L + ".scores"][P] = row
    if topk is not None:
        row = np.full(k.shape, -1, np.int32)
        row[:len(topk)] = np.sort(topk)
        g[L + ".topk"][P] = row
    if drop_scores:
        del g[L + ".scores"]
    g.close()
swap = np.where(sel == kth, out, sel)             # kth -> out
swap2 = np.where(sel == top, far, swap)           # and top -> far
edit("a_tie", scores={out: s[kth]})               # A's scores: out ties the boundary
edit("b_swap", topk=swap)                         # B selected out instead of kth
edit("b_swap2", topk=swap2)
edit("b_swap_noscores", topk=swap, drop_scores=True)
edit("a_tie_noscores", scores={out: s[kth]}, drop_scores=True)
json.dump({"kth": int(kth), "out": int(out), "far": int(far), "top": int(top), "boundary": float(s[kth])},
          open(f"{w}/rows.json", "w"))
PY
rows=$(cat "$work/rows.json")

# 1. a swap of two rows tied at the boundary in A's scores: a tie, exit 0
diff_rc "tied swap is no divergence" 0 --tap 'layers.1.indexer.topk' "$work/a_tie.h5" "$work/b_swap.h5"
json_check "verdict tie, one tie row at 150, judged by A's scores at the boundary; Jaccard counts it as equal" \
  "(r := $rows) and (x := t['layers.1.indexer.topk']) and x['verdict'] == 'tie' and not x['diverges'] and x['tie_rows'] == 1 and x['first_tie']['position'] == 150 and x['first_tie']['judged_by'] == 'A' and x['first_tie']['boundary_score'] == r['boundary'] and x['value'] == 1 and x['worst']['only_a'] == [r['kth']] and x['worst']['only_b'] == [r['out']] and d['first_divergence'] is None"
out=$($st diff --tap 'layers.1.indexer.topk' "$work/a_tie.h5" "$work/b_swap.h5")
check "text: 'ties only', 'no divergence' and the tie's detail" \
  grep -qE 'ties only.*first tie at pos 150.*1 row differ only by ties at the boundary score' <<<"$out"
check "text: no divergence" grep -q '^no divergence' <<<"$out"
$st report "$work/a_tie.h5" "$work/b_swap.h5" -o "$work/report.html" --store "$work/store" >/dev/null 2>&1 \
  || failed "report of the tied pair"
check "report: the tap's row says 'ties only'" grep -q 'layers.1.indexer.topk</td><td>ties only<' "$work/report.html"

# 2. the same swap, scores untouched: the rows do not tie, a divergence (Jaccard 31/33)
diff_rc "untied swap diverges" 1 --tap 'layers.1.indexer.topk' "$work/a.h5" "$work/b_swap.h5"
json_check "diverges at 150 by jaccard 31/33, no tie rows" \
  "(x := t['layers.1.indexer.topk']) and x['verdict'] == 'diverges' and x['tie_rows'] == 0 and abs(x['value'] - 31/33) < 1e-12 and d['first_divergence']['position'] == 150"

# 3. the tied swap plus one that does not tie: still a divergence (Jaccard 30/34)
diff_rc "a tie and a non-tie in one row diverge" 1 --tap 'layers.1.indexer.topk' "$work/a_tie.h5" "$work/b_swap2.h5"
json_check "diverges by jaccard 30/34" \
  "(x := t['layers.1.indexer.topk']) and x['verdict'] == 'diverges' and x['tie_rows'] == 0 and abs(x['value'] - 30/34) < 1e-12"

# 4. whose scores judge: A's when A holds them, else B's
diff_rc "A without scores: B's scores judge (a tie)" 0 --tap 'layers.1.indexer.topk' "$work/b_swap_noscores.h5" "$work/a_tie.h5"
json_check "judged by B" "t['layers.1.indexer.topk']['verdict'] == 'tie' and t['layers.1.indexer.topk']['first_tie']['judged_by'] == 'B'"
diff_rc "A's own scores (no tie there) decide over B's" 1 --tap 'layers.1.indexer.topk' "$work/b_swap.h5" "$work/a_tie.h5"
diff_rc "neither holds scores: a divergence" 1 --tap 'layers.1.indexer.topk' "$work/b_swap_noscores.h5" "$work/a_tie_noscores.h5"
# rule exact compares bits and excuses nothing
diff_rc "exact excuses no tie" 1 --tap 'layers.1.indexer.topk' --tolerance 'indexer.topk=exact' "$work/a_tie.h5" "$work/b_swap.h5"

# 5. tolerance profiles: two runs of the engine name the same-engine defaults
diff_rc "a against itself" 0 "$work/a.h5" "$work/a.h5"
json_check "profile same-engine, diff:1e-6" \
  "d['tolerances']['profile'] == 'same-engine' and d['tolerances']['imported'] is None and t['layers.1.attn.out']['threshold'] == 1e-6"
check "h5py marks a copy as imported" /usr/bin/python3 - "$work" <<'PY'
import sys, shutil, h5py
w = sys.argv[1]
for src, dst in (("a", "imp"), ("rotq", "rotq_imp")):
    shutil.copy(f"{w}/{src}.h5", f"{w}/{dst}.h5")
    with h5py.File(f"{w}/{dst}.h5", "r+") as f:
        f.attrs["import"] = '{"format":"hf","source":{"dtype":"bfloat16"}}'
PY
diff_rc "a against its imported copy" 0 "$work/a.h5" "$work/imp.h5"
json_check "profile imported (B), per-tap defaults of the profile" \
  "d['tolerances']['profile'] == 'imported' and d['tolerances']['imported'] == 'B' and t['layers.1.attn.out']['threshold'] == 1e-3 and t['layers.1.indexer.scores']['threshold'] == 3e-2 and t['layers.1.indexer.q_used']['threshold'] == 3e-2 and t['logits']['threshold'] == 1e-2 and t['layers.1.indexer.topk']['threshold'] == 0.9 and t['layers.1.ffn.experts']['threshold'] == 0.7 and t['layers.1.indexer.topk']['rule'] == 'indexer.topk=jaccard:0.9 (default)'"
out=$($st diff "$work/imp.h5" "$work/a.h5")
check "text names the profile and its rules" \
  grep -qE '^tolerances: defaults for an imported engine \(A is imported.*indexer.scores=diff:0.03.*indexer.topk=jaccard:0.9' <<<"$out"
diff_rc "user rules still come first" 1 --tolerance '*=diff:0' --tap 'layers.1.indexer.scores' "$work/a.h5" "$work/a_tie.h5"
diff_rc "rotate=q imported still diverges" 1 "$work/a.h5" "$work/rotq_imp.h5"
json_check "at layer 1's rotated query, beyond the imported tolerance" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.q_used' and d['first_divergence']['value'] > 3e-2 and d['first_divergence']['threshold'] == 3e-2"

# 6. exact ties from a real run: a random model with one indexer head scores many rows exactly 0
# (the ReLU of the head's dot product), often at the top-k boundary. B re-selects every top-k row
# from A's own scores breaking ties towards the highest index, as another engine may: each row
# that changes is a tie, and the count is numpy's.
$PY_BIN "$src/tools/make_random_checkpoint.py" "$work/rnd1" --index-heads 1 --topk 8 --window 16 >/dev/null \
  || failed "writing the random one-head checkpoint"
$st run --model "$work/rnd1" --prompt-tokens "$work/prompt.json" --max-new-tokens 1 --tap 'layers.*.indexer.*' \
  --trace "$work/one.h5" --store "$work/store" >/dev/null || failed "recording the one-head run"
check "h5py re-selects the top-k with the other tie order" $PY_BIN - "$work" <<'PY'
import sys, json, shutil, h5py, numpy as np
w = sys.argv[1]
shutil.copy(f"{w}/one.h5", f"{w}/one_hi.h5")
f = h5py.File(f"{w}/one_hi.h5", "r+")
changed = {}
for name in list(f["taps"]):
    if not name.endswith("indexer.topk"):
        continue
    s = f["taps"][name.replace("topk", "scores")][()]
    k = f["taps"][name][()]
    n = 0
    for p in range(len(k)):
        sel = k[p][k[p] >= 0]
        vis = np.flatnonzero(np.isfinite(s[p]))
        order = sorted(vis, key=lambda j: (-s[p][j], -j))  # highest score first, ties: highest index
        alt = np.sort(np.array(order[:len(sel)], dtype=np.int32))
        if set(alt.tolist()) != set(sel.tolist()):
            n += 1
        row = np.full(k.shape[1], -1, np.int32)
        row[:len(alt)] = alt
        k[p] = row
    f["taps"][name][...] = k
    changed[name] = n
f.close()
assert sum(changed.values()) > 10, changed  # the one-head model ties often (else the test proves nothing)
json.dump(changed, open(f"{w}/changed.json", "w"))
PY
diff_rc "the other tie order is no divergence" 0 --tap 'indexer.topk' "$work/one.h5" "$work/one_hi.h5"
json_check "every changed row is a tie; tie_rows equal numpy's count per layer" \
  "(c := json.load(open('$work/changed.json'))) and all(t[n]['verdict'] == ('tie' if c[n] else 'ok') and t[n]['tie_rows'] == c[n] and t[n]['first_tie' if c[n] else 'tie_rows'] is not None for n in c)"
diff_rc "rule exact still sees the changed sets" 1 --tap 'indexer.topk' --tolerance 'indexer.topk=exact' "$work/one.h5" "$work/one_hi.h5"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# End to end: the IndexCache setting index_topk_reuse (schemas/settings.def) on the bundled needle
# model (CSA layers 1, 3, 5). With N=1 the bits equal the default run (every tap compared with
# numpy); with N=2 layer 3 selects with layer 1's top-k and layer 5 computes its own, with N=3 both
# 3 and 5 reuse layer 1's; a reusing layer scores nothing (no indexer.scores tap). The pattern form
# (sglang's index_topk_pattern: one F or S per model layer) gives the same bits as the number it
# spells. Replay of a reusing layer reproduces the recorded tensors bit for bit at every stage, and
# a replay sweep of index_topk_reuse on a trace recorded without it selects exactly what the
# recorded computing layer selected (Jaccard against layer 3's own top-k = numpy's). Bad values
# are refused with a message naming the setting.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
model=$src/models/needle-v4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then pass "$1"; else failed "$1"; fi; }
expect_fail() { # expect_fail DESCRIPTION PATTERN ARGS...: exit non-zero with a message matching PATTERN
  local out rc
  out=$("${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ]; then failed "$1: exit 0"; return; fi
  if ! grep -qE -- "$2" <<<"$out"; then failed "$1: message '$out' lacks /$2/"; return; fi
  pass "$1 -> $(head -1 <<<"$out")"
}

awk 'BEGIN { s = 11; printf "["; for (i = 0; i < 160; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), 100 + int(s / 65536) % 3000 } print "]" }' >"$work/prompt.json"
record() { # record NAME [run options]...
  $st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 3 --ignore-eos \
    --tap 'layers.*' --tap logits --trace "$work/$1.h5" --store "$work/store" "${@:2}" >/dev/null \
    || failed "recording $1"
}
record def
record r1 --set index_topk_reuse=1
record r2 --set index_topk_reuse=2
record r3 --set index_topk_reuse=3
record p2 --set index_topk_reuse=FFFSFF   # layer 3 reuses, 1 and 5 compute: N=2 spelled out

check "N=1: every tap and the tokens equal the default run, bit for bit" /usr/bin/python3 - "$work" <<'PY'
import sys, h5py, numpy as np
w = sys.argv[1]
a, b = h5py.File(f"{w}/def.h5", "r"), h5py.File(f"{w}/r1.h5", "r")
assert sorted(a["taps"]) == sorted(b["taps"]), "tap lists differ"
for name in a["taps"]:
    x, y = a["taps"][name][()], b["taps"][name][()]
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
assert np.array_equal(a["tokens"][()], b["tokens"][()])
print(len(a["taps"]), "taps equal")
PY

check "N=2 and N=3: each reusing layer's top-k is the computing layer's; it has no scores" /usr/bin/python3 - "$work" <<'PY'
import sys, json, h5py, numpy as np
w = sys.argv[1]
d = h5py.File(f"{w}/def.h5", "r")["taps"]
def topk(f, l): return f[f"layers.{l}.indexer.topk"][()]
for name, reusing in (("r2", {3: 1}), ("r3", {3: 1, 5: 1})):
    f = h5py.File(f"{w}/{name}.h5", "r")
    t = f["taps"]
    assert json.loads(f.attrs["settings"])["index_topk_reuse"] == int(name[1])
    for l, source in reusing.items():
        assert np.array_equal(topk(t, l), topk(t, source)), (name, l)
        assert f"layers.{l}.indexer.scores" not in t, (name, l)
        assert f"layers.{l}.indexer.q" in t  # the indexer's own inputs are still recorded
    for l in (1, 3, 5):
        if l not in reusing:
            assert f"layers.{l}.indexer.scores" in t
    # everything before the first reusing layer is the default run's
    assert np.array_equal(topk(t, 1), topk(d, 1)) and t["layers.3.input"][()].tobytes() == d["layers.3.input"][()].tobytes()
    # the reuse changes what layer 3 selects on this prompt (else the test proves nothing)
    assert not np.array_equal(topk(t, 3), topk(d, 3)), name
# N=2: layer 5 computes its own top-k again
t2 = h5py.File(f"{w}/r2.h5", "r")["taps"]
assert not np.array_equal(topk(t2, 5), topk(t2, 1))
print("ok")
PY

check "the pattern form equals the number it spells, bit for bit" /usr/bin/python3 - "$work" <<'PY'
import sys, json, h5py
w = sys.argv[1]
a, b = h5py.File(f"{w}/r2.h5", "r"), h5py.File(f"{w}/p2.h5", "r")
assert json.loads(b.attrs["settings"])["index_topk_reuse"] == "FFFSFF"
assert sorted(a["taps"]) == sorted(b["taps"])
for name in a["taps"]:
    assert a["taps"][name][()].tobytes() == b["taps"][name][()].tobytes(), name
PY

# replay of a reusing layer: the recorded settings reproduce the recorded tensors bit for bit
for stage in indexer attention layer rest; do
  out=$($st replay --trace "$work/r3.h5" --model "$model" --layer 5 --stage $stage --store "$work/store" --json 2>"$work/err.txt")
  check "replay --stage $stage of reusing layer 5 is bit-exact" \
    /usr/bin/python3 -c "import json,sys; d = json.loads(sys.argv[1]); sys.exit(0 if d['bit_exact'] is True and d['cells'][0]['metrics']['topk_jaccard_min'] == 1 else 1)" "$out"
done
out=$($st replay --trace "$work/p2.h5" --model "$model" --layer 3 --stage layer --store "$work/store" --json 2>"$work/err.txt")
check "replay of the pattern form's reusing layer is bit-exact" \
  /usr/bin/python3 -c "import json,sys; sys.exit(0 if json.loads(sys.argv[1])['bit_exact'] is True else 1)" "$out"

# a sweep on a run without reuse: the cell index_topk_reuse=3 selects layer 1's recorded top-k at
# layer 5, so its Jaccard against layer 5's own recorded top-k is numpy's Jaccard of the two taps
out=$($st replay --trace "$work/def.h5" --model "$model" --layer 5 --sweep index_topk_reuse=1,3 --store "$work/store" --json 2>"$work/err.txt")
check "sweep index_topk_reuse=1,3: reuse cell's Jaccard equals numpy's of layer 1 vs layer 5" /usr/bin/python3 - "$work" "$out" <<'PY'
import sys, json, h5py, numpy as np
w, d = sys.argv[1], json.loads(sys.argv[2])
t = h5py.File(f"{w}/def.h5", "r")["taps"]
a, b = t["layers.1.indexer.topk"][()], t["layers.5.indexer.topk"][()]
j = []
for x, y in zip(a, b):
    x, y = set(x[x >= 0].tolist()), set(y[y >= 0].tolist())
    j.append(len(x & y) / len(x | y) if x | y else 1.0)
cells = {c["settings"]["index_topk_reuse"]: c for c in d["cells"]}
assert cells[1]["bit_exact"] is True
m = cells[3]["metrics"]
assert abs(m["topk_jaccard_mean"] - float(np.mean(j))) < 1e-6 and abs(m["topk_jaccard_min"] - min(j)) < 1e-6, (m, np.mean(j))  # JSON keeps 6 digits
assert min(j) < 1
PY
# the other way round: r3's layer 5 replayed under index_topk_reuse=1 selects its own top-k again
out=$($st replay --trace "$work/r3.h5" --model "$model" --layer 5 --stage layer --sweep index_topk_reuse=3,1 --store "$work/store" --json 2>"$work/err.txt")
check "r3 layer 5 under index_topk_reuse=1 no longer selects layer 1's top-k" \
  /usr/bin/python3 -c "import json,sys; c = {x['settings']['index_topk_reuse']: x for x in json.loads(sys.argv[1])['cells']}; sys.exit(0 if c[3]['bit_exact'] is True and c[1]['metrics']['topk_jaccard_min'] < 1 else 1)" "$out"

# bisect takes it like any setting: under index_topk_reuse=3, layers 3 and 5 select layer 1's
# top-k, so they keep the needle at exactly as many answer positions as layer 1 does
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 12 --ignore-eos \
  --tap 'layers.*.indexer.*' --needle-tokens 60:72 --trace "$work/nd.h5" --store "$work/store" >/dev/null || failed "recording nd"
$st bisect --trace "$work/nd.h5" --model "$model" --good index_topk_reuse=1 --bad index_topk_reuse=3 \
  --needle-tokens 60:72 --json >"$work/bisect.json" 2>"$work/err.txt"
rc=$?
check "bisect index_topk_reuse 1 -> 3 runs (exit $rc)" test $rc -le 1
check "bisect: the reusing layers keep the needle where layer 1 does" /usr/bin/python3 - "$work/bisect.json" <<'PY'
import sys, json
d = json.load(open(sys.argv[1]))
L = {x["layer"]: x for x in d["layers"]}
k1 = L[1]["bad"]["kept"]
assert L[1]["good"]["kept"] == k1 and L[3]["bad"]["kept"] == k1 and L[5]["bad"]["kept"] == k1, L
assert any(L[l]["good"]["kept"] != k1 for l in (3, 5))  # the reuse changes something here
PY

# a replay that needs a reused top-k the trace does not hold
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 1 --tap 'layers.5.*' \
  --trace "$work/only5.h5" --store "$work/store" --set index_topk_reuse=3 >/dev/null || failed "recording only5"
expect_fail "replay without the reused layer's top-k" "layer 5 reuses layer 1's top-k: .*holds no tap layers.1.indexer.topk" \
  $st replay --trace "$work/only5.h5" --model "$model" --layer 5 --stage layer --store "$work/store"
expect_fail "indexer replay without the reused layer's top-k" "cell recorded: layer 5 reuses layer 1's top-k: .*holds no tap layers.1.indexer.topk" \
  $st replay --trace "$work/only5.h5" --model "$model" --layer 5 --store "$work/store"

# bad values
run1() { $st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 1 --trace "$work/bad.h5" --store "$work/store" "$@"; }
expect_fail "N=0" "index_topk_reuse=0: allowed values are N\|PATTERN" run1 --set index_topk_reuse=0
expect_fail "a letter other than F and S" "index_topk_reuse=FFXS.*F \(computes its top-k\) and S" run1 --set index_topk_reuse=FFXS
expect_fail "a pattern of the wrong length" "pattern has 4 letters, the model 6 layers" run1 --set index_topk_reuse=FFFS
expect_fail "the first CSA layer reusing" "layer 1, the first CSA layer, is S" run1 --set index_topk_reuse=FSFFFF
check "sparsetrace settings lists index_topk_reuse" bash -c "'$st' settings | grep -q index_topk_reuse"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

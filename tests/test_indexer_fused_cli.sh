#!/usr/bin/env bash
# The fused indexer top-k (a backend's indexer_topk: scores in chunks of rows, a running top-k,
# no [tokens, rows] matrix) against the composition (indexer_scores, then topk) inside the
# engine, through the CLI on the cpu backend, whose table has both. The engine composes only
# where the indexer.scores tap keeps a row of the chunk, so three recordings of one request
# (chunks of 100 tokens, 330 + 3 tokens, tiny oracle model: 83 compressed rows, top-k 32) run:
#   A  every indexer tap at every position: composed in every chunk
#   B  the same taps at positions 150:260: composed in chunks 1 and 2 only, fused elsewhere
#   C  indexer.topk and logits at every position, scores not armed: fused in every chunk
# Both paths must give the same bits, so B's rows equal A's rows 150..259 and C's top-k and
# logits equal A's, bit for bit, at every position.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
py=/usr/bin/python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: Debian python3-h5py/python3-numpy missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }

awk 'BEGIN { s = 5; printf "["; for (i = 0; i < 330; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
record() { # record NAME POSITIONS TAP...
  local name=$1 positions=$2
  shift 2
  local taps=()
  for t in "$@"; do taps+=(--tap "$t"); done
  $st run --backend cpu --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 3 --ignore-eos \
    "${taps[@]}" --positions "$positions" --chunk 100 --trace "$work/$name.h5" --json \
    >"$work/$name.json" 2>"$work/$name.err" || { bad "run $name: $(tail -3 "$work/$name.err")"; exit 1; }
}
record A all 'layers.*.indexer.*' logits
record B 150:260 'layers.*.indexer.*' logits
record C all 'layers.*.indexer.topk' logits

if $py - "$work/A.h5" "$work/B.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = sorted(n for n in b["taps"] if n.endswith((".scores", ".topk", ".q_used", ".weights")) or n == "logits")
assert len(names) >= 9, names
for n in names:
    x, y = a["taps"][n][()], b["taps"][n][()]
    assert np.array_equal(b["positions"][n][()], np.arange(150, 260)), n
    x = x[150:260, : y.shape[1]] if x.ndim > 1 else x[150:260]
    assert x.shape == y.shape and x.tobytes() == y.tobytes(), n
# a score row of B past its chunk's visible rows is -inf in both; the widths differ only there
assert any(b["taps"][n].shape[1] < a["taps"][n].shape[1] for n in names if n.endswith(".scores"))
PY
then ok "positions 150:260 (fused outside chunks 1-2): every recorded row equals the all-composed run's, bit for bit"
else bad "positions 150:260: rows differ from the all-composed run"; fi

if $py - "$work/A.h5" "$work/C.h5" "$work/A.json" "$work/C.json" <<'PY'
import sys, json, h5py, numpy as np
a, c = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = sorted(n for n in c["taps"])
assert "logits" in names and sum(n.endswith(".topk") for n in names) >= 2, names
assert not any(n.endswith(".scores") for n in names), names
for n in names:
    x, y = a["taps"][n][()], c["taps"][n][()]
    assert x.shape == y.shape and x.tobytes() == y.tobytes(), n
ja, jc = (json.load(open(f)) for f in sys.argv[3:])
assert ja["generated"] == jc["generated"], (ja["generated"], jc["generated"])
PY
then ok "fused in every chunk: every layer's top-k, the logits and the greedy tokens equal the composed run's, bit for bit"
else bad "fused in every chunk differs from the composed run"; fi

[ $failures -eq 0 ] && echo "test_indexer_fused_cli: all passed" || exit 1

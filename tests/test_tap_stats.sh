#!/usr/bin/env bash
# Every summary statistic of every tap equals a brute force over the dataset as stored: for
# traces recorded by `sparsetrace run` (tiny model: every tap at all positions with generated
# tokens, --positions last, --positions A:B, chunked prefill; the needle model's indexer taps),
# numpy reads each /taps/<name> whole and computes count (elements of the dataset), finite, NaN,
# +inf and -inf counts, min, max, mean and rms over the finite values (integer taps: min, max and
# mean over all values). The dataset's attributes, `inspect --json` and the index's `taps` rows
# must all say the same. Fill values (the -inf of a scores row narrower than the dataset, the -1
# of a short top-k row) are elements of the dataset like any other. Bounded: about 20 s.
set -uo pipefail
st=${ST_BIN:?}
data=${ST_TEST_DATA:?}
src=$(cd "${ST_SOURCE_DIR:-$data/../..}" && pwd)
py=/usr/bin/python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: Debian python3-h5py/python3-numpy missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
tiny=$data/oracle/tiny
awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"

record() { # NAME ARGS...: a run into the store $work/s, trace $work/NAME.h5
  $st run --prompt-tokens "$work/p.json" --store "$work/s" --trace "$work/$1.h5" "${@:2}" >/dev/null 2>"$work/$1.err" ||
    bad "recording $1: $(tail -1 "$work/$1.err")"
}
record all --model "$tiny" --tap 'layers.*' --tap logits --max-new-tokens 6 --ignore-eos
record last --model "$tiny" --tap 'layers.*' --tap logits --positions last --max-new-tokens 6 --ignore-eos
record range --model "$tiny" --tap 'layers.*.indexer.*' --tap logits --positions 100:200
record chunked --model "$tiny" --tap 'layers.*' --chunk 7 --max-new-tokens 3 --ignore-eos --set precision=reference
if [ -f "$src/models/needle-v4/model.safetensors" ]; then
  $st needle make --model "$src/models/needle-v4" --tokens 1k --position 0.5 --seed 1 --format openai-chat \
    --thinking off --out "$work/req.json" --quiet
  $st render --request "$work/req.json" --model "$src/models/needle-v4" --thinking off --ids >"$work/p.json"
  record needle --model "$src/models/needle-v4" --tap 'layers.*.indexer.*' --positions all --max-new-tokens 8
fi

for h5 in "$work"/*.h5; do
  name=$(basename "$h5" .h5)
  $st inspect --json "$h5" >"$work/$name.inspect.json" || bad "inspect $name"
  if out=$($py - "$h5" "$work/s/index.sqlite" "$work/$name.inspect.json" 2>&1 <<'PY'
import sys, json, math, sqlite3, h5py, numpy as np
trace, index, inspect = sys.argv[1:4]
f = h5py.File(trace, "r")
run_id = f.attrs["run_id"]
db = sqlite3.connect(index)
db.row_factory = sqlite3.Row
rows = {r["name"]: dict(r) for r in db.execute("SELECT * FROM taps WHERE run_id = ?", (run_id,))}
shown = {t["name"]: t for t in json.load(open(inspect))["taps"]}
problems, checked = [], 0
def same(x, y):
    if x is None or y is None: return x is None and y is None
    return x == y or abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30)
for name, d in f["taps"].items():
    a = d[()]
    want = {"count": a.size}
    if a.dtype.kind == "f":
        v = a.astype(np.float64)
        fin = v[np.isfinite(v)]
        want.update(finite_count=fin.size, nan_count=int(np.isnan(v).sum()), posinf_count=int(np.isposinf(v).sum()),
                    neginf_count=int(np.isneginf(v).sum()))
        want["inf_count"] = want["posinf_count"] + want["neginf_count"]
        want.update(min=float(fin.min()) if fin.size else None, max=float(fin.max()) if fin.size else None,
                    mean=float(fin.mean()) if fin.size else None, rms=float(np.sqrt((fin * fin).mean())) if fin.size else None)
    else:
        v = a.astype(np.float64)
        want.update(finite_count=a.size, nan_count=0, posinf_count=0, neginf_count=0, inf_count=0,
                    min=float(v.min()) if a.size else None, max=float(v.max()) if a.size else None,
                    mean=float(v.mean()) if a.size else None, rms=None)
    for source, got in (("attribute", dict(d.attrs)), ("index", rows.get(name, {})), ("inspect --json", shown.get(name, {}))):
        for key, w in want.items():
            g = got.get(key)
            g = None if g is None else float(g) if isinstance(g, (float, np.floating)) else int(g) if isinstance(g, (int, np.integer)) else g
            exact = key not in ("mean", "rms")
            if not (g == w if exact or g is None or w is None else same(g, w)):
                problems.append(f"{name} {source} {key}: {g!r}, numpy {w!r}")
    checked += 1
assert checked and not problems, "\n".join(problems[:12]) + (f"\n... {len(problems)} in all" if len(problems) > 12 else "")
print(f"{checked} taps")
PY
  ); then ok "$name: every statistic of $out equals the brute force (attributes, index, inspect --json)"
  else bad "$name: $out"; fi
done

[ $failures -eq 0 ] && echo "all statistics checks passed" || echo "$failures statistics check(s) FAILED"
exit $((failures > 0))

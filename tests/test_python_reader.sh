#!/usr/bin/env bash
# tools/sparsetrace_read.py, the Python reader, against what the C side recorded: two runs of the
# tiny model into one store (one with --positions last and --needle-tokens, one with
# --positions A:B and its trace outside the store). For every tap the reader's array has the
# shape, count, finite/NaN/inf counts, min, max and mean that `inspect --json` reports, and its
# positions are the ones the run kept; the needle span comes from the trace's own attributes
# (needle_start / needle_end, schemas/trace-layout.md) and equals the index's; the settings dict
# equals the index's; every needle verdict the C side computed (needle_verdicts: best_row,
# in_topk, score at a query position) is found again in the reader's indexer.topk / .scores
# rows at that position. Then the CLI: runs / tap, --json, exit 1 on an unknown tap, 2 on bad
# usage. Bounded: about 15 s.
set -uo pipefail
st=${ST_BIN:?}
data=${ST_TEST_DATA:?}
src=$(cd "${ST_SOURCE_DIR:-$data/../..}" && pwd)
py=/usr/bin/python3
[ -x $py ] || py=python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: h5py/numpy missing (Debian python3-h5py python3-numpy)"; exit 77; }
reader=$src/tools/sparsetrace_read.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
tiny=$data/oracle/tiny
awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"

$st run --model "$tiny" --prompt-tokens "$work/p.json" --store "$work/s" --tap 'layers.*' --tap logits \
  --positions last --max-new-tokens 4 --ignore-eos --needle-tokens 100:110 --set rotate=q \
  >"$work/a.out" 2>&1 || bad "recording run a: $(tail -1 "$work/a.out")"
$st run --model "$tiny" --prompt-tokens "$work/p.json" --store "$work/s" --trace "$work/b.h5" \
  --tap 'layers.*.indexer.*' --positions 50:120 >"$work/b.out" 2>&1 || bad "recording run b: $(tail -1 "$work/b.out")"
ta=$(ls "$work"/s/runs/*.h5 2>/dev/null | head -1)
$st inspect --json "$ta" >"$work/a.json" || bad "inspect a"
$st inspect --json "$work/b.h5" >"$work/b.json" || bad "inspect b"
$st query --store "$work/s" --json "SELECT run_id, settings, tap_positions FROM runs" >"$work/runs.json" || bad "query runs"
$st query --store "$work/s" --json "SELECT run_id, layer, position, best_row, in_topk, score FROM needle_verdicts" \
  >"$work/verdicts.json" || bad "query needle_verdicts"

if out=$($py - "$reader" "$work" <<'PY' 2>&1
import sys, json, math, os, importlib.util
import h5py, numpy as np
spec = importlib.util.spec_from_file_location("sparsetrace_read", sys.argv[1])
rd = importlib.util.module_from_spec(spec); spec.loader.exec_module(rd)
work = sys.argv[2]
problems = []
def check(cond, what):
    if not cond: problems.append(what)
def same(x, y):
    if x is None or y is None: return x is None and y is None
    return x == y or abs(x - y) <= 1e-6 * max(abs(x), abs(y), 1e-30)

s = rd.Store(os.path.join(work, "s"))
runs = s.runs()
check(isinstance(runs, list) and len(runs) == 2 and all(isinstance(r, dict) for r in runs), f"runs(): {len(runs)} rows")
indexed = {r["run_id"]: r for r in json.load(open(os.path.join(work, "runs.json")))}
for r in runs:
    check(r["settings"] == json.loads(indexed[r["run_id"]]["settings"]), f"settings of {r['run_id']}")
    check(r["tap_positions"] == indexed[r["run_id"]]["tap_positions"], f"positions filter of {r['run_id']}")
a_info = json.load(open(os.path.join(work, "a.json")))
b_info = json.load(open(os.path.join(work, "b.json")))
run_a, run_b = a_info["run_id"], b_info["run_id"]
check(s.run(run_a[:8])["run_id"] == run_a, "run by prefix")
check(s.run("last")["run_id"] == run_b, "run 'last'")
check(os.path.samefile(s.trace_path(run_b), os.path.join(work, "b.h5")), "trace path outside the store")

def kept(info, spec):  # positions the engine ran (the last generated token is never fed back)
    n_prompt, n_ran = info["tokens"]["n_prompt"], info["tokens"]["n_tokens"] - 1
    if spec == "last": return list(range(n_prompt - 1, n_ran))
    a, b = spec.split(":"); return list(range(int(a), min(int(b), n_ran)))

for info, run, spec in ((a_info, run_a, "last"), (b_info, run_b, "50:120")):
    check(len(info["taps"]) > 0, f"{run}: no taps")
    for t in info["taps"]:
        tap = s.tap(run, t["name"])
        a = tap.array
        where = f"{run[:8]} {t['name']}"
        check(list(a.shape) == t["shape"], f"{where}: shape {list(a.shape)} vs {t['shape']}")
        check(a.size == t["count"], f"{where}: count")
        check(len(tap.positions) == a.shape[0], f"{where}: one position per row")
        if t["axis0"] == "compressed_row":
            check(tap.positions.tolist() == list(range(a.shape[0])), f"{where}: rows")
        elif t["name"] != "logits":
            check(tap.positions.tolist() == kept(info, spec), f"{where}: positions {tap.positions[:3]}...")
        else:
            check(set(tap.positions.tolist()) <= set(kept(info, spec)), f"{where}: logits positions")
        if a.dtype.kind == "f":
            v = a.astype(np.float64); fin = v[np.isfinite(v)]
            check(fin.size == t["finite_count"], f"{where}: finite {fin.size} vs {t['finite_count']}")
            check(int(np.isnan(v).sum()) == t["nan_count"], f"{where}: nan")
            check(int(np.isinf(v).sum()) == t["inf_count"], f"{where}: inf")
            if fin.size:
                check(same(float(fin.min()), t["min"]) and same(float(fin.max()), t["max"]), f"{where}: min/max")
                check(same(float(fin.mean()), t["mean"]), f"{where}: mean {fin.mean()} vs {t['mean']}")
        else:
            check(same(float(a.min()), t["min"]) and same(float(a.max()), t["max"]), f"{where}: int min/max")
        check(tap.settings == info["settings"], f"{where}: settings")

# the needle span: carried by the trace itself, and the same as the index's
with h5py.File(s.trace_path(run_a), "r") as f:
    check(int(f.attrs.get("needle_start", -1)) == 100 and int(f.attrs.get("needle_end", -1)) == 110,
          f"trace attributes needle_start/needle_end: {dict((k, f.attrs[k]) for k in f.attrs if 'needle' in k)}")
    check(rd.trace_needles(f) and rd.trace_needles(f)[0]["start"] == 100, "trace_needles")
with h5py.File(os.path.join(work, "b.h5"), "r") as f:
    check("needle_start" not in f.attrs, "run b (no needle) has no needle attributes")
t = rd.read_tap(s.trace_path(run_a), "layers.1.indexer.topk")  # no store: the trace alone
check(t.needle is not None and (t.needle["start"], t.needle["end"]) == (100, 110), f"needle from the trace alone: {t.needle}")
ix = s.needles(run_a)
check(len(ix) == 1 and (ix[0]["start"], ix[0]["end"]) == (100, 110), f"index needles {ix}")
check(s.tap(run_b, "layers.1.indexer.topk").needle is None, "run b: no needle")

# every verdict the C side computed, found again through the reader's arrays and positions
verdicts = json.load(open(os.path.join(work, "verdicts.json")))
check(len(verdicts) > 0, "no needle verdicts recorded")
cache = {}
for v in verdicts:
    L, p = v["layer"], v["position"]
    if L not in cache:
        cache[L] = (s.tap(run_a, f"layers.{L}.indexer.topk"), s.tap(run_a, f"layers.{L}.indexer.scores"))
    topk, scores = cache[L]
    if v["best_row"] is None: continue
    sel = topk.at(p)
    check(bool(v["best_row"] in sel.tolist()) == bool(v["in_topk"]), f"layer {L} position {p}: in_topk")
    check(same(float(scores.at(p)[v["best_row"]]), v["score"]), f"layer {L} position {p}: score")
try:
    cache[next(iter(cache))][0].at(5); problems.append("at() of an unrecorded position")
except KeyError:
    pass
print(f"{len(verdicts)} verdicts, {len(a_info['taps']) + len(b_info['taps'])} taps")
if problems:
    print("\n".join(problems[:20])); sys.exit(1)
PY
); then ok "reader arrays, positions, needle and settings equal the recording ($out)"; else bad "reader: $out"; fi

# the CLI
if $py "$reader" "$work/s" runs >"$work/cli.runs" 2>&1 && [ "$(wc -l <"$work/cli.runs")" -eq 2 ] &&
   grep -q "rotate=q" "$work/cli.runs"; then ok "cli runs"; else bad "cli runs: $(cat "$work/cli.runs")"; fi
if $py "$reader" "$work/s" runs --json | $py -c 'import json,sys; r=json.load(sys.stdin); assert len(r)==2 and isinstance(r[0]["settings"], dict)' 2>"$work/err"
then ok "cli runs --json"; else bad "cli runs --json: $(cat "$work/err")"; fi
if $py "$reader" "$work/s" tap last layers.1.indexer.topk --json | $py -c '
import json,sys; t=json.load(sys.stdin); assert t["shape"][0] == len(t["positions"]) == len(t["array"]) == 70, t["shape"]
assert t["positions"][0] == 50 and t["needles"] == [], (t["positions"][:2], t["needles"])' 2>"$work/err"
then ok "cli tap --json"; else bad "cli tap --json: $(cat "$work/err")"; fi
out=$($py "$reader" "$work/s" tap "$(basename "$ta" .h5)" layers.1.indexer.scores 2>&1)
if grep -q "needle    100:110" <<<"$out" && grep -q '"rotate": "q"' <<<"$out"; then ok "cli tap"; else bad "cli tap: $out"; fi
$py "$reader" "$work/s" tap last layers.1.nosuch >/dev/null 2>"$work/err"
[ $? -eq 1 ] && grep -q "no tap" "$work/err" && ok "cli: unknown tap exits 1" || bad "cli unknown tap: $(cat "$work/err")"
$py "$reader" "$work/s" bogus >/dev/null 2>&1
[ $? -eq 2 ] && ok "cli: bad usage exits 2" || bad "cli bad usage"
$py "$reader" "$work/nostore" runs >/dev/null 2>&1
[ $? -eq 1 ] && ok "cli: no store exits 1" || bad "cli no store"

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }

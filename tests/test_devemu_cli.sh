#!/usr/bin/env bash
# The engine's device path end to end, through the CLI, on cpu-ref-devemu (kernels/devemu/:
# cpu-ref's arithmetic, host_memory = 0, memory PROT_NONE to the host outside backend calls, so
# any host read of backend memory is a SIGSEGV): a run with every layer tap and the logits armed
# (every value downloaded) records the same tensors, bit for bit, as the same run on cpu-ref; the
# trace names its backend; every replay stage of that trace reopens it and reproduces the
# recording (bit_exact), the indexer stage's sweep equals the same sweep on cpu-ref; replays
# stored in the index name the backend; run --needle (which replays every CSA layer's indexer)
# and bisect work on it and agree with cpu-ref.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
py=/usr/bin/python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: Debian python3-h5py/python3-numpy missing"; exit 77; }
$st run --help 2>&1 | grep -q . || { echo "FAIL: $st"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
dev=cpu-ref-devemu

awk 'BEGIN { s = 5; printf "["; for (i = 0; i < 330; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
record() { # record NAME BACKEND [options]...
  $st run --backend "$2" --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 3 --ignore-eos \
    --tap 'layers.*' --tap logits --positions all --chunk 100 --store "$work/s" --trace "$work/$1.h5" \
    --json "${@:3}" >"$work/$1.json" 2>"$work/$1.err"
}
if record dev $dev; then ok "run --backend $dev with every tap armed"; else bad "run on $dev: $(tail -3 "$work/dev.err")"; exit 1; fi
record ref cpu-ref || { bad "run on cpu-ref: $(tail -3 "$work/ref.err")"; exit 1; }

# 1. the same tensors as cpu-ref, bit for bit, and the same tokens
if $py - "$work/ref.h5" "$work/dev.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
ta, tb = sorted(a["taps"].keys()), sorted(b["taps"].keys())
assert ta == tb and len(ta) > 40, (len(ta), len(tb))
for name in ta:
    x, y = a["taps"][name][()], b["taps"][name][()]
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
assert np.array_equal(a["tokens"][()], b["tokens"][()])
assert b.attrs["backend"] in ("cpu-ref-devemu", b"cpu-ref-devemu"), b.attrs["backend"]
PY
then ok "$dev trace: every tap equals cpu-ref's bit for bit; tokens equal; backend attribute $dev"
else bad "$dev trace differs from cpu-ref's"; fi
$py -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); sys.exit(0 if a["generated"]==b["generated"] and b["backend"]=="cpu-ref-devemu" else 1)' \
  "$work/ref.json" "$work/dev.json" && ok "run --json: same generated tokens, backend $dev" || bad "run --json differs"

# 1b. a positions range across chunks (100 tokens each): the device session downloads only the
#     kept rows of each tap (the sink's kept()); the trace equals cpu-ref's, which hands over all
part() {
  $st run --backend "$2" --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 3 --ignore-eos \
    --tap 'layers.*' --tap logits --positions 150:260 --chunk 100 --trace "$work/$1.h5" >/dev/null 2>"$work/$1.err"
}
if part devpart $dev && part refpart cpu-ref && $py - "$work/refpart.h5" "$work/devpart.h5" <<'PY'
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
ta, tb = sorted(a["taps"].keys()), sorted(b["taps"].keys())
assert ta == tb and len(ta) > 40, (len(ta), len(tb))
def datasets(f):
    out = {}
    f.visititems(lambda n, o: out.__setitem__(n, o) if isinstance(o, h5py.Dataset) else None)
    return out
da, db = datasets(a), datasets(b)
assert sorted(da) == sorted(db), set(da) ^ set(db)
for name, x in da.items():  # every tap and its positions, the tokens
    y = db[name]
    assert x.shape == y.shape and x[()].tobytes() == y[()].tobytes(), name
shapes = {x.shape[0] for n, x in da.items() if n.startswith("taps/") and x.ndim}
assert 110 in shapes, shapes  # positions 150..259 kept
PY
then ok "--positions 150:260 over chunks of 100: the $dev trace equals cpu-ref's (only kept rows downloaded)"
else bad "--positions 150:260: $dev trace differs from cpu-ref's $(tail -2 "$work/devpart.err")"; fi

# 2. every replay stage of the device trace: reopens the backend (the stored rows say so),
#    reproduces the recording
for stage in indexer attention layer rest; do
  out=$($st replay --trace "$work/dev.h5" --model "$model" --layer 1 --stage $stage --store "$work/s" --json 2>"$work/replay.err")
  if $py -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["bit_exact"] is True and d["cells"][0]["bit_exact"] is True else 1)' <<<"$out"; then
    ok "replay --stage $stage on $dev: bit-exact"
  else bad "replay --stage $stage on $dev: $(head -c 300 <<<"$out") $(tail -2 "$work/replay.err")"; fi
done
n=$($st query --store "$work/s" "SELECT count(*) FROM replays JOIN builds USING (build_id) WHERE builds.backend = 'cpu-ref-devemu'" | sed -n 3p | tr -d ' ')
[ "$n" = "4" ] && ok "the 4 stored replays name backend $dev" || bad "stored replays on $dev: '$n'"

# 3. an indexer sweep (RoPE, rotation, formats, top-k) on the device equals the same on cpu-ref
sweep() { $st replay --backend "$1" --trace "$work/dev.h5" --model "$model" --layer 1 --stage indexer \
  --needle-tokens 40:44 --sweep rotate=none,q --sweep index_rope=interleaved,neox --sweep index_k=fp32,fp8_e4m3fn \
  --sweep topk=16,4 --json; }
if sweep $dev >"$work/sw_dev.json" && sweep cpu-ref >"$work/sw_ref.json" && $py - "$work/sw_ref.json" "$work/sw_dev.json" <<'PY'
import sys, json
def timeless(v): # everything but the timings
    if isinstance(v, dict): return {k: timeless(x) for k, x in v.items() if k != "seconds"}
    if isinstance(v, list): return [timeless(x) for x in v]
    return v
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert len(a["cells"]) == len(b["cells"]) == 16
for x, y in zip(a["cells"], b["cells"]):
    assert timeless(x) == timeless(y), x.get("label")
PY
then ok "indexer sweep of 16 cells: identical on $dev and cpu-ref"
else bad "indexer sweep differs between $dev and cpu-ref"; fi

# 4. run --needle replays every CSA layer's indexer on the recording backend; bisect likewise
needle() { $st run --backend "$1" --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 4 --ignore-eos \
  --tap 'layers.*.indexer.*' --positions last --needle-tokens 40:44 --trace "$work/needle_$1.h5" | grep '^needle layer'; }
if needle $dev >"$work/n_dev.txt" 2>&1 && needle cpu-ref >"$work/n_ref.txt" 2>&1 && [ -s "$work/n_dev.txt" ] &&
   cmp -s "$work/n_dev.txt" "$work/n_ref.txt"; then ok "run --needle on $dev: the verdicts of cpu-ref"
else bad "run --needle on $dev: $(head -3 "$work/n_dev.txt")"; fi
bis() { $st bisect --trace "$1" --model "$model" --good rotate=none --bad rotate=q --needle-tokens 40:44 | grep -v ' s$\| in [0-9.]* s'; }
if bis "$work/dev.h5" >"$work/b_dev.txt" 2>&1 && bis "$work/ref.h5" >"$work/b_ref.txt" 2>&1 && [ -s "$work/b_dev.txt" ] &&
   diff <(sed 's/[0-9a-f]\{8\}-[0-9a-f-]*//g' "$work/b_ref.txt") <(sed 's/[0-9a-f]\{8\}-[0-9a-f-]*//g' "$work/b_dev.txt") >/dev/null; then
  ok "bisect of the $dev trace: cpu-ref's answer"
else bad "bisect on $dev: $(head -5 "$work/b_dev.txt")"; fi

[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
exit $((failures > 0))

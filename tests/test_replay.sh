#!/usr/bin/env bash
# Replay, bisect and fault emulation end to end, against independent references:
#  - determinism: replaying a layer (indexer / attention / layer / rest) under the recorded
#    settings reproduces the recorded tensors bit for bit (bit_exact in --json);
#  - the indexer replay's metrics and needle ranks under other settings equal a numpy brute force
#    written here from SPEC-dsv4 (Sylvester Hadamard, interleaved/neox RoPE with YaRN, e4m3fn
#    bytes decoded as e4m3fnuz, ReLU-weighted scores, top-k with ties to the lower row);
#  - bisect's per-layer verdicts and first flipping layer equal the brute force's, for F1-F5;
#  - a fault planted in layer 3 alone (run --layer-set) is localised to layer 3 by diff.
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

awk 'BEGIN { s = 11; printf "["; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
$st run --model "$model" --prompt-tokens "$work/p.json" --tap 'layers.*' --tap logits \
  --store "$work/s" --trace "$work/clean.h5" >/dev/null || { echo "FAIL: run"; exit 1; }

# 1. determinism check of every stage
for stage in indexer attention layer rest; do
  layer=1
  out=$($st replay --trace "$work/clean.h5" --model "$model" --layer $layer --stage $stage --store "$work/s" --json)
  if $py -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["bit_exact"] is True and d["cells"][0]["bit_exact"] is True else 1)' <<<"$out"; then
    ok "replay --stage $stage under the recorded settings is bit-exact"
  else bad "replay --stage $stage not bit-exact: $out"; fi
done
# a replay stored in the index is visible to SQL
n=$($st query --store "$work/s" "SELECT count(*) FROM replays WHERE bit_exact = 1" | sed -n 3p | tr -d ' ')
[ "$n" = "4" ] && ok "4 bit-exact replays in the index" || bad "replays in the index: '$n'"

# 2. the needle: the 9th-best compressed row of layer 1 at the last position (kept by top-32,
#    lost by a top-k of 2 or by a scrambled score)
read -r needle_a needle_b < <($py - "$work/clean.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s = f["taps/layers.1.indexer.scores"][-1]
j = int(np.argsort(-s, kind="stable")[8])
print(4 * j, 4 * j + 4)
PY
)
echo "needle tokens $needle_a:$needle_b"

# 3. brute force reference for a settings list, per CSA layer, over the answer's positions that
#    can copy the needle (from the last prompt position on, as many as the needle has tokens,
#    among those the trace recorded: schemas/needle-verdicts.md)
cat >"$work/brute.py" <<'PY'
import sys, json, math, h5py, numpy as np
trace, a, b, settings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
f = h5py.File(trace, "r")
cfg = json.loads(f.attrs["config"])
m, r = 4, cfg.get("qk_rope_head_dim", 64)
def inv_freq(theta, yarn):
    i = np.arange(r // 2, dtype=np.float64)
    base = theta ** (-2 * i / r)
    if not yarn:
        return base
    low = max(math.floor(r * math.log(65536 / (32 * 2 * math.pi)) / (2 * math.log(theta))), 0)
    high = min(math.ceil(r * math.log(65536 / (1 * 2 * math.pi)) / (2 * math.log(theta))), r - 1)
    ramp = np.clip((i - low) / (high - low), 0, 1)
    return base / 16 * ramp + base * (1 - ramp)
def rope(x, pos, freq, neox, inverse):
    x = x.astype(np.float64).copy()
    ang = np.outer(pos, freq) * (-1 if inverse else 1)  # [rows, r/2]
    c, s = np.cos(ang), np.sin(ang)
    n = x.shape[-1] - r
    if neox:
        i0, i1 = n + np.arange(r // 2), n + r // 2 + np.arange(r // 2)
    else:
        i0, i1 = n + 2 * np.arange(r // 2), n + 2 * np.arange(r // 2) + 1
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (r // 2,)
    c, s = c.reshape(shape), s.reshape(shape)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = x0 * c - x1 * s
    x[..., i1] = x1 * c + x0 * s
    return x
def hadamard(n):
    H = np.array([[1.0]])
    while H.shape[0] < n:
        H = np.block([[H, H], [H, -H]])
    return H / math.sqrt(n)
def e4m3(fnuz):  # all finite code values, by the format definition
    vals = []
    for code in range(256):
        sgn, e, mant = code >> 7, (code >> 3) & 15, code & 7
        if fnuz and code == 0x80: vals.append(np.nan); continue
        if not fnuz and (code & 0x7F) == 0x7F: vals.append(np.nan); continue
        bias = 8 if fnuz else 7
        v = (mant / 8) * 2.0 ** (1 - bias) if e == 0 else (1 + mant / 8) * 2.0 ** (e - bias)
        vals.append(-v if sgn else v)
    return np.array(vals)
FN, FNUZ = e4m3(False), e4m3(True)
def fn_code(x):  # nearest e4m3fn code, ties to even mantissa, saturating at 448
    x = np.clip(x, -448, 448)
    cand = [c for c in range(256) if not np.isnan(FN[c])]
    vals = FN[cand]
    out = np.empty(x.shape, dtype=np.int64)
    for idx, v in np.ndenumerate(x):
        d = np.abs(vals - v)
        best = np.flatnonzero(d == d.min())
        codes = [cand[k] for k in best]
        # among equals prefer the even mantissa; for +-0 prefer the sign of v
        codes.sort(key=lambda c: (c & 1, (c >> 7) != (1 if math.copysign(1, v) < 0 else 0)))
        out[idx] = codes[0]
    return out
def quantize(x, fmt):
    if fmt == "fp32": return x
    if fmt == "fp8_e4m3fn_as_fnuz":
        out = np.empty_like(x)
        for i, row in enumerate(x):
            s = max(np.abs(row).max(), 1e-4) / 448
            out[i] = FNUZ[fn_code(row / s)] * s
        return out
    raise SystemExit("brute force: format %s not modelled" % fmt)
rec = {"rotate": "none", "index_rope": "interleaved", "compress_rope_theta": 160000.0, "yarn": "on",
       "index_k": "fp32", "index_q": "fp32", "topk": cfg["index_topk"]}
cur = dict(rec, **settings)
n_prompt = int(f["tokens"].attrs["n_prompt"])
def verdict(layer, row, t):
    g = f["taps"]
    q = g[f"layers.{layer}.indexer.q"][row][None].astype(np.float64)  # [1, hI, dI]
    k = g[f"layers.{layer}.indexer.k"][:].astype(np.float64)
    w = g[f"layers.{layer}.indexer.weights"][row].astype(np.float64)
    R = k.shape[0]
    kpos = np.arange(R) * m
    if (cur["index_rope"], float(cur["compress_rope_theta"]), cur["yarn"]) != (rec["index_rope"], rec["compress_rope_theta"], rec["yarn"]):
        f0 = inv_freq(rec["compress_rope_theta"], True)
        f1 = inv_freq(float(cur["compress_rope_theta"]), cur["yarn"] == "on")
        q = rope(rope(q, np.array([t]), f0, False, True), np.array([t]), f1, cur["index_rope"] == "neox", False)
        k = rope(rope(k, kpos, f0, False, True), kpos, f1, cur["index_rope"] == "neox", False)
    H = hadamard(k.shape[1])
    if cur["rotate"] in ("q", "both"): q = q @ H.T
    if cur["rotate"] in ("k", "both"): k = k @ H.T
    q = quantize(q[0], cur["index_q"])[None]
    k = quantize(k, cur["index_k"])
    vis = min((t + 1) // m, R)
    dots = np.einsum("hd,jd->hj", q[0], k[:vis])
    dots = np.where(np.isnan(dots), np.nan, np.maximum(dots, 0))
    sc = (w[:, None] * dots).sum(0)
    sc = np.where(np.isnan(sc), -np.inf, sc)
    topk = int(cur["topk"]) if cur["topk"] != "all" else vis
    order = sorted(range(vis), key=lambda j: (-sc[j], j))[:min(topk, vis)]
    rows = [j for j in range(R) if 4 * (j - 1) < b and 4 * j + 3 >= a]
    best = max((sc[j] for j in rows if j < vis), default=-np.inf)
    rank = int((sc > best).sum())
    return any(j in order for j in rows), rank
result = {}
for layer, kind in enumerate(cfg["layer_types"]):
    if kind != "compressed_sparse_attention": continue
    name = f"layers.{layer}.indexer.q"
    pos = f[f"positions/{name}"][()] if f"positions/{name}" in f else np.arange(f["taps"][name].shape[0])
    judged = [i for i, p in enumerate(pos) if n_prompt - 1 <= p < n_prompt - 1 + (b - a)]
    v = [verdict(layer, i, int(pos[i])) for i in judged]
    kept = sum(ok for ok, _ in v)
    result[layer] = {"retrieves": 2 * kept > len(v), "kept": kept, "positions": len(v), "rank": max(r for _, r in v)}
print(json.dumps(result))
PY

check_bisect() { # NAME GOOD BAD SETTINGS_JSON_OF_BAD [TRACE]
  local name=$1 good=$2 badset=$3 js=$4 trace=${5:-$work/clean.h5}
  local ref out
  ref=$($py "$work/brute.py" "$trace" "$needle_a" "$needle_b" "$js") || { bad "$name: brute force failed"; return; }
  out=$($st bisect --trace "$trace" --model "$model" --good "$good" --bad "$badset" --needle-tokens "$needle_a:$needle_b" --json)
  if $py - "$ref" "$out" <<'PY'
import sys, json
ref, out = json.loads(sys.argv[1]), json.loads(sys.argv[2])
first = None
for L in out["layers"]:
    r = ref[str(L["layer"])]
    assert L["bad"]["retrieves"] == r["retrieves"], (L, r)
    assert abs(L["bad"]["rank"] - r["rank"]) <= 1, (L, r)
    assert (L["bad"]["kept"], L["bad"]["positions"]) == (r["kept"], r["positions"]), (L, r)
# the first flip: the first layer whose verdict (top-k at most answer positions) differs between
# good and bad, in either direction (schemas/needle-verdicts.md); the first change: of the counts
g, b = {L["layer"]: L["good"] for L in out["layers"]}, {L["layer"]: ref[str(L["layer"])] for L in out["layers"]}
first = next((L for L in sorted(g) if g[L]["retrieves"] != b[L]["retrieves"]), None)
change = next((L for L in sorted(g) if g[L]["kept"] != b[L]["kept"]), None)
assert out["first_change_layer"] == change, (out["first_change_layer"], change)
assert out["first_flip_layer"] == first, (out["first_flip_layer"], first)
print("   ", out["explanation"])
PY
  then ok "$name: bisect verdicts and first flip layer ($(echo "$out" | $py -c 'import json,sys; print(json.load(sys.stdin)["first_flip_layer"])')) match the brute force"
  else bad "$name: bisect disagrees with the brute force: $out / $ref"; fi
}
check_bisect "F1 Hadamard on q only" "rotate=both" "rotate=q" '{"rotate":"q"}'
check_bisect "F1 Hadamard on k only" "rotate=none" "rotate=k" '{"rotate":"k"}'
check_bisect "F2 OCP fp8 keys read as FNUZ" "index_k=fp32" "index_k=fp8_e4m3fn_as_fnuz" '{"index_k":"fp8_e4m3fn_as_fnuz"}'
check_bisect "F3 neox RoPE in the indexer" "index_rope=interleaved" "index_rope=neox" '{"index_rope":"neox"}'
check_bisect "F4 theta 40000" "compress_rope_theta=160000" "compress_rope_theta=40000" '{"compress_rope_theta":40000}'
check_bisect "F5 top-k too small" "topk=32" "topk=2" '{"topk":2}'
# the same over an answer: 8 generated tokens, recorded from the last prompt position on; the
# needle is one 4-token row, so each layer's verdict is "kept at the answer's first 4 positions"
# and the 5 after them must not count
$st run --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 8 --ignore-eos --tap 'layers.*.indexer.*' \
  --positions last --store "$work/s" --trace "$work/answer.h5" >/dev/null || bad "run with an answer"
# the needle here: the compressed row of layer 1 whose worst rank over the answer is best
read -r needle_a needle_b < <($py - "$work/answer.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s = f["taps/layers.1.indexer.scores"][()]                      # [9, R], -inf = not visible
ranks = np.argsort(np.argsort(-s, axis=1, kind="stable"), axis=1)
j = int(np.argmin(np.where(np.isfinite(s).all(0), ranks.max(0), 1 << 30)))
print(4 * j, 4 * j + 4)
PY
)
# (random weights keep no row in the top-32 at all 8 positions: the good side keeps 128)
check_bisect "F1 over an answer" "rotate=both,topk=128" "rotate=q,topk=128" '{"rotate":"q","topk":128}' "$work/answer.h5"
check_bisect "F5 over an answer" "topk=128" "topk=32" '{"topk":32}' "$work/answer.h5"
# reversed: a layer that retrieves the needle under bad but not under good flips too
check_bisect "F5 reversed over an answer" "topk=32" "topk=128" '{"topk":128}' "$work/answer.h5"

# 4. the brute force also checks the replay's own needle rank under a sweep
out=$($st replay --trace "$work/clean.h5" --model "$model" --layer 3 --store "$work/s" --needle-tokens "$needle_a:$needle_b" --sweep rotate=none,q --json)
ref=$($py "$work/brute.py" "$work/clean.h5" "$needle_a" "$needle_b" '{"rotate":"q"}')
if $py - "$ref" "$out" <<'PY'
import sys, json
ref, out = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cell = [c for c in out["cells"] if c["settings"]["rotate"] == "q"][0]["metrics"]
# clean.h5 holds the last prompt position alone: one judged position
assert ref["3"]["positions"] == 1, ref
needle = cell["needle"]  # the needle verdict (schemas/needle-verdicts.md) over that position
assert (needle["positions"], needle["kept"], needle["retrieves"]) == (1, ref["3"]["kept"], ref["3"]["retrieves"]), (cell, ref)
assert abs(needle["worst_rank"] - ref["3"]["rank"]) <= 1, (cell, ref)
PY
then ok "replay's needle rank under rotate=q matches the brute force"; else bad "replay needle rank: $out / $ref"; fi

# 5. faults planted in layer 3 alone are localised to layer 3 by diff
if ! $st diff --help >/dev/null 2>&1; then
  echo "note: sparsetrace diff not built; skipping the localisation checks"
else
  for fault in "rotate=q:indexer.q_used" "index_k=fp8_e4m3fn_as_fnuz:indexer.k_used" "index_rope=neox:indexer.q" \
               "compress_rope_theta=40000:attn.q" "topk=2:indexer.topk"; do
    setting=${fault%%:*} expect=${fault##*:}
    faulty="$work/fault-${setting//[=.]/-}.h5"
    $st run --model "$model" --prompt-tokens "$work/p.json" --tap 'layers.*' --tap logits --layer-set "3:$setting" \
      --store "$work/s" --trace "$faulty" >/dev/null || bad "run with the fault $setting"
    $st diff "$work/clean.h5" "$faulty" --json >"$work/diff.json"
    if $py - "$work/diff.json" "$expect" <<'PY'
import sys, json
d = json.load(open(sys.argv[1]))
fd = d["first_divergence"]
assert fd is not None and fd["layer"] == 3 and fd["tap"].endswith(sys.argv[2]), fd
PY
    then ok "fault $setting in layer 3: diff's first divergence is layers.3.$expect"
    else bad "fault $setting in layer 3: diff says $(head -c 400 "$work/diff.json")"; fi
  done
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

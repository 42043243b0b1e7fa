#!/usr/bin/env bash
# End to end, the way a user drives it: `sparsetrace run` on the bundled model with indexer taps
# armed; the trace is read by stock h5py and the index by sqlite3 and `sparsetrace query`; bad
# input of every kind ends with one clear message, a non-zero exit and no crash.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() { # check DESCRIPTION COMMAND...: the command must succeed
  if ! "${@:2}"; then echo "FAIL: $1"; failures=$((failures + 1)); else echo "ok: $1"; fi
}
expect_error() { # expect_error DESCRIPTION PATTERN COMMAND...: exit 1 or 2, stderr matches
  local out rc
  out=$("${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then echo "FAIL: $1: exit $rc (crash?) $out"; failures=$((failures + 1)); return; fi
  if ! grep -qE -- "$2" <<<"$out"; then echo "FAIL: $1: message '$out' lacks /$2/"; failures=$((failures + 1)); return; fi
  echo "ok: $1 -> $out"
}

awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/prompt.json"

# 1. a run into the store, with every indexer tap and the layer inputs armed
check "run records a trace" $st run --model "$model" --prompt-tokens "$work/prompt.json" \
  --max-new-tokens 4 --ignore-eos --tap 'layers.*.indexer.*' --tap 'layers.1.input' --tap logits \
  --store "$work/store" --json
[ -f "$work/store/index.sqlite" ] || { echo "FAIL: no index"; failures=$((failures + 1)); }
trace=$(ls "$work"/store/runs/*.h5 2>/dev/null | head -1)
check "trace file exists and is complete" test -f "$trace"
check "no .part file left" bash -c "! ls '$work'/store/runs/*.part >/dev/null 2>&1"

# 2. stock h5py reads it: tokens, n_prompt, tap shapes, position axis, settings attribute
check "h5py reads the trace" /usr/bin/python3 - "$trace" <<'PY'
import sys, json, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
tok = f["tokens"]
assert tok.attrs["n_prompt"] == 600 and tok.shape == (604,), (tok.attrs["n_prompt"], tok.shape)
topk = f["taps/layers.1.indexer.topk"]
assert topk.shape == (603, 32) and topk.dtype == np.int32, topk.shape
scores = f["taps/layers.1.indexer.scores"]
assert scores.shape[0] == 603 and scores.shape[1] == 150, scores.shape
# the top-k rows are the highest visible scores of each position (brute force)
for t in (100, 400, 599, 602):
    vis = (t + 1) // 4
    s = scores[t, :vis]
    best = set(np.argsort(-s, kind="stable")[:min(32, vis)].tolist())
    assert best == set(topk[t][topk[t] >= 0].tolist()), t
    assert np.all(np.isneginf(scores[t, vis:])), t
assert f["taps/layers.1.input"].shape == (603, 4, 128)
assert f["taps/logits"].shape == (603, 264)
assert json.loads(f.attrs["settings"])["precision"] == "exact"
assert f["taps/layers.3.indexer.k"].shape == (150, 128)
print("h5py: ok")
PY

# 3. sqlite3 reads the index; sparsetrace query answers from it, read-only
check "sqlite3 reads the index" bash -c "sqlite3 '$work/store/index.sqlite' 'SELECT count(*) FROM taps' | grep -qx 16"
out=$($st query --store "$work/store" --json "SELECT name, shape FROM taps WHERE name = 'layers.3.indexer.topk'")
check "query --json answers (shape as an array)" grep -q '"shape": \[603,32\]' <<<"$out"
expect_error "query refuses writes" "read-only|readonly" $st query --store "$work/store" "DELETE FROM runs"

# 4. determinism: the same run twice gives the same bits (threads 1 and 2)
$st run --model "$model" --prompt-tokens "$work/prompt.json" --tap logits --trace "$work/a.h5" --store "$work/s2" --threads 1 >/dev/null
$st run --model "$model" --prompt-tokens "$work/prompt.json" --tap logits --trace "$work/b.h5" --store "$work/s2" --threads 2 >/dev/null
check "logits bit-identical for 1 and 2 threads" /usr/bin/python3 -c "
import h5py, numpy as np, sys
a = h5py.File('$work/a.h5')['taps/logits'][:]; b = h5py.File('$work/b.h5')['taps/logits'][:]
sys.exit(0 if a.tobytes() == b.tobytes() else 1)"

# 5. bad input: a clear message, exit 1 or 2, never a crash
mkdir -p "$work/bad"
cp "$model/config.json" "$work/bad/config.json"
printf 'not a safetensors file at all' >"$work/bad/model.safetensors"
expect_error "garbage safetensors names the file" "model.safetensors" $st run --model "$work/bad" --prompt-tokens "$work/prompt.json"
head -c 3000000 "$model/model.safetensors" >"$work/bad/model.safetensors"
expect_error "truncated safetensors names the file" "model.safetensors" $st run --model "$work/bad" --prompt-tokens "$work/prompt.json"
sed 's/"deepseek_v4"/"llama"/' "$model/config.json" >"$work/bad/config.json"
cp "$model/model.safetensors" "$work/bad/model.safetensors"
expect_error "unknown model_type" "model_type" $st run --model "$work/bad" --prompt-tokens "$work/prompt.json"
sed 's/"hidden_size": 128/"hidden_size": 96/' "$model/config.json" >"$work/bad/config.json"
expect_error "wrong shape names the tensor" "embed|weight" $st run --model "$work/bad" --prompt-tokens "$work/prompt.json"
expect_error "missing model dir" "nowhere" $st run --model "$work/nowhere" --prompt-tokens "$work/prompt.json"
printf '[1, 2,\n 3, "x"]' >"$work/bad.json"
expect_error "prompt with a non-id" "element 3" $st run --model "$model" --prompt-tokens "$work/bad.json"
printf '[1, 2,\n 3' >"$work/bad.json"
expect_error "malformed prompt JSON gives line:column" "bad.json:[0-9]+:[0-9]+" $st run --model "$model" --prompt-tokens "$work/bad.json"
printf '[1, 99999]' >"$work/bad.json"
expect_error "token outside the vocabulary" "vocabulary" $st run --model "$model" --prompt-tokens "$work/bad.json"
expect_error "unknown setting" "unknown setting" $st run --model "$model" --prompt-tokens "$work/prompt.json" --set colour=blue
expect_error "bad setting value lists the allowed ones" "none\|q\|k\|both" $st run --model "$model" --prompt-tokens "$work/prompt.json" --set rotate=up
expect_error "tap glob that matches nothing" "matches no tap" $st run --model "$model" --prompt-tokens "$work/prompt.json" --tap 'layers.*.nonsense'
expect_error "bad positions spec" "positions" $st run --model "$model" --prompt-tokens "$work/prompt.json" --tap logits --positions 9:3
expect_error "inspect a truncated trace" "exact.h5|truncated|HDF5|not" bash -c "head -c 5000 '$trace' >'$work/exact.h5'; $st inspect '$work/exact.h5'"
expect_error "unknown subcommand" "unknown command" $st frobnicate

# 6. --help on every subcommand
for cmd in run query inspect taps settings; do
  check "$cmd --help" bash -c "$st $cmd --help | grep -q usage"
done

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

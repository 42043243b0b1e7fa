#!/usr/bin/env bash
# End to end: `sparsetrace import sglang-pass` on Pass*.pt files in sglang's
# --debug-tensor-dump-output-folder layout (TP{t}_PP{p}_Rank{r}_pid{pid}/Pass{N:05d}.pt, each a
# dict {module name: output} with model.forward_batch_info.*), written with real torch.save by
# tools/make_sglang_pass_fixtures.py from a run of our own engine (the prefill and two decode
# passes; the `model` and `logits_processor` outputs in the next pass's file, as sglang's hook
# leaves them; a second tensor-parallel rank). In float32 the imported taps equal the engine's bit
# for bit; in bfloat16 they pass the imported-engine tolerances; a rotate=q run diverges first at
# layer 1's attention output (the indexer's own values are not among sglang's leaf outputs).
# Hostile Pass files give errors naming the file or tensor.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
model=${ST_TEST_DATA:?}/oracle/tiny
PY=/usr/bin/python3
$PY -c "import torch, h5py, numpy" 2>/dev/null || { echo "skip: $PY lacks torch/h5py/numpy (tools/deps.sh)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then pass "$1"; else failed "$1"; fi; }
expect_fail() { # expect_fail DESCRIPTION PATTERN ARGS...: exit 1 with a message matching PATTERN
  local out rc
  out=$("${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 1 ]; then failed "$1: exit $rc (wanted 1): $out"; return; fi
  if ! grep -qE -- "$2" <<<"$out"; then failed "$1: message '$out' lacks /$2/"; return; fi
  pass "$1 -> $(head -1 <<<"$out")"
}
fixture() { $PY "$src/tools/make_sglang_pass_fixtures.py" --sparsetrace "$st" --model "$model" --prompt-tokens 140 "$@" >/dev/null; }
import() { $st import sglang-pass "$@" --model "$model" --store "$work/store" --force; }

fixture --out "$work/f32" --dtype float32 --tp 2 || failed "writing the float32 passes"
fixture --out "$work/bf16" --dtype bfloat16 || failed "writing the bfloat16 passes"
fixture --out "$work/rotq" --dtype float32 --set rotate=q || failed "writing the rotate=q passes"
$PY -c "import json; json.dump(json.load(open('$work/f32/tokens.json'))[:140], open('$work/prompt.json', 'w'))"
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 3 --ignore-eos --tap 'layers.*' \
  --positions all --trace "$work/ref.h5" --store "$work/store" >/dev/null || failed "reference run"

# 1. float32 passes: every imported tap bit for bit; the tokens are the ones the passes ran (the
# last generated token is never forwarded, so the import holds one token fewer than the run)
check "import float32 passes" bash -c "'$st' import sglang-pass '$work/f32' --model '$model' --store '$work/store' --out '$work/f32.h5' --json >'$work/imp.json'"
check "3 passes x 2 ranks; 12 taps; 142 tokens" $PY -c "
import json; d = json.load(open('$work/imp.json')); assert d['taps'] == 12 and d['tokens'] == 142 and d['mapped'] == 36, d"
$st diff --json --tolerance '*=exact' "$work/ref.h5" "$work/f32.h5" >"$work/diff.json"
check "every imported tap equal bit for bit; the tokens part only where the passes end" $PY -c "
import json; d = json.load(open('$work/diff.json'))
taps = [x for x in d['taps'] if x['verdict'] != 'only_a']
assert len(taps) == 12 and all(x['verdict'] == 'ok' and x['value'] == 0 for x in taps), [(x['name'], x['verdict']) for x in taps]
tk = d['tokens']; assert tk['first_difference'] == 142 and tk['n_b'] == 142 and tk['n_a'] == 143 and not tk['in_prompt'], tk
assert d['first_divergence']['tap'] == 'tokens'"
check "the rows are the passes' values at their positions (h5py against torch.load)" $PY - "$work" <<'PY'
import sys, glob, torch, h5py, numpy as np
w = sys.argv[1]
t = h5py.File(f"{w}/f32.h5", "r")["taps"]
names = {"input_layernorm": "attn.x", "self_attn.q_norm": "attn.qr", "self_attn.wo_b": "attn.out"}
n = 0
for path in sorted(glob.glob(f"{w}/f32/TP0_PP0_Rank0_pid*/Pass*.pt")):
    d = torch.load(path)
    pos = d["model.forward_batch_info.positions"].numpy()
    for key, v in d.items():
        parts = key.split(".")
        if len(parts) > 3 and parts[1] == "layers" and ".".join(parts[3:]) in names:
            got = t[f"layers.{parts[2]}.{names['.'.join(parts[3:])]}"][pos[0]:pos[-1] + 1]
            assert got.tobytes() == v.numpy().tobytes(), key
            n += 1
assert n == 36, n
PY
check "inspect notes the rank left out" bash -c "'$st' inspect '$work/f32.h5' | grep -q '1 tensor-parallel ranks other than 0 left out'"

# 2. bfloat16 passes, as sglang runs: within the imported-engine tolerances, which diff names
import "$work/bf16" --out "$work/bf16.h5" >/dev/null || failed "importing bf16"
$st diff --json "$work/ref.h5" "$work/bf16.h5" >"$work/diff.json"
check "bf16: every tap within its imported-profile tolerance, converted from bfloat16" $PY -c "
import json; d = json.load(open('$work/diff.json'))
taps = [x for x in d['taps'] if x['verdict'] != 'only_a']
assert d['tolerances']['profile'] == 'imported' and all(x['verdict'] == 'ok' and 0 < x['value'] < 1e-4 and x['threshold'] == 1e-3 for x in taps), [(x['name'], x['value']) for x in taps]"

# 3. a planted bug: rotate=q changes layer 1's selection, so its attention output is the first tap to leave
import "$work/rotq" --out "$work/rotq.h5" >/dev/null || failed "importing rotate=q"
$st diff --json --tolerance '*=diff:1e-6' "$work/ref.h5" "$work/rotq.h5" >"$work/diff.json"
check "rotate=q: first divergence layers.1.attn.out; layer 1's attn.x and attn.qr equal" $PY -c "
import json; d = json.load(open('$work/diff.json')); t = {x['name']: x for x in d['taps']}
assert d['first_divergence']['tap'] == 'layers.1.attn.out' and t['layers.1.attn.x']['value'] == 0 and t['layers.1.attn.qr']['value'] == 0, d['first_divergence']"

# 4. hostile Pass files
mkdir -p "$work/bad"
cp -r "$work/f32/TP0_PP0_Rank0_pid4242" "$work/bad/"
r="$work/bad/TP0_PP0_Rank0_pid4242"
$PY -c "import torch; torch.save(torch.zeros(3), '$r/Pass00003.pt')"
expect_fail "a Pass file holding no dict" "Pass00003.pt: a Pass file holds a dict of module outputs" import "$work/bad" --out "$work/x.h5"
rm "$r/Pass00003.pt"; head -c 3000 "$r/Pass00001.pt" >"$r/Pass00004.pt"
expect_fail "a truncated Pass file" "Pass00004.pt" import "$work/bad" --out "$work/x.h5"
rm "$r/Pass00004.pt"
$PY -c "
import torch; d = torch.load('$r/Pass00002.pt'); d['model.layers.2.input_layernorm'] = torch.zeros(1, 64); torch.save(d, '$r/Pass00002.pt')"
expect_fail "a module output of the wrong width" "Pass00002.pt: tensor model.layers.2.input_layernorm is \[rows, 64\].*tap attn.x .* is \[rows, 128\]" import "$work/bad" --out "$work/x.h5"
$PY -c "
import torch; d = torch.load('$r/Pass00002.pt'); d['model.layers.2.input_layernorm'] = [torch.zeros(1, 128), torch.zeros(1, 128)]; torch.save(d, '$r/Pass00002.pt')"
expect_fail "a list where a tensor is mapped" "Pass00002.pt: model.layers.2.input_layernorm is not a tensor" import "$work/bad" --out "$work/x.h5"
mkdir -p "$work/none"
expect_fail "no Pass files" "holds no Pass\*.pt file" import "$work/none" --out "$work/x.h5"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

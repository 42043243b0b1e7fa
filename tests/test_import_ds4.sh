#!/usr/bin/env bash
# End to end: `sparsetrace import ds4` on tests/data/import/ds4, a run of our own engine on the
# tiny model written in antirez/ds4's dump naming by tools/make_ds4_fixtures.py (raw float32 .bin
# and int32 .i32 files, PREFIX_NAME-LAYER_posPOS, a prefill batch at pos 0 and one file per
# decode step; the indexer's dumps only where n_comp > K, as ds4 writes them). The imported trace
# must hold exactly the files' values at their positions (read independently with numpy) and diff
# bit for bit against a fresh run of the engine on the same tokens; a fixture written from a
# rotate=q run must diverge first at layer 1's indexer scores. Hostile dumps (truncated, wrong
# size, rows that disagree, a layer the model lacks, the wrong element type, no tokens) give a
# clear error naming the file.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
model=${ST_TEST_DATA:?}/oracle/tiny
fixture=$ST_TEST_DATA/import/ds4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then pass "$1"; else failed "$1"; fi; }
expect_fail() { # expect_fail DESCRIPTION WANT_RC PATTERN ARGS...
  local out rc
  out=$("${@:4}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne "$2" ]; then failed "$1: exit $rc (wanted $2): $out"; return; fi
  if ! grep -qE -- "$3" <<<"$out"; then failed "$1: message '$out' lacks /$3/"; return; fi
  pass "$1 -> $(head -1 <<<"$out")"
}
import() { $st import ds4 "$@" --model "$model" --store "$work/store" --force; }

# 1. the fixture, by its prefix and by its directory
check "import by prefix" bash -c "'$st' import ds4 '$fixture/ds4' --model '$model' --prompt-tokens '$fixture/tokens.json' --out '$work/ds4.h5' --store '$work/store' --json >'$work/imp.json'"
check "49 files: 48 mapped, result_output not (its position is always 0), 135 tokens" /usr/bin/python3 -c "
import json; d = json.load(open('$work/imp.json')); assert (d['files'], d['mapped'], d['unmapped'], d['tokens']) == (49, 48, 1, 135), d"
check "import by directory gives the same taps" bash -c "'$st' import ds4 '$fixture' --model '$model' --prompt-tokens '$fixture/tokens.json' --out '$work/ds4d.h5' --store '$work/store' >/dev/null && '$st' diff --tolerance '*=exact' '$work/ds4.h5' '$work/ds4d.h5' >/dev/null"
check "inspect names the source and the unmapped tensor" bash -c "'$st' inspect '$work/ds4.h5' | grep -q 'not in the map (1): result_output'"

# 2. the trace holds the files' values at their positions (numpy reads the raw files itself)
check "every dump file's rows are in the trace at its positions" /usr/bin/python3 - "$fixture" "$work/ds4.h5" <<'PY'
import sys, os, re, h5py, numpy as np
fx, trace = sys.argv[1], sys.argv[2]
taps = {"attn_out": "attn.out", "ffn_out": "ffn.out", "ffn_moe_topk": "ffn.experts",
        "indexer_scores": "indexer.scores", "indexer_topk": "indexer.topk"}
widths = {"attn.out": 128, "ffn.out": 128, "ffn.experts": 2, "indexer.topk": 32}
t = h5py.File(trace, "r")["taps"]
checked = 0
for name in sorted(os.listdir(fx)):
    m = re.fullmatch(r"ds4_(.+)-(\d+)_pos(\d+)\.(bin|i32)", name)
    if not m or m.group(1) not in taps:
        continue
    tap, layer, pos = taps[m.group(1)], int(m.group(2)), int(m.group(3))
    raw = np.fromfile(os.path.join(fx, name), "<i4" if m.group(4) == "i32" else "<f4")
    ds = t[f"layers.{layer}.{tap}"]
    if tap == "indexer.scores":
        n = 132 if pos == 0 else 1
        x = raw.reshape(n, -1)
        got = ds[pos:pos + n, :x.shape[1]]
        for r in range(n):  # rows not yet visible at pos + r are -inf in the trace
            vis = min((pos + r + 1) // 4, x.shape[1])
            assert np.array_equal(got[r, :vis], x[r, :vis]) and np.all(np.isneginf(got[r, vis:])), (name, r)
    else:
        x = raw.reshape(-1, widths[tap])
        got = ds[pos:pos + x.shape[0]]
        if tap in ("indexer.topk", "ffn.experts"):
            for a, b in zip(got, x):
                assert set(a[a >= 0].tolist()) == set(b[b >= 0].tolist()), name
        else:
            assert got.tobytes() == x.astype("<f4").tobytes(), name
    checked += 1
assert checked == 48, checked
print(checked, "files checked")
PY

# 3. against a fresh run of the engine on the same tokens: the same bits
/usr/bin/python3 -c "import json; t = json.load(open('$fixture/tokens.json')); json.dump(t[:132], open('$work/prompt.json', 'w'))"
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 3 --ignore-eos --tap 'layers.*' \
  --positions all --trace "$work/ref.h5" --store "$work/store" >/dev/null || failed "reference run"
$st diff --json --tolerance '*=exact' "$work/ref.h5" "$work/ds4.h5" >"$work/diff.json"; rc=$?
check "diff --tolerance '*=exact' against the engine: no divergence (exit $rc)" test $rc -eq 0
check "every imported tap compared, the imported profile named" /usr/bin/python3 -c "
import json; d = json.load(open('$work/diff.json'))
b = [x for x in d['taps'] if x['verdict'] not in ('only_a',)]
assert len(b) == 16 and all(x['verdict'] == 'ok' for x in b), [(x['name'], x['verdict']) for x in b]
assert d['tolerances']['profile'] == 'imported' and d['tolerances']['imported'] == 'B' and d['tokens']['equal']"

# 4. a planted bug in the dumps: rotate=q, written by the same script
/usr/bin/python3 "$src/tools/make_ds4_fixtures.py" --sparsetrace "$st" --model "$model" --out "$work/rotq" --set rotate=q \
  --names attn_out,indexer_scores,indexer_topk >/dev/null || failed "writing the rotate=q dumps"
import "$work/rotq" --prompt-tokens "$work/rotq/tokens.json" --out "$work/rotq.h5" >/dev/null || failed "importing rotate=q"
$st diff --json "$work/ref.h5" "$work/rotq.h5" >"$work/diff.json"; rc=$?
check "rotate=q dumps diverge (exit $rc) first at layers.1.indexer.scores" /usr/bin/python3 -c "
import json; d = json.load(open('$work/diff.json')); assert d['first_divergence']['tap'] == 'layers.1.indexer.scores', d['first_divergence']"

# a batch whose only file is indexer_scores: its rows solve n * ((pos + n) / m) = the values
mkdir -p "$work/scores_only"; cp "$fixture"/ds4_indexer_scores-* "$work/scores_only/"
check "scores alone: rows found from the size, the same values" bash -c "'$st' import ds4 '$work/scores_only' --model '$model' --prompt-tokens '$fixture/tokens.json' --out '$work/so.h5' --store '$work/store' >/dev/null && '$st' diff --tolerance '*=exact' --tap indexer.scores '$work/ds4.h5' '$work/so.h5' >/dev/null"

# 5. hostile dumps
bad() { rm -rf "$work/bad"; cp -r "$fixture" "$work/bad"; }
tok=(--prompt-tokens "$fixture/tokens.json")
bad; truncate -s -3 "$work/bad/ds4_attn_out-1_pos0.bin"
expect_fail "truncated mid-value" 1 "ds4_attn_out-1_pos0.bin: 67581 bytes, not a whole number of 4-byte float32 values" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; truncate -s -20 "$work/bad/ds4_ffn_out-2_pos0.bin"
expect_fail "not a whole row" 1 "ds4_ffn_out-2_pos0.bin: 16891 values, not a whole number of rows of 128 \(tap ffn.out" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; truncate -s -512 "$work/bad/ds4_attn_out-3_pos0.bin"
expect_fail "one row short: the batch's files disagree" 1 "ds4_attn_out-3_pos0.bin holds 131 rows, .* of the same batch \(position 0\) 132" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; truncate -s -4 "$work/bad/ds4_indexer_scores-1_pos0.bin"
expect_fail "scores of the wrong size" 1 "ds4_indexer_scores-1_pos0.bin: 4355 values do not make whole rows" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; cp "$work/bad/ds4_attn_out-1_pos132.bin" "$work/bad/ds4_attn_out-9_pos132.bin"
cp "$work/bad/ds4_attn_out-1_pos132.bin" "$work/bad/ds4_attn_out-99999999999_pos132.bin" # not a layer number: unmapped
expect_fail "a layer the model lacks" 1 "ds4_attn_out-9_pos132.bin: layer 9, but the model in .* has layers 0..3" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; mv "$work/bad/ds4_ffn_moe_topk-0_pos132.i32" "$work/bad/ds4_ffn_moe_topk-0_pos132.bin"
expect_fail "float32 dump of an integer tap" 1 "ds4_ffn_moe_topk-0_pos132.bin: tensor ffn_moe_topk is float32; tap ffn.experts holds integers" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
bad; : >"$work/bad/ds4_attn_out-0_pos133.bin"
expect_fail "an empty file" 1 "ds4_attn_out-0_pos133.bin: 0 bytes" import "$work/bad" "${tok[@]}" --out "$work/x.h5"
/usr/bin/python3 -c "import json; json.dump(json.load(open('$fixture/tokens.json'))[:100], open('$work/short.json', 'w'))"
expect_fail "fewer tokens than the dumps' positions" 1 "positions 0..131, past the 100 tokens of --prompt-tokens" import "$fixture" --prompt-tokens "$work/short.json" --out "$work/x.h5"
expect_fail "no --prompt-tokens" 2 "--prompt-tokens FILE is needed: ds4's dumps hold no token ids" import "$fixture" --out "$work/x.h5"
mkdir -p "$work/empty"; : >"$work/empty/notes.txt"
expect_fail "a directory without dumps" 1 "holds no ds4 dump of a mapped tensor" import "$work/empty" "${tok[@]}" --out "$work/x.h5"
expect_fail "a prefix that names no file" 1 "holds no ds4 dump" import "$fixture/nothing" "${tok[@]}" --out "$work/x.h5"
# the default trace path (STORE/runs/import-ds4-<dir>.h5) past 4095 bytes: refused, nothing made
long=$work/long # a store path of 4085 bytes: it fits, the trace path under it does not
for i in $(seq 20); do long=$long/$(printf 'd%.0s' $(seq 200)); done
long=$long/$(printf 'e%.0s' $(seq $((4085 - ${#long} - 1))))
expect_fail "a default trace path past 4095 bytes" 1 "longer than 4095 bytes: name the trace with --out" \
  $st import ds4 "$fixture" --model "$model" "${tok[@]}" --store "$long"
[ ! -e "$work/long" ] && pass "nothing was created under the long store" || failed "the long store's directories were made"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# End to end: `sparsetrace diff` on traces recorded by `sparsetrace run` on the bundled tiny model.
# The same run twice does not diverge; each emulated fault is caught at the first tap it changes
# (forward order of schemas/taps.def, layer 1 = the first CSA layer); a trace that kept positions
# 300:400 still compares the common positions; tolerance rules, --tap, --all, the token
# comparison, a planted -inf in a copy edited by h5py, --json parsed by python3, exit codes.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok: $1"; }
failed() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { # check DESCRIPTION COMMAND...: the command must succeed
  if "${@:2}"; then pass "$1"; else failed "$1"; fi
}
# diff_rc DESCRIPTION WANT_RC ARGS...: runs diff --json into $work/out.json, checks the exit code
diff_rc() {
  local rc
  $st diff --json "${@:3}" >"$work/out.json" 2>"$work/err.txt"; rc=$?
  if [ $rc -ne "$2" ]; then failed "$1: exit $rc, wanted $2: $(head -c 300 "$work/err.txt")"; return 1; fi
  pass "$1 (exit $rc)"
}
# json_check DESCRIPTION PYTHON_EXPR: evaluated with d = the last --json output
json_check() {
  if /usr/bin/python3 -c "import json,sys; d = json.load(open('$work/out.json')); t = {x['name']: x for x in d['taps']}; sys.exit(0 if ($2) else 1)"; then
    pass "$1"
  else
    failed "$1: $(/usr/bin/python3 -c "import json; d = json.load(open('$work/out.json')); print(json.dumps(d['first_divergence']))" 2>&1 | head -c 400)"
  fi
}
expect_usage() { # expect_usage DESCRIPTION PATTERN ARGS...: exit 2 and a message matching PATTERN
  local out rc
  out=$($st diff "${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then failed "$1: exit $rc (wanted 2) $out"; return; fi
  if ! grep -qE -- "$2" <<<"$out"; then failed "$1: message '$out' lacks /$2/"; return; fi
  pass "$1 -> $(head -1 <<<"$out")"
}

awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 520; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/prompt.json"
record() { # record NAME [run options]...
  $st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 4 --ignore-eos \
    --tap 'layers.*' --tap logits --trace "$work/$1.h5" --store "$work/store" "${@:2}" >/dev/null \
    || failed "recording $1"
}
record a
record a2
record rotq --set rotate=q
record topk8 --set topk=8
record fp8k --set index_k=fp8_e4m3fn
record window --positions 300:400

# 1. the same run twice: no divergence, exit 0
diff_rc "same run twice" 0 "$work/a.h5" "$work/a2.h5"
json_check "same run: first_divergence null, tokens equal" \
  "d['first_divergence'] is None and d['tokens']['equal'] and not d['diverges'] and d['not_compared'] == 0"
json_check "same run: every tap ok with difference 0" \
  "all(x['verdict'] == 'ok' and x['value'] in (0, 1) for x in d['taps']) and len(d['taps']) == 54"
json_check "a and b carry build and settings" \
  "d['a']['build']['backend'] == 'cpu' and d['b']['settings']['rotate'] == 'none' and 'revision' in d['a']['build']"
out=$($st diff "$work/a.h5" "$work/a2.h5"); rc=$?
check "text: exit 0 and 'no divergence'" bash -c "[ $rc -eq 0 ] && grep -q 'no divergence' <<<'$out'"

# 2. rotate=q: the indexer query is rotated, the key is not. indexer.q (before rotation) is equal;
#    the first tap that changes is layers.1.indexer.q_used.
diff_rc "rotate=q diverges" 1 "$work/a.h5" "$work/rotq.h5"
json_check "rotate=q: first divergence layers.1.indexer.q_used, layer 1, diff metric" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.q_used' and d['first_divergence']['layer'] == 1 and d['first_divergence']['metric'] == 'diff' and d['first_divergence']['value'] > 0.1 and d['first_divergence']['threshold'] == 1e-6 and d['first_divergence']['position'] is not None"
json_check "rotate=q: indexer.q and indexer.k equal, layer 0 equal, scores and topk diverge" \
  "t['layers.1.indexer.q']['verdict'] == 'ok' and t['layers.1.indexer.q']['value'] == 0 and t['layers.1.indexer.k_used']['verdict'] == 'ok' and all(x['verdict'] == 'ok' for x in d['taps'] if x['layer'] == 0) and t['layers.1.indexer.scores']['verdict'] == 'diverges' and t['layers.1.indexer.topk']['verdict'] == 'diverges'"
json_check "rotate=q: stops after layer 1 (later taps not compared)" \
  "t['layers.2.input']['verdict'] == 'not_compared' and t['logits']['verdict'] == 'not_compared' and d['not_compared'] == 28"
json_check "rotate=q: generated tokens differ, positions after them left out" \
  "not d['tokens']['equal'] and d['tokens']['in_prompt'] is False and d['tokens']['compared_before'] == d['tokens']['first_difference'] and t['layers.0.input']['rows_compared'] == d['tokens']['first_difference']"
out=$($st diff "$work/a.h5" "$work/rotq.h5")
check "text names the first divergence and the settings change" \
  bash -c "grep -q '^first divergence: layers.1.indexer.q_used (layer 1): diff' <<<'$out' && grep -q 'rotate \"none\" -> \"q\"' <<<'$out' && grep -qE '^1 +indexer.q_used +diff .*DIVERGES' <<<'$out'"
diff_rc "rotate=q --all" 1 --all "$work/a.h5" "$work/rotq.h5"
json_check "--all compares every tap" \
  "d['not_compared'] == 0 and d['first_divergence']['tap'] == 'layers.1.indexer.q_used' and t['logits']['verdict'] == 'diverges' and 'kl_mean' in t['logits']"

# 3. topk=8: scores unchanged, the top-k set is the first to change
diff_rc "topk=8 diverges" 1 "$work/a.h5" "$work/topk8.h5"
json_check "topk=8: first divergence layers.1.indexer.topk by Jaccard (8 of 32 = 0.25)" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.topk' and d['first_divergence']['layer'] == 1 and d['first_divergence']['metric'] == 'jaccard' and d['first_divergence']['value'] == 0.25 and t['layers.1.indexer.scores']['verdict'] == 'ok'"
diff_rc "topk=8 with indexer.topk=jaccard:0.2" 1 --tolerance 'indexer.topk=jaccard:0.2' "$work/a.h5" "$work/topk8.h5"
json_check "a looser Jaccard rule passes topk; attention output is next" \
  "t['layers.1.indexer.topk']['verdict'] == 'ok' and d['first_divergence']['tap'] == 'layers.1.attn.out'"
diff_rc "topk=8 ignoring topk and attn" 1 --tolerance 'indexer.topk=ignore' --tolerance 'layers.1.attn.*=ignore,*=diff:1e-5' "$work/a.h5" "$work/topk8.h5"
json_check "ignore rules and a catch-all float rule" \
  "t['layers.1.indexer.topk']['verdict'] == 'ignored' and t['layers.1.attn.out']['verdict'] == 'ignored' and d['first_divergence']['tap'] != 'layers.1.indexer.topk' and t['layers.1.indexer.scores']['threshold'] == 1e-5 and t['layers.1.ffn.experts']['metric'] == 'jaccard'"

# 4. index_k=fp8_e4m3fn: the keys as scored are the first to change (q_used is equal)
diff_rc "index_k=fp8 diverges" 1 "$work/a.h5" "$work/fp8k.h5"
json_check "fp8 keys: first divergence layers.1.indexer.k_used, by row index" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.k_used' and d['first_divergence']['layer'] == 1 and d['first_divergence']['axis0'] == 'compressed_row' and t['layers.1.indexer.q_used']['verdict'] == 'ok' and t['layers.1.indexer.k']['verdict'] == 'ok'"
diff_rc "fp8 keys pass a loose k_used rule" 1 --tolerance 'indexer.k_used=diff:1e-2' "$work/a.h5" "$work/fp8k.h5"
json_check "then the scores are the first divergence" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.scores'"

# 5. positions 300:400 against a full trace: the common positions are compared
diff_rc "positions 300:400 vs all" 0 "$work/a.h5" "$work/window.h5"
json_check "100 common positions compared, row taps whole" \
  "t['layers.1.indexer.scores']['rows_compared'] == 100 and t['layers.1.indexer.scores']['positions_only_a'] == 423 and t['layers.1.indexer.topk']['rows_compared'] == 100 and t['layers.1.indexer.k']['rows_compared'] == 130 and t['logits']['rows_compared'] == 100"
diff_rc "window against rotate=q" 1 "$work/window.h5" "$work/rotq.h5"
json_check "the window's first divergence lies inside 300:400" \
  "d['first_divergence']['tap'] == 'layers.1.indexer.q_used' and 300 <= d['first_divergence']['position'] < 400"

# 6. --tap selects taps; tokens decide when no selected tap diverges
diff_rc "only layer 0 taps of rotate=q" 1 --tap 'layers.0.*' "$work/a.h5" "$work/rotq.h5"
json_check "tokens are the first divergence (generated)" \
  "d['first_divergence']['tap'] == 'tokens' and d['first_divergence']['in_prompt'] is False and len(d['taps']) == 9"
diff_rc "--tap by suffix" 1 --all --tap indexer.q --tap indexer.k "$work/a.h5" "$work/rotq.h5"
json_check "suffix globs select indexer.q and indexer.k of both CSA layers" \
  "sorted(t) == ['layers.1.indexer.k', 'layers.1.indexer.q', 'layers.3.indexer.k', 'layers.3.indexer.q'] and t['layers.1.indexer.q']['verdict'] == 'ok' and t['layers.1.indexer.k']['verdict'] == 'ok' and d['first_divergence']['tap'] == 'layers.3.indexer.q'"

# 7. a different prompt: the tokens are the first divergence, in the prompt
/usr/bin/python3 -c "import json; p = json.load(open('$work/prompt.json')); p[1] = (p[1] + 1) % 256; print(json.dumps(p))" >"$work/prompt2.json"
$st run --model "$model" --prompt-tokens "$work/prompt2.json" --max-new-tokens 4 --ignore-eos \
  --tap 'layers.0.*' --trace "$work/other.h5" --store "$work/store" >/dev/null || failed "recording other"
diff_rc "different prompt" 1 --tap 'layers.0.*' "$work/a.h5" "$work/other.h5"
json_check "prompt difference at position 1 is the first divergence; rows before it equal" \
  "d['first_divergence']['tap'] == 'tokens' and d['first_divergence']['position'] == 1 and d['first_divergence']['in_prompt'] is True and t['layers.0.input']['rows_compared'] == 1 and t['layers.0.input']['verdict'] == 'ok'"

# 8. masks compared exactly: a copy with one visible score set to -inf, one hidden set to 0.5
cp "$work/a.h5" "$work/planted.h5"
check "h5py plants values in a copy" /usr/bin/python3 - "$work/planted.h5" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r+")
s = f["taps/layers.3.indexer.scores"]
row = s[200]
assert np.isfinite(row[5]) and np.isneginf(row[100])
row[5] = -np.inf
s[200] = row
o = f["taps/layers.2.output"]
r = o[7]; r[1, 3] = np.float32(r[1, 3]) * np.float32(1 + 1e-6); o[7] = r   # far below 1e-6
f.close()
PY
diff_rc "planted -inf" 1 "$work/a.h5" "$work/planted.h5"
json_check "mask divergence at position 200, column 5; the tiny change passes" \
  "d['first_divergence']['tap'] == 'layers.3.indexer.scores' and d['first_divergence']['metric'] == 'mask' and d['first_divergence']['value'] == 1 and d['first_divergence']['position'] == 200 and d['first_divergence']['coordinates'] == [5] and t['layers.2.output']['verdict'] == 'ok' and 0 < t['layers.2.output']['value'] < 1e-12 and t['layers.2.output']['bit_mismatch'] == 1"
diff_rc "exact rule catches the tiny change" 1 --tolerance 'layers.2.output=exact' "$work/a.h5" "$work/planted.h5"
json_check "exact: first differing element named" \
  "d['first_divergence']['tap'] == 'layers.2.output' and d['first_divergence']['metric'] == 'exact' and d['first_divergence']['position'] == 7 and d['first_divergence']['coordinates'] == [1, 3]"

# 9. usage and I/O errors: exit 2 with a message
expect_usage "one trace only" "two traces" "$work/a.h5"
expect_usage "missing trace" "nowhere.h5" "$work/a.h5" "$work/nowhere.h5"
head -c 4000 "$work/a.h5" >"$work/trunc.h5"
expect_usage "truncated trace" "trunc.h5" "$work/a.h5" "$work/trunc.h5"
expect_usage "unknown metric" "unknown metric 'jacard'" --tolerance 'indexer.topk=jacard:0.9' "$work/a.h5" "$work/a2.h5"
expect_usage "bad threshold" "threshold" --tolerance 'indexer.scores=diff:abc' "$work/a.h5" "$work/a2.h5"
expect_usage "rule without '='" "GLOB=METRIC" --tolerance 'indexer.scores' "$work/a.h5" "$work/a2.h5"
expect_usage "unknown option" "unknown option" --frobnicate "$work/a.h5" "$work/a2.h5"
# a --tap glob that matches no tap of either trace compares nothing: an error naming the glob
expect_usage "--tap matching no tap" "--tap 'layers\.\*\.indexr\.\*' matches no tap" --tap 'layers.*.indexr.*' "$work/a.h5" "$work/a2.h5"
expect_usage "--tap: one of two globs matching nothing" "--tap 'lgits' matches no tap" --tap 'layers.0.*' --tap lgits "$work/a.h5" "$work/a2.h5"
check "--help documents the grammar and exit codes" \
  bash -c "$st diff --help | grep -q 'GLOB=METRIC' && $st diff --help | grep -q 'exit status: 0'"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# End to end (issue 13 #7): input that used to be accepted without a word. `run --positions A:B`
# past every position the run forwards recorded 0 taps silently: refused (exit 2), saying how many
# tokens there are. `run --layer-set L:rotate=q` on a layer without an indexer (sliding, HCA) changes
# nothing: a warning naming the layer and its kind. `sparsetrace settings` lists the default
# `auto`, which `--set rotate=auto` refused: accepted, resolving as the default does.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny # layers: 0 sliding, 1 CSA, 2 HCA, 3 CSA
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
expect() { # expect DESCRIPTION RC PATTERN COMMAND...: exit RC, stderr matches PATTERN
  local out rc
  out=$("${@:4}" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$2" ]; then fail "$1: exit $rc, not $2: $out"; return; fi
  if ! grep -qE -- "$3" <<<"$out"; then fail "$1: message '$out' lacks /$3/"; return; fi
  echo "ok: $1 -> $(head -1 <<<"$out")"
}
quiet() { # quiet DESCRIPTION COMMAND...: exit 0, nothing on stderr
  local out
  out=$("${@:2}" 2>&1 >/dev/null) || { fail "$1: exit $?: $out"; return; }
  [ -z "$out" ] && echo "ok: $1" || fail "$1: unexpected stderr '$out'"
}
echo '[1, 2, 3, 4, 5, 6, 7, 8, 9]' >"$work/p.json"
run=($st run --model "$model" --prompt-tokens "$work/p.json" --store "$work/store" --tap logits)

# 1. --positions beyond the run's tokens
expect "--positions 30:40 on a 9-token prompt" 2 "--positions 30:40 lies beyond the run's tokens: the prompt has 9 tokens" \
  "${run[@]}" --positions 30:40
expect "--positions 9: on a 9-token prompt" 2 "the prompt has 9 tokens, positions 0 to 8" "${run[@]}" --positions 9:
expect "--positions 20:30 with --max-new-tokens 5" 2 "9 prompt tokens and up to 5 generated, positions 0 to 12" \
  "${run[@]}" --positions 20:30 --max-new-tokens 5
quiet "--positions 8:100 (reaches in) is fine" "${run[@]}" --positions 8:100
quiet "--positions 10:12 in the generated tokens is fine" "${run[@]}" --positions 10:12 --max-new-tokens 5
[ "$(ls "$work/store/runs" | wc -l)" -eq 2 ] && echo "ok: the refused runs wrote no trace" || fail "traces: $(ls "$work/store/runs")"

# 2. --layer-set with an indexer setting on a layer without an indexer
expect "--layer-set 2:rotate=q (HCA)" 0 "warning: --layer-set '2:rotate=q': layer 2 is an HCA layer, which has no indexer: rotate changes nothing" \
  "${run[@]}" --layer-set 2:rotate=q
expect "--layer-set 0:topk=4 (sliding)" 0 "layer 0 is a sliding-window layer, which has no indexer: topk changes nothing.*CSA layers, with an indexer: 1, 3" \
  "${run[@]}" --layer-set 0:topk=4
expect "--layer-set 1,2:index_k=bf16 names layer 2 only" 0 "layer 2 is an HCA layer" "${run[@]}" --layer-set 1,2:index_k=bf16
out=$("${run[@]}" --layer-set 1,2:index_k=bf16 2>&1 >/dev/null)
grep -q "layer 1 " <<<"$out" && fail "layer 1 (CSA) warned about: $out" || echo "ok: no warning for the CSA layer"
expect "--layer-set 0:yarn=off (no compressor)" 0 "layer 0 is a sliding-window layer, which has no compressor: yarn" \
  "${run[@]}" --layer-set 0:yarn=off
quiet "--layer-set 3:rotate=q (CSA) is quiet" "${run[@]}" --layer-set 3:rotate=q
quiet "--layer-set 2:yarn=off (HCA has a compressor) is quiet" "${run[@]}" --layer-set 2:yarn=off

# 3. every default that `settings` lists is accepted by --set, resolving as the default does
default_json=$("${run[@]}" --json | grep -o '"settings":{[^}]*}')
while read -r name default; do
  out=$("${run[@]}" --set "$name=$default" --json 2>&1) || { fail "--set $name=$default (listed default) refused: $out"; continue; }
  [ "$(grep -o '"settings":{[^}]*}' <<<"$out")" = "$default_json" ] && echo "ok: --set $name=$default resolves as the default" ||
    fail "--set $name=$default: $(grep -o '"settings":{[^}]*}' <<<"$out") vs $default_json"
done < <($st settings --json | python3 -c 'import json,sys; [print(s["name"], s["default"]) for s in json.load(sys.stdin)]')
out=$("${run[@]}" --set precision=reference --set rotate=auto --set index_k=auto --set index_q=auto --json 2>&1)
grep -q '"index_k":"fp4_e2m1","index_q":"fp4_e2m1","rotate":"both"' <<<"$out" && echo "ok: auto resolves from precision=reference" ||
  fail "auto under precision=reference: $out"
expect "--set rotate=bogus names auto among the values" 2 "allowed values are none\|q\|k\|both\|auto" "${run[@]}" --set rotate=bogus

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

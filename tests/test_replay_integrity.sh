#!/usr/bin/env bash
# test_replay_integrity.sh — issue 14 #9: a replay checks the trace against its own metadata.
# Before: a trace whose layers.1.indexer.q was cut to 0 rows (h5py resize; here test_recorder
# --truncate) replayed as "0 positions ... reproduce the recorded tensors bit for bit", exit 0;
# cut to 5 rows it silently replayed those 5, and either replay was stored under the run's id.
set -u
st=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
model=${ST_TEST_DATA:-}/oracle/tiny
if [[ -z "$st" || ! -x "$st" || ! -x "$FIXTURE" || ! -f $model/config.json ]]; then
  echo "skip: need ST_BIN, ST_BUILD_DIR/tests/test_recorder and ST_TEST_DATA/oracle/tiny"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/st_test_rint.XXXXXX")
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
awk 'BEGIN { s = 11; printf "["; for (i = 0; i < 64; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
"$st" run --model "$model" --prompt-tokens "$work/p.json" --tap 'layers.1.*' --store "$work/s" \
  --trace "$work/clean.h5" >/dev/null 2>&1 || { echo "FAIL: run"; exit 1; }
replays() { "$st" query --store "$work/s" --json "SELECT count(*) AS n FROM replays" | tr -dc '0-9'; }

for stage in indexer layer; do
  for rows in 0 5; do
    cp "$work/clean.h5" "$work/cut.h5"
    tap=layers.1.indexer.q
    [[ $stage == layer ]] && tap=layers.1.input
    "$FIXTURE" --truncate "$work/cut.h5" $tap $rows || { bad "truncate"; continue; }
    before=$(replays)
    out=$("$st" replay --trace "$work/cut.h5" --model "$model" --layer 1 --stage $stage --store "$work/s" 2>&1)
    rc=$?
    if [[ $rc -eq 1 && "$out" == *"changed after recording"* && "$out" != *"bit for bit"* ]]; then ok
    else bad "$stage, $tap cut to $rows rows: rc=$rc: $out"; fi
    [[ $(replays) == "$before" ]] && ok || bad "$stage, $rows rows: a replay was stored"
  done
done
# the untouched trace still replays, bit for bit, and is stored
out=$("$st" replay --trace "$work/clean.h5" --model "$model" --layer 1 --stage indexer --store "$work/s" 2>&1)
if [[ $? -eq 0 && "$out" == *"reproduce the recorded tensors bit for bit"* ]]; then ok; else bad "clean replay: $out"; fi

echo "test_replay_integrity: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

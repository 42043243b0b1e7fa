#!/usr/bin/env bash
# test_store_check.sh — issue 14 #1: `sparsetrace store check [--repair]` on a store recorded by
# `test_recorder --fixture` (two finished runs, one aborted .part), then damaged: one trace file
# removed (a row without its file), one row deleted (a complete trace without a row: a crash
# between rename and index insert), a copy of a trace under another name (a file whose run the
# index has elsewhere), the .part aged past the grace period. Before: there was no such command
# (sparsetrace: unknown command 'store', exit 2).
set -u
BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
PY=$(command -v python3 || true)
[[ -n "$PY" ]] || { echo "skip: need python3 (sqlite3) to damage the index"; exit 77; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_store.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
S=$TMP/store
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
run() { out=$("$@" 2>"$TMP/stderr"); rc=$?; err=$(cat "$TMP/stderr"); }
expect_rc() { if [[ $rc -eq $1 ]]; then ok; else bad "$2: exit $rc, wanted $1 (out: $out err: $err)"; fi; }
expect_in() { if [[ "$1" == *"$2"* ]]; then ok; else bad "$3: '$2' not in: $1"; fi; }
q() { "$BIN" query --store "$S" --json "$1" | tr -d ' \n'; }

"$FIXTURE" --fixture "$S" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }
run "$BIN" store check --store "$S"
expect_rc 1 "fresh fixture (its aborted .part)"
expect_in "$out" "leftover .part" "fresh fixture"
run "$BIN" store check --store "$S" --repair
expect_rc 1 "a .part written to just now is not deleted"
[[ -e $S/runs/aborted.h5.part ]] && ok || bad "a fresh .part was deleted"

touch -d '1 hour ago' "$S/runs/aborted.h5.part"
last_id=$(q "SELECT run_id FROM runs WHERE trace_path = 'runs/fixture-last.h5'" | sed 's/.*"run_id":"\([^"]*\)".*/\1/')
rm "$S/runs/fixture-all.h5"
"$PY" -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("PRAGMA foreign_keys=ON"); c.execute("DELETE FROM runs WHERE run_id=?", (sys.argv[2],)); c.commit()' \
  "$S/index.sqlite" "$last_id"
cp "$S/runs/fixture-last.h5" "$S/copy.h5"
run "$BIN" store check --store "$S"
expect_rc 1 "damaged store"
expect_in "$out" "row without its file" "dangling row reported"
expect_in "$out" "file without row: $S/runs/fixture-last.h5" "orphan reported"
expect_in "$out" "leftover .part" "old .part reported"
expect_in "$out" "4 problems" "problem count"

run "$BIN" store check --store "$S" --repair
expect_rc 1 "repair leaves two copies of one run unindexed"
expect_in "$out" "holds the same run as" "duplicate explained"
[[ ! -e $S/runs/aborted.h5.part ]] && ok || bad "old .part not deleted"
expect_in "$(q "SELECT count(*) AS n FROM runs")" '"n":0' "dangling row gone, no copy indexed"
rm "$S/copy.h5"
run "$BIN" store check --store "$S" --repair
expect_rc 0 "second repair"
expect_in "$out" "indexed: $S/runs/fixture-last.h5 as run $last_id" "orphan indexed"
expect_in "$(q "SELECT trace_path FROM runs")" '"runs/fixture-last.h5"' "orphan indexed by the path rule"
expect_in "$(q "SELECT group_concat(kind) AS k FROM (SELECT kind FROM store_notes ORDER BY note_id)")" \
  'dangling_row,part_removed,orphan_indexed' "notes"
n_taps=$(q "SELECT count(*) AS n FROM taps WHERE run_id = '$last_id'")
[[ "$n_taps" != *'"n":0'* ]] && ok || bad "the re-indexed run has no taps: $n_taps"

run "$BIN" store check --store "$S"
expect_rc 0 "consistent after repair"
expect_in "$out" "0 problems" "consistent"
run "$BIN" store check --store "$S" --nonsense
expect_rc 2 "usage error"
run "$BIN" store --store "$S"
expect_rc 2 "no subcommand"
run "$BIN" store check --store "$TMP/nothing"
expect_rc 1 "no index"

echo "test_store_check: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

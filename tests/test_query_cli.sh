#!/usr/bin/env bash
# test_query_cli.sh — `sparsetrace query` and `sparsetrace inspect` driven the way a user does,
# against a store recorded by `test_recorder --fixture` (two finished runs and one aborted).
# Checks output shapes, read-only enforcement (the index is unchanged after refused writes),
# clear errors and exit codes for missing stores and truncated, garbage and unfinished traces.
set -u

BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3 || true)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_query_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
STORE=$TMP/store
passed=0
failed=0

ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }

# run CMD...: captures stdout in $out, stderr in $err, exit code in $rc
run() {
  out=$("$@" 2>"$TMP/stderr")
  rc=$?
  err=$(cat "$TMP/stderr")
}

expect_rc() { # expect_rc WANT what
  if [[ $rc -eq $1 ]]; then ok; else bad "$2: exit $rc, wanted $1 (stderr: $err)"; fi
}
expect_in() { # expect_in HAYSTACK NEEDLE what
  if [[ "$1" == *"$2"* ]]; then ok; else bad "$3: '$2' not in: $1"; fi
}

"$FIXTURE" --fixture "$STORE" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }
ALL=$STORE/runs/fixture-all.h5
LAST=$STORE/runs/fixture-last.h5

# ---------------------------------------------------------------- query
run "$BIN" query --help
expect_rc 0 "query --help"
expect_in "$out" "read-only" "query --help text"

run "$BIN" query --store "$STORE" "SELECT model, tap_positions, n_prompt, n_generated FROM run_summary ORDER BY tap_positions"
expect_rc 0 "query table"
expect_in "$out" "model" "table header"
expect_in "$out" "tiny-dsv4" "table row"
expect_in "$out" "(2 rows)" "row count"
header=$(printf '%s\n' "$out" | sed -n 1p)
dashes=$(printf '%s\n' "$out" | sed -n 2p)
[[ ${#dashes} -ge $((${#header} - 1)) ]] && ok || bad "table rule shorter than header"

run "$BIN" query --store "$STORE" --json "SELECT name, layer, rms, shape FROM taps WHERE positions_placeholder IS NULL"
expect_rc 1 "query with unknown column"
expect_in "$err" "no such column" "SQL error text"

run "$BIN" query --store "$STORE" --json "SELECT name, layer, rms FROM tap_summary WHERE tap_positions = 'last' ORDER BY name"
expect_rc 0 "query --json"
if [[ -n "$PY" ]]; then
  printf '%s' "$out" | "$PY" -c '
import json, sys
rows = json.load(sys.stdin)
assert len(rows) == 7, rows
logits = [r for r in rows if r["name"] == "logits"][0]
assert logits["layer"] is None and isinstance(logits["rms"], float)
topk = [r for r in rows if r["name"] == "layers.2.indexer.topk"][0]
assert topk["rms"] is None and topk["layer"] == 2
' && ok || bad "query --json output: $out"
fi

run "$BIN" query --store "$STORE" --json "SELECT 1 WHERE 0"
expect_rc 0 "empty json"
[[ "$out" == "[]" ]] && ok || bad "empty json result: $out"

echo "SELECT count(*) AS n FROM runs" > "$TMP/q.sql"
run "$BIN" query --store "$STORE" - < "$TMP/q.sql"
expect_rc 0 "query from stdin"
expect_in "$out" "2" "stdin query result"

count_before=$("$BIN" query --store "$STORE" --json "SELECT count(*) AS n FROM taps")
for sql in "DELETE FROM taps" "UPDATE runs SET model = 'x'" "DROP TABLE runs" \
           "INSERT INTO builds (revision, compiler, build_type, backend, kernel_mode) VALUES (1,2,3,4,5)" \
           "PRAGMA user_version = 99" "CREATE TABLE t (x)" "VACUUM"; do
  run "$BIN" query --store "$STORE" "$sql"
  expect_rc 1 "refuse: $sql"
  expect_in "$err" "read-only" "refusal message for: $sql"
done
run "$BIN" query --store "$STORE" "SELECT 1; DELETE FROM taps"
expect_rc 1 "two statements"
expect_in "$err" "one SQL statement" "two statements message"
run "$BIN" query --store "$STORE" "ATTACH '$TMP/other.db' AS other"
expect_rc 1 "attach a new database"
[[ ! -e "$TMP/other.db" ]] && ok || bad "ATTACH created a file"
count_after=$("$BIN" query --store "$STORE" --json "SELECT count(*) AS n FROM taps")
[[ "$count_before" == "$count_after" ]] && ok || bad "index changed: $count_before -> $count_after"

run "$BIN" query --store "$TMP/nowhere" "SELECT 1"
expect_rc 1 "missing store"
expect_in "$err" "no index at $TMP/nowhere/index.sqlite" "missing store message"
run "$BIN" query
expect_rc 2 "no SQL"
(cd "$TMP" && "$BIN" query "SELECT 1" >/dev/null 2>"$TMP/stderr"); rc=$?; err=$(cat "$TMP/stderr")
expect_rc 1 "default store ./traces absent"
expect_in "$err" "traces/index.sqlite" "default store path"

# ---------------------------------------------------------------- inspect
run "$BIN" inspect --help
expect_rc 0 "inspect --help"

run "$BIN" inspect "$ALL"
expect_rc 0 "inspect"
expect_in "$out" "(complete," "complete"
expect_in "$out" "tiny-dsv4" "model"
expect_in "$out" "9 (6 prompt + 3 generated)" "tokens"
expect_in "$out" "layers.2.indexer.scores" "tap list"
expect_in "$out" "compressed_row" "axis0"
expect_in "$out" '"rotate":"none"' "settings"
expect_in "$out" "layer 2" "readiness layer"
expect_in "$out" "--stage indexer: ready" "indexer ready"
expect_in "$out" "--stage layer|rest: missing input" "layer stage missing input"

run "$BIN" inspect --json "$LAST"
expect_rc 0 "inspect --json"
if [[ -n "$PY" ]]; then
  printf '%s' "$out" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["complete"] is True and d["positions"] == "last"
assert d["tokens"] == {"n_tokens": 9, "n_prompt": 6, "n_generated": 3}, d["tokens"]
assert d["settings"]["precision"] == "exact"
taps = {t["name"]: t for t in d["taps"]}
assert len(taps) == 7
assert taps["layers.0.input"]["shape"] == [4, 2, 3] and taps["layers.0.input"]["has_positions"]
assert taps["layers.2.indexer.k"]["axis0"] == "compressed_row"
r = d["replay_readiness"]
assert r[0]["layer"] == 2 and r[0]["indexer"] and not r[0]["layer_rest"], r
' && ok || bad "inspect --json output"
fi

head -c 20000 "$ALL" > "$TMP/truncated.h5"
run "$BIN" inspect "$TMP/truncated.h5"
expect_rc 1 "truncated trace"
expect_in "$err" "$TMP/truncated.h5" "truncated names the file"
expect_in "$err" "truncated" "truncated says so"

head -c 3000 /dev/urandom > "$TMP/garbage.h5"
run "$BIN" inspect "$TMP/garbage.h5"
expect_rc 1 "garbage trace"
expect_in "$err" "not a readable HDF5 file" "garbage message"

run "$BIN" inspect "$STORE/runs/aborted.h5.part"
expect_rc 1 "unfinished trace"
expect_in "$err" "unfinished" "unfinished message"
expect_in "$err" "--partial" "hint at --partial"
run "$BIN" inspect "$STORE/runs/aborted.h5"
expect_rc 1 "final name of an unfinished trace"
expect_in "$err" "never finished" "points at the .part"
run "$BIN" inspect --partial "$STORE/runs/aborted.h5.part"
expect_rc 0 "inspect --partial"
expect_in "$out" "INCOMPLETE" "partial says incomplete"

run "$BIN" inspect "$TMP/missing.h5"
expect_rc 1 "missing trace"
expect_in "$err" "No such file" "missing message"
run "$BIN" inspect
expect_rc 2 "no trace"
run "$BIN" inspect "$ALL" --bogus
expect_rc 2 "unknown option"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]

#!/usr/bin/env bash
# test_query_limits.sh — issue 14 #12: `sparsetrace query` bounds time, memory, value size and
# output. Before: printf('%.*c', 2e9, 'x') built a 2 GB string and ran ~30 s (past the 20 s the
# user was told), a 100 MB zeroblob was answered, and output had no bound.
set -u
BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_qlim.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
STORE=$TMP/store
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
"$FIXTURE" --fixture "$STORE" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }

expect() { # expect LABEL WANT_RC NEEDLE_IN_STDERR CMD...
  local label=$1 want=$2 needle=$3; shift 3
  local t0=$SECONDS
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? err
  err=$(head -c 2000 "$TMP/err")
  if [[ $rc -eq $want && "$err" == *"$needle"* ]]; then ok
  else bad "$label: rc=$rc (wanted $want), stderr: $err"; fi
  LAST_S=$((SECONDS - t0))
}

# a value over the 64 MiB limit: refused, not built
expect "zeroblob over the value limit" 1 "limit of 64 MiB" \
  "$BIN" query --store "$STORE" "SELECT length(zeroblob(100000000))"
# one function call that runs long: stopped by the hard limit a second after --timeout
expect "printf 2e9 under --timeout 2" 1 "time limit" \
  "$BIN" query --store "$STORE" --timeout 2 "SELECT length(printf('%.*c', 2e9, 'x'))"
if [[ $LAST_S -le 6 ]]; then ok; else bad "printf 2e9 took ${LAST_S}s with --timeout 2"; fi
# a statement that never ends: stopped at the deadline
expect "endless recursive CTE under --timeout 1" 1 "time limit of 1 s" \
  "$BIN" query --store "$STORE" --timeout 1 \
  "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"
# output past 256 MiB: JSON stops with an error (and still closes its array)
expect "JSON output over 256 MiB" 1 "limit of 256 MiB" \
  "$BIN" query --store "$STORE" --json \
  "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 6) SELECT hex(zeroblob(30000000)) AS v FROM r"
# the table, buffered before printing, likewise
# (wide rows, few of them, and a generous --timeout: only the output limit may stop it, also in the
# slow sanitizer build)
expect "table over 256 MiB" 1 "limit of 256 MiB" \
  "$BIN" query --store "$STORE" --timeout 600 \
  "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 300000) SELECT i, printf('%0990d', i) FROM r"
# bad --timeout is a usage error; ordinary queries are unaffected
expect "--timeout 0" 2 "--timeout" "$BIN" query --store "$STORE" --timeout 0 "SELECT 1"
expect "ordinary query" 0 "" "$BIN" query --store "$STORE" "SELECT count(*) FROM runs"

echo "test_query_limits: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

#!/usr/bin/env bash
# test_readonly_store.sh — issue 14 #10: `query` and `requests list` on a store this user cannot
# write. The index is in WAL mode, so an ordinary read-only open fails ("attempt to write a
# readonly database": SQLite must create index.sqlite-shm); it is opened by URI instead (mode=ro
# or immutable=1) with one line on stderr saying so. Tested as an unprivileged user (setpriv or
# runuser; root ignores permission bits) and through ST_INDEX_READONLY=1 (the same code path,
# forced); skipped (77) only when neither can run.
set -u

BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_ro.XXXXXX")
trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
chmod 755 "$TMP"
STORE=$TMP/store
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
run() { out=$("$@" 2>"$TMP/stderr"); rc=$?; err=$(cat "$TMP/stderr"); }

"$FIXTURE" --fixture "$STORE" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }
n_runs=$("$BIN" query --store "$STORE" --json "SELECT count(*) AS n FROM runs" | tr -dc '0-9')
# as a writer's clean close leaves it: WAL checkpointed into index.sqlite, no -wal, no -shm
python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.close()' \
  "$STORE/index.sqlite" || { echo "FAIL: python3 sqlite3 checkpoint"; exit 1; }
rm -f "$STORE/index.sqlite-wal" "$STORE/index.sqlite-shm"
chmod -R a-w "$STORE"
chmod a+rx "$STORE"

check() { # check LABEL CMD-PREFIX...
  local label=$1; shift
  run "$@" "$BIN" query --store "$STORE" "SELECT count(*) AS n FROM runs"
  if [[ $rc -eq 0 && "$out" == *"$n_runs"* ]]; then ok; else bad "$label: query rc=$rc out=$out err=$err"; fi
  if [[ "$err" == *"not writable"* && $(grep -c "not writable" <<<"$err") -eq 1 ]]; then ok
  else bad "$label: query did not say once that the store is read-only: $err"; fi
  run "$@" "$BIN" requests list --store "$STORE"
  if [[ $rc -eq 0 ]]; then ok; else bad "$label: requests list rc=$rc err=$err"; fi
  # nothing was created in the store
  if [[ ! -e $STORE/index.sqlite-shm && ! -e $STORE/index.sqlite-wal ]]; then ok
  else bad "$label: files were created in the read-only store: $(ls "$STORE")"; fi
}

# the unprivileged user first: the store is as a clean close left it (no -wal, no -shm)
if [[ $(id -u) -ne 0 ]]; then
  check "as $(id -un)" env
elif command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
  check "as uid 65534 (setpriv)" setpriv --reuid=65534 --regid=65534 --clear-groups
elif command -v runuser >/dev/null && runuser -u nobody -- true 2>/dev/null; then
  check "as nobody (runuser)" runuser -u nobody --
else
  echo "note: root and no setpriv/runuser: only the forced path was tested"
fi
check "forced (ST_INDEX_READONLY=1)" env ST_INDEX_READONLY=1
# a writable store is opened the ordinary way: no note
chmod -R u+w "$STORE"
run "$BIN" query --store "$STORE" "SELECT 1"
if [[ $rc -eq 0 && "$err" != *"not writable"* ]]; then ok; else bad "writable store: rc=$rc err=$err"; fi

echo "test_readonly_store: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

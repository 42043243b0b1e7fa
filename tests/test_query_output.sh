#!/usr/bin/env bash
# `sparsetrace query` output a script can use: table cells are cut at 80 characters only on a
# terminal (a pty from script(1)) and never with --full / --no-truncate, when piped, or in
# --json, so `SELECT sql FROM sqlite_schema` (what query --help recommends) prints the whole
# statement; --json prints taps.shape (and any column named shape holding an integer array) as a
# JSON array; the index has no column called plain `positions` (the positions filter is
# runs.tap_positions, migration 0008; counts are *_positions), so runs joined with the needle
# views needs no qualification. Store: `test_recorder --fixture`. Bounded: about a second.
set -u
BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3 || true)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_query_output.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
STORE=$TMP/store
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
"$FIXTURE" --fixture "$STORE" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }

schema_sql="SELECT sql FROM sqlite_schema WHERE name = 'needle_rank_by_layer'"
# piped: whole
out=$("$BIN" query --store "$STORE" "$schema_sql" 2>&1)
if [[ "$out" == *"GROUP BY p.run_id, p.replay_id, p.needle_id, p.layer"* && "$out" != *"..."* ]]; then
  ok "piped output is not cut"; else bad "piped output cut: $out"; fi
out=$("$BIN" query --store "$STORE" --json "$schema_sql" 2>&1)
[[ "$out" == *"GROUP BY p.run_id"* ]] && ok "--json is not cut" || bad "--json cut: $out"

# on a terminal: cut, unless --full / --no-truncate
if command -v script >/dev/null && script -qec true /dev/null >/dev/null 2>&1; then
  q=$(printf '%q ' "$BIN" query --store "$STORE" "$schema_sql")
  out=$(script -qec "$q" /dev/null </dev/null 2>&1 | tr -d '\r')
  if [[ "$out" == *"..."* && "$out" != *"GROUP BY"* ]]; then ok "terminal output is cut at 80"; else bad "terminal output not cut: $out"; fi
  for flag in --full --no-truncate; do
    out=$(script -qec "$q $flag" /dev/null </dev/null 2>&1 | tr -d '\r')
    [[ "$out" == *"GROUP BY p.run_id, p.replay_id, p.needle_id, p.layer"* ]] && ok "terminal $flag is whole" ||
      bad "terminal $flag cut: $out"
  done
else
  echo "note: no script(1) pty; the terminal case is not checked"
fi
out=$("$BIN" query --help)
[[ "$out" == *"--full"* ]] && ok "query --help lists --full" || bad "query --help: no --full"

# shape as an array
if [[ -n "$PY" ]]; then
  "$BIN" query --store "$STORE" --json "SELECT name, shape, dtype, 'x' AS shape_note, '[1, 2' AS bad_shape, '[]' AS empty_shape FROM taps" >"$TMP/shape.json" 2>&1
  if err=$("$PY" - "$TMP/shape.json" 2>&1 <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert rows, "no taps"
for r in rows:
    assert isinstance(r["shape"], list) and all(isinstance(x, int) for x in r["shape"]), r
    assert r["shape_note"] == "x" and r["bad_shape"] == "[1, 2" and r["empty_shape"] == [], r
PY
  ); then ok "--json shape is an array"; else bad "--json shape: $err $(head -c 300 "$TMP/shape.json")"; fi
fi

# one name per notion: no column called plain `positions`
out=$("$BIN" query --store "$STORE" "SELECT m.name || '.' || p.name AS col FROM sqlite_schema m JOIN pragma_table_info(m.name) p WHERE m.type IN ('table', 'view') AND p.name = 'positions'" 2>&1)
[[ "$out" == *"(0 rows)"* ]] && ok "no column named positions" || bad "columns named positions: $out"
out=$("$BIN" query --store "$STORE" "SELECT tap_positions, n_prompt FROM run_summary ORDER BY tap_positions" 2>&1)
[[ "$out" == *"last"* && "$out" == *"(2 rows)"* ]] && ok "run_summary.tap_positions" || bad "run_summary.tap_positions: $out"
out=$("$BIN" query --store "$STORE" "SELECT count(*) AS n FROM tap_summary WHERE tap_positions = 'last'" 2>&1)
[[ $? -eq 0 ]] && ok "tap_summary.tap_positions" || bad "tap_summary.tap_positions: $out"
out=$("$BIN" query --store "$STORE" "SELECT run_id, tap_positions, layer, answer_positions, recorded_positions FROM runs JOIN needle_rank_by_layer USING (run_id)" 2>&1)
[[ $? -eq 0 ]] && ok "runs joined with needle_rank_by_layer" || bad "join: $out"

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# test_trace_corrupt_superblock.sh — issue 14 #12: a trace whose superblock is corrupt (one byte,
# offset 25, set to 0x20) gives one clear error and, in the sanitizer build, no leak report.
# libhdf5 leaks on this error path by itself; tools/lsan.supp (LSAN_OPTIONS in tools/test.sh)
# suppresses that. Before: the ASan run of this command exited with LeakSanitizer's report.
set -u
BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" ]]; then
  echo "skip: need ST_BIN (sparsetrace) and ST_BUILD_DIR/tests/test_recorder"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_csb.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
"$FIXTURE" --fixture "$TMP/store" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }
cp "$TMP/store/runs/fixture-all.h5" "$TMP/bad.h5"
printf '\x20' | dd of="$TMP/bad.h5" bs=1 seek=25 conv=notrunc status=none
if [[ -n "${ST_SOURCE_DIR:-}" && -z "${LSAN_OPTIONS:-}" ]]; then
  export LSAN_OPTIONS=suppressions=$ST_SOURCE_DIR/tools/lsan.supp:print_suppressions=0
fi
"$BIN" inspect "$TMP/bad.h5" >/dev/null 2>"$TMP/err"
rc=$?
if [[ $rc -eq 1 ]] && grep -q "not a readable HDF5 file" "$TMP/err"; then
  echo "test_trace_corrupt_superblock: passed"
  exit 0
fi
echo "FAIL: rc=$rc (wanted 1 and a clear error): $(head -c 3000 "$TMP/err")"
exit 1

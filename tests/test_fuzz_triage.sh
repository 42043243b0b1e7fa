#!/usr/bin/env bash
# tools/fuzz_first_frame.awk, which tells tools/fuzz.sh whether a fuzzer's report starts inside a
# library it feeds (kept aside, the fuzzer restarted) or in our code (the run fails). Held to real
# reports: small programs built here with clang's AddressSanitizer overflow a heap block in a
# shared library or in the executable, and the tool must name the one that did it. The first case
# is the CI failure of 2026-12-05: libhdf5 called strdup on a corrupt name, and ASan's strdup
# interceptor (a frame in the executable named plain "strdup") passed for our code.
set -uo pipefail
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
tool=$src/tools/fuzz_first_frame.awk
cc=${FUZZ_CC:-clang}
command -v "$cc" >/dev/null || { echo "skip: $cc missing (tools/deps.sh installs clang)"; exit 77; }
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures

cat >"$work/lib.c" <<'C'
#include <stdlib.h>
#include <string.h>
/* a "name" read from a file, its terminator missing: strdup reads past the block */
char *lib_read_name(void) { char *b = malloc(8); memcpy(b, "namename", 8); char *d = strdup(b); free(b); return d; }
/* a library that calls back into its caller (as H5Literate does) */
void lib_iterate(void (*cb)(void)) { cb(); }
C
cat >"$work/main.c" <<'C'
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
char *lib_read_name(void);
void lib_iterate(void (*cb)(void));
static void ours(void) { char *b = malloc(8); memcpy(b, "ourbytes", 8); char *d = strdup(b); puts(d); }
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "lib")) puts(lib_read_name());
  if (argc > 1 && !strcmp(argv[1], "ours")) ours();
  if (argc > 1 && !strcmp(argv[1], "callback")) lib_iterate(ours);
  if (argc > 1 && !strcmp(argv[1], "leak")) { void *p = malloc(64); p = 0; }
  return 0;
}
C
# no -g, as Debian's libhdf5: its frames name the .so, not a source line
"$cc" -O0 -fPIC -shared "$work/lib.c" -o "$work/libfeed.so" || { echo "FAIL: building the library"; exit 1; }
"$cc" -g -O0 -fsanitize=address,undefined "$work/main.c" -L"$work" -lfeed -Wl,-rpath,"$work" \
  -o "$work/prog" || { echo "FAIL: building the program"; exit 1; }

check() {  # case expected [ASAN_OPTIONS]
  local case=$1 want=$2 opts=${3:-}
  ASAN_OPTIONS=detect_leaks=1:$opts "$work/prog" "$case" >"$work/$case.log" 2>&1
  grep -q 'ERROR: \(AddressSanitizer\|LeakSanitizer\)' "$work/$case.log" \
    || { fail "$case: the program made no sanitizer report"; return; }
  local got
  got=$(awk -f "$tool" "$work/$case.log")
  [ "$got" = "$want" ] || { fail "$case ($opts): '$got', expected '$want'"; sed -n '1,8p' "$work/$case.log"; }
}
check lib "$work/libfeed.so"
check ours sparsetrace
check callback sparsetrace
check leak ""
# No llvm-symbolizer (no source lines, no names): the frames in the executable are taken for ours,
# so a callback from a library is never passed off as the library's fault.
check callback sparsetrace symbolize=0
check ours sparsetrace symbolize=0

# the report's first frame is the interceptor, named plain strdup, in the executable
grep -q '#0 0x[0-9a-f]* in strdup (' "$work/lib.log" \
  || fail "the library case no longer starts with a bare strdup frame: the test no longer covers it"

[ "$failures" -eq 0 ] && echo "fuzz triage: all cases pass" || exit 1

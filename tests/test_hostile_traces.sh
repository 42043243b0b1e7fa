#!/usr/bin/env bash
# test_hostile_traces.sh — corrupt traces found by tests/fuzz/fuzz_trace.c (tests/data/hostile/)
# given to every command that opens a trace file itself: each must end with exit 1 and a message
# that names the file and says it is corrupt (diff: exit 2, its "unreadable trace", as cmp(1)),
# never with a signal or a hang.
#   attr-undecodable.h5       one attribute message of / does not decode. Before: listing the
#                             attributes (H5Aiterate2) made libhdf5 1.10 free a half-built table
#                             of uninitialised pointers: SEGV in H5A__close (under ASan, or here
#                             with MALLOC_PERTURB_, which fills fresh memory as a used heap would).
#   attr-name-unterminated.h5  found by CI's fuzzer on 2026-12-05: a root attribute message's
#                             name has no terminator, and libhdf5 1.10 strdup()s past its block
#                             (H5MM_strdup from H5O_attr_shared_decode, under H5Aexists). ASan
#                             reports the over-read in libhdf5; here the message does not decode
#                             and every command says the trace is corrupt.
#   gheap-empty-free-object.h5  the global heap collection holding the vlen strings ends in a
#                             free-space object of size 0. Before: libhdf5 1.10's heap decoder
#                             looped forever reading the first string attribute (format).
#   heap-read-crash.h5        3 bytes off the fuzzer seed deflate.h5, in object headers (one
#                             next to a tap's shape_doc attribute message). libhdf5 crashes in
#                             H5HG_read fetching a string attribute's bytes from the global heap,
#                             past any check a caller can make; st_trace_open's pre-check in a
#                             child process turns that into "the HDF5 library crashed reading it
#                             (signal 11, ...)". Before: SEGV.
#   vlen-huge-length.h5       found by a 120 s fuzzer run: one byte off a seed makes the
#                             variable-length string attribute `config` claim about 4 GiB, which
#                             libhdf5 allocates and touches before it finds the heap object too
#                             short. Before: inspect took 20 s and 4 GB of memory (its pre-check
#                             child, then its own open, each read it) to say "corrupt". Now the
#                             child runs with its data capped 1 GiB above what it holds, fails the
#                             allocation at once and hands its message over: "reading its metadata
#                             needs more than 1024 MiB".
# Each command gets 10 s (a clean open takes milliseconds) and, with everything it starts, at
# most 512 MiB of memory at its peak (a small trace's metadata takes a few MiB); store check
# finds the file as a trace without a row in a store written by test_recorder --fixture.
set -u
BIN=${ST_BIN:-}
FIXTURE=${ST_BUILD_DIR:-}/tests/test_recorder
DATA=${ST_TEST_DATA:-}
MODEL=$DATA/oracle/tiny
if [[ -z "$BIN" || ! -x "$BIN" || ! -x "$FIXTURE" || ! -d "$DATA/hostile" || ! -f $MODEL/config.json ]]; then
  echo "skip: need ST_BIN, ST_BUILD_DIR/tests/test_recorder, ST_TEST_DATA/hostile and oracle/tiny"
  exit 77
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/st_test_hostile.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if [[ -n "${ST_SOURCE_DIR:-}" && -z "${LSAN_OPTIONS:-}" ]]; then
  export LSAN_OPTIONS=suppressions=$ST_SOURCE_DIR/tools/lsan.supp:print_suppressions=0
fi
export MALLOC_PERTURB_=165
"$FIXTURE" --fixture "$TMP/store" >/dev/null 2>&1 || { echo "FAIL: could not write the fixture"; exit 1; }
passed=0
failed=0

# check NAME FILE WHERE RC CMD...: CMD must exit RC within 10 s, its WHERE (stdout or stderr)
# naming FILE and saying "corrupt".
check() {
  local name=$1 file=$2 where=$3 want=$4
  shift 4
  # the command's exit status, and its peak memory with what it started (the largest process of
  # the tree: RUSAGE_CHILDREN's ru_maxrss, KiB) in $TMP/stdout.rss
  python3 -c 'import resource, subprocess, sys
try:
    rc = subprocess.run(sys.argv[3:], stdout=open(sys.argv[1], "w"), stderr=open(sys.argv[2], "w"), timeout=10).returncode
except subprocess.TimeoutExpired:
    rc = 137
open(sys.argv[1] + ".rss", "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(128 - rc if rc < 0 else rc)' "$TMP/stdout" "$TMP/stderr" "$@"
  local rc=$?
  local rss_kib
  rss_kib=$(cat "$TMP/stdout.rss" 2>/dev/null || echo 0)
  local text
  text=$(cat "$TMP/$where")
  local why=
  if [[ $rc -eq 137 ]]; then why="still running after 10 s (killed)"
  elif [[ $rc -ge 128 ]]; then why="killed by signal $((rc - 128))"
  elif [[ $rc -ne $want ]]; then why="exit $rc, wanted $want"
  elif [[ $rss_kib -gt $((512 * 1024)) ]]; then why="it took $((rss_kib / 1024)) MiB of memory at its peak"
  elif [[ "$text" != *"$file"* ]]; then why="its $where does not name $file"
  elif [[ "$text" != *corrupt* ]]; then why="its $where does not say the trace is corrupt"
  fi
  if [[ -z "$why" ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name on ${file##*/}: $why; $where: $(head -c 600 "$TMP/$where")"
  fi
}

for src in "$DATA"/hostile/*.h5; do
  f=$TMP/${src##*/}
  cp "$src" "$f"
  check inspect "$f" stderr 1 "$BIN" inspect "$f"
  check "inspect --partial" "$f" stderr 1 "$BIN" inspect --partial "$f"
  check diff "$f" stderr 2 "$BIN" diff "$f" "$TMP/store/runs/fixture-all.h5"
  check replay "$f" stderr 1 "$BIN" replay --trace "$f" --model "$MODEL" --layer 0 --store "$TMP/store"
  cp "$src" "$TMP/store/runs/hostile.h5"
  check "store check" "$TMP/store/runs/hostile.h5" stdout 1 "$BIN" store check --store "$TMP/store"
  rm -f "$TMP/store/runs/hostile.h5"
done
echo "test_hostile_traces: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

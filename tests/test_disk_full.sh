#!/usr/bin/env bash
# test_disk_full.sh — a disk that fills while sparsetrace writes (hardening issue: "bad input gets
# a clear error and loses nothing").
#
# Two ways to fill it: the file size limit (RLIMIT_FSIZE: `ulimit -f`, SIGXFSZ ignored, so a write
# past it fails with EFBIG) at several sizes, and, where a tmpfs can be mounted (root), a small
# filesystem filled up to a few MiB (ENOSPC). Under each:
#   run      `run --tap '*'` of tests/data/oracle/tiny (23 MB of trace) into a store that already
#            holds a run: exit 1 (not a signal), a message naming the trace file and saying the
#            disk is full / the file is too large, `store check` reporting only the .part, which
#            `--repair` removes, and the earlier run still indexed with its content digest
#            verified by `store check`;
#   capture  the proxy on a store that already holds captured exchanges, a request whose bodies
#            spill to files (--inline-max) and a burst of streams: the clients still get their
#            answers, the proxy exits 1 at SIGTERM (not a signal) with a message naming the store
#            file and the cause, and every exchange captured before is still there, byte for byte.
# Before the fixes: `run` died of SIGSEGV at exit (libhdf5 closing the trace a second time), the
# message said neither the cause nor, for a tap's write, the file; the proxy said "disk I/O error".
set -u
BIN=${ST_BIN:-}
FAKE=${ST_BUILD_DIR:-}/tests/fake_upstream
model=${ST_TEST_DATA:-}/oracle/tiny
if [[ -z "$BIN" || ! -x "$BIN" || ! -f $model/config.json || ! -x "$FAKE" ]]; then
  echo "skip: need ST_BIN, ST_BUILD_DIR/tests/fake_upstream and ST_TEST_DATA/oracle/tiny"
  exit 77
fi
command -v sqlite3 >/dev/null && command -v curl >/dev/null || { echo "skip: need sqlite3 and curl"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/st_test_disk_full.XXXXXX")
PIDS=()
MNT=
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ -n "$MNT" ]] && umount "$MNT" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
expect() { # expect WHAT COMMAND...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}

awk 'BEGIN { s = 5; printf "["; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$T/p.json"

# store_is_sound LABEL STORE N_RUNS: store check reports nothing but .part files; --repair (the
# .part aged past its grace period) fixes them; then consistent, with N_RUNS runs whose digests
# store check has just verified
store_is_sound() {
  local label=$1 S=$2 n=$3 out rc other
  out=$("$BIN" store check --store "$S" 2>&1); rc=$?
  if [[ $rc -ne 0 ]]; then
    other=$(grep -v -e '^leftover \.part: ' -e '^store .*: [0-9]* runs\? indexed' <<<"$out")
    [[ $rc -eq 1 && -z "$other" ]] && ok || bad "$label: store check reports more than the .part (rc $rc): $out"
    find "$S" -name '*.part' -exec touch -d '1 hour ago' {} +
    out=$("$BIN" store check --store "$S" --repair 2>&1); rc=$?
    [[ $rc -eq 0 ]] && ok || bad "$label: store check --repair (rc $rc): $out"
  fi
  out=$("$BIN" store check --store "$S" 2>&1); rc=$?
  [[ $rc -eq 0 && "$out" == *": $n run"*" indexed, 0 problems"* ]] && ok ||
    bad "$label: store not consistent with $n run(s) (rc $rc): $out"
  [[ -z $(find "$S" -name '*.part') ]] && ok || bad "$label: .part files left"
}

# run_full LABEL STORE WHY_REGEX [ulimit KB]: a recording that must fail on the full disk
run_full() {
  local label=$1 S=$2 why=$3 kb=${4:-} rc
  if [[ -n "$kb" ]]; then
    ( trap '' XFSZ; ulimit -f "$kb"
      exec "$BIN" run --model "$model" --prompt-tokens "$T/p.json" --tap '*' --store "$S" ) >"$T/run.out" 2>"$T/run.err"
  else
    "$BIN" run --model "$model" --prompt-tokens "$T/p.json" --tap '*' --store "$S" >"$T/run.out" 2>"$T/run.err"
  fi
  rc=$?
  [[ $rc -eq 1 ]] && ok || bad "$label: run exited $rc, wanted 1 (a signal is 128+): $(head -c 600 "$T/run.err")"
  grep -Eq "$S/runs/[0-9a-f-]+\.h5(\.part)?" "$T/run.err" && ok || bad "$label: the message does not name the trace file: $(head -c 600 "$T/run.err")"
  grep -Eq "$why" "$T/run.err" && ok || bad "$label: the message does not say '$why': $(head -c 600 "$T/run.err")"
}

# ---- run, file size limit ---------------------------------------------------------------------
S=$T/store
"$BIN" run --model "$model" --prompt-tokens "$T/p.json" --tap '*' --store "$S" >"$T/first.out" 2>&1 ||
  { echo "FAIL: the first run: $(cat "$T/first.out")"; exit 1; }
trace_bytes=$(find "$S/runs" -name '*.h5' -printf '%s\n' | head -1)
echo "an unlimited run writes a trace of $trace_bytes bytes"
# 1 KiB (the superblock), 64 KiB (the first chunk), 1 MiB (mid-run, at a flush or a
# chunk eviction), and 200 KiB short of the whole trace (at finish, writing the last chunks)
for kb in 1 64 1024 $((trace_bytes / 1024 - 200)); do
  run_full "ulimit -f $kb" "$S" 'file is too large|File too large' "$kb"
  store_is_sound "ulimit -f $kb" "$S" 1
done

# ---- capture, file size limit -----------------------------------------------------------------
"$FAKE" --port-file "$T/fake.port" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [[ -s "$T/fake.port" ]] && break; sleep 0.05; done
UP="http://127.0.0.1:$(cat "$T/fake.port")"

# start_proxy STORE LOG [ulimit KB] -> URL, PROXY_PID
start_proxy() {
  local S=$1 log=$2 kb=${3:-}
  rm -f "$T/ready"
  ( [[ -n "$kb" ]] && { trap '' XFSZ; ulimit -f "$kb"; }
    exec "$BIN" capture --listen 127.0.0.1:0 --upstream "$UP" --store "$S" --ready-file "$T/ready" \
      --inline-max 4K --grace 5 ) 2>"$log" &
  PROXY_PID=$!
  PIDS+=($PROXY_PID)
  for _ in $(seq 200); do [[ -s "$T/ready" ]] && break; sleep 0.05; done
  URL=$(cat "$T/ready" 2>/dev/null)
}
big=$(head -c 30000 /dev/zero | tr '\0' 'a')
# traffic TAG N: N exchanges, one in two streamed; one request with a body that spills to a file
traffic() {
  local tag=$1 n=$2 i codes=()
  curl -s --noproxy '*' --max-time 20 -o "$T/big.out" -w '%{http_code}\n' -H 'content-type: application/json' \
    -d "{\"model\":\"df\",\"t\":\"$tag.big\",\"pad\":\"$big\",\"messages\":[]}" "$URL/v1/chat/completions" >"$T/codes"
  for i in $(seq "$n"); do
    if (( i % 2 )); then
      curl -sN --noproxy '*' --max-time 20 -o /dev/null -w '%{http_code}\n' -H 'content-type: application/json' \
        -H 'x-fake-events: 200' -H 'x-fake-delta-bytes: 64' \
        -d "{\"model\":\"df\",\"stream\":true,\"t\":\"$tag.$i\"}" "$URL/v1/messages" >>"$T/codes" &
    else
      curl -s --noproxy '*' --max-time 20 -o /dev/null -w '%{http_code}\n' -H 'content-type: application/json' \
        -d "{\"model\":\"df\",\"t\":\"$tag.$i\",\"messages\":[]}" "$URL/v1/chat/completions" >>"$T/codes" &
    fi
  done
  for j in $(jobs -p); do [[ " ${PIDS[*]} " == *" $j "* ]] || wait "$j"; done
}
# snapshot STORE: every captured exchange as id, state and digests of its stored bytes
snapshot() {
  sqlite3 -readonly "$1/index.sqlite" "SELECT id, state, length(request_body), hex(sha3(request_body)),
    length(response_body), hex(sha3(response_body)), request_body_file, response_body_file, n_events,
    (SELECT count(*) FROM request_events e WHERE e.request_id = r.id) FROM requests r ORDER BY id" 2>&1
}
sqlite3 :memory: "SELECT sha3('x')" >/dev/null 2>&1 || snapshot() {
  sqlite3 -readonly "$1/index.sqlite" "SELECT id, state, length(request_body), quote(request_body),
    length(response_body), quote(response_body), request_body_file, response_body_file, n_events,
    (SELECT count(*) FROM request_events e WHERE e.request_id = r.id) FROM requests r ORDER BY id" 2>&1
}
files_digest() { (cd "$1" && find captures -type f -print0 2>/dev/null | sort -z | xargs -0 -r sha256sum); }

# capture_full LABEL STORE WHY_REGEX [ulimit KB]: earlier captures kept, a clear exit 1
capture_full() {
  local label=$1 S=$2 why=$3 kb=${4:-} rc before files
  before=$(snapshot "$S"); files=$(files_digest "$S")
  start_proxy "$S" "$T/proxy.log" "$kb"
  if [[ -n "$URL" ]]; then
    traffic "$label" 12
    [[ $(grep -c '^200$' "$T/codes") -eq 13 ]] && ok || bad "$label: the clients did not all get 200: $(tr '\n' ' ' <"$T/codes")"
    kill -TERM "$PROXY_PID"
  else # a store it cannot even open for writing: refused at start, said why
    echo "  ($label: the proxy refused to start: $(tail -1 "$T/proxy.log"))"
  fi
  wait "$PROXY_PID"; rc=$?
  [[ $rc -eq 1 ]] && ok || bad "$label: the proxy exited $rc, wanted 1 (a signal is 128+): $(tail -5 "$T/proxy.log")"
  grep -q "$S/" "$T/proxy.log" && ok || bad "$label: the proxy's log does not name the store's file: $(tail -5 "$T/proxy.log")"
  grep -Eq "$why" "$T/proxy.log" && ok || bad "$label: the proxy's log does not say '$why': $(tail -5 "$T/proxy.log")"
  local after; after=$(snapshot "$S")
  # every row of before is in after, unchanged
  local missing; missing=$(comm -23 <(sort <<<"$before") <(sort <<<"$after"))
  [[ -z "$missing" ]] && ok || bad "$label: exchanges captured before changed or vanished: $missing"
  [[ -z $(comm -23 <(sort <<<"$files") <(files_digest "$S" | sort)) ]] && ok || bad "$label: a spilled body of an earlier capture changed"
  [[ -z $(find "$S/captures" -name '*.tmp' 2>/dev/null) ]] && ok || bad "$label: temporary body files left"
  "$BIN" requests --store "$S" list >/dev/null 2>"$T/err" && ok || bad "$label: requests list: $(cat "$T/err")"
}

C=$T/cstore
start_proxy "$C" "$T/proxy0.log"
traffic base 6
kill -TERM "$PROXY_PID"; wait "$PROXY_PID" || bad "the unlimited proxy did not stop cleanly: $(cat "$T/proxy0.log")"
n_base=$(sqlite3 -readonly "$C/index.sqlite" "SELECT count(*) FROM requests WHERE state = 'complete'")
[[ "$n_base" -eq 7 ]] && ok || bad "the unlimited proxy captured $n_base complete exchanges, wanted 7"
db_kb=$(( $(stat -c %s "$C/index.sqlite") / 1024 ))
# 16 KiB: the spilled bodies and the WAL's first frames fail; 100 KiB: the WAL fails mid-burst
for kb in 16 100; do
  capture_full "capture ulimit -f $kb" "$C" 'file is too large|File too large' "$kb"
done
echo "(index.sqlite was $db_kb KiB before the limited proxies)"

# ---- a genuinely full filesystem (ENOSPC) -----------------------------------------------------
MNT=$T/mnt
mkdir -p "$MNT"
if mount -t tmpfs -o size=32m tmpfs "$MNT" 2>/dev/null; then
  F=$MNT/store
  "$BIN" run --model "$model" --prompt-tokens "$T/p.json" --tap '*' --store "$F" >"$T/first.out" 2>&1 ||
    bad "the first run on the tmpfs: $(cat "$T/first.out")"
  for free_mb in 1 5; do
    rm -f "$MNT/filler"
    avail=$(df -B1 --output=avail "$MNT" | tail -1)
    fallocate -l $((avail - free_mb * 1048576)) "$MNT/filler" 2>/dev/null ||
      head -c $((avail - free_mb * 1048576)) /dev/zero >"$MNT/filler"
    run_full "tmpfs, $free_mb MiB free" "$F" 'disk is full|No space left'
    store_is_sound "tmpfs, $free_mb MiB free" "$F" 1
  done
  rm -f "$MNT/filler"
  G=$MNT/cstore
  start_proxy "$G" "$T/proxy0.log"
  traffic base 6
  kill -TERM "$PROXY_PID"; wait "$PROXY_PID" || bad "the proxy on the tmpfs did not stop cleanly: $(cat "$T/proxy0.log")"
  for free_kb in 8 64; do
    rm -f "$MNT/filler"
    avail=$(df -B1 --output=avail "$MNT" | tail -1)
    head -c $((avail - free_kb * 1024)) /dev/zero >"$MNT/filler" 2>/dev/null
    capture_full "capture on tmpfs, $free_kb KiB free" "$G" 'disk is full|No space left'
  done
  rm -f "$MNT/filler"
  umount "$MNT" && MNT=
else
  echo "note: no tmpfs could be mounted here (not root?): ENOSPC not tested, only the file size limit"
fi

echo "test_disk_full: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

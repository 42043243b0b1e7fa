# serve_checks.sh — sourced by the tests that start `sparsetrace serve` (test_serve.sh,
# test_serve_concurrent.sh): their check(), and what a failed check shows of the server.
#
#   check "what" command...   runs the command: "ok   what", or "FAIL what", counted in $fails,
#                             then server_log_tail
#   server_log_tail           on stderr: whether serve ($SERVER_PID) still runs, unless the test
#                             stopped it itself (SERVER_STOPPED=1), and the end of $SERVER_LOG,
#                             from the first line of a crash report when it has one; once per
#                             state of the log
#   keep_server_log NAME      in the test's cleanup: after a failed run, $SERVER_LOG whole in
#                             $ST_BUILD_DIR/Testing/Temporary/NAME.serve.log, beside ctest's own
#   alive PID                 whether the process runs
fails=0
SERVER_PID=
SERVER_LOG=
SERVER_STOPPED=0
LOG_SHOWN=
server_log_tail() {
  [ -n "$SERVER_LOG" ] || return 0
  if [ "$SERVER_STOPPED" = 0 ] && [ -n "$SERVER_PID" ] && ! kill -0 "$SERVER_PID" 2> /dev/null; then
    echo "serve (pid $SERVER_PID) is not running: it died" >&2
  fi
  local size from
  size=$(wc -c < "$SERVER_LOG" 2> /dev/null || echo 0)
  if [ "$SERVER_LOG:$size" = "$LOG_SHOWN" ]; then
    echo "(serve's log: nothing new since it was shown above)" >&2
    return 0
  fi
  LOG_SHOWN=$SERVER_LOG:$size
  from=$(grep -n -m1 -E 'Sanitizer|runtime error|Assertion|double free|corrupted|free\(\)' "$SERVER_LOG" | cut -d: -f1)
  echo "---- serve's log ($SERVER_LOG, $size bytes)${from:+, from line $from} ----" >&2
  if [ -n "$from" ]; then tail -n +"$from" "$SERVER_LOG" | head -n 80 >&2; else tail -n 40 "$SERVER_LOG" >&2; fi
  echo "----" >&2
}
check() {
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); server_log_tail; fi
}
keep_server_log() {
  if [ "$fails" != 0 ] && [ -s "$SERVER_LOG" ] && [ -d "${ST_BUILD_DIR:-}" ]; then
    mkdir -p "$ST_BUILD_DIR/Testing/Temporary" &&
      cp "$SERVER_LOG" "$ST_BUILD_DIR/Testing/Temporary/$1.serve.log" &&
      echo "serve's log kept in $ST_BUILD_DIR/Testing/Temporary/$1.serve.log" >&2
  fi
}
alive() { kill -0 "$1" 2> /dev/null; }

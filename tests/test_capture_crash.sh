#!/usr/bin/env bash
# test_capture_crash.sh — a capture proxy killed with kill -9 mid-stream (issue 14, defect 3).
#
# 20 SSE streams through `sparsetrace capture`, each slow enough to be in flight when the proxy
# is killed with SIGKILL once every client has received at least MIN_BYTES. Checked:
#   - before any restart, the store already holds, for every stream, its row (state 'open'),
#     SSE events and response bytes: the proxy persisted what it relayed as it went;
#   - what is stored of each response is a prefix of what its client received (nothing invented,
#     nothing out of order), and no less than the client's bytes minus the last flush window;
#   - the next proxy started on the store marks the 20 rows 'interrupted', keeping the events
#     and bytes, and says so in its log; a request through it then works.
# Prints the figures (events and bytes stored per stream, against what the clients got).
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
FAKE=${ST_BUILD_DIR:?ST_BUILD_DIR must point at the build tree}/tests/fake_upstream
T=$(mktemp -d /tmp/st_capture_crash.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
N=20
MIN_BYTES=2000
fails=0
check() { # check "what" command...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
sql() { sqlite3 -readonly "$T/store/index.sqlite" "$@"; }

"$FAKE" --port-file "$T/fake.port" > /dev/null &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
UP="http://127.0.0.1:$(cat "$T/fake.port")"

start_proxy() { # start_proxy NAME -> URL, PROXY_PID
  rm -f "$T/$1.ready"
  "$BIN" capture --listen 127.0.0.1:0 --upstream "$UP" --store "$T/store" \
    --ready-file "$T/$1.ready" --grace 0 2> "$T/$1.log" &
  PROXY_PID=$!
  PIDS+=($PROXY_PID)
  for _ in $(seq 200); do [ -s "$T/$1.ready" ] && break; sleep 0.05; done
  URL=$(cat "$T/$1.ready")
}

start_proxy first
check "proxy is listening" test -n "$URL"
for i in $(seq -w 1 $N); do
  # ~12 s of events if nothing stops it; one API in two, so both event shapes are persisted
  if [ $((10#$i % 2)) = 0 ]; then path=/v1/messages; else path=/v1/chat/completions; fi
  curl -sN --noproxy '*' -H 'content-type: application/json' -H 'x-fake-events: 400' \
    -H 'x-fake-interval-ms: 30' -H 'x-fake-delta-bytes: 24' \
    -d "{\"model\":\"crash\",\"stream\":true,\"t\":\"K$i\"}" "$URL$path" > "$T/c$i.out" &
  PIDS+=($!)
done
ready=0
for _ in $(seq 300); do
  ready=0
  for i in $(seq -w 1 $N); do [ "$(stat -c %s "$T/c$i.out")" -ge $MIN_BYTES ] && ready=$((ready + 1)); done
  [ $ready = $N ] && break
  sleep 0.05
done
check "all $N clients received >= $MIN_BYTES bytes while streaming" test $ready = $N
kill -9 "$PROXY_PID"
wait "$PROXY_PID" 2>/dev/null
sleep 0.3 # the clients see the connection drop
check "the proxy is gone" bash -c "! kill -0 $PROXY_PID 2>/dev/null"

check "$N rows, all still 'open' (nobody reconciled yet)" \
  test "$(sql "SELECT count(*) FROM requests WHERE state = 'open' AND model IS NULL")" = $N
printf '%-5s %8s %8s %10s\n' stream events bytes client
short=0; lost=0; notprefix=0; min_events=999999
for i in $(seq -w 1 $N); do
  id=$(sql "SELECT id FROM requests WHERE CAST(request_body AS TEXT) LIKE '%\"K$i\"%'")
  ev=$(sql "SELECT count(*) FROM request_events WHERE request_id = '$id'")
  sql "SELECT writefile('$T/s$i.stored', response_body) FROM requests WHERE id = '$id'" > /dev/null
  [ -f "$T/s$i.stored" ] || : > "$T/s$i.stored"
  sb=$(stat -c %s "$T/s$i.stored")
  cb=$(stat -c %s "$T/c$i.out")
  printf '%-5s %8s %8s %10s\n' "K$i" "$ev" "$sb" "$cb"
  [ "$ev" -gt 0 ] && [ "$sb" -gt 0 ] || lost=$((lost + 1))
  [ "$ev" -lt $min_events ] && min_events=$ev
  cmp -s -n "$sb" "$T/s$i.stored" "$T/c$i.out" || notprefix=$((notprefix + 1))
  # at most one flush window (CAPTURE_PROGRESS_MS = 200 ms, ~7 events of ~150 B) behind
  [ $((cb - sb)) -le 4096 ] || short=$((short + 1))
done
check "every stream has events and bytes stored after kill -9 (min $min_events events)" test $lost = 0
check "what is stored of each response is a prefix of what its client received" test $notprefix = 0
check "and at most one flush window behind it" test $short = 0
check "n_events agrees with the event rows" \
  test "$(sql "SELECT count(*) FROM requests r WHERE n_events = (SELECT count(*) FROM request_events e WHERE e.request_id = r.id)")" = $N

start_proxy second
check "a new proxy starts on the store" test -n "$URL"
check "its log says it marked the rows interrupted" grep -q "$N request(s) left open .* marked 'interrupted'" "$T/second.log"
check "all $N rows are 'interrupted'" test "$(sql "SELECT count(*) FROM requests WHERE state = 'interrupted'")" = $N
check "they say why" test "$(sql "SELECT count(*) FROM requests WHERE upstream_error LIKE 'interrupted: the proxy relaying this exchange ended%'")" = $N
check "and keep their events" test "$(sql "SELECT count(DISTINCT request_id) FROM request_events")" = $N
code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
  -d '{"model":"after","messages":[]}' "$URL/v1/chat/completions")
check "the new proxy relays" test "$code" = 200
# the client has its answer before the proxy has finished the exchange (the upstream transfer's
# end, the row): stopping now, with --grace 0, would rightly record it as cut. Wait for its row.
for _ in $(seq 200); do
  [ "$(sql "SELECT count(*) FROM requests WHERE model = 'after' AND state = 'complete'")" = 1 ] && break
  sleep 0.05
done
check "and records it complete" test "$(sql "SELECT count(*) FROM requests WHERE model = 'after' AND state = 'complete'")" = 1
kill -TERM "$PROXY_PID"
wait "$PROXY_PID"
check "and stops cleanly" test $? = 0
check "leaving nothing open" test "$(sql "SELECT count(*) FROM requests WHERE state = 'open'")" = 0
"$BIN" requests --store "$T/store" list > "$T/list.out"
check "requests list shows the interrupted rows" test "$(grep -c interrupted "$T/list.out")" = $N

if [ $fails -ne 0 ]; then
  echo "--- proxy logs"; cat "$T/first.log" "$T/second.log"
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"

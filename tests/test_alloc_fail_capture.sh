#!/usr/bin/env bash
# test_alloc_fail_capture.sh — tests/test_alloc_fail.sh's probe for the capture proxy: the Nth
# allocation of `sparsetrace capture` fails (tests/alloc_fail.c, preloaded) while it starts (index
# open + migrate, reconcile, listener), relays two exchanges from tests/fake_upstream (one whole
# JSON answer on /v1/chat/completions, one SSE stream on /v1/messages) and stops on SIGTERM.
#
# Each probe must end one of these ways, and nothing else passes:
#   - the proxy exits 1 before it listens, saying memory ran out;
#   - or it listens, both clients get an answer (HTTP 200 relayed, or a 5xx the proxy made), it
#     stops on SIGTERM with exit 0 (or 1 saying memory ran out), and then, read without the shim:
#     `store check` says the store is consistent, no row is left 'open', every client that got
#     200 has its row 'complete' with status 200 unless the proxy's log says which exchange it
#     could not store and that memory ran out, and a client that did not get 200 got a 5xx whose
#     body says memory ran out, and so does the log (an exchange that could not be created was
#     answered an empty 500, logged nowhere).
# A signal, a hang, a sanitizer report (the ASan build: LeakSanitizer included), a dropped
# connection without a word in the log, or a relayed answer missing from the store fails.
#
# The proxy's threads allocate in an order that varies from run to run, so a probe's N is a
# moment, not one fixed call site: the probes sample the path (every N to ST_ALLOC_FAIL_DENSE,
# default 40, then a stride to about ST_ALLOC_FAIL_SAMPLES probes, default 100), then every N of
# the first ST_ALLOC_FAIL_REQUEST (default 120) past the count of a proxy that starts and stops
# (reading the first request, its exchange, headers and secrets, the open row: a failure there
# was answered an empty 500 the log never mentioned), and the last probe, past the failure-free
# count, must relay both exchanges with nothing failed.
set -uo pipefail
st=${ST_BIN:?}
shim=${ST_BUILD_DIR:?}/tests/liballoc_fail.so
fake=${ST_BUILD_DIR:?}/tests/fake_upstream
[[ -f $shim ]] || { echo "skip: $shim not built"; exit 77; }
[[ -x $fake ]] || { echo "skip: $fake not built"; exit 77; }
command -v curl >/dev/null || { echo "skip: no curl"; exit 77; }
dense=${ST_ALLOC_FAIL_DENSE:-40}
samples=${ST_ALLOC_FAIL_SAMPLES:-100}
dense_request=${ST_ALLOC_FAIL_REQUEST:-120}
work=$(mktemp -d "${TMPDIR:-/tmp}/st_alloc_fail_capture.XXXXXX")
fake_pid=
trap '[[ -n $fake_pid ]] && kill $fake_pid 2>/dev/null; rm -rf "$work"' EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
export ST_ALLOC_FAIL_SKIP=libhdf5
if ldd "$st" 2>/dev/null | grep libasan >/dev/null; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0:detect_leaks=1"
  # Under ASan, allocations libc makes for itself are not failed: the ASan runtime calls
  # pthread_getattr_np as each of the proxy's threads starts, and aborts on its own CHECK when the
  # allocation inside it fails ("CHECK failed: sanitizer_linux_libcdep.cpp:148", seen in CI), a
  # crash of the sanitizer, not of the proxy. The normal build's run still fails them.
  export ST_ALLOC_FAIL_SKIP=libhdf5,libc.so.6
fi

"$fake" --port-file "$work/fake.port" >/dev/null 2>&1 &
fake_pid=$!
for _ in $(seq 100); do [[ -s $work/fake.port ]] && break; sleep 0.05; done
[[ -s $work/fake.port ]] || { echo "FAIL: fake_upstream did not start"; exit 1; }
up="http://127.0.0.1:$(cat "$work/fake.port")"
oom='out of memory|allocat|cannot allocate memory'

# probe N: prints "N VERDICT detail"; VERDICT: end (N not reached, all relayed), ok, FAIL
probe() {
  local n=$1 w=$work/p.$1 pid rc url a b verdict=""
  rm -rf "$w" && mkdir -p "$w"
  timeout -s KILL 60 env ST_ALLOC_FAIL_AT=$n ST_ALLOC_FAIL_REPORT=$w/report LD_PRELOAD=$shim \
    "$st" capture --listen 127.0.0.1:0 --upstream "$up" --store "$w/s" --ready-file "$w/ready" \
    --grace 0 >"$w/log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ -s $w/ready ]] && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  if [[ ! -s $w/ready ]]; then
    wait $pid; rc=$?
    if grep -qE 'Sanitizer|runtime error:' "$w/log"; then verdict="FAIL sanitizer: $(grep -m1 -E 'Sanitizer|runtime error:' "$w/log")"
    elif [[ $rc -eq 1 ]] && grep -qiE "$oom" "$w/log"; then verdict="ok error at start"
    elif kill -0 $pid 2>/dev/null; then kill -9 $pid; verdict="FAIL did not listen within 15 s"
    else verdict="FAIL exit $rc before listening: $(tail -1 "$w/log" | cut -c1-200)"; fi
    [[ $verdict == FAIL* ]] || rm -rf "$w"
    echo "$n $verdict"; return
  fi
  url=$(cat "$w/ready")
  a=$(curl -s --noproxy '*' --max-time 20 -o "$w/a.body" -w '%{http_code}' -H 'content-type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"a"}]}' "$url/v1/chat/completions")
  b=$(curl -sN --noproxy '*' --max-time 20 -o "$w/b.body" -w '%{http_code}' -H 'content-type: application/json' \
    -H 'x-fake-events: 5' -d '{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"b"}]}' \
    "$url/v1/messages")
  kill -TERM $pid 2>/dev/null
  wait $pid; rc=$?
  local hit complete open check
  hit=$(grep -c '^hit' "$w/report" 2>/dev/null)
  if grep -qE 'Sanitizer|runtime error:' "$w/log"; then
    verdict="FAIL sanitizer: $(grep -m1 -E 'Sanitizer|runtime error:' "$w/log")"
  elif [[ $rc -eq 137 ]]; then verdict="FAIL hang (no exit 60 s after start)"
  elif [[ $rc -ne 0 ]] && ! { [[ $rc -eq 1 ]] && grep -qiE "$oom" "$w/log"; }; then
    verdict="FAIL exit $rc after SIGTERM: $(tail -1 "$w/log" | cut -c1-200)"
  elif ! check=$(env -u LD_PRELOAD "$st" store check --store "$w/s" 2>&1); then
    verdict="FAIL store check: $(tr '\n' ' ' <<<"$check" | cut -c1-300)"
  else
    open=$(sqlite3 -readonly "$w/s/index.sqlite" "SELECT count(*) FROM requests WHERE state = 'open'")
    complete=$(sqlite3 -readonly "$w/s/index.sqlite" \
      "SELECT count(*) FROM requests WHERE state = 'complete' AND status = 200")
    local got200=0
    for ab in "a $a" "b $b"; do
      local code=${ab#* } body=$w/${ab%% *}.body
      if [[ $code == 200 ]]; then got200=$((got200 + 1))
      elif [[ ! $code =~ ^5 ]] && ! grep -qiE "$oom" "$w/log"; then verdict="FAIL a client got HTTP $code and the log says nothing"
      elif ! grep -qiE "$oom" "$w/log"; then verdict="FAIL a client got HTTP $code without the log saying memory ran out"
      elif [[ $code =~ ^5 ]] && ! grep -qiE "$oom" "$body" 2>/dev/null; then
        verdict="FAIL a client got HTTP $code whose body does not say memory ran out: '$(head -c 200 "$body" 2>/dev/null)'"; fi
    done
    if [[ -n $verdict ]]; then :
    elif [[ $open != 0 ]]; then verdict="FAIL $open rows left 'open' after a clean stop"
    elif [[ $complete -lt $got200 ]] && ! grep -qiE "$oom" "$w/log"; then
      verdict="FAIL $got200 clients got 200 but $complete rows are complete, and the log says nothing"
    elif [[ ${hit:-0} -eq 0 ]]; then
      [[ $got200 == 2 && $complete == 2 ]] && verdict="end" || verdict="FAIL no failure injected, yet $got200 answers and $complete rows"
    else verdict="ok ($a $b, $complete complete)"; fi
  fi
  [[ $verdict == FAIL* ]] || rm -rf "$w"
  echo "$n $verdict"
}

# the failure-free counts (the largest any process reported): started and stopped; and relaying
# quiet_proxy DIR: a proxy with nothing failed, its shim reporting into DIR, up and listening; sets cpid
quiet_proxy() {
  mkdir -p "$1"
  timeout -s KILL 60 env ST_ALLOC_FAIL_AT=0 ST_ALLOC_FAIL_REPORT="$1/report" \
    LD_PRELOAD=$shim "$st" capture --listen 127.0.0.1:0 --upstream "$up" --store "$1/s" \
    --ready-file "$1/ready" --grace 0 >"$1/log" 2>&1 &
  cpid=$!
  for _ in $(seq 300); do [[ -s $1/ready ]] && break; sleep 0.05; done
}
quiet_proxy "$work/c0"
kill -TERM $cpid; wait $cpid || { echo "FAIL: the failure-free proxy (no request): $(tail -3 "$work/c0/log")"; exit 1; }
count0=$(awk '$1 == "count" && $2 > m { m = $2 } END { print m + 0 }' "$work/c0/report")
quiet_proxy "$work/c"
curl -s --noproxy '*' --max-time 20 -o /dev/null -H 'content-type: application/json' \
  -d '{"model":"m","messages":[{"role":"user","content":"a"}]}' "$(cat "$work/c/ready")/v1/chat/completions"
curl -sN --noproxy '*' --max-time 20 -o /dev/null -H 'content-type: application/json' -H 'x-fake-events: 5' \
  -d '{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"b"}]}' \
  "$(cat "$work/c/ready")/v1/messages"
kill -TERM $cpid; wait $cpid || { echo "FAIL: the failure-free proxy: $(tail -3 "$work/c/log")"; exit 1; }
count=$(awk '$1 == "count" && $2 > m { m = $2 } END { print m + 0 }' "$work/c/report")
[[ $count0 -gt 0 && $count -gt $count0 ]] || { echo "FAIL: the shim's counts: $count0 started, $count relaying"; exit 1; }

stride=$(( count > dense ? (count - dense + samples - dense - 1) / (samples > dense ? samples - dense : 1) : 1 ))
ns=$( { seq 1 $((dense < count ? dense : count)); [[ $count -gt $dense ]] && seq $((dense + stride)) "$stride" "$count"
        seq $((count0 + 1)) $((count0 + dense_request < count ? count0 + dense_request : count)); echo $((count * 2 + 100)); } | sort -un )
export -f probe; export work shim st up oom
results=$(for n in $ns; do echo "$n"; done | xargs -P2 -I{} bash -c 'probe {}')
nfail=$(grep -c ' FAIL' <<<"$results")
nok=$(grep -c ' ok' <<<"$results")
last=$(sort -n <<<"$results" | tail -1)
echo "capture: about $count allocations, $count0 to start and stop; $(wc -w <<<"$ns") probes (every N to $dense," \
  "then every $stride, then every N from $((count0 + 1)) to $((count0 + dense_request))):" \
  "$(grep -c ' ok error at start' <<<"$results") clean errors at start, $((nok - $(grep -c ' ok error at start' <<<"$results"))) relayed-or-refused, $nfail failures"
grep ' FAIL' <<<"$results" | sort -n | head -20 | sed 's/^/FAIL: capture N=/'
if [[ $last != *" end" ]]; then echo "FAIL: the probe past the count did not relay cleanly: $last"; nfail=$((nfail + 1)); fi
[[ $nok -ge 1 ]] || { echo "FAIL: no failure was injected"; nfail=$((nfail + 1)); }
[[ $nfail -eq 0 ]] && echo "all capture allocation-failure probes passed" || echo "$nfail failures"
[[ $nfail -eq 0 ]]

#!/usr/bin/env bash
# test_alloc_fail_serve.sh — tests/test_alloc_fail.sh's probe for `sparsetrace serve`: the Nth
# allocation fails (tests/alloc_fail.c, preloaded) while serve (models/needle-v4) answers one
# well-formed chat request and stops on SIGTERM. The request is the client's part and it is
# right, so memory running out must never read as the client's fault:
#   - serve exits 1 before it listens, saying memory ran out;
#   - or the client gets 200 with the answer (a chat.completion), or a 5xx whose body says memory
#     ran out; never a 4xx (a failed allocation in the JSON parser or the renderer used to come
#     back as 400 "not valid JSON", "messages: not a list", "messages[0]: no role"), never a
#     dropped connection (a failed read buffer used to hang up without a word, a failed answer
#     head to be recorded as 200 with nothing sent);
#   - serve stops with exit 0 (or 1 saying memory ran out), and then, read without the shim:
#     `store check` says the store is consistent, no row is left 'open', and the request's row
#     has the status the client got (no row only when the request could not be read or stored, and
#     the log says so).
# A signal, a hang or a sanitizer report fails. The probes cover the request's own allocations:
# from the failure-free count of a serve that starts and stops (model load, index, listener) to
# that of one that also answers, every N for the first ST_ALLOC_FAIL_DENSE (default 120: the body,
# the JSON parse, the rendering, the tokenizer), then a stride to about ST_ALLOC_FAIL_SAMPLES
# (default 160) probes, and every N of the last ST_ALLOC_FAIL_TAIL (default 24: the store's
# transaction recording the finished request, whose failed COMMIT used to leave the row 'open');
# the last probe, past the count, must answer 200 with nothing failed.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
shim=${ST_BUILD_DIR:?}/tests/liballoc_fail.so
model=$src/models/needle-v4
[[ -f $shim ]] || { echo "skip: $shim not built"; exit 77; }
[[ -f $model/model.safetensors ]] || { echo "skip: models/needle-v4 is not there"; exit 77; }
command -v curl >/dev/null || { echo "skip: no curl"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skip: no sqlite3"; exit 77; }
dense=${ST_ALLOC_FAIL_DENSE:-120}
samples=${ST_ALLOC_FAIL_SAMPLES:-160}
ntail=${ST_ALLOC_FAIL_TAIL:-24}
work=$(mktemp -d "${TMPDIR:-/tmp}/st_alloc_fail_serve.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
export ST_ALLOC_FAIL_SKIP=libhdf5
if ldd "$st" 2>/dev/null | grep libasan >/dev/null; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0:detect_leaks=1"
  export ST_ALLOC_FAIL_SKIP=libhdf5,libc.so.6 # as test_alloc_fail_capture.sh: ASan's own thread start
fi
oom='out of memory|allocat|cannot allocate memory'
request='{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"Working directory: /srv/a"},{"role":"user","content":"Repeat the working directory line."}]}'

# serve N ask|quiet DIR: serve with the Nth allocation failed (0: none), asked once or not at all,
# then SIGTERM; leaves DIR/log, DIR/report, DIR/code, DIR/body, DIR/rc
serve() {
  local n=$1 ask=$2 w=$3 pid
  rm -rf "$w" && mkdir -p "$w"
  # serve itself is the child (not under timeout(1), which would pass SIGTERM on twice: once to
  # serve and once to its process group, and a second SIGTERM makes serve stop at once)
  env ST_ALLOC_FAIL_AT="$n" ST_ALLOC_FAIL_REPORT="$w/report" LD_PRELOAD="$shim" \
    "$st" serve --model "$model" --listen 127.0.0.1:0 --store "$w/s" --ready-file "$w/ready" >"$w/log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ -s $w/ready ]] && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  if [[ -s $w/ready && $ask == ask ]]; then
    curl -s --noproxy '*' --max-time 30 -o "$w/body" -w '%{http_code}' -H 'content-type: application/json' \
      -d "$request" "$(cat "$w/ready")/v1/chat/completions" >"$w/code"
  fi
  kill -TERM $pid 2>/dev/null
  for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  kill -0 $pid 2>/dev/null && kill -KILL $pid # no exit 30 s after SIGTERM: a hang (137)
  wait $pid
  echo $? >"$w/rc"
}

# probe N: prints "N VERDICT detail"; VERDICT: end (N not reached, answered), ok, FAIL
probe() {
  local n=$1 w=$work/p.$1 rc code verdict="" check rows row
  serve "$n" ask "$w"
  rc=$(cat "$w/rc")
  code=$(cat "$w/code" 2>/dev/null)
  if grep -qE 'Sanitizer|runtime error:' "$w/log"; then
    verdict="FAIL sanitizer: $(grep -m1 -E 'Sanitizer|runtime error:' "$w/log")"
  elif [[ $rc -eq 137 ]]; then verdict="FAIL hang (no exit 30 s after SIGTERM)"
  elif [[ ! -s $w/ready ]]; then
    if [[ $rc -eq 1 ]] && grep -qiE "$oom" "$w/log"; then verdict="ok error at start"
    else verdict="FAIL exit $rc before listening: $(tail -1 "$w/log" | cut -c1-200)"; fi
  elif [[ $rc -ne 0 ]] && ! { [[ $rc -eq 1 ]] && grep -qiE "$oom" "$w/log"; }; then
    verdict="FAIL exit $rc after SIGTERM: $(tail -1 "$w/log" | cut -c1-200)"
  elif [[ $code == 200 ]] && ! /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["object"] == "chat.completion" and isinstance(d["choices"][0]["message"]["content"], str)' "$w/body" 2>/dev/null; then
    verdict="FAIL 200 without a chat.completion: $(head -c 200 "$w/body")"
  elif [[ $code != 200 && ! $code =~ ^5 ]]; then
    verdict="FAIL HTTP ${code:-none} for a well-formed request: $(head -c 200 "$w/body" 2>/dev/null)"
  elif [[ $code =~ ^5 ]] && ! grep -qiE "$oom" "$w/body"; then
    verdict="FAIL HTTP $code whose body does not say memory ran out: $(head -c 200 "$w/body")"
  elif ! check=$(env -u LD_PRELOAD "$st" store check --store "$w/s" 2>&1); then
    verdict="FAIL store check: $(tr '\n' ' ' <<<"$check" | cut -c1-300)"
  else
    rows=$(sqlite3 -readonly "$w/s/index.sqlite" "SELECT count(*) FROM requests WHERE state = 'open'")
    row=$(sqlite3 -readonly "$w/s/index.sqlite" "SELECT group_concat(status) FROM requests")
    if [[ $rows != 0 ]]; then verdict="FAIL $rows rows left 'open' after a clean stop"
    elif [[ -z $row && $code == 500 ]] && grep -qE 'out of memory.*answered 500' "$w/log"; then
      verdict="ok (500 before the request could be stored; the log says so)"
    elif [[ $row != "$code" ]]; then verdict="FAIL the client got $code, the request's row says '${row}'"
    elif ! grep -q '^hit' "$w/report" 2>/dev/null; then
      [[ $code == 200 ]] && verdict="end" || verdict="FAIL no failure injected, yet HTTP $code"
    else verdict="ok ($code)"; fi
  fi
  [[ $verdict == FAIL* ]] || rm -rf "$w"
  echo "$n $verdict"
}

# the failure-free counts (the largest any process reported): started and stopped; and answering
serve 0 quiet "$work/c0"
serve 0 ask "$work/c1"
c0=$(awk '$1 == "count" && $2 > m { m = $2 } END { print m + 0 }' "$work/c0/report")
c1=$(awk '$1 == "count" && $2 > m { m = $2 } END { print m + 0 }' "$work/c1/report")
[[ $(cat "$work/c1/code") == 200 && $(cat "$work/c1/rc") == 0 ]] ||
  { echo "FAIL: the failure-free serve: HTTP $(cat "$work/c1/code") exit $(cat "$work/c1/rc"): $(tail -3 "$work/c1/log")"; exit 1; }
[[ $c0 -gt 0 && $c1 -gt $c0 ]] || { echo "FAIL: the shim's counts: $c0 started, $c1 answering"; exit 1; }

span=$((c1 - c0))
d=$((dense < span ? dense : span))
stride=$(( span > d && samples > d ? (span - d + samples - d - 1) / (samples - d) : 1 ))
t=$((ntail < span ? ntail : span))
ns=$( { seq $((c0 + 1)) $((c0 + d)); [[ $span -gt $d ]] && seq $((c0 + d + stride)) "$stride" "$c1"
        seq $((c1 - t + 1)) "$c1"; echo $((c1 * 2 + 100)); } | sort -un )
export -f probe serve; export work shim st model oom request
results=$(for n in $ns; do echo "$n"; done | xargs -P2 -I{} bash -c 'probe {}')
nfail=$(grep -c ' FAIL' <<<"$results")
nok=$(grep -c ' ok' <<<"$results")
last=$(sort -n <<<"$results" | tail -1)
echo "serve: $c0 allocations to listen, $span more to answer; $(wc -w <<<"$ns") probes (every N to" \
  "$((c0 + d)), then every $stride, then every N from $((c1 - t + 1))): $(grep -c ' ok (200)' <<<"$results") answered, $(grep -c ' ok (5' <<<"$results")" \
  "5xx saying memory ran out, $(grep -c ' ok error at start' <<<"$results") errors at start, $nfail failures"
grep ' FAIL' <<<"$results" | sort -n | head -20 | sed 's/^/FAIL: serve N=/'
if [[ $last != *" end" ]]; then echo "FAIL: the probe past the count did not answer cleanly: $last"; nfail=$((nfail + 1)); fi
[[ $nok -ge 1 ]] || { echo "FAIL: no failure was injected"; nfail=$((nfail + 1)); }
[[ $nfail -eq 0 ]] && echo "all serve allocation-failure probes passed" || echo "$nfail failures"
[[ $nfail -eq 0 ]]

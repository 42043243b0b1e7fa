#!/usr/bin/env bash
# test_serve_concurrent.sh — `sparsetrace serve` with many requests rendered at once. The listener's
# workers render and encode each request before it queues for the engine (a 400 or a 429 needs no
# turn of it), all with the server's one tokenizer, whose encoder is not reentrant (word cache,
# scratch buffers: engine/text/tokenizer.h). Encoded on two workers at once, prompts came out with
# wrong token counts, the encoder asked for 2^64-byte words, or the heap was corrupted: a double
# free in the scratch buffers' realloc, the SIGABRT that once killed serve in test_serve.sh's
# queue-overflow section (4 requests at once against --queue 1).
#
# The requests here are past --context (64 tokens), so each is answered 400 "prompt is too long:
# N tokens" right after it is encoded: only the concurrent encodes run, and N says what the encoder
# made of the prompt. Each prompt (~5,000 tokens of distinct words, filling the word cache) is sent
# alone first, then rounds of 8 at once: every answer must name the token count of the same
# request sent alone, the server must stay up and exit 0 on SIGTERM with every request a finished
# row. Before the fix, the first round failed (Release: wrong counts; ASan: the double free).
# Bounded: 40 rounds or 20 s of rounds, whichever ends first.
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
MODEL=$SRC/models/needle-v4
[ -f "$MODEL/model.safetensors" ] || { echo "skip: models/needle-v4 is not there"; exit 77; }
T=$(mktemp -d /tmp/st_serve_concurrent.XXXXXX)
PIDS=()
. "$SRC/tests/serve_checks.sh"
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  keep_server_log test_serve_concurrent
  rm -rf "$T"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
PY=/usr/bin/python3

"$BIN" serve --model "$MODEL" --store "$T/store" --port 0 --ready-file "$T/ready" --queue 1 \
  --context 64 --quiet 2> "$T/serve.log" &
SERVER_PID=$! SERVER_LOG=$T/serve.log
PIDS+=($SERVER_PID)
for _ in $(seq 600); do [ -s "$T/ready" ] && break; sleep 0.05; done
URL=$(cat "$T/ready" 2>/dev/null)
check "serve is listening" test -n "$URL"

$PY - "$URL" > "$T/client.out" 2>&1 <<'PY'
import json, random, re, sys, threading, time, urllib.error, urllib.request
url = sys.argv[1]
N, ROUNDS, SECONDS, WORDS = 8, 40, 20.0, 1000
def body(i):
    rnd = random.Random(i)
    words = " ".join("%s%d" % (rnd.choice(("alpha", "beta", "gamma", "zeta", "quux")), rnd.randrange(10**6))
                     for _ in range(WORDS))
    return json.dumps({"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": words}]}).encode()
def ask(b):
    """The token count serve's 400 names, else what came back instead."""
    rq = urllib.request.Request(url + "/v1/chat/completions", data=b, headers={"content-type": "application/json"})
    try:
        try:
            urllib.request.urlopen(rq, timeout=15)
            return "200 (expected a 400)"
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            m = re.search(r"prompt is too long: (\d+) tokens", text)
            return int(m.group(1)) if m else "%d %s" % (e.code, text[:200])
    except Exception as e:  # no answer, or one cut short
        return "no answer: %r" % e
bodies = [body(i) for i in range(N * ROUNDS)]
alone = {}
for i in range(N):  # the first round's requests, one at a time
    alone[i] = ask(bodies[i])
    if not isinstance(alone[i], int):
        sys.exit("request %d alone: %s" % (i, alone[i]))
bad, t0, rounds = 0, time.time(), 0
for r in range(ROUNDS):
    if r and time.time() - t0 > SECONDS: break
    rounds += 1
    idx = range(r * N, r * N + N)
    got, start = {}, threading.Barrier(N)
    def one(i):
        try:
            start.wait(timeout=15)
        except threading.BrokenBarrierError:
            pass
        got[i] = ask(bodies[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in idx]
    for t in threads: t.start()
    for t in threads: t.join()
    for i in idx:
        if i not in alone: alone[i] = ask(bodies[i])  # the same request, alone, after the round
        if got[i] != alone[i]:
            bad += 1
            print("round %d, request %d: at once %s, alone %s" % (r, i, got[i], alone[i]))
    if bad: break  # one round that failed says it: no need to wait out the rest
print("%d rounds of %d at once (%.1f s): %d answer(s) differ from the same request's alone" % (rounds, N, time.time() - t0, bad))
sys.exit(1 if bad else 0)
PY
client_rc=$?
cat "$T/client.out"
check "8 requests encoded at once: each counts the tokens it counts alone" test "$client_rc" = 0
check "serve is still running after the rounds" alive "$SERVER_PID"

SERVER_STOPPED=1
kill -TERM "$SERVER_PID" 2>/dev/null
wait "$SERVER_PID"
server_rc=$?
check "SIGTERM: the server exits 0" test "$server_rc" = 0
n_rows=$(sqlite3 "$T/store/index.sqlite" "SELECT count(*) FROM requests WHERE state = 'rejected' AND status = 400" 2>/dev/null)
check "every request is a finished row, rejected 400 ($n_rows)" bash -c "
  [ '${n_rows:-0}' -ge 16 ] && [ \$(sqlite3 '$T/store/index.sqlite' \"SELECT count(*) FROM requests WHERE state = 'open'\") = 0 ]"

echo "$fails failure(s)"
[ "$fails" = 0 ]

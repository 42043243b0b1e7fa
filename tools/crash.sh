#!/usr/bin/env bash
# tools/crash.sh — kill -9 at random moments of `run`, `replay --sweep` and `capture`, each kill
# followed by `sparsetrace store check` and the next command. In CI as tests/test_crash.sh (a few
# trials per kind, in a work dir of the build tree); a long run by hand (from the repository
# root, after a build):
#   ST_BIN=build/sparsetrace ST_BUILD_DIR=build ST_TEST_DATA=tests/data tools/crash.sh
# One full run once lost its whole temporary folder (under the shared /tmp) from capture trial 42
# on; the work dir and every command's TMPDIR are now private to the run, and a trial that finds
# the store or tmp/ gone fails saying so.
#
# Kinds (each CRASH_TRIALS trials, default 100, but stopped after CRASH_BUDGET_S seconds of that
# kind, default 60, so that CI and the ASan build stay well inside their limits):
#   run      `run` of tests/data/oracle/tiny on a 300-token prompt with every tap (--tap '*'),
#            killed after a delay drawn uniformly from [0, 1.2 x the duration of an unkilled run]
#   replay   `replay --sweep` over 2 x 3 cells with --store (so it writes replays), same rule
#   capture  `capture` on the store with tests/fake_upstream behind it and 4 streaming clients,
#            killed after [0, 1.5 s] from its start (some before it listens, most mid-stream)
# After every kill: `store check` must say consistent (exit 0), or report only leftover .part
# files (a trace killed between rename and index insert, reported "file without row", is also
# accepted as recoverable and counted); then `store check --repair` (the .part files first aged
# past its 30 s grace period) must exit 0 and a second `store check` must exit 0; and the next
# command must work: `query` (run), `query` of the replays (replay), `requests list` (capture).
# Every 10th trial and at the end of each kind a complete command runs (a new run, a stored
# replay, a relayed request through a new proxy, which must also reconcile every row a killed
# proxy left 'open'); the unkilled runs and replays also lower the duration estimate the delays
# scale with, when the first measurement was slowed by a busy machine. Delays come from bash's RANDOM seeded with CRASH_SEED (default 1): a failure
# is reproduced by the same seed (and CRASH_KINDS="run" etc. to run one kind).
# Prints trials run per kind, how many of them left .part files or orphans, and failures.
set -u
st=${ST_BIN:-}
FAKE=${ST_BUILD_DIR:-}/tests/fake_upstream
model=${ST_TEST_DATA:-}/oracle/tiny
if [[ -z "$st" || ! -x "$st" || ! -f $model/config.json ]]; then
  echo "skip: need ST_BIN and ST_TEST_DATA/oracle/tiny"
  exit 77
fi
TRIALS=${CRASH_TRIALS:-100}
BUDGET=${CRASH_BUDGET_S:-60}
SEED=${CRASH_SEED:-1}
KINDS=${CRASH_KINDS:-run replay capture}
RANDOM=$SEED
# The work dir (CRASH_WORK_PARENT, default $TMPDIR or /tmp) holds everything this run writes, and
# is also the TMPDIR of every command it starts, so nothing it needs lives in a folder others
# share (and clean).
work=$(mktemp -d "${CRASH_WORK_PARENT:-${TMPDIR:-/tmp}}/st_test_crash.XXXXXX") || { echo "FAIL: mktemp"; exit 1; }
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
S=$work/store
failures=0
fail() { failures=$((failures + 1)); echo "FAIL [$kind trial $trial seed $SEED]: $*"; }
now_ms() { date +%s%3N; }
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
rand_ms() { echo $(( (RANDOM * 32768 + RANDOM) % ($1 + 1) )); } # uniform in [0, $1]
# kill_after MS CMD...: starts CMD, kill -9 after MS ms (if still running); rc of the wait in krc
kill_after() {
  local ms=$1; shift
  "$@" >"$work/cmd.out" 2>&1 &
  local pid=$!
  sleep_ms "$ms"
  kill -9 "$pid" 2>/dev/null && killed=1 || killed=0
  wait "$pid" 2>/dev/null
  local rc=$?
  # finished before the kill: it must have succeeded
  [[ $killed == 1 || $rc == 0 ]] || fail "exited $rc before the kill: $(tail -3 "$work/cmd.out")"
}
# check_store: store check after a kill; counts parts/orphans; repairs; checks again
n_part=0; n_orphan=0
check_store() {
  local out rc
  out=$("$st" store check --store "$S" 2>&1); rc=$?
  [[ $rc -eq 0 ]] && return 0
  local other
  other=$(grep -v -e '^leftover \.part: ' -e '^file without row: ' -e '^store .*: [0-9]* runs\? indexed' <<<"$out")
  if [[ $rc -ne 1 || -n "$other" ]]; then fail "store check after the kill (rc $rc): $out"; return 1; fi
  grep -q '^leftover \.part: ' <<<"$out" && n_part=$((n_part + 1))
  grep -q '^file without row: ' <<<"$out" && n_orphan=$((n_orphan + 1))
  find "$S" -name '*.part' -exec touch -d '1 hour ago' {} +
  out=$("$st" store check --store "$S" --repair 2>&1); rc=$?
  [[ $rc -eq 0 ]] || { fail "store check --repair (rc $rc): $out"; return 1; }
  out=$("$st" store check --store "$S" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || { fail "store check after --repair (rc $rc): $out"; return 1; }
  [[ -z $(find "$S" -name '*.part') ]] || { fail ".part files left after --repair"; return 1; }
}
min() { echo $(( $1 < $2 ? $1 : $2 )); }
q() { "$st" query --store "$S" --json "$1" 2>&1 | tr -d ' \n'; }
count() { q "$1" | tr -dc '0-9'; }

awk 'BEGIN { s = 5; printf "["; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
run_cmd=("$st" run --model "$model" --prompt-tokens "$work/p.json" --tap '*' --store "$S")
# the unkilled run: its duration scales the kill delays, its trace is what replay sweeps
t0=$(now_ms)
"${run_cmd[@]}" >"$work/first.out" 2>&1 || { echo "FAIL: the first run: $(cat "$work/first.out")"; exit 1; }
run_ms=$(( $(now_ms) - t0 ))
t0=$(now_ms) # a second, warm one (the first pays for a cold page cache)
"${run_cmd[@]}" >"$work/first.out" 2>&1 || { echo "FAIL: the second run: $(cat "$work/first.out")"; exit 1; }
run_ms=$(min "$run_ms" $(( $(now_ms) - t0 )))
base_trace=$S/$(q "SELECT trace_path FROM runs ORDER BY created_at LIMIT 1" | sed 's/.*"trace_path":"\([^"]*\)".*/\1/')
replay_cmd=("$st" replay --trace "$base_trace" --model "$model" --layer 1 --store "$S"
            --sweep index_k=fp32,bf16 --sweep rotate=none,q,k)
t0=$(now_ms)
"${replay_cmd[@]}" >"$work/first.out" 2>&1 || { echo "FAIL: the first replay: $(cat "$work/first.out")"; exit 1; }
replay_ms=$(( $(now_ms) - t0 ))
echo "unkilled: run ${run_ms} ms, replay sweep ${replay_ms} ms; seed $SEED, up to $TRIALS trials or ${BUDGET} s per kind"

# keeps the store small: beyond CRASH_KEEP_TRACES (default 3) traces besides the base, the
# oldest are removed and the dangling rows repaired (which also exercises --repair on rows
# without files); every store check verifies the digest of every trace, so this bounds its time
KEEP=${CRASH_KEEP_TRACES:-3}
prune() {
  local n
  n=$(find "$S" -name '*.h5' ! -path "$base_trace" | wc -l)
  [[ $n -le $KEEP ]] && return 0
  find "$S" -name '*.h5' ! -path "$base_trace" -printf '%T@ %p\n' | sort -n | head -n $((n - KEEP)) |
    cut -d' ' -f2- | xargs -r rm -f
  local out
  out=$("$st" store check --store "$S" --repair 2>&1) || fail "repairing after pruning: $out"
}

fake_started=0
start_fake() {
  [[ $fake_started == 1 ]] && return 0
  [[ -x "$FAKE" ]] || return 1
  "$FAKE" --port-file "$work/fake.port" >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [[ -s "$work/fake.port" ]] && break; sleep 0.05; done
  UP="http://127.0.0.1:$(cat "$work/fake.port")"
  fake_started=1
}
# one capture trial: proxy started, clients fired once it listens, proxy killed at ms
capture_trial() {
  local ms=$1 t_start pid url i
  rm -f "$work/ready"
  t_start=$(now_ms)
  "$st" capture --listen 127.0.0.1:0 --upstream "$UP" --store "$S" --ready-file "$work/ready" \
    --grace 0 >"$work/proxy.log" 2>&1 &
  pid=$!
  local clients=()
  while (( $(now_ms) - t_start < ms )); do
    if [[ ${#clients[@]} -eq 0 && -s "$work/ready" ]]; then
      url=$(cat "$work/ready")
      for i in 1 2 3 4; do
        local path=/v1/chat/completions; (( i % 2 )) || path=/v1/messages
        curl -sN --noproxy '*' --max-time 5 -H 'content-type: application/json' -H 'x-fake-events: 100' \
          -H 'x-fake-interval-ms: 10' -d "{\"model\":\"crash\",\"stream\":true,\"t\":\"$trial.$i\"}" \
          "$url$path" >/dev/null 2>&1 &
        clients+=($!)
      done
    fi
    sleep 0.01
  done
  kill -9 "$pid" 2>/dev/null && killed=1 || killed=0
  wait "$pid" 2>/dev/null
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null; wait "$c" 2>/dev/null; done
}
capture_full() { # a proxy that reconciles what killed ones left open, relays, and stops
  local pid url code out
  rm -f "$work/ready"
  "$st" capture --listen 127.0.0.1:0 --upstream "$UP" --store "$S" --ready-file "$work/ready" \
    --grace 0 >"$work/proxy.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [[ -s "$work/ready" ]] && break; sleep 0.05; done
  url=$(cat "$work/ready" 2>/dev/null)
  code=$(curl -s --noproxy '*' --max-time 10 -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
    -d '{"model":"after","messages":[]}' "$url/v1/chat/completions")
  [[ "$code" == 200 ]] || fail "a new proxy did not relay (HTTP $code): $(cat "$work/proxy.log")"
  kill -TERM "$pid"; wait "$pid" || fail "the new proxy did not stop cleanly"
  out=$(sqlite3 -readonly "$S/index.sqlite" "SELECT count(*) FROM requests WHERE state = 'open'" 2>/dev/null ||
        "$st" query --store "$S" --json "SELECT count(*) AS n FROM requests WHERE state = 'open'" | tr -dc '0-9')
  [[ "$out" == 0 ]] || fail "$out request rows still 'open' after a proxy restart"
}

summary=()
for kind in $KINDS; do
  trial=0; n_part=0; n_orphan=0; n_killed=0; f0=$failures
  if [[ $kind == capture ]] && ! start_fake; then summary+=("capture: skipped (no fake_upstream)"); continue; fi
  [[ $kind == capture ]] && ! command -v curl >/dev/null && { summary+=("capture: skipped (no curl)"); continue; }
  k0=$(now_ms)
  while (( trial < TRIALS && $(now_ms) - k0 < BUDGET * 1000 )); do
    trial=$((trial + 1))
    if [[ ! -d "$S" || ! -d "$TMPDIR" ]]; then # the flake once seen at capture trial 42
      fail "the work dir $work lost $( [[ -d "$S" ]] && echo "its tmp/" || echo "the store"): $(ls -la "$work" 2>&1 | tr '\n' ' ')"
      break
    fi
    case $kind in
      run) kill_after "$(rand_ms $((run_ms * 12 / 10)))" "${run_cmd[@]}" ;;
      replay) kill_after "$(rand_ms $((replay_ms * 12 / 10)))" "${replay_cmd[@]}" ;;
      capture) capture_trial "$(rand_ms 1500)" ;;
    esac
    n_killed=$((n_killed + killed))
    check_store
    case $kind in
      run) [[ $(q "SELECT count(*) AS n FROM runs") == *'"n":'* ]] || fail "query after the kill: $(q "SELECT count(*) AS n FROM runs")"; prune ;;
      replay) [[ $(q "SELECT count(*) AS n FROM replays") == *'"n":'* ]] || fail "query of the replays after the kill" ;;
      capture) "$st" requests --store "$S" list >/dev/null 2>"$work/err" || fail "requests list after the kill: $(cat "$work/err")" ;;
    esac
    if (( trial % 10 == 0 )); then
      case $kind in
        run) t0=$(now_ms)
             "${run_cmd[@]}" >"$work/cmd.out" 2>&1 || fail "a new run after the kills: $(tail -3 "$work/cmd.out")"
             run_ms=$(min "$run_ms" $(( $(now_ms) - t0 ))); prune ;;
        replay) before=$(count "SELECT count(*) AS n FROM replays"); t0=$(now_ms)
                "${replay_cmd[@]}" >"$work/cmd.out" 2>&1 || fail "a replay after the kills: $(tail -3 "$work/cmd.out")"
                replay_ms=$(min "$replay_ms" $(( $(now_ms) - t0 )))
                [[ $(count "SELECT count(*) AS n FROM replays") -gt $before ]] || fail "the replay after the kills was not stored" ;;
        capture) capture_full ;;
      esac
      check_store
    fi
  done
  case $kind in # the next command, once more at the end
    run) "${run_cmd[@]}" >"$work/cmd.out" 2>&1 || fail "a new run at the end: $(tail -3 "$work/cmd.out")" ;;
    replay) "${replay_cmd[@]}" >"$work/cmd.out" 2>&1 || fail "a replay at the end: $(tail -3 "$work/cmd.out")" ;;
    capture) capture_full ;;
  esac
  out=$("$st" store check --store "$S" 2>&1) || fail "store check at the end: $out"
  summary+=("$kind: $trial trials in $(( ($(now_ms) - k0) / 1000 )) s, $n_killed killed while running, $n_part left .part files, $n_orphan left a trace without a row, $((failures - f0)) failures")
done
echo "test_crash (seed $SEED):"
for s in "${summary[@]}"; do echo "  $s"; done
[[ $failures -eq 0 ]] && echo "no failures" || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# End to end (issue 13 #10): a long `run` shows a progress line on stderr when stderr is a
# terminal (tokens done / total, rate, time left; cli/progress.c), and nothing extra when it is not
# or with --quiet. The outputs are the same either way: stdout, --json (but the run id, path and
# time) and the trace's tokens and taps (the prompt is fed in pieces; the engine's results are
# bit-identical for any chunking).
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
command -v script >/dev/null || { echo "skip: no script(1) for a pty"; exit 77; }
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
# 2500 prompt tokens: three pieces of 1024 (the tiny model has 264 ids)
python3 -c 'print([i * 7 % 250 + 1 for i in range(2500)])' >"$work/p.json"
run="$st run --model $model --prompt-tokens $work/p.json --store $work/store --max-new-tokens 3 --tap logits --tap layers.1.indexer.*"

# 1. on a terminal (script(1) gives the command a pty; stdout goes to a file): the progress line,
#    the first piece's always (its rate and time left), then at most ten a second
script -qec "$run --out $work/tty.h5 --json >$work/tty.json" /dev/null >"$work/tty.err" 2>&1 || fail "run on a pty failed: $(cat "$work/tty.err")"
if grep -aqE 'run: 1024/2503 tokens, [0-9.]+ tokens/s, [0-9]+ (s|min) left' "$work/tty.err" &&
   grep -aqE 'run: 2503 tokens in [0-9.]+ s' "$work/tty.err"; then
  echo "ok: progress on a terminal: $(tr '\r' '\n' <"$work/tty.err" | grep -a . | tail -1)"
else
  fail "no progress line on a terminal: $(cat -A "$work/tty.err" | head -5)"
fi

# 2. not a terminal: nothing on stderr
$run --out "$work/pipe.h5" --json >"$work/pipe.json" 2>"$work/pipe.err" || fail "run without a tty failed"
[ -s "$work/pipe.err" ] && fail "stderr not a terminal, yet: $(cat -A "$work/pipe.err" | head -3)" || echo "ok: nothing on stderr without a terminal"

# 3. --quiet on a terminal: nothing either
script -qec "$run --out $work/quiet.h5 --quiet >/dev/null" /dev/null >"$work/quiet.err" 2>&1 || fail "run --quiet on a pty failed"
[ -s "$work/quiet.err" ] && fail "--quiet still printed: $(cat -A "$work/quiet.err" | head -3)" || echo "ok: --quiet prints nothing"

# 4. the outputs agree: --json but the run id, trace and seconds; the trace's tokens and taps
strip() { sed -E 's/"run_id":"[^"]*"//; s/"trace":"[^"]*"//; s/"seconds":[0-9.e+-]+//' "$1"; }
if [ "$(strip "$work/tty.json")" = "$(strip "$work/pipe.json")" ]; then echo "ok: --json identical"
else fail "--json differs: $(strip "$work/tty.json") vs $(strip "$work/pipe.json")"; fi
if command -v h5diff >/dev/null; then
  for obj in /tokens /taps; do
    if h5diff -q "$work/tty.h5" "$work/pipe.h5" $obj >/dev/null 2>&1; then echo "ok: trace $obj identical"
    else fail "trace $obj differs between the pty and the pipe run"; fi
  done
fi
# and against one unpieced forward: --chunk 4096 makes a single piece of the whole prompt
$run --out "$work/whole.h5" --chunk 4096 >/dev/null 2>&1 || fail "run --chunk 4096 failed"
if command -v h5diff >/dev/null; then
  h5diff -q "$work/pipe.h5" "$work/whole.h5" /taps >/dev/null 2>&1 && echo "ok: pieces equal one forward" ||
    fail "taps of the pieced prompt differ from one forward"
fi

# 5. replay: the progress line over its cells on a terminal, nothing without one
rep="$st replay --trace $work/pipe.h5 --model $model --layer 1 --sweep rotate=none,q,k,both"
script -qec "$rep >$work/rep_tty.out" /dev/null >"$work/rep_tty.err" 2>&1 || fail "replay on a pty failed: $(cat "$work/rep_tty.err")"
grep -aqE 'replay: 4 cells in [0-9.]+ s' "$work/rep_tty.err" && echo "ok: replay progress on a terminal" ||
  fail "no replay progress on a terminal: $(cat -A "$work/rep_tty.err" | head -3)"
$rep >"$work/rep_pipe.out" 2>"$work/rep_pipe.err" || fail "replay without a tty failed"
[ -s "$work/rep_pipe.err" ] && fail "replay without a terminal printed: $(head -3 "$work/rep_pipe.err")" || echo "ok: replay quiet without a terminal"
strip_t() { sed -E "s/[0-9]+\.[0-9]+ s//g; s/ [0-9.]+\r?$//" "$1"; }
[ "$(strip_t "$work/rep_tty.out" | tr -d '\r')" = "$(strip_t "$work/rep_pipe.out")" ] && echo "ok: replay stdout identical" ||
  fail "replay stdout differs: $(diff <(strip_t "$work/rep_tty.out") <(strip_t "$work/rep_pipe.out") | head -5)"

[ $failures -eq 0 ] && echo "all progress checks passed" || { echo "$failures failure(s)"; exit 1; }

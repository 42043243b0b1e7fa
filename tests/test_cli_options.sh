#!/usr/bin/env bash
# End to end: every subcommand reads its command line the same way (cli/options.c). --help exits 0
# with one format; an unknown option, a value that does not fit (2^32 + 1, which (int)strtol made
# 1), a thread count libgomp cannot start and an unknown backend exit 2 with a message naming the
# option; runtime failures exit 1.
set -uo pipefail
st=${ST_BIN:?}
model=${ST_TEST_DATA:?}/oracle/tiny
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
expect() { # expect DESCRIPTION RC PATTERN COMMAND...: exit RC, stderr matches PATTERN
  local out rc
  out=$("${@:4}" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$2" ]; then fail "$1: exit $rc, not $2: $out"; return; fi
  if ! grep -qE -- "$3" <<<"$out"; then fail "$1: message '$out' lacks /$3/"; return; fi
  echo "ok: $1 -> $(head -1 <<<"$out")"
}
echo '[1, 2, 3, 4, 5, 6, 7, 8, 9]' >"$work/p.json"
run=($st run --model "$model" --prompt-tokens "$work/p.json" --store "$work/store")

# 1. --help: exit 0, stdout "usage: sparsetrace CMD", an options list ending with -h, --help
commands=(run query inspect diff replay bisect report "needle make" "needle sweep" capture requests tokenize
          render taps settings)
for cmd in "${commands[@]}"; do
  # shellcheck disable=SC2086
  out=$($st $cmd --help 2>&1); rc=$?
  if [ $rc -ne 0 ]; then fail "$cmd --help: exit $rc"; continue; fi
  head -1 <<<"$out" | grep -q "^usage: sparsetrace $cmd" || { fail "$cmd --help: first line $(head -1 <<<"$out")"; continue; }
  grep -qx "options:" <<<"$out" || { fail "$cmd --help: no options: section"; continue; }
  grep -qE '^  -h, --help +this text$' <<<"$out" || { fail "$cmd --help: no '-h, --help' line"; continue; }
  # shellcheck disable=SC2086
  [ "$($st $cmd -h 2>&1)" = "$out" ] || { fail "$cmd -h differs from --help"; continue; }
  echo "ok: $cmd --help"
done
check_needle_help() { $st needle --help | grep -q '^usage: sparsetrace needle make'; }
check_needle_help && echo "ok: needle --help" || fail "needle --help"

# 2. unknown options: exit 2, named (taps and settings ignored them and exited 0)
for cmd in "${commands[@]}"; do
  # shellcheck disable=SC2086
  expect "$cmd --bogus" 2 "unknown option '--bogus'" $st $cmd --bogus
done
expect "an option another command takes" 2 "tokenize takes no --store" $st tokenize --store x
expect "a value on a flag" 2 "'--json' takes no value" $st taps --json=yes
expect "a missing value" 2 "'--model' needs a value" $st run --model
expect "an ambiguous abbreviation" 2 "ambiguous option '--t'" $st diff --t x a.h5 b.h5
expect "a stray argument" 2 "unexpected argument 'extra'" "${run[@]}" extra

# 3. numbers that do not fit: refused, not wrapped
expect "run --max-new-tokens 2^32+1" 2 "--max-new-tokens '4294967297'" "${run[@]}" --max-new-tokens 4294967297
expect "run --max-new-tokens -1" 2 "--max-new-tokens '-1'" "${run[@]}" --max-new-tokens -1
expect "run --chunk 2^32+1" 2 "--chunk '4294967297'" "${run[@]}" --chunk 4294967297
expect "run --threads 100000 (libgomp crashed)" 2 "--threads '100000': expected an integer from 1 to 1024" "${run[@]}" --threads 100000
expect "run --threads 0" 2 "--threads '0'" "${run[@]}" --threads 0
expect "run --threads 2x" 2 "--threads '2x'" "${run[@]}" --threads 2x
expect "run --needle-tokens past int64" 2 "--needle-tokens" "${run[@]}" --needle-tokens 1:99999999999999999999
expect "run --layer-set with a wrapped layer" 2 "--layer-set '4294967297:rotate=q'" "${run[@]}" --layer-set 4294967297:rotate=q
expect "replay --layer 2^32+1 (was layer 1)" 2 "--layer '4294967297'" $st replay --trace "$work/t.h5" --model "$model" --layer 4294967297
expect "replay --continue 2^32+1" 2 "--continue '4294967297'" $st replay --trace "$work/t.h5" --model "$model" --layer 1 --continue 4294967297
expect "replay --threads 100000" 2 "--threads '100000'" $st replay --trace "$work/t.h5" --model "$model" --layer 1 --threads 100000
expect "needle make --max-new-tokens 2^32+1" 2 "--max-new-tokens '4294967297'" $st needle make --tokens 1k --position 0.5 --seed 1 --max-new-tokens 4294967297
expect "needle make --max-tokens (the old spelling) range-checked too" 2 "4294967297" $st needle make --tokens 1k --position 0.5 --seed 1 --max-tokens 4294967297
expect "needle make --seed -1" 2 "--seed '-1'" $st needle make --tokens 1k --position 0.5 --seed -1
expect "needle sweep --seeds 2^32+1" 2 "--seeds '4294967297'" $st needle sweep --model "$model" --seeds 4294967297
expect "needle sweep --max-new-tokens 2^32+1" 2 "--max-new-tokens '4294967297'" $st needle sweep --model "$model" --max-new-tokens 4294967297
expect "needle sweep --threads 100000" 2 "--threads '100000'" $st needle sweep --model "$model" --threads 100000
expect "report --position -1" 2 "--position '-1'" $st report --store "$work/store" x.h5 --position -1
expect "requests --limit 2^32+1" 2 "--limit '4294967297'" $st requests --store "$work/store" list --limit 4294967297
expect "capture --threads 100000" 2 "--threads '100000'" $st capture --upstream http://127.0.0.1:9 --threads 100000

# 4. --backend: one of cpu-ref, cpu, cuda, hip on every command that computes, nowhere else
expect "run --backend metal" 2 "--backend 'metal': expected one of cpu-ref, cpu, cuda, hip" "${run[@]}" --backend metal
expect "replay --backend metal" 2 "--backend 'metal'" $st replay --trace "$work/t.h5" --model "$model" --layer 1 --backend metal
expect "bisect --backend metal" 2 "--backend 'metal'" $st bisect --trace "$work/t.h5" --model "$model" --good rotate=none --bad rotate=q --needle-tokens 1:2 --backend metal
expect "needle sweep --backend metal" 2 "--backend 'metal'" $st needle sweep --model "$model" --backend metal
expect "query takes no --backend" 2 "query takes no --backend" $st query --backend cpu-ref "SELECT 1"

# 5. the accepted spellings work: --backend cpu-ref, -o/--out (and the older --trace), --threads 1024
out=$("${run[@]}" --backend cpu-ref --threads 1024 --max-new-tokens 1 -o "$work/o.h5" --json 2>&1)
[ $? -eq 0 ] && [ -f "$work/o.h5" ] && grep -q '"threads":1024' <<<"$out" && echo "ok: run --backend cpu-ref --threads 1024 -o" || fail "run -o: $out"
"${run[@]}" --trace "$work/t.h5" >/dev/null 2>&1 && [ -f "$work/t.h5" ] && echo "ok: run --trace (the older spelling of --out)" || fail "run --trace"
$st inspect --trace "$work/t.h5" --json >/dev/null && echo "ok: inspect --trace" || fail "inspect --trace"
out=$($st diff --trace "$work/t.h5" --trace "$work/o.h5" 2>&1); rc=$?
[ $rc -le 1 ] && grep -q "^A  $work/t.h5" <<<"$out" && grep -q "^B  $work/o.h5" <<<"$out" && echo "ok: diff --trace A --trace B" || fail "diff --trace: rc $rc $out"
$st needle make --tokens 1k --position 0.5 --seed 1 --max-tokens 32 --quiet -o "$work/r.json" &&
  grep -q '"max_tokens": 32' "$work/r.json" && echo "ok: needle make --max-tokens (alias) and -o" || fail "needle make alias"
# options after positional arguments, and "--" before an argument that looks like an option
$st query --store "$work/store" "SELECT count(*) AS n FROM runs" --json | grep -q '"n"' && echo "ok: query SQL --json" || fail "query SQL --json"

# 6. runtime errors exit 1
expect "a missing trace is a runtime error" 1 "missing.h5" $st inspect "$work/missing.h5"
expect "a missing model is a runtime error" 1 "nowhere" $st run --model "$work/nowhere" --prompt-tokens "$work/p.json" --store "$work/store"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# tools/train_needle_gpu.sh cdata: the C generator's training examples are drawn with seeds that
# follow the run (100 x the step the training resumes from, + 0..13), so a call that goes on from
# a later step trains on needles no earlier call saw. With fixed seeds every session re-read one
# pool of 3,080 examples, and the release copied those needles better than new ones
# (bench/needle-train-results.md, "2026-12-05, fifth session"). Checked on small files
# (CDATA_BATCH=2): the same step gives the same bytes; a later step (INIT's log, or DIR's when an
# earlier call on the machine saved) gives other needles; CDATA_SEED picks the seeds, and seeds of
# an evaluation set are refused; CDATA_VOCAB_TOKENS is needle make's --vocab-tokens, CDATA_LENGTHS
# its --lengths.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
# the script runs `python3`; the system's (Debian's) has what tools/needle_data.py imports
mkdir -p "$work/bin" && ln -s "$(command -v /usr/bin/python3 || command -v python3)" "$work/bin/python3"

# an INIT whose training log's last save is STEP (what a release's training/log.jsonl holds)
init_at() {
  mkdir -p "$work/$1/training"
  printf '{"event": "saved", "step": 7000, "stage": 5}\n{"event": "saved", "step": %s, "stage": 5}\n{"event": "stage done", "stage": 5}\n' \
    "$2" > "$work/$1/training/log.jsonl"
}
# cdata NAME INIT [VAR=VALUE...]: one call's cdata step into $work/NAME
cdata() {
  local name=$1 init=$2
  shift 2
  env PATH="$work/bin:$PATH" "$@" INIT="$work/$init" CDATA_BATCH=2 NEEDLE_TRAIN_DIR="$work/$name.dir" \
    NEEDLE_CDATA_DIR="$work/$name.c" "$src/tools/train_needle_gpu.sh" "$work/$name.out" cdata \
    > "$work/$name.log" 2>&1 || fail "$name: train_needle_gpu.sh cdata: $(tail -3 "$work/$name.log")"
  tar -xzf "$work/$name.out/logs.tgz" -C "$work/$name.out" || fail "$name: no logs.tgz"  # the call packs its logs
}
values() { /usr/bin/python3 -c 'import json,sys; [print(json.loads(l)["value"]) for l in open(sys.argv[1])]' "$1" | sort -u; }

init_at a 7893
init_at b 8344
cdata a1 a
cdata a2 a
cdata b1 b
cdata s1 a CDATA_SEED=10

grep -qx "cdata seeds 789300 to 789313" "$work/a1.out/logs/cdata-seeds.txt" \
  || fail "INIT at step 7893: $(cat "$work/a1.out/logs/cdata-seeds.txt" 2>&1)"
grep -qx "cdata seeds 834400 to 834413" "$work/b1.out/logs/cdata-seeds.txt" \
  || fail "INIT at step 8344: $(cat "$work/b1.out/logs/cdata-seeds.txt" 2>&1)"
grep -qx "cdata seeds 1000 to 1013" "$work/s1.out/logs/cdata-seeds.txt" \
  || fail "CDATA_SEED=10: $(cat "$work/s1.out/logs/cdata-seeds.txt" 2>&1)"
n=$(wc -l < "$work/a1.c/train.jsonl" 2>/dev/null)
[ "${n:-0}" = 28 ] || fail "14 files of CDATA_BATCH=2: $n examples"
grep -q '"examples": 28' "$work/a1.out/logs/cdata.txt" || fail "needle_data.py's summary: $(cat "$work/a1.out/logs/cdata.txt")"
cmp -s "$work/a1.c/train.jsonl" "$work/a2.c/train.jsonl" || fail "the same step drew different examples"

# each file is needle make --batch at its seed: file 3 of step 8344 is seed 834403
$st needle make --batch 2 --jsonl "$work/one.jsonl" --seed 834403 --model "$src/models/needle-v4" \
  --lengths 1k,2k,4k,8k,16k,32k --split train --kinds path,host,key,number,ticket,url,commit,random,key,commit,random \
  --composed 0.5 --open-labels 0.3 --quiet || fail "needle make at seed 834403"
cmp -s "$work/one.jsonl" "$work/b1.c/3.jsonl" || fail "file 3 of step 8344 is not seed 834403's examples"

values "$work/a1.c/train.jsonl" > "$work/va"
values "$work/b1.c/train.jsonl" > "$work/vb"
values "$work/s1.c/train.jsonl" > "$work/vs"
[ "$(wc -l < "$work/va")" = 28 ] || fail "step 7893's 28 examples hold $(wc -l < "$work/va") distinct needles"
shared=$(comm -12 "$work/va" "$work/vb" | wc -l)
[ "$shared" = 0 ] || fail "steps 7893 and 8344 share $shared of 28 needles"
shared=$(comm -12 "$work/va" "$work/vs" | wc -l)
[ "$shared" = 0 ] || fail "step 7893 and CDATA_SEED=10 share $shared of 28 needles"

# CDATA_VOCAB_TOKENS reaches every file's needle make --vocab-tokens: file 5 of a vocab mix is
# seed 1005's examples made so
cdata v1 a CDATA_SEED=10 CDATA_KINDS=path,vocab CDATA_VOCAB_TOKENS=40-60
$st needle make --batch 2 --jsonl "$work/one.jsonl" --seed 1005 --model "$src/models/needle-v4" \
  --lengths 1k,2k,4k,8k,16k,32k --split train --kinds path,vocab --vocab-tokens 40-60 \
  --composed 0.5 --open-labels 0.3 --quiet || fail "needle make at seed 1005 with --vocab-tokens"
cmp -s "$work/one.jsonl" "$work/v1.c/5.jsonl" || fail "file 5 of CDATA_VOCAB_TOKENS=40-60 is not needle make --vocab-tokens 40-60's"
$st needle make --batch 2 --jsonl "$work/one.jsonl" --seed 1005 --model "$src/models/needle-v4" \
  --lengths 1k,2k,4k,8k,16k,32k --split train --kinds path,vocab --composed 0.5 --open-labels 0.3 --quiet
cmp -s "$work/one.jsonl" "$work/v1.c/5.jsonl" && fail "CDATA_VOCAB_TOKENS made the default vocab values"

# CDATA_LENGTHS reaches every file's needle make --lengths: file 5 at 1k alone is seed 1005's
# examples made so, and every example is near 1k tokens
cdata l1 a CDATA_SEED=10 CDATA_LENGTHS=1k
$st needle make --batch 2 --jsonl "$work/one.jsonl" --seed 1005 --model "$src/models/needle-v4" \
  --lengths 1k --split train --kinds path,host,key,number,ticket,url,commit,random,key,commit,random \
  --composed 0.5 --open-labels 0.3 --quiet || fail "needle make at seed 1005 with --lengths 1k"
cmp -s "$work/one.jsonl" "$work/l1.c/5.jsonl" || fail "file 5 of CDATA_LENGTHS=1k is not needle make --lengths 1k's"
long=$(/usr/bin/python3 -c 'import json,sys; print(sum(len(json.loads(l)["ids"]) > 1100 for l in open(sys.argv[1])))' \
  "$work/l1.c/train.jsonl")
[ "$long" = 0 ] || fail "CDATA_LENGTHS=1k: $long of 28 examples over 1,100 tokens"

# seeds an evaluation set uses are refused (bench/needle-train-results.md's e-fresh220 is seed 2000)
out=$(env PATH="$work/bin:$PATH" CDATA_SEED=20 CDATA_BATCH=2 NEEDLE_TRAIN_DIR="$work/e.dir" NEEDLE_CDATA_DIR="$work/e.c" \
  "$src/tools/train_needle_gpu.sh" "$work/e.out" cdata 2>&1); rc=$?
[ $rc = 2 ] && grep -q "take evaluation seed 2000" <<< "$out" || fail "CDATA_SEED=20 (seeds 2000-2013): rc $rc, '$out'"
[ -e "$work/e.c/0.jsonl" ] && fail "CDATA_SEED=20 wrote examples before refusing"

# an earlier call on this machine saved step 9000 in DIR: that is where the training resumes
mkdir -p "$work/d1.dir"
printf '{"event": "saved", "step": 9000, "stage": 5}\n' > "$work/d1.dir/log.jsonl"
cdata d1 a
grep -qx "cdata seeds 900000 to 900013" "$work/d1.out/logs/cdata-seeds.txt" \
  || fail "DIR's log at step 9000: $(cat "$work/d1.out/logs/cdata-seeds.txt" 2>&1)"

[ $failures = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "ok: cdata seeds follow the resumed step (7893, 8344, DIR's 9000, CDATA_SEED), 28 examples a call, disjoint needles"

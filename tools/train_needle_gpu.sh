#!/usr/bin/env bash
# The needle model's work in one device call (the GPU machine; carry .bundle, made here by
# tools/needle_bundle.sh): training data from the harness's own generator, the fast forward's
# parity with transformers, the training throughput, a training stage, the release.
#
#   tools/train_needle_gpu.sh OUT STEP...
#     cdata            `needle make --batch` training examples (train split, every kind but the
#                      Python generator's held-out `branch`), 1k-32k tokens, in parallel. CDATA_KINDS:
#                      the kinds drawn from, a kind named twice drawn twice as often (default: key,
#                      commit and random twice, the random strings step 7442 could not copy: 6, 0 and
#                      0 of 24 in its engine sweeps; `assorted`, 16 value shapes no other kind has,
#                      and `vocab`, tokens from the whole vocabulary, only when named; 64 entries
#                      at most); CDATA_VOCAB_TOKENS=LO-HI: `vocab` values of LO to HI tokens (needle
#                      make --vocab-tokens: many tokens to copy per example; default 6-14);
#                      CDATA_LENGTHS: the prompt sizes (needle make --lengths; default
#                      1k,2k,4k,8k,16k,32k; a stage draws a C example of 0.6-1x each batch's length, so
#                      give a stage of short lengths short examples);
#                      CDATA_DECOYS=N or LO-HI: that many decoys (each
#                      example's count drawn from LO-HI) in the examples of the last CDATA_DECOY_FILES
#                      (default 4) of the 14 files (needle make --decoys: the last line of the label);
#                      CDATA_COMPOSED: the share asking a composed question (default 0.5; needle make
#                      --composed); CDATA_OPEN_LABELS: the share with a made-up label (default 0.3;
#                      --open-labels). The 14 files' seeds are 100 x the step the training resumes
#                      from (the last save in DIR's log, else INIT's) + 0..13, so each call of a run
#                      draws examples no earlier call trained on; CDATA_SEED=N: N x 100 + 0..13
#                      instead (seeds of an evaluation set, EVAL_SEEDS, are refused). CDATA_BATCH:
#                      examples per file (default 220)
#     parity           train_needle.py parity against the release in INIT (default models/needle-v4)
#     check            tests/needle_fast_check.py: the fast forward against brute force (CPU, float64)
#     speed            train_needle.py speed (SPEED_ONLY=a,b: those configs and the v4 path)
#     profile          train_needle.py profile: where a step's time goes, torch.compile against eager
#     train:SECONDS    stage $STAGE (default 5) for SECONDS from INIT, half of each batch from cdata;
#     train:@T         the same until T seconds into this script
#                      COMPILE=1 (or layers): the decoder layers through torch.compile; COMPILE=hc: only
#                      their mHC; COMPILE=auto: what the profile step compiled (PROFILE_COMPILE=layers|hc),
#                      when it found it faster and equal to eager in fp32; SPLITS=N: micro-batches;
#                      DECAY=A:B: the learning rate falls linearly from step A to a tenth at step B
#                      (train_needle.py stage --decay); DECOYS=SHARE:LO-HI: that share of the Python
#                      generator's prompts get LO-HI earlier lines of the needle's label, the last one
#                      asked for (train_needle.py stage --decoys); LABELLED=SHARE: that share of them
#                      are of the labelled kind, whose labels and values are in no list (--labelled);
#                      COMPOSED=SHARE: that share of their questions composed from parts (--composed;
#                      default 0.5, 0: the families' own wordings, the mix the release trained on);
#                      PEAK=SCALE: the stage's learning rate times SCALE (--peak: a fine-tune from a
#                      cooled-down release; give it to every call of the stage); TRAIN_LAYERS=L,...:
#                      only those layers train (--train-layers; give it to every call of the stage)
#                      LENGTHS=LO-HI: prompts of LO to HI tokens instead of the stage's (--lengths; as
#                      many tokens a step, so more answers in each; CDATA_LENGTHS to match)
#                      Compiled, torch.compile's artifacts load from .compile-cache/needle.bin when it
#                      was carried and are saved to OUT/compile-cache.bin (carry it back as
#                      .compile-cache/needle.bin: compiling took 302 s on a fresh machine)
#     release          the trained weights as a release in OUT/needle-release.tgz (no evaluation)
#     adopt            tools/needle_adopt.py: this call's release against ADOPT_RELEASE (default INIT) on
#                      the adoption sets (ADOPT_SETS: only those; ADOPT_FIRST=N: their first N
#                      examples), one engine per core, into OUT/logs/adopt.txt (the table and the
#                      verdict) and adopt-answers.txt. The answers are kept in .adopt-cache
#                      (ADOPT_WORK): carry it with the release's answers in it (made here by
#                      tools/needle_adopt.py INIT --release INIT --st .bundle/bin/sparsetrace --work
#                      .adopt-cache), and only the candidate's examples run. The answers this call
#                      adds to the cache come back in OUT/logs/adopt-cache/ (logs.tgz): copied into
#                      .adopt-cache/answers here, they judge the candidate against any release whose
#                      answers are cached, with no example run again. The verdict includes the demo
#                      gate (tools/demo.sh on the candidate: item 5 of the model's issue; ADOPT_DEMO=0
#                      leaves it out)
#     soup             this call's release mixed with INIT weight by weight (tools/needle_soup.py INIT
#                      RELEASE, SOUP_ALPHA: the release's share, default 0.5; SOUP_ALPHA_FOR=GLOB=ALPHA:
#                      the tensors GLOB names at their own share, e.g. '*.attn.indexer.*=0', INIT's
#                      indexers) into DIR/soup and OUT/needle-soup.tgz, then adopted as the adopt
#                      step adopts the release, into
#                      OUT/logs/adopt-soup.txt and adopt-soup-answers.txt: the fine-tune and its mix
#                      with INIT judged in one call
#     probe            tools/needle_copy_probe.py on the adoption sets PROBE_SETS (default e-heldoutk48
#                      e-assorted48 e-vocab48; the adopt step writes them) for INIT, this call's release and its
#                      soup where made, with --trained this call's C examples when cdata ran: each
#                      needle token's wrong share by how many training needles held it, into
#                      OUT/logs/copy-probe-SET.txt
#     sweep            the engine (the bundle's sparsetrace, --backend cpu) on this call's release, else
#                      INIT: tools/demo.sh's recall sweep (1k and 4k x 4 positions x seeds 1-2, path, as
#                      trained and with rotate=q) into OUT/logs/demo-sweep.txt; ENGINE_SWEEPS=1: then
#                      tools/needle_engine_sweeps.sh over every kind, the toollist shape and the faults
#                      (1k,4k,16k x 2 seeds, as the card's) into OUT/logs/engine-sweeps.txt
#     oracle           transformers' greedy continuations on ORACLE (default: this call's release when
#                      there is one, else INIT): 6 prompts of held-out wording at 1k-4k and 6 of `needle
#                      make --batch` at 1k-4k, into OUT/oracle.jsonl (tests/test_needle_model.sh's fixture)
#     evaldata         `needle make --batch` evaluation sets with their own seeds, 1k-32k tokens
#                      (train_needle.py CARD_EVALS_V5): make-train (trained kinds, every format and
#                      shape), make-heldout (held-out kinds and question families), toollist-heldout,
#                      make-decoys (trained kinds, 1-24 decoys drawn per example: recall by position,
#                      the card's rows by decoys placed)
#     card             the release's card evaluations (of this machine's training, else of INIT's release as
#                      it is) (EVAL_SECONDS; CARD=v5: CARD_EVALS_V5; CARD_ONLY=a.json,b.json:
#                      those alone, the others' files of an earlier call on this machine kept). Each runs
#                      length by length, every mode at each: a short budget leaves out long lengths, not modes;
#                      the time left at the end measures again those that stopped short. Where INIT
#                      has a card (INIT/evals), the two are compared case by case into
#                      OUT/logs/card-compare.md (train_needle.py compare), whose last line is the
#                      card's verdict: the adoption rule on its paired rows
#
# GROW=L[,L...]: INIT grown first by a copy of each listed layer right after it, outputs zeroed and
# residual mix the identity (tools/needle_grow.py into /tmp/needle-grown; the stage trains that
# model, e.g. TRAIN_LAYERS with the new layers' numbers, which needle_grow prints). GROWN_LAYERS=FILE:
# the new layers from FILE (needle_grow.py --pack of an earlier fine-tune of them;
# models/checkpoints/README.md), not fresh copies: that fine-tune goes on.
#
# Outputs go to OUT; logs and JSON are packed into OUT/logs.tgz at the end (the device tool brings
# back few files). DIR (/tmp/needle-train; NEEDLE_TRAIN_DIR) and the C examples (/tmp/needle-c;
# NEEDLE_CDATA_DIR) are the machine's own: they are lost with the machine. ST_BIN: the harness to run
# (default .bundle/bin/sparsetrace).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/train_needle_gpu.sh OUT STEP...}
shift
export PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
init=${INIT:-models/needle-v4} stage=${STAGE:-5} dir=${NEEDLE_TRAIN_DIR:-/tmp/needle-train} cdata=${NEEDLE_CDATA_DIR:-/tmp/needle-c}
st=${ST_BIN:-.bundle/bin/sparsetrace}
mkdir -p "$out/logs" "$cdata"
SECONDS=0
if [ -n "${GROW:-}" ]; then
  [ -f /tmp/needle-grown/config.json ] || python3 tools/needle_grow.py "$init" /tmp/needle-grown --after "$GROW" \
    ${GROWN_LAYERS:+--new-layers "$GROWN_LAYERS"} | tee "$out/logs/grow.txt" \
    || { echo "GROW=$GROW: needle_grow failed"; exit 1; }
  init=/tmp/needle-grown
fi
step() { echo "== $1 ($SECONDS s)"; }
# tools/needle_adopt.py on MODEL against ADOPT_RELEASE (default INIT), one engine per core, its table
# into OUT/logs/NAME.txt and every example's verdict into NAME-answers.txt (the adopt and soup steps)
adopt_model() {
  local work=${ADOPT_WORK:-.adopt-cache}
  mkdir -p "$work/answers" "$out/logs/adopt-cache" && ls "$work/answers" > "$out/logs/adopt-cache.before"
  python3 tools/needle_adopt.py "$1" --release "${ADOPT_RELEASE:-$init}" --st "$st" --jobs "$(nproc)" \
    --work "$work" ${ADOPT_SETS:+--sets "$ADOPT_SETS"} ${ADOPT_FIRST:+--first "$ADOPT_FIRST"} \
    --answers "$out/logs/$2-answers.txt" $([ "${ADOPT_DEMO:-1}" = 0 ] && echo --no-demo) 2>&1 | tee "$out/logs/$2.txt"
  ls "$work/answers" | grep -vxF -f "$out/logs/adopt-cache.before" | while read -r f; do cp "$work/answers/$f" "$out/logs/adopt-cache/"; done
  rm -f "$out/logs/adopt-cache.before"
}
# needle make --batch seeds of the evaluation sets, which cdata never draws: evaldata's and the
# oracle's (used below by name), and the bench's engine sets (tools/needle_adopt.py's adoption
# sets and the others it lists)
SEED_MAKE_TRAIN=90001 SEED_MAKE_HELDOUT=90002 SEED_TOOLLIST_HELDOUT=90003 SEED_MAKE_DECOYS=90004
SEED_ORACLE=4242
SEEDS_BENCH=$(python3 tools/needle_adopt.py --seeds) || { echo "tools/needle_adopt.py --seeds failed"; exit 1; }
EVAL_SEEDS="$SEED_MAKE_TRAIN $SEED_MAKE_HELDOUT $SEED_TOOLLIST_HELDOUT $SEED_MAKE_DECOYS $SEED_ORACLE $SEEDS_BENCH"
# The step a stage of this call resumes from, as train_needle.py reads it (_saved_steps): the last
# save in DIR's log (an earlier call on this machine), else in INIT's (training/log.jsonl of a
# release, which seeds a fresh DIR), else 0.
resume_step() {
  python3 -c 'import sys; sys.path.insert(0, "tools"); from train_needle import _saved_steps
print(next((steps[-1] for steps in map(_saved_steps, sys.argv[1:]) if steps), 0))' "$dir" "$init/training"
}
for s in "$@"; do
  case $s in
    cdata)
      step cdata
      # Fixed seeds (1000-1013 until 2026-12-05) had every session train on one pool of 3,080
      # examples, and the release copies those needles better than new ones
      # (bench/needle-train-results.md, "2026-12-05, fifth session").
      base=${CDATA_SEED:-$(resume_step)}
      for e in $EVAL_SEEDS; do   # a training file at an evaluation's seed would be that evaluation
        [ "$e" -lt $((base * 100)) ] || [ "$e" -gt $((base * 100 + 13)) ] \
          || { echo "cdata: seeds $((base * 100))-$((base * 100 + 13)) take evaluation seed $e"; exit 2; }
      done
      echo "cdata seeds $((base * 100)) to $((base * 100 + 13))" | tee "$out/logs/cdata-seeds.txt"
      for i in $(seq 0 13); do
        "$st" needle make --batch "${CDATA_BATCH:-220}" --jsonl "$cdata/$i.jsonl" --seed $((base * 100 + i)) \
          --model models/needle-v4 --lengths "${CDATA_LENGTHS:-1k,2k,4k,8k,16k,32k}" --split train \
          --kinds "${CDATA_KINDS:-path,host,key,number,ticket,url,commit,random,key,commit,random}" \
          $([ "$i" -ge $((14 - ${CDATA_DECOY_FILES:-4})) ] && [ -n "${CDATA_DECOYS:-}" ] && echo --decoys "$CDATA_DECOYS") \
          --composed "${CDATA_COMPOSED:-0.5}" --open-labels "${CDATA_OPEN_LABELS:-0.3}" \
          $([ -n "${CDATA_VOCAB_TOKENS:-}" ] && echo --vocab-tokens "$CDATA_VOCAB_TOKENS") \
          --quiet &
      done
      wait
      cat "$cdata"/[0-9]*.jsonl > "$cdata/train.jsonl"
      python3 tools/needle_data.py jsonl "$cdata/train.jsonl" | tee "$out/logs/cdata.txt" ;;
    check)
      step check
      python3 tests/needle_fast_check.py 2>&1 | tee "$out/logs/needle_fast_check.txt" | tail -4
      [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "needle_fast_check failed: no training on the fast forward"; break; } ;;
    parity)
      step parity
      python3 tools/train_needle.py parity "$dir" --init "$init" --out "$out/logs/parity.json" 2>&1 \
        | grep -v Warning | tee "$out/logs/parity.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "parity failed: no training on the fast forward"; break; } ;;
    speed)
      step speed
      python3 tools/train_needle.py speed "$dir" --init "$init" --out "$out/logs/speed.json" --steps "${SPEED_STEPS:-8}" \
        ${SPEED_ONLY:+--only "$SPEED_ONLY"} 2>&1 \
        | grep -v Warning | tee "$out/logs/speed.txt" ;;
    profile)
      step profile
      python3 tools/train_needle.py profile "$dir" --init "$init" --out "$out/logs/profile.json" \
        --compile "${PROFILE_COMPILE:-layers}" 2>&1 \
        | grep -v Warning | tee "$out/logs/profile.txt" ;;
    train:*)
      step "$s"
      j=(); [ -s "$cdata/train.jsonl" ] && j=(--jsonl "$cdata/train.jsonl")
      c=${COMPILE:-0}
      if [ "$c" = auto ]; then
        c=$(python3 - "$out/logs/profile.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["configs"]
except Exception:
    rows = []
eq = [r["compiled_vs_eager_fp32"] for r in rows if "compiled_vs_eager_fp32" in r]
fast = [r.get("compiled_vs_eager", 0) for r in rows]
ok = (eq and eq[0]["logits_max_diff_over_max"] < 1e-4 and eq[0]["grads_max_diff_over_max"] < 1e-3
      and eq[0]["same_parameters"] and fast and min(fast) >= 1.15)
print(rows[0].get("compile_scope", "layers") if ok else 0)
PY
)
        echo "COMPILE=auto: $c"
      fi
      [ "$c" = 1 ] && c=layers
      if [ "$c" = layers ] || [ "$c" = hc ]; then
        j+=(--compile "$c")
        mkdir -p .compile-cache
        export NEEDLE_COMPILE_CACHE=$PWD/.compile-cache/needle.bin
      fi
      [ -n "${SPLITS:-}" ] && j+=(--splits "$SPLITS")
      [ -n "${DECAY:-}" ] && j+=(--decay "$DECAY")
      [ -n "${DECOYS:-}" ] && j+=(--decoys "$DECOYS")
      [ -n "${LABELLED:-}" ] && j+=(--labelled "$LABELLED")
      [ -n "${COMPOSED:-}" ] && j+=(--composed "$COMPOSED")
      [ -n "${PEAK:-}" ] && j+=(--peak "$PEAK")
      [ -n "${TRAIN_LAYERS:-}" ] && j+=(--train-layers "$TRAIN_LAYERS")
      [ -n "${LENGTHS:-}" ] && j+=(--lengths "$LENGTHS")
      budget=${s#train:}
      [ "${budget:0:1}" = @ ] && budget=$(( ${budget:1} - SECONDS ))
      python3 tools/train_needle.py stage "$stage" "$dir" --init "$init" --budget "$budget" --eval-seconds 0 \
        "${j[@]}" 2>&1 | grep -v Warning | tee "$out/logs/train-$SECONDS.txt" | grep -E '"step": [0-9]*[05]0,|event|Error|error|out of memory'
      [ -s "${NEEDLE_COMPILE_CACHE:-}" ] && cp "$NEEDLE_COMPILE_CACHE" "$out/compile-cache.bin" ;;
    release)
      step release
      rm -rf "$dir/release" "$dir/soup" && python3 tools/train_needle.py release "$dir" "$dir/release" --budget 0 2>&1 | tail -3
      tar -C "$dir/release" -czf "$out/needle-release.tgz" . ;;
    adopt)
      step adopt
      [ -f "$dir/release/config.json" ] || { echo "adopt: no release in $dir (the release step first)"; break; }
      adopt_model "$dir/release" adopt ;;
    soup)
      step soup
      [ -f "$dir/release/config.json" ] || { echo "soup: no release in $dir (the release step first)"; break; }
      rm -rf "$dir/soup"
      python3 tools/needle_soup.py "$init" "$dir/release" "$dir/soup" --alpha "${SOUP_ALPHA:-0.5}" \
        ${SOUP_ALPHA_FOR:+--alpha-for "$SOUP_ALPHA_FOR"} 2>&1 | tail -1
      [ -f "$dir/soup/config.json" ] || { echo "soup: tools/needle_soup.py made no soup"; break; }
      tar -C "$dir/soup" -czf "$out/needle-soup.tgz" .
      adopt_model "$dir/soup" adopt-soup ;;
    probe)
      step probe
      models=(--model "$init")
      for m in "$dir/release" "$dir/soup"; do [ -f "$m/config.json" ] && models+=(--model "$m"); done
      trained=(); [ -s "$cdata/train.jsonl" ] && trained=(--trained "$cdata/train.jsonl")
      for set in ${PROBE_SETS:-e-heldoutk48 e-assorted48 e-vocab48}; do
        f=${ADOPT_WORK:-.adopt-cache}/sets/$set.jsonl
        [ -f "$f" ] || { echo "probe: no $f (the adopt step writes it)"; continue; }
        python3 tools/needle_copy_probe.py "$f" "${models[@]}" "${trained[@]}" --st "$st" \
          > "$out/logs/copy-probe-$set.txt" 2>&1 || echo "probe: $set failed (OUT/logs/copy-probe-$set.txt)"
        echo "-- $set"; sed -n '/of the needle tokens wrong/p; /^times a trained/,/^$/p' "$out/logs/copy-probe-$set.txt"
      done ;;
    sweep)
      step sweep
      m=$init; [ -f "$dir/release/hf_config.json" ] && m=$dir/release
      echo "engine sweeps on $m ($(nproc) cores)" | tee "$out/logs/demo-sweep.txt"
      for set in "" rotate=q; do
        "$st" needle sweep --backend cpu --model "$m" --tokens 1k,4k --seeds 2 --kind path \
          --store /tmp/needle-sweep ${set:+--set "$set"} --quiet 2>&1 | tee -a "$out/logs/demo-sweep.txt" | grep -E "^(settings|all)"
      done
      [ "${ENGINE_SWEEPS:-0}" = 1 ] && ST_BIN="$st" tools/needle_engine_sweeps.sh "$m" \
        "$out/logs/engine-sweeps.txt" 1k,4k,16k 2 2>&1 | grep -E '^==|^all' ;;
    oracle)
      step oracle
      w=${ORACLE:-$init}; [ -z "${ORACLE:-}" ] && [ -f "$dir/release/hf_config.json" ] && w=$dir/release
      echo "oracle on $w"
      "$st" needle make --batch 6 --jsonl /tmp/oracle-make.jsonl --seed $SEED_ORACLE \
        --model models/needle-v4 --lengths 1k,2k,4k --quiet
      rm -rf /tmp/needle-oracle
      python3 tools/train_needle.py oracle-fixture "$w" /tmp/needle-oracle "$out/oracle.jsonl" --count 6 \
        --lengths 1024,2048,4096 --jsonl /tmp/oracle-make.jsonl 2>&1 | grep -v Warning | tee "$out/logs/oracle.txt" ;;
    evaldata)
      step evaldata
      mk() { "$st" needle make --batch "$2" --jsonl "$dir/evals-$1.jsonl" --seed "$3" \
               --model models/needle-v4 --lengths 1k,2k,4k,8k,16k,32k --quiet "${@:4}"; }
      mkdir -p "$dir"
      mk make-train 192 $SEED_MAKE_TRAIN --split train & mk make-heldout 96 $SEED_MAKE_HELDOUT --split heldout &
      mk toollist-heldout 96 $SEED_TOOLLIST_HELDOUT --split heldout --shapes toollist &
      mk make-decoys 96 $SEED_MAKE_DECOYS --split train --decoys 1-24 & wait
      for f in "$dir"/evals-*.jsonl; do echo "$(basename "$f"): $(wc -l < "$f") examples"; done | tee "$out/logs/evaldata.txt" ;;
    card)
      step card
      from=(); [ -f "$dir/weights/config.json" ] || from=(--from "$init")
      python3 tools/train_needle.py release "$dir" "$dir/release" --budget "${EVAL_SECONDS:-240}" --card "${CARD:-v4}" \
        "${from[@]}" \
        ${CARD_ONLY:+--only "$CARD_ONLY"} 2>&1 \
        | grep -v Warning | tee "$out/logs/card.txt" | tail -30
      if [ -d "$init/evals" ] && [ "$(cd "$init" && pwd)" != "$(cd "$dir/release" && pwd)" ]; then
        python3 tools/train_needle.py compare "$init/evals" "$dir/release/evals" --which "${CARD:-v4}" \
          > "$out/logs/card-compare.md" && tail -1 "$out/logs/card-compare.md"
      fi
      tar -C "$dir/release" -czf "$out/needle-release.tgz" . ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
step done
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"

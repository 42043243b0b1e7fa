#!/usr/bin/env bash
# Replay speed: one layer's indexer under a 16-cell sweep (rotate x top-k) at N tokens, beside
# the time of one full re-run of the model and of the 16 full re-runs the sweep replaces.
# Writes bench/replay-results.md. Usage: bench/run_replay.sh [BUILD_DIR] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tokens=${2:-16384}
st="$build/sparsetrace"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 tools/make_random_checkpoint.py "$work/model" --index-heads 4 --topk 64 --window 128
awk -v n="$tokens" 'BEGIN { s = 5; printf "["; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
now() { date +%s.%N; }
t0=$(now)
$st run --model "$work/model" --prompt-tokens "$work/p.json" --store "$work/s" --trace "$work/plain.h5" >/dev/null
t1=$(now)
$st run --model "$work/model" --prompt-tokens "$work/p.json" --tap 'layers.*.indexer.*' --store "$work/s" --trace "$work/rec.h5" >/dev/null
t2=$(now)
$st replay --trace "$work/rec.h5" --model "$work/model" --layer 1 --store "$work/s" \
  --sweep rotate=none,q,k,both --sweep topk=16,64,256,all --needle-tokens 400:404 >"$work/sweep.txt"
t3=$(now)
full=$(echo "$t1 - $t0" | bc -l); recorded=$(echo "$t2 - $t1" | bc -l); sweep=$(echo "$t3 - $t2" | bc -l)
{
  echo "# Replay: a 16-cell indexer sweep vs re-running the model"
  echo
  echo "Command: \`bench/run_replay.sh $build $tokens\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), build $(git rev-parse --short HEAD))."
  echo "Model: random DeepSeek-V4 in the shape of the bundled tiny model (tools/make_random_checkpoint.py, 4 indexer heads of 128, top-k 64)."
  echo "Each time is one process, wall clock, including loading; the sweep is rotate={none,q,k,both} x topk={16,64,256,all} on layer 1."
  echo
  echo "| what | seconds | ratio |"
  echo "|---|---:|---:|"
  printf "| full run, %d tokens, no taps | %.2f | 1 |\n" "$tokens" "$full"
  printf "| full run with every indexer tap recorded | %.2f | %.2f |\n" "$recorded" "$(echo "$recorded / $full" | bc -l)"
  printf "| replay: 16-cell sweep of layer 1's indexer | %.2f | %.2f |\n" "$sweep" "$(echo "$sweep / $full" | bc -l)"
  printf "| the same 16 cells as full re-runs (16 x full run) | %.2f | 16 |\n" "$(echo "16 * $full" | bc -l)"
  printf "\nThe sweep costs %.1f%% of the 16 re-runs it replaces.\n\n" "$(echo "100 * $sweep / (16 * $full)" | bc -l)"
  echo '```'
  cat "$work/sweep.txt"
  echo '```'
} | tee bench/replay-results.md

#!/usr/bin/env bash
# Scoreboard speed: the `small` corpus (24 cases, 512 and 1k tokens, schemas/scoreboard-corpora.json)
# against the bundled needle model as trained and under rotate=q, on the cpu backend; cases per
# minute from the wall clock of each target and from the attempts' own durations in the index.
# Writes bench/scoreboard-results.md. Usage: bench/run_scoreboard.sh [BUILD_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
st="$build/sparsetrace"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
declare -A wall
for t in trained=engine:backend=cpu rotate=q=engine:backend=cpu,rotate=q; do
  t0=$(now)
  $st scoreboard --corpus small --model models/needle-v4 --store "$work/s" --threads "$threads" --quiet --target "$t" \
    >"$work/board.txt"
  wall[${t%%=engine*}]=$(echo "$(now) - $t0" | bc -l)
done
{
  echo "# Scoreboard: cases per minute on the bundled model"
  echo
  echo "Command: \`bench/run_scoreboard.sh $build $threads\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), build $(git rev-parse --short HEAD))."
  echo "Corpus \`small\` v1: 24 cases (path and host needles x 512 and 1024 tokens x positions 0.2, 0.6, 0.9 x seed 2 x"
  echo "openai-chat and anthropic), up to 40 tokens generated each; models/needle-v4 on the cpu backend, $threads OpenMP threads."
  echo "Each case is one recorded engine run (indexer taps at the answer positions, needle verdicts) plus its rows."
  echo
  echo "| target | cases | wall s (one process, loading included) | cases per minute | mean attempt s (index) |"
  echo "|---|---:|---:|---:|---:|"
  for label in trained rotate=q; do
    read -r n mean < <(sqlite3 -separator ' ' "$work/s/index.sqlite" \
      "SELECT count(*), round(avg(a.duration_s), 2) FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id) WHERE r.label = '$label'")
    printf '| %s | %d | %.1f | %.1f | %s |\n' "$label" "$n" "${wall[$label]}" "$(echo "60 * $n / ${wall[$label]}" | bc -l)" "$mean"
  done
  echo
  echo '```'
  cat "$work/board.txt"
  echo '```'
} >bench/scoreboard-results.md
cat bench/scoreboard-results.md

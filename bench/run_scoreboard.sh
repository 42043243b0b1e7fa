#!/usr/bin/env bash
# Scoreboard speed: a corpus of schemas/scoreboard-corpora.json (default demo: 4 cases of ~512
# tokens) against the bundled needle model as trained, under rotate=q and under rotate=both, on
# the cpu backend. Per target: wall clock and CPU time of the one scoreboard process (loading
# included), cases per minute of each, and the attempts' mean duration from the index. On a
# shared machine the wall clock follows the load (printed); CPU time much less.
# Writes bench/scoreboard-results.md. Usage: bench/run_scoreboard.sh [BUILD_DIR] [THREADS] [CORPUS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
corpus=${3:-demo}
st="$build/sparsetrace"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
for t in trained=engine:backend=cpu rotate=q=engine:backend=cpu,rotate=q rotate=both=engine:backend=cpu,rotate=both; do
  label=${t%%=engine*}
  TIMEFORMAT='%R %U %S'
  { time $st scoreboard --corpus "$corpus" --model models/needle-v4 --store "$work/s" --threads "$threads" --quiet \
      --target "$t" >"$work/board.txt"; } 2>"$work/time.txt"
  read -r wall user sys <"$work/time.txt"
  read -r n mean < <(sqlite3 -separator ' ' "$work/s/index.sqlite" \
    "SELECT count(*), round(avg(a.duration_s), 2) FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id) WHERE r.label = '$label'")
  cpu=$(echo "$user + $sys" | bc -l)
  rows+=("$(printf '| %s | %d | %.1f | %.1f | %.1f | %.1f | %s |' "$label" "$n" "$wall" "$(echo "60 * $n / $wall" | bc -l)" \
    "$cpu" "$(echo "60 * $n / $cpu" | bc -l)" "$mean")")
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
{
  echo "# Scoreboard: cases per minute on the bundled model"
  echo
  echo "Command: \`bench/run_scoreboard.sh $build $threads $corpus\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), build $(git rev-parse --short HEAD))."
  echo "Corpus \`$corpus\` of schemas/scoreboard-corpora.json; models/needle-v4 on the cpu backend, $threads OpenMP threads."
  echo "Each case is one recorded engine run (indexer taps at the answer positions, needle verdicts) plus its rows;"
  echo "each target is one scoreboard process. Load average (1, 5, 15 min) before: $load0; after: $load1."
  echo
  echo "| target | cases | wall s | cases per wall minute | CPU s | cases per CPU minute | mean attempt s (index) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
  echo '```'
  cat "$work/board.txt"
  echo '```'
} >bench/scoreboard-results.md
cat bench/scoreboard-results.md

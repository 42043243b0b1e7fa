#!/usr/bin/env bash
# Time to draw `sparsetrace report` of a long trace on the bundled needle model (models/needle-v4):
# an N-token agentic request (needle make, the needle at 50%) recorded once with the indexer's
# inputs and top-k at every position from the needle on (not the scores: 0.25 GB a layer at 16k)
# and the needle marked, so the index holds a verdict per CSA layer at every one of those
# positions. Timed: the report of the run (identity, verdict table, the heat map of every
# verdict), the report of the run against itself (both heat maps and the diff, which reads every
# tap of both traces in full), and headless Chromium loading the first page.
# Writes bench/report-results.md (or $ST_REPORT_RESULTS). Usage: bench/run_report.sh [BUILD_DIR] [TOKENS]
# (default build, 16k). User time and peak RSS of the two reports from /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tokens=${2:-16k}
st="$build/sparsetrace"
model=models/needle-v4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
field() { /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
now() { date +%s.%N; }
timed() { /usr/bin/time -f '%U %M' -o "$1" "${@:2}"; } # timed FILE COMMAND...: user s, peak KiB
$st needle make --model "$model" --tokens "$tokens" --position 0.5 --seed 3 --kind path --format openai-chat \
  --thinking off --out "$work/req.json" --meta "$work/needle.json" 2>/dev/null
$st render --request "$work/req.json" --model "$model" --thinking off --ids >"$work/prompt.json"
t0=$(now)
$st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 8 \
  --tap 'layers.*.indexer.q' --tap 'layers.*.indexer.k' --tap 'layers.*.indexer.weights' --tap 'layers.*.indexer.topk' \
  --positions "$(field "$work/needle.json" needle_token):1000000000" --needle "$(field "$work/needle.json" needle)" \
  --store "$work/s" --trace "$work/s/run.h5" >"$work/run.txt"
t1=$(now)
timed "$work/one.time" $st report --store "$work/s" "$work/s/run.h5" -o "$work/one.html" 2>/dev/null
t2=$(now)
timed "$work/two.time" $st report --store "$work/s" "$work/s/run.h5" "$work/s/run.h5" -o "$work/two.html" 2>/dev/null
t3=$(now)
timeout 600 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$work/profile" --dump-dom \
  "file://$work/one.html" >/dev/null 2>&1
t4=$(now)
n_prompt=$(/usr/bin/python3 -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r")["tokens"].attrs["n_prompt"])' "$work/s/run.h5")
verdicts=$(sqlite3 "$work/s/index.sqlite" 'SELECT count(*) FROM needle_verdicts')
read -r one_user one_kib <"$work/one.time"
read -r two_user two_kib <"$work/two.time"
{
  echo "# Drawing a report of a long trace"
  echo
  echo "Command: \`bench/run_report.sh $build $tokens\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), build $(git rev-parse --short HEAD); load average $(cut -d' ' -f1 /proc/loadavg))."
  echo "Model: models/needle-v4. Request: \`needle make --tokens $tokens\`, $n_prompt prompt tokens, the needle at 50%;"
  echo "recorded with the indexer's q, k, weights and top-k from the needle's first token on, 8 tokens generated."
  echo
  echo "| what | seconds (wall) | user s | peak RSS | page |"
  echo "|---|---:|---:|---:|---:|"
  printf '| record the run (run --needle: prefill, taps, verdicts) | %.1f | | | |\n' "$(echo "$t1 - $t0" | bc -l)"
  printf '| report of the run: %s verdicts in one heat map | %.2f | %s | %d MB | %s |\n' "$verdicts" "$(echo "$t2 - $t1" | bc -l)" \
    "$one_user" $((one_kib / 1024)) "$(du -h "$work/one.html" | cut -f1)"
  printf '| report of the run against itself: four heat maps, the diff of every tap | %.2f | %s | %d MB | %s |\n' \
    "$(echo "$t3 - $t2" | bc -l)" "$two_user" $((two_kib / 1024)) "$(du -h "$work/two.html" | cut -f1)"
  printf '| headless Chromium loads the first page (--dump-dom) | %.2f | | | |\n' "$(echo "$t4 - $t3" | bc -l)"
  echo
  echo "Trace: $(du -sh "$work/s/run.h5" | cut -f1); index $(du -sh "$work/s/index.sqlite" | cut -f1)."
} | tee "${ST_REPORT_RESULTS:-bench/report-results.md}"

#!/usr/bin/env bash
# run_serve_bug_report.sh — bench/bug_report.py against `sparsetrace serve` on models/needle-v4 at
# several tool counts, as trained and with X-Sparsetrace-Set: rotate=q (indexer taps and the
# needle's verdicts armed per request), then `sparsetrace diff` of each pair: the answers, the
# prompt lengths and the first divergence, as the table of bench/serve-results.md.
#   bench/run_serve_bug_report.sh [BUILD_DIR] [N_TOOLS...]     (default: build 100 200 300 400)
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
shift || true
COUNTS=${*:-100 200 300 400}
T=$(mktemp -d /tmp/st_bug_report.XXXXXX)
"$BUILD/sparsetrace" serve --model "$SRC/models/needle-v4" --store "$T/store" --port 0 --context 32768 \
  --ready-file "$T/ready" --quiet 2> "$T/serve.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 600); do [ -s "$T/ready" ] && break; sleep 0.1; done
URL=$(cat "$T/ready")
TAPS='X-Sparsetrace-Tap: layers.*.indexer.q_used,layers.*.indexer.topk,logits'
NEEDLE='X-Sparsetrace-Needle: Primary working directory: /home/devon/work/lanternfish'
echo "| tools | prompt tokens | as trained | rotate=q | first divergence |"
echo "|---|---|---|---|---|"
for n in $COUNTS; do
  /usr/bin/python3 "$SRC/bench/bug_report.py" "$URL" "$n" "$TAPS" "$NEEDLE" > "$T/a.json"
  /usr/bin/python3 "$SRC/bench/bug_report.py" "$URL" "$n" "$TAPS" "$NEEDLE" 'X-Sparsetrace-Set: rotate=q' > "$T/b.json"
  get() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
  div=$("$BUILD/sparsetrace" diff "$(get "$T/a.json" 'd["trace"]')" "$(get "$T/b.json" 'd["trace"]')" 2>&1 |
        sed -n 's/^first divergence: \([^ ]*\).*/\1/p' | head -1)
  echo "| $n | $(get "$T/a.json" 'd["usage"]["prompt_tokens"]') | $(get "$T/a.json" 'json.dumps(d["text"])') | $(get "$T/b.json" 'json.dumps(d["text"])') | ${div:-none} |"
done

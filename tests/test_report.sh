#!/usr/bin/env bash
# test_report.sh — `sparsetrace report` opened in real headless Chromium (Debian's chromium), on a
# store made here with the bundled needle model: two runs of a 1k-token agentic request (as
# trained, and with rotate=q), a stored replay sweep, two small needle sweeps, and a bisect.
#  - the page loads from file:// with no console message at all (a page with a deliberate error
#    first proves the console check sees one) and loads nothing from anywhere;
#  - what Chromium's DOM holds equals the store read independently (tests/report_check.py:
#    sqlite3, h5py, numpy): every heat-map cell's rank and top-k side, the verdict tables, the
#    histograms' bins, needle marks and top-k line, the top-k Jaccard per layer, the first
#    divergence's difference, the sweep grids' counts, the bisect's sentence and columns;
#  - hostile text (an answer and a store path holding markup) is shown as text, never markup;
#  - a run written by `serve` links its request row (stores of run, serve and needle sweep alike);
#  - bad targets get an error naming them, and no page;
#  - screenshots (screen and print) are taken and must be non-empty PNGs.
# Chromium comes from tools/deps.sh; the test skips (77) only when it cannot be installed.
# About a minute on 2 cores (the runs and sweeps; Chromium ~3 s per page).
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=$src/models/needle-v4
py=/usr/bin/python3
[ -f "$model/model.safetensors" ] || { echo "skip: no needle model"; exit 77; }
if ! command -v chromium >/dev/null; then
  "$src/tools/deps.sh" >/dev/null 2>&1 || true
  command -v chromium >/dev/null || { echo "skip: chromium is not installed and tools/deps.sh could not install it"; exit 77; }
fi
work=$(mktemp -d /tmp/st_report.XXXXXX)
serve_pid=
trap '[ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null; rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }
field() { $py -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
# chromium PAGE OUT: the DOM after scripts ran into OUT, console lines into OUT.console
chromium_dom() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --enable-logging=stderr --v=0 --dump-dom "file://$1" >"$2" 2>"$2.log"
  grep 'CONSOLE' "$2.log" >"$2.console"
}
shot() { # PAGE PNG [extra flags]
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --hide-scrollbars --window-size=1300,2400 "${@:3}" --screenshot="$2" "file://$1" >/dev/null 2>&1
}

# ---------------------------------------------------------------- the console check can fail
printf '<!DOCTYPE html><p>x</p><script>missingFunction();</script>' >"$work/broken.html"
chromium_dom "$work/broken.html" "$work/broken.dom"
if grep -q 'missingFunction' "$work/broken.dom.console"; then ok "the console check sees an uncaught error"
else bad "the console check is blind: $(tail -3 "$work/broken.dom.log")"; fi

# ---------------------------------------------------------------- a store with hostile paths
store="$work/s<b>&\"x'"
$st needle make --model "$model" --tokens 1k --position 0.5 --seed 3 --kind path --format openai-chat \
  --thinking off --out "$work/req.json" --meta "$work/needle.json" 2>/dev/null
$st render --request "$work/req.json" --model "$model" --thinking off --ids >"$work/prompt.json"
needle=$(field "$work/needle.json" needle)
a=$(field "$work/needle.json" needle_token) b=$(field "$work/needle.json" needle_token_end)
for s in none q; do
  $st run --model "$model" --prompt-tokens "$work/prompt.json" --max-new-tokens 24 --set rotate=$s \
    --tap 'layers.*.indexer.*' --positions last --needle "$needle" --store "$store" --trace "$store/$s.h5" \
    >"$work/run-$s.txt" 2>&1 || { echo "FAIL: run rotate=$s"; cat "$work/run-$s.txt"; exit 1; }
done
$st replay --trace "$store/none.h5" --model "$model" --layer 5 --store "$store" --needle-tokens "$a:$b" \
  --sweep rotate=none,q >/dev/null 2>&1 || bad "replay sweep"
for s in none q; do
  $st needle sweep --model "$model" --tokens 1k --positions 0.25,0.75 --seeds 1 --first-seed 2 --kind path \
    --max-new-tokens 24 --set rotate=$s --store "$store" --quiet >/dev/null 2>&1 || bad "needle sweep rotate=$s"
done
hostile='</title><script id="pwned">alert(1)</script><b>x</b> & "q"'
$py - "$store/index.sqlite" "$hostile" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("UPDATE needle_attempts SET answer = ? WHERE attempt_id = (SELECT min(attempt_id) FROM needle_attempts)", (sys.argv[2],))
db.commit()
PY
$st bisect --trace "$store/none.h5" --model "$model" --good rotate=none --bad rotate=q --needle-tokens "$a:$b" \
  --json >"$work/bisect.json" 2>/dev/null

# ---------------------------------------------------------------- the page
page="$work/report.html"
if $st report --store "$store" --model "$model" "$store/none.h5" "$store/q.h5" sweep:all \
     --good rotate=none --bad rotate=q -o "$page" 2>"$work/report.err"; then ok "report wrote the page"
else bad "report: $(cat "$work/report.err")"; fi
chromium_dom "$page" "$work/dom.html"
if [ -s "$work/dom.html" ] && [ ! -s "$work/dom.html.console" ]; then ok "Chromium loads the page with no console message"
else bad "console: $(head -5 "$work/dom.html.console") $(tail -2 "$work/dom.html.log")"; fi
$py "$src/tests/report_check.py" "$work/dom.html" "$store" "$store/none.h5" "$store/q.h5" "$hostile" \
  "$work/bisect.json" || failures=$((failures + 1))

# a run by id prefix gives the same run section as by path
rid=$($py -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r").attrs["run_id"])' "$store/none.h5")
$st report --store "$store" "${rid:0:8}" -o "$work/one.html" 2>/dev/null
if grep -q "data-key=\"run id\">$rid<" "$work/one.html"; then ok "a run id prefix finds the run"
else bad "report by run id prefix"; fi

# ---------------------------------------------------------------- a run written by serve
# the store of `sparsetrace serve`: its run carries request_id, the report links the request row
"$st" serve --model "$model" --store "$work/served" --port 0 --ready-file "$work/ready" --tap 'layers.*.indexer.topk' \
  --positions last --quiet 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 300); do [ -s "$work/ready" ] && break; sleep 0.05; done
url=$(cat "$work/ready" 2>/dev/null)
curl -s -D "$work/head" -H 'content-type: application/json' -H 'authorization: Bearer sk-REPORTPLANTED-0001' \
  -d '{"model":"needle","max_tokens":6,"messages":[{"role":"user","content":"Working directory: /srv/<i>x</i>\nRepeat it."}]}' \
  "$url/v1/chat/completions" >/dev/null
kill "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null
served_run=$(sed -n 's/^X-Sparsetrace-Run: //Ip' "$work/head" | tr -d '\r')
request_id=$(sqlite3 "$work/served/index.sqlite" "SELECT request_id FROM runs WHERE run_id = '$served_run'" 2>/dev/null)
if [ -n "$served_run" ] && [ -n "$request_id" ] &&
   $st report --store "$work/served" "$served_run" -o "$work/served.html" 2>"$work/served.err"; then
  chromium_dom "$work/served.html" "$work/served.dom"
  if $py - "$work/served.dom" "$request_id" <<'PY'
import re, sys, html
dom = open(sys.argv[1]).read()
m = re.search(r'data-key="request">([^<]*)<', dom)
sys.exit(0 if m and html.unescape(m.group(1)).startswith(sys.argv[2] + ": POST /v1/chat/completions (openai.chat")
         and "REPORTPLANTED" not in dom else 1)
PY
  then ok "a served run's page links its request ($request_id, POST /v1/chat/completions) and holds no API key"
  else bad "served run: the request row is not linked: $(grep -o 'data-key="request">[^<]*' "$work/served.dom")"; fi
  [ -s "$work/served.dom.console" ] && bad "served page console: $(head -3 "$work/served.dom.console")"
else bad "a served run: run '$served_run', request '$request_id': $(cat "$work/served.err" "$work/serve.log" 2>/dev/null | tail -3)"; fi

# ---------------------------------------------------------------- bad targets
check_error() { # WHAT EXPECTED-TEXT ARGS...
  local what=$1 want=$2
  shift 2
  rm -f "$work/bad.html"
  if $st report --store "$store" "$@" -o "$work/bad.html" 2>"$work/bad.err"; then bad "$what: accepted"
  elif grep -qF -- "$want" "$work/bad.err" && [ ! -e "$work/bad.html" ] && [ ! -e "$work/bad.html.part" ]; then
    ok "$what: $(head -1 "$work/bad.err")"
  else bad "$what: $(cat "$work/bad.err")"; fi
}
check_error "an unknown run id" "'nosuchrun'" nosuchrun
check_error "an unknown sweep" "sweep:feedface" sweep:feedface
check_error "a missing trace" "missing.h5" "$work/missing.h5"
printf 'not hdf5' >"$work/junk.h5"
check_error "a file that is not a trace" "junk.h5" "$work/junk.h5"
if $st report --store "$store" "$store/none.h5" --good rotate=none -o "$work/bad.html" 2>/dev/null; [ $? -eq 2 ]; then
  ok "--good without --bad is a usage error"; else bad "--good without --bad"; fi

# ---------------------------------------------------------------- a run known by its path alone
# a trace with no run id, in no index, under a path of 800 bytes: the section is titled with the
# whole path (the title was cut at 600 bytes)
long=$work/$($py -c 'print("/".join(["p" * 200] * 4))')
mkdir -p "$long"
cp "$store/none.h5" "$long/t.h5"
$py -c 'import h5py, sys; del h5py.File(sys.argv[1], "r+").attrs["run_id"]' "$long/t.h5"
mkdir -p "$work/empty-store"
if $st report --store "$work/empty-store" "$long/t.h5" -o "$work/long.html" 2>"$work/long.err" &&
   $py - "$work/long.html" "$long/t.h5" <<'PY'
import html, re, sys
page, path = open(sys.argv[1]).read(), sys.argv[2]
titles = [html.unescape(t) for t in re.findall(r"<h2[^>]*>([^<]*)</h2>", page)]
assert "Run " + path in titles, [t[:80] + "..." + t[-40:] for t in titles]
PY
then ok "a run known by its ${#long}-byte path is titled with all of it"; else bad "long path title: $(cat "$work/long.err")"; fi

# ---------------------------------------------------------------- screenshots
shots=${ST_BUILD_DIR:-$work}/report-screenshots
mkdir -p "$shots"
shot "$page" "$shots/report.png"
shot "$page" "$shots/report-print.png" --blink-settings=mediaType=print
for p in report report-print; do
  if $py -c 'import sys; d=open(sys.argv[1],"rb").read(); sys.exit(0 if d[:8]==b"\x89PNG\r\n\x1a\n" and len(d) > 20000 else 1)' "$shots/$p.png"
  then ok "screenshot $shots/$p.png"; else bad "screenshot $p"; fi
done

echo "$failures failed"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# tools/needle_engine_batch.py, whose figures the needle model's notes cite: each `needle make
# --batch` example's prompt through `sparsetrace run`, a pass when the answer holds the value.
# Checked against the engine run directly on the same ids (each verdict and the totals), with
# and without --set; --question re-renders the request: asked in its own question it gives the
# example's ids back (and the plain run's output), asked in another the new question is in the
# prompt, '{needle}\n\n{question}' adds one copy of the line; --relabel puts a new
# label wherever the old one was; --kinds filters; --retrieval's per-layer counts are the store's
# needle_rank_by_layer over the same runs made directly, and --jobs gives the serial output; a
# setting the engine refuses stops the tool with the engine's error. With two models (needle-v5
# and needle-v4, one tokenizer), each column is that model's verdicts run directly, and the line
# of gains and losses against the first model is those verdicts' difference, in both orders.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=$src/models/needle-v5
tool=$src/tools/needle_engine_batch.py
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
[ -f "$model/model.safetensors" ] || { echo "FAIL: $model is missing"; exit 1; }

$st needle make --batch 3 --jsonl "$work/e.jsonl" --seed 31 --model "$model" --lengths 512 \
  --kinds host,number,path -q || { echo "FAIL: needle make"; exit 1; }

# the engine on each example's ids, directly: PASS or miss per line, in order, in direct.txt, and
# each run's id beside its verdict in direct-runs.txt (the runs are in the store $work/s); with
# direct_needle=1, each run judges the example's needle (--needle-tokens, its needle_span)
calls=0
direct() {
  : >"$work/direct.txt"
  : >"$work/direct-runs.txt"
  local i=0 needle=() verdict
  calls=$((calls + 1))
  while IFS= read -r line; do
    printf '%s' "$line" | python3 -c 'import json, sys; json.dump(json.load(sys.stdin)["ids"], sys.stdout)' >"$work/p.json"
    value=$(printf '%s' "$line" | python3 -c 'import json, sys; print(json.load(sys.stdin)["value"])')
    [ -n "${direct_needle:-}" ] &&
      needle=(--needle-tokens "$(printf '%s' "$line" | python3 -c 'import json, sys; print("%d:%d" % tuple(json.load(sys.stdin)["needle_span"]))')")
    if ! $st run --model "${direct_model:-$model}" --prompt-tokens "$work/p.json" --max-new-tokens 48 --store "$work/s" \
           -o "$work/d$calls-$i.h5" --json -q "${needle[@]}" "$@" >"$work/run.json"; then
      echo error >>"$work/direct.txt"
    else
      text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["text"])' "$work/run.json")
      case $text in *"$value"*) verdict=PASS ;; *) verdict=miss ;; esac
      echo $verdict >>"$work/direct.txt"
      echo "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["run_id"])' "$work/run.json") $verdict" \
        >>"$work/direct-runs.txt"
    fi
    i=$((i + 1))
  done <"$work/e.jsonl"
}
verdicts() { grep -E '^ *[0-9]+ ' "$1" | awk '{print $5}'; }
check_against_direct() {  # label, tool output, engine settings
  local label=$1 out=$2; shift 2
  direct "$@"
  if [ "$(verdicts "$out")" = "$(cat "$work/direct.txt")" ]; then
    echo "ok: $label: each verdict as the engine run directly ($(tr '\n' ' ' <"$work/direct.txt"))"
  else
    fail "$label: the tool's verdicts $(verdicts "$out" | tr '\n' ' ') against the engine's $(tr '\n' ' ' <"$work/direct.txt")"
  fi
  local want
  want="all: $(grep -c PASS "$work/direct.txt")/3"
  grep -qx "$want" "$out" && echo "ok: $label: totals $want" || fail "$label: no '$want' line: $(tail -1 "$out")"
}

python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" >"$work/plain.txt" || fail "the tool failed"
check_against_direct "as asked" "$work/plain.txt"
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --set topk=1 --set compress_rope_theta=40000 \
  >"$work/set.txt" || fail "the tool failed with --set"
check_against_direct "--set topk=1 --set compress_rope_theta=40000" "$work/set.txt" --set topk=1 --set compress_rope_theta=40000

# --retrieval: per CSA layer, the examples whose needle its indexer retrieves, among passes and
# misses, as the store's view needle_rank_by_layer (schemas/migrations/0005) judges the same runs
# made directly with --needle-tokens; as asked, and with topk=1, where fewer rows are kept
for settings in "" "--set topk=1"; do
  python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --retrieval $settings >"$work/retr.txt" ||
    fail "--retrieval $settings failed"
  direct_needle=1 direct $settings
  grep -q error "$work/direct.txt" && fail "a direct run with --needle-tokens $settings failed"
  want=$(python3 - "$work/s/index.sqlite" "$work/direct-runs.txt" <<'PY'
import sqlite3, sys
db, runs = sys.argv[1:]
ok = {run_id: verdict == "PASS" for run_id, verdict in (l.split() for l in open(runs))}  # this call's runs
rows = sqlite3.connect(db).execute("SELECT run_id, layer, retrieves FROM needle_rank_by_layer WHERE replay_id IS NULL").fetchall()
counts = {}
for run_id, layer, retrieves in (row for row in rows if row[0] in ok):
    k = counts.setdefault(layer, {True: [0, 0], False: [0, 0]})[ok[run_id]]
    k[0] += bool(retrieves); k[1] += 1
for layer in sorted(counts):
    (rp, np), (rm, nm) = counts[layer][True], counts[layer][False]
    print(f"  LAYER {layer}: retrieves in {rp}/{np} passes, {rm}/{nm} misses")
PY
)
  got=$(grep -E '^  .* layer [0-9]+: retrieves' "$work/retr.txt" | sed -E 's/^  .* layer /  LAYER /')
  if [ -n "$want" ] && [ "$got" = "$want" ]; then
    echo "ok: --retrieval $settings: per layer as the store's needle_rank_by_layer judges the direct runs ($(echo $want | tr -s ' '))"
  else
    fail "--retrieval $settings: the tool's '$got' against the view's '$want'"
  fi
done
# --jobs: the examples run at once, the same output line for line (the last loop's, topk=1)
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --retrieval --set topk=1 --jobs 3 >"$work/retr-jobs.txt" ||
  fail "--retrieval --set topk=1 --jobs 3 failed"
cmp -s "$work/retr.txt" "$work/retr-jobs.txt" && echo "ok: --jobs 3: the serial run's output, line for line" ||
  fail "--jobs 3: $(diff "$work/retr.txt" "$work/retr-jobs.txt" | head -4)"
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --jobs 0 >/dev/null 2>&1 &&
  fail "--jobs 0 was accepted" || echo "ok: --jobs 0 refused"
# after a re-render the needle is found by its text (run --needle): every CSA layer judged
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --retrieval --relabel "Zephyr Quillon" >"$work/retr-relabel.txt" 2>&1 ||
  fail "--retrieval --relabel: $(tail -2 "$work/retr-relabel.txt")"
n=$(grep -cE '^  .* layer [0-9]+: retrieves in [0-9]+/[0-9]+ passes, [0-9]+/[0-9]+ misses' "$work/retr-relabel.txt")
[ "$n" -ge 1 ] && [ "$n" = "$(grep -cE '^  .* layer [0-9]+: ' "$work/retr.txt")" ] &&
  echo "ok: --retrieval --relabel: the needle found by its text, $n layers judged" ||
  fail "--retrieval --relabel: $n layer lines: $(tail -3 "$work/retr-relabel.txt")"

# --kinds: only the examples of those kinds (the first example's kind, counted in the file)
kind=$(head -1 "$work/e.jsonl" | python3 -c 'import json, sys; print(json.load(sys.stdin)["kind"])')
want=$(python3 -c 'import json, sys; print(sum(json.loads(l)["kind"] == sys.argv[2] for l in open(sys.argv[1])))' \
         "$work/e.jsonl" "$kind")
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --kinds "$kind" >"$work/kinds.txt" || fail "--kinds failed"
n=$(grep -cE '^ *[0-9]+ ' "$work/kinds.txt")
others=$(grep -E '^ *[0-9]+ ' "$work/kinds.txt" | awk -v k="$kind" '$2 != k' | wc -l)
[ "$n" = "$want" ] && [ "$others" = 0 ] && echo "ok: --kinds $kind keeps its $want example(s)" ||
  fail "--kinds $kind: $n lines ($want in the file), $others of another kind"

# --question: the request re-rendered (sparsetrace render) with its last user text replaced; then
# --relabel in the same script
python3 - "$tool" "$work/e.jsonl" "$model" "$st" "$work" <<'PY' || failures=$((failures + 1))
import importlib.util, json, subprocess, sys, types
tool, jsonl, model, st, work = sys.argv[1:]
spec = importlib.util.spec_from_file_location("neb", tool)
neb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(neb)
args = types.SimpleNamespace(st=st, model=[model])
decode = lambda ids: subprocess.run([st, "tokenize", "--model", model, "--decode"], input=json.dumps(ids),
                                    capture_output=True, text=True).stdout
bad = 0
for line in open(jsonl, encoding="utf-8"):
    e = json.loads(line)
    own = neb.question_of(e["request"])
    same = neb.rerender(args, neb.ask(json.loads(json.dumps(e["request"])), own), e["thinking"], work)
    if same != e["ids"]:
        print(f"FAIL: example {e['index']}: its own question re-rendered to other ids")
        bad += 1
    other = "Print the line for the sentinel-zebra setting and nothing else."
    ids = neb.rerender(args, neb.ask(json.loads(json.dumps(e["request"])), other), e["thinking"], work)
    text = decode(ids)
    if ids == e["ids"] or other not in text or own in text:
        print(f"FAIL: example {e['index']}: another question is not in its re-rendered prompt")
        bad += 1
    # '{needle}\n\n{question}': the line twice in the prompt, the second copy in the last message
    twice = neb.ask(json.loads(json.dumps(e["request"])), e["needle"] + "\n\n" + own)
    text = decode(neb.rerender(args, twice, e["thinking"], work))
    if text.count(e["needle"]) != decode(e["ids"]).count(e["needle"]) + 1 or \
            e["needle"] + "\n\n" + own not in text:
        print(f"FAIL: example {e['index']}: the needle and its question are not in the re-rendered prompt")
        bad += 1
print("ok: --question: its own question gives the example's ids back; another replaces it; "
      "the needle before it, one more copy of the line" if not bad else "")
questions_bad, bad = bad, 0

# --relabel: the needle's label replaced wherever the request says it (as written and in lower
# case): relabelled to itself, the example's ids back; to another, the old label nowhere in the
# prompt and the new one where it was
for line in open(jsonl, encoding="utf-8"):
    e = json.loads(line)
    label = e["needle"].split(": ", 1)[0]
    copy = lambda: json.loads(json.dumps(e["request"]))
    if neb.rerender(args, neb.relabel(copy(), label, label), e["thinking"], work) != e["ids"]:
        print(f"FAIL: example {e['index']}: relabelled to itself, other ids"); bad += 1
    before = decode(e["ids"])
    after = decode(neb.rerender(args, neb.relabel(copy(), label, "Zephyr Quillon"), e["thinking"], work))
    n_old = before.count(label) + before.count(label.lower())
    n_new = after.count("Zephyr Quillon") + after.count("zephyr quillon")
    if label in after or label.lower() in after or n_old == 0 or n_new != n_old \
            or "Zephyr Quillon: " + e["value"] not in after:
        print(f"FAIL: example {e['index']}: {label!r} ({n_old} times) -> 'Zephyr Quillon' ({n_new} times)"); bad += 1
print("ok: --relabel: to itself the same ids; to another label, in every place of the old" if not bad else "")
sys.exit(1 if bad or questions_bad else 0)
PY
# --question '{question}' through the tool: the example's own prompt, the plain run's output line
# for line; '{needle}' with --retrieval is refused (the engine would judge one of two copies)
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --question '{question}' >"$work/own.txt" 2>&1 ||
  fail "--question '{question}': $(tail -2 "$work/own.txt")"
cmp -s "$work/plain.txt" "$work/own.txt" && echo "ok: --question '{question}': the plain run's output" ||
  fail "--question '{question}': $(diff "$work/plain.txt" "$work/own.txt" | head -4)"
if python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --retrieval --question $'{needle}\n\n{question}' \
     >"$work/twice.txt" 2>&1; then
  fail "--retrieval with the needle repeated was accepted"
elif grep -q "holds two" "$work/twice.txt"; then
  echo "ok: --retrieval with the needle repeated refused: $(tail -1 "$work/twice.txt")"
else
  fail "--retrieval with the needle repeated: $(tail -1 "$work/twice.txt")"
fi
# --relabel through the tool: each example's line names the new label
python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --relabel "Zephyr Quillon" --threads 1 >"$work/relabel.txt" 2>&1 ||
  fail "--relabel: $(tail -2 "$work/relabel.txt")"
n=$(grep -cE "^ *[0-9]+ .*'Zephyr Quillon: " "$work/relabel.txt")
[ "$n" = "$(wc -l <"$work/e.jsonl")" ] && echo "ok: --relabel through the tool: every example's line names the new label" ||
  fail "--relabel through the tool: $n example lines name the new label"

# two models: each column as that model run directly; gains and losses against the first
v4=$src/models/needle-v4
dir_of() { [ "$1" = v5 ] && echo "$model" || echo "$v4"; }
direct_model=$model direct && cp "$work/direct.txt" "$work/direct-v5.txt"
direct_model=$v4 direct && cp "$work/direct.txt" "$work/direct-v4.txt"
for order in "v5 v4" "v4 v5"; do
  set -- $order
  python3 "$tool" "$work/e.jsonl" --model "$(dir_of $1)" --model "$(dir_of $2)" --st "$st" >"$work/two.txt" ||
    fail "two models ($order) failed"
  cols=$(grep -E '^ *[0-9]+ ' "$work/two.txt" | awk '{print $5, $6}')
  want=$(paste -d' ' "$work/direct-$1.txt" "$work/direct-$2.txt")
  [ "$cols" = "$want" ] && echo "ok: two models ($order): each column as its model run directly ($(echo $want))" ||
    fail "two models ($order): columns $(echo $cols) against the engine's $(echo $want)"
  line=$(python3 - "$work/e.jsonl" "$work/direct-$1.txt" "$work/direct-$2.txt" <<'PY'
import json, sys
kinds = [json.loads(l)["kind"] for l in open(sys.argv[1])]
a, b = (open(p).read().split() for p in sys.argv[2:])
gains = [f"{i} {k}" for i, k in enumerate(kinds) if b[i] == "PASS" and a[i] != "PASS"]
losses = [f"{i} {k}" for i, k in enumerate(kinds) if a[i] == "PASS" and b[i] != "PASS"]
print(f"passes {len(gains)} it fails ({', '.join(gains) or 'none'}); fails {len(losses)} it passes ({', '.join(losses) or 'none'})")
PY
)
  grep -qF "against $(basename "$(dir_of $1)"): $line" "$work/two.txt" &&
    echo "ok: two models ($order): $line" || fail "two models ($order): want '$line', got '$(tail -1 "$work/two.txt")'"
done
cmp -s "$work/direct-v5.txt" "$work/direct-v4.txt" && fail "needle-v4 and needle-v5 agree on every example: the comparison is not exercised"

# models with other tokenizers cannot share a prompt's ids
mkdir -p "$work/othertok"
for f in "$model"/*; do ln -s "$f" "$work/othertok/"; done
rm "$work/othertok/tokenizer.json" && sed 's/"<｜end▁of▁sentence｜>"/"<｜eos｜>"/' "$model/tokenizer.json" >"$work/othertok/tokenizer.json"
if python3 "$tool" "$work/e.jsonl" --model "$model" --model "$work/othertok" --st "$st" >/dev/null 2>"$work/tok.err"; then
  fail "models with different tokenizers accepted"
else
  grep -q "tokenizer.json differ" "$work/tok.err" && echo "ok: different tokenizers refused" || fail "tokenizers: $(cat "$work/tok.err")"
fi

# a setting the engine refuses: the tool stops with the engine's message
if python3 "$tool" "$work/e.jsonl" --model "$model" --st "$st" --set topk=banana >"$work/bad.out" 2>"$work/bad.err"; then
  fail "--set topk=banana was accepted"
elif grep -q "topk" "$work/bad.err"; then
  echo "ok: --set topk=banana stops the tool: $(tail -c 160 "$work/bad.err")"
else
  fail "--set topk=banana: no word of the engine's error: $(cat "$work/bad.err")"
fi

# with --jobs, a refused run stops the tool too, without running the examples not yet started:
# 12 examples (the 3 four times), 2 at once, each run counted by a wrapper of the engine
for _ in 1 2 3 4; do cat "$work/e.jsonl"; done >"$work/e12.jsonl"
printf '#!/bin/sh\necho run >>"%s"\nexec "%s" "$@"\n' "$work/runs.log" "$st" >"$work/st-count" && chmod +x "$work/st-count"
: >"$work/runs.log"
if python3 "$tool" "$work/e12.jsonl" --model "$model" --st "$work/st-count" --set topk=banana --jobs 2 \
     >"$work/bad.out" 2>"$work/bad.err"; then
  fail "--set topk=banana --jobs 2 was accepted"
else
  n=$(wc -l <"$work/runs.log")
  grep -q "topk" "$work/bad.err" && [ "$n" -le 6 ] &&
    echo "ok: --set topk=banana --jobs 2 stops the tool after $n of 12 runs" ||
    fail "--set topk=banana --jobs 2: $n of 12 runs, '$(tail -c 160 "$work/bad.err")'"
fi

[ $failures -eq 0 ] && echo "all needle_engine_batch checks passed" || { echo "$failures failure(s)"; exit 1; }

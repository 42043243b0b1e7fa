#!/usr/bin/env bash
# tools/needle_copy_probe.py, whose per-token figures the needle model's notes cite: each example
# teacher-forced once, every token of the needle line the answer copies scored against the
# engine's argmax. Held to the engine's own greedy answers: greedy decoding and the teacher-forced
# run see the same tokens until the greedy answer first leaves the expected one, so the tool's
# first wrong token in the line must be exactly where the greedy answer first differs (and none
# when the greedy answer copies the whole line), and its argmax the token the greedy answer wrote
# there. Each wrong token's class (a skip, a repeat, ...) is what its definition gives from the
# prompt's ids. Checked for two models in one invocation, as asked and with --set (a planted fault
# that makes the copies slip); --kinds filters; the printed totals are the sums of the --json
# records; --trained counts each token among the training needles' tokens.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
py=/usr/bin/python3
[ -x $py ] || py=python3
$py -c 'import h5py, numpy' 2>/dev/null || { echo "skip: h5py/numpy missing (Debian python3-h5py python3-numpy)"; exit 77; }
tool=$src/tools/needle_copy_probe.py
v5=$src/models/needle-v5
v4=$src/models/needle-v4
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures

$st needle make --batch 4 --jsonl "$work/e.jsonl" --seed 77 --model "$v5" --lengths 512 \
  --kinds key,commit,random,path -q || { echo "FAIL: needle make"; exit 1; }

# each model's greedy answer per example, straight from the engine (generated ids)
greedy() {  # examples model out settings...
  local examples=$1 model=$2 out=$3 i=0
  shift 3
  : >"$out"
  while IFS= read -r line; do
    printf '%s' "$line" | $py -c 'import json, sys; json.dump(json.load(sys.stdin)["ids"], sys.stdout)' >"$work/p.json"
    $st run --model "$model" --prompt-tokens "$work/p.json" --max-new-tokens 64 --store "$work/s" \
      -o "$work/$(basename "$out" .txt)-$i.h5" --json -q "$@" >"$work/run.json" || { echo "FAIL: greedy run" >&2; return 1; }
    $py -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["generated"]))' "$work/run.json" >>"$out"
    i=$((i + 1))
  done <"$examples"
}

# the tool's first wrong index per (model, example) against the greedy answers' first difference
check() {  # label, examples, tool json, then pairs of model and greedy file
  local label=$1 examples=$2 records=$3
  shift 3
  $py - "$examples" "$records" "$label" "$@" <<'PY'
import json, sys
jsonl, records, label, *pairs = sys.argv[1:]
examples = [json.loads(l) for l in open(jsonl)]
recs = json.load(open(records))
bad = checked = slipped = classed = 0
for model, greedy_file in zip(pairs[::2], pairs[1::2]):
    for e, gen in zip(examples, (json.loads(l) for l in open(greedy_file))):
        mine = [r for r in recs if r["model"] == model and r["example"] == e["index"]]
        if not mine:
            print(f"FAIL: {label}: {model} example {e['index']}: no scored tokens"); bad += 1; continue
        ans = e["answer_ids"]
        d = next((k for k in range(min(len(ans), len(gen))) if ans[k] != gen[k]), min(len(ans), len(gen)))
        if d < mine[0]["answer_index"]:
            continue  # the greedy answer left before the line: nothing in it to compare
        want = next((r["index"] for r in mine if r["answer_index"] == d), None)
        got = next((r["index"] for r in mine if r["wrong"]), None)
        checked += 1
        slipped += want is not None
        if got != want:
            print(f"FAIL: {label}: {model} example {e['index']}: first wrong token {got}, the greedy answer "
                  f"first differs at {want}"); bad += 1
        first = next((r for r in mine if r["wrong"]), None)
        if first and d < len(gen) and first["predicted"] != gen[d]:
            print(f"FAIL: {label}: {model} example {e['index']}: the wrong token's argmax {first['predicted']}, "
                  f"the greedy answer wrote {gen[d]} there"); bad += 1
        # each wrong token's class, by its definition (SLIPS in the tool), from the prompt's ids
        line = e["ids"][e["needle_span"][0]:e["needle_span"][1]]
        for r in mine:
            p, i = r["predicted"], r["index"]
            want_slip = None if not r["wrong"] else (
                "skip" if i + 1 < len(line) and p == line[i + 1] else
                "repeat" if i >= 1 and p == line[i - 1] else "another token of the line" if p in line else
                "the end" if p == 1 else "elsewhere in the prompt" if p in e["ids"] else "does not hold")
            classed += want_slip is not None
            if (want_slip is None) != (r["slip"] is None) or (want_slip and want_slip not in r["slip"]):
                print(f"FAIL: {label}: {model} example {e['index']} index {i}: slip {r['slip']!r}, by its "
                      f"definition {want_slip!r}"); bad += 1
        if any(r["source"] != e["needle_span"][0] + r["index"] for r in mine):
            print(f"FAIL: {label}: {model} example {e['index']}: a source position is not the line's"); bad += 1
pairs_n = len(pairs) // 2 * len(examples)
if checked * 2 < pairs_n or not slipped or not classed:
    print(f"FAIL: {label}: {checked} of {pairs_n} answers reached the line, {slipped} left it: too few to "
          "tell"); bad += 1
if not bad:
    print(f"ok: {label}: the first wrong token is where the greedy answer leaves the line, "
          f"{checked} answers ({slipped} leave it); {classed} wrong tokens classed as defined")
sys.exit(1 if bad else 0)
PY
}

greedy "$work/e.jsonl" "$v5" "$work/g5.txt" && greedy "$work/e.jsonl" "$v4" "$work/g4.txt" || exit 1
$py "$tool" "$work/e.jsonl" --model "$v5" --model "$v4" --st "$st" --json "$work/r.json" >"$work/out.txt" ||
  fail "the tool failed"
check "as asked" "$work/e.jsonl" "$work/r.json" "$v5" "$work/g5.txt" "$v4" "$work/g4.txt" || failures=$((failures + 1))

set_args=(--set topk=1 --set compress_rope_theta=40000)
greedy "$work/e.jsonl" "$v5" "$work/f5.txt" "${set_args[@]}" || exit 1
$py "$tool" "$work/e.jsonl" --model "$v5" --st "$st" --json "$work/f.json" "${set_args[@]}" >"$work/fault.txt" ||
  fail "the tool failed with --set"
check "--set topk=1 --set compress_rope_theta=40000" "$work/e.jsonl" "$work/f.json" "$v5" "$work/f5.txt" || failures=$((failures + 1))
# the fault must change what the tool sees, or --set was not forwarded
$py - "$work/r.json" "$work/f.json" "$v5" <<'PY' || failures=$((failures + 1))
import json, sys
a, b, m = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
wa = sum(r["wrong"] for r in a if r["model"] == m)
wb = sum(r["wrong"] for r in b)
print(f"ok: --set: {wa} wrong tokens as asked, {wb} under the fault" if wb > wa else
      f"FAIL: --set: {wa} wrong tokens as asked, {wb} under the fault (not forwarded?)")
sys.exit(0 if wb > wa else 1)
PY

# a needle whose last token the prompt's tokenizer merged with the text after the line: example 1
# of this batch ("Session token: a?9_I3/7&d^Ry4b^9&W^g:S>" then a newline: one token in the prompt,
# two in the answer). Scored on the tokens the answer holds, not skipped.
$st needle make --batch 2 --jsonl "$work/m.jsonl" --seed 4 --model "$v5" --lengths 512 --kinds random \
  --split train -q || { echo "FAIL: needle make"; exit 1; }
$py - "$work/m.jsonl" "$work/merged.jsonl" <<'PY' || failures=$((failures + 1))
import json, sys
keep = [l for l in open(sys.argv[1]) if json.loads(l)["index"] == 1]
e = json.loads(keep[0]) if keep else None
needle = e["ids"][e["needle_span"][0]:e["needle_span"][1]] if e else []
a = e["answer_ids"] if e else []
merged = (e is not None and not any(a[k:k + len(needle)] == needle for k in range(len(a)))
          and any(a[k:k + len(needle) - 1] == needle[:-1] for k in range(len(a))))
open(sys.argv[2], "w").writelines(keep)
print("ok: example 1 of seed 4 ends its needle on a merged token" if merged else
      "FAIL: example 1 of seed 4 is not the merged-last-token case any more")
sys.exit(0 if merged else 1)
PY
greedy "$work/merged.jsonl" "$v5" "$work/gm.txt" || exit 1
$py "$tool" "$work/merged.jsonl" --model "$v5" --st "$st" --json "$work/m.json" >"$work/merged.txt" ||
  fail "the tool failed on the merged examples"
grep -q skipped "$work/merged.txt" && fail "merged last token: $(head -1 "$work/merged.txt")"
$py - "$work/merged.jsonl" "$work/m.json" <<'PY' || failures=$((failures + 1))
import json, sys
recs = json.load(open(sys.argv[2]))
bad = 0
for l in open(sys.argv[1]):
    e = json.loads(l)
    n = sum(r["example"] == e["index"] for r in recs)
    want = e["needle_span"][1] - e["needle_span"][0] - 1
    if n != want:
        print(f"FAIL: example {e['index']}: {n} tokens scored, the needle's {want} before its merged last"); bad += 1
print("ok: a merged last token: every other token of the line scored" if not bad else "")
sys.exit(1 if bad else 0)
PY
check "a merged last token" "$work/merged.jsonl" "$work/m.json" "$v5" "$work/gm.txt" || failures=$((failures + 1))

# the printed totals are the records' sums, per model
$py - "$work/r.json" "$work/out.txt" "$v5" "$v4" <<'PY' || failures=$((failures + 1))
import json, sys
recs, out, models = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), sys.argv[3:]
bad = 0
for m in models:
    mine = [r for r in recs if r["model"] == m]
    head = f"{m}: {sum(r['wrong'] for r in mine)}/{len(mine)} "
    if not any(line.startswith(head) for line in out.splitlines()):
        print(f"FAIL: no line starting {head!r}"); bad += 1
print("ok: each model's printed total is its records' sum" if not bad else "")
sys.exit(1 if bad else 0)
PY

# --kinds: only that kind's examples are scored
$py "$tool" "$work/e.jsonl" --model "$v5" --st "$st" --kinds commit --json "$work/k.json" >/dev/null ||
  fail "--kinds failed"
$py - "$work/k.json" "$work/e.jsonl" <<'PY' || failures=$((failures + 1))
import json, sys
recs = json.load(open(sys.argv[1]))
want = {json.loads(l)["index"] for l in open(sys.argv[2]) if json.loads(l)["kind"] == "commit"}
got = {r["example"] for r in recs}
print(f"ok: --kinds commit scores examples {sorted(got)}" if got == want and want else
      f"FAIL: --kinds commit scored {sorted(got)}, the commit examples are {sorted(want)}")
sys.exit(0 if got == want and want else 1)
PY

# --trained: each scored token's count among the training needles' tokens, recounted here from the
# file, and the table's rows are the records' sums by those counts
$st needle make --batch 30 --jsonl "$work/t.jsonl" --seed 78 --model "$v5" --lengths 512 --kinds path,key -q ||
  { echo "FAIL: needle make"; exit 1; }
$py "$tool" "$work/e.jsonl" --model "$v5" --st "$st" --trained "$work/t.jsonl" --json "$work/t.json" >"$work/t.txt" ||
  fail "--trained failed"
$py - "$work/t.jsonl" "$work/e.jsonl" "$work/t.json" "$work/t.txt" <<'PY' || failures=$((failures + 1))
import json, sys
train = [json.loads(l) for l in open(sys.argv[1])]
examples = {json.loads(l)["index"]: json.loads(l) for l in open(sys.argv[2])}
recs, out = json.load(open(sys.argv[3])), open(sys.argv[4]).read().splitlines()
bad = 0
bins = {}
for r in recs:
    tok = examples[r["example"]]["ids"][r["source"]]
    n = sum(e["ids"][e["needle_span"][0]:e["needle_span"][1]].count(tok) for e in train)
    if r["trained"] != n:
        print(f"FAIL: example {r['example']} index {r['index']}: trained {r['trained']}, recounted {n}"); bad += 1
    name = "0 (never)" if n == 0 else "1-9" if n < 10 else "10-99" if n < 100 else "100+"
    w, t = bins.get(name, (0, 0))
    bins[name] = (w + r["wrong"], t + 1)
rows = out[out.index(next(l for l in out if l.startswith("times a trained needle held it"))) + 1:]
for name, (w, t) in bins.items():
    if not any(l.startswith(name + " ") and f" {w}/{t} " in l + " " for l in rows[:len(bins)]):
        print(f"FAIL: no row {name!r} with {w}/{t}"); bad += 1
if len(bins) < 2: print(f"FAIL: --trained: the tokens fall in {sorted(bins)} only"); bad += 1
print(f"ok: --trained: every token's count recounted, rows {sorted(bins)} are the records' sums" if not bad else "")
sys.exit(1 if bad else 0)
PY

[ $failures -eq 0 ] && echo "all needle_copy_probe checks passed" || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# tools/demo.sh end to end on the bundled model (models/needle-v5, the CPU backend): the request
# is answered with the needle's line as trained and not under rotate=q, and the closing text
# ("What it shows: ...") says what the steps above it printed: the run's kept positions at the
# replayed layer, bisect's counts, both sweeps' totals, what the scoreboard says rotate=q and
# rotate=both break, and how far back the needle is. Each figure is read here from the step's own
# output line, the closing text's from the store.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
py=/usr/bin/python3

ST_BIN=$st ST_DEMO_STORE=$work/demo "$src/tools/demo.sh" >"$work/out.txt" 2>&1
rc=$?
[ $rc = 0 ] || { tail -20 "$work/out.txt"; echo "FAIL: tools/demo.sh exited $rc"; exit 1; }

$py - "$work/out.txt" <<'PY' || fail "the demo's output (above)"
import re, sys
out = open(sys.argv[1]).read()
bad = []
def check(what, got, want):
    print(("ok: " if got == want else "FAIL: ") + f"{what}: {got!r}" + ("" if got == want else f", the step printed {want!r}"))
    if got != want:
        bad.append(what)
def one(pattern, text=out):
    m = re.search(pattern, text, re.S)
    if not m:
        print(f"FAIL: no match for {pattern!r}")
        sys.exit(1)
    return m.groups()

closing = " ".join(out[out.index("What it shows:"):].split())  # one line: the text wraps
needle = one(r"\nneedle: (.*?)\n")[0]
answers = re.findall(r'\ntext "(.*?)"\n', out)
check("the answer as trained holds the needle", needle in answers[0], True)
check("the answer under rotate=q does not", needle in answers[1], False)

# how far back: the prompt's length less the needle's end (needle tokens A:B, B exclusive)
n_prompt = int(one(r"prompt: (\d+) tokens")[0])
end = int(one(r"needle tokens \d+:(\d+)")[0])
check("tokens before the question", one(r"back from ([\d,]+) tokens earlier")[0].replace(",", ""), str(n_prompt - end))

# the replayed layer's verdict in the first run
layer = one(r"== 6\. replay layer (\d+)'s indexer")[0]
kept, positions = one(rf"needle layer {layer} +retrieves yes in the top-32 at (\d+) of (\d+) answer positions")
check("kept as trained", one(rf"the indexer of layer {layer} keeps .*? at (\d+) of the answer's (\d+) positions", closing),
      (kept, positions))

# bisect's sentence: rotate=q alone ... at KQ of P answer positions vs K with rotate=none
kq, p2, k2 = one(rf"rotate=q alone loses the needle at layer {layer} \(in the top-32 at (\d+) of (\d+) answer positions vs (\d+)")
check("bisect's counts", one(rf"\(layer {layer}: (\d+) -> (\d+) of (\d+)\)", closing), (k2, kq, p2))

# the two sweeps' totals, in order: as trained, rotate=q
sweeps = re.findall(r"\nall +(?:\d+/\d+ +)+(\d+/\d+)\n", out[out.index("== 9."):out.index("== 10.")])
check("the sweeps' totals", one(r"the recall it costs \((\S+) -> (\S+)\)", closing), tuple(sweeps))

# the scoreboard's sentences against trained: "breaks none of the N it passes", "breaks X of the N
# it passes"; the closing text's "none of them", "every case", "X of the N cases"
def scoreboard(label):
    x, n = one(rf"\n +{re.escape(label)} restores \d+ of the \d+ cases trained fails and breaks (none|\d+) of the (\d+) it passes")
    return (0 if x == "none" else int(x)), int(n)
def closing_count(phrase, n):
    if phrase == "none of them":
        return 0, n
    if phrase == "every case":
        return n, n
    x, of = one(r"^(\d+) of the (\d+) cases$", phrase)
    return int(x), int(of)
got_q, got_both = one(r"rotate=q breaks (.*?) the model passes as trained, rotate=both (.*?)\. ", closing)
for label, phrase in (("rotate=q", got_q), ("rotate=both", got_both)):
    x, n = scoreboard(label)
    check(f"what {label} breaks", closing_count(phrase, n), (x, n))
sys.exit(1 if bad else 0)
PY

[ "$failures" = 0 ] && echo "test_demo: all checks passed" || echo "test_demo: $failures check(s) FAILED"
[ "$failures" = 0 ]

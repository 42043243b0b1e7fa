#!/usr/bin/env bash
# End to end: `sparsetrace scoreboard` (needle/scoreboard.c, 0011_scoreboard.sql). Server targets
# are tests/needle_fake_server.py instances on loopback whose loss rules decide each case (its log
# says per request whether it lost the needle: the oracle), a server nobody listens on, and
# `sparsetrace serve` on the bundled model; engine targets run the tiny model (fast, never right:
# distances) and the bundled one; `binary:` runs this build as "another build". Checked against
# sqlite3 counts over the tables (not the view), Python's own edit distance and comparison, and
# the fake's log. Resume: a scoreboard killed with SIGKILL mid-case is run again: no case lost,
# none done twice. Bounded: about a minute on 2 cores.
set -uo pipefail
st=${ST_BIN:?}
data=${ST_TEST_DATA:?}
src=${ST_SOURCE_DIR:-$data/../..}
py=/usr/bin/python3
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -s "$work/hung.pid" ] && kill "$(cat "$work/hung.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then ok "$1"; else fail "$1"; fi; }
expect_fail() { # expect_fail DESCRIPTION CODE PATTERN COMMAND...: exit CODE, stderr matches
  local out rc
  out=$("${@:4}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne "$2" ] || ! grep -qE -- "$3" <<<"$out"; then fail "$1: exit $rc, '$out'"; else ok "$1"; fi
}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

tiny=$work/tiny # the tiny model with the byte-level tokenizer made for it (as test_needle.sh)
mkdir -p "$tiny"
ln -s "$data/oracle/tiny/config.json" "$data/oracle/tiny/model.safetensors" "$tiny/"
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$tiny/"
needle_v4=$src/models/needle-v4

start_fake() { # start_fake NAME RULES...: sets port_NAME
  $py "$src/tests/needle_fake_server.py" --port-file "$work/$1.port" --log "$work/$1.log" "${@:2}" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [ -s "$work/$1.port" ] && break; sleep 0.05; done
  printf -v "port_$1" %s "$(cat "$work/$1.port")"
}
start_fake perfect
start_fake early --lose-before 0.4
start_fake late --lose-odd-after 0.5
dead_port=$($py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# 2 kinds x 2 lengths x 3 positions x 2 seeds x 2 formats = 48 cases (no tokenizer: sizes estimated)
cat >"$work/corpora.json" <<'EOF'
{"corpora": [
  {"name": "t", "version": 1, "kinds": ["path", "host"], "tokens": [1024, 2048], "positions": [0.2, 0.6, 0.9],
   "seeds": [1, 2], "formats": ["openai-chat", "anthropic"], "thinking": "off", "max_new_tokens": 16},
  {"name": "t-changed", "version": 1, "kinds": ["path"], "tokens": [1024], "positions": [0.2],
   "seeds": [1], "formats": ["openai-chat"]},
  {"name": "engine", "version": 1, "kinds": ["path"], "tokens": [300, 400], "positions": [0.3, 0.7],
   "seeds": [1, 2], "formats": ["openai-chat"], "max_new_tokens": 6},
  {"name": "hang", "version": 1, "kinds": ["path"], "tokens": [300], "positions": [0.3],
   "seeds": [1, 2, 3], "formats": ["openai-chat"], "max_new_tokens": 6},
  {"name": "bad", "version": 1, "kinds": ["path", "needle"], "tokens": [1024], "positions": [0.2],
   "seeds": [1], "formats": ["openai-chat"]}
]}
EOF
sed 's/"t-changed"/"t-x"/; s/"name": "t", "version": 1, "kinds": \["path", "host"\]/"name": "t", "version": 1, "kinds": ["host", "path"]/' \
  "$work/corpora.json" >"$work/changed.json"

# ---------------------------------------------------------------- servers: matrix, comparison, errors
sb=(--corpus-file "$work/corpora.json" --corpus t --store "$work/s" --quiet)
$st scoreboard "${sb[@]}" --target perfect=http://127.0.0.1:$port_perfect --target early=http://127.0.0.1:$port_early \
  >"$work/m1.txt" 2>"$work/m1.err"
check "two server targets: exit 0" test $? -eq 0
# a second run adds a column and redoes nothing: the fakes' logs do not grow
lines_before=$(cat "$work/perfect.log" "$work/early.log" | wc -l)
$st scoreboard "${sb[@]}" --target perfect=http://127.0.0.1:$port_perfect --target early=http://127.0.0.1:$port_early \
  --target late=http://127.0.0.1:$port_late --target down=http://127.0.0.1:$dead_port >"$work/m.txt" 2>"$work/m.err"
rc=$?
cat "$work/m.txt"
check "a down server: exit 1" test $rc -eq 1
check "re-running skips the cases done (no request to perfect or early)" \
  test "$(cat "$work/perfect.log" "$work/early.log" | wc -l)" -eq "$lines_before"
check "every request format went to its API" $py -c "
import json, sys
apis = {json.loads(l)['api'] for l in open('$work/late.log')}
assert apis == {'openai', 'anthropic'}, apis"
$st scoreboard "${sb[@]}" --json >"$work/m.json"
check "--json without targets reads the stored board" test -s "$work/m.json"
$st report --store "$work/s" scoreboard:t -o "$work/board.html" 2>"$work/board.err"
check "report scoreboard:t writes the page (exit 0)" test $? -eq 0
check "the page's board equals the tables, cell for cell (passed/cases~D*, per target and all)" \
  $py - "$work" <<'PY'
import sqlite3, sys
from html.parser import HTMLParser
work = sys.argv[1]
db = sqlite3.connect(f"{work}/s/index.sqlite")
version = db.execute("SELECT max(corpus_version) FROM scoreboard_cases WHERE corpus = 't'").fetchone()[0]
cells = {}  # (label, col) -> [cases, passed, wrong, errors, distances]
cases = db.execute("SELECT case_index, tokens, position FROM scoreboard_cases WHERE corpus = 't' AND corpus_version = ?",
                   (version,)).fetchall()
labels = [r[0] for r in db.execute("SELECT label FROM scoreboard_targets WHERE corpus = 't' AND corpus_version = ?",
                                   (version,))]
res = {(l, i): (p, e, d) for l, i, p, e, d in db.execute(
    """SELECT r.label, r.case_index, a.pass, a.error, r.distance FROM scoreboard_results r
       JOIN needle_attempts a ON a.attempt_id = r.attempt_id WHERE r.corpus = 't' AND r.corpus_version = ?""", (version,))}
for label in labels:
    for i, tokens, pos in cases:
        for col in (f"{tokens} @ {pos:.2f}", "all"):
            c = cells.setdefault((label, col), [0, 0, 0, 0, []])
            if (label, i) not in res:
                continue
            passed, error, dist = res[label, i]
            c[0] += 1
            if error is not None: c[3] += 1
            elif passed: c[1] += 1
            else: c[2] += 1; c[4].append(dist)
def text(c):
    if c[0] == 0: return "-"
    t = f"{c[1]}/{c[0]}"
    if c[2]: t += "~%.0f" % (sum(c[4]) / len(c[4]))
    if c[3]: t += "*"
    return t
expected = {k: text(v) for k, v in cells.items()}
class P(HTMLParser):
    def __init__(self):
        super().__init__(); self.drawn = {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "rect" and "data-label" in a and "data-col" in a:
            self.drawn[a["data-row"], a["data-col"]] = a["data-label"]
p = P(); p.feed(open(f"{work}/board.html", encoding="utf-8").read())
assert p.drawn == expected, {k: (p.drawn.get(k), expected.get(k)) for k in set(p.drawn) | set(expected) if p.drawn.get(k) != expected.get(k)}
page = open(f"{work}/board.html", encoding="utf-8").read()
lines = open(f"{work}/m.txt").read().split("against ", 1)[1].splitlines()[1:]
sentences = [l.strip() for l in lines if l.startswith("  ")]  # against the first target
assert len(sentences) == len(labels) - 1, sentences
for line in sentences:  # as the text matrix prints them
    assert line.replace("&", "&amp;") in page, line
print(len(expected), "cells")
PY
expect_fail "report of a scoreboard the store lacks" 1 "no scoreboard of corpus nope" \
  $st report --store "$work/s" scoreboard:nope -o "$work/none.html"
check "matrix, cases and comparisons against the tables, the fakes' logs and Python's own edit distance" \
  $py - "$work" <<'PY'
import json, sqlite3, sys, re
work = sys.argv[1]
db = sqlite3.connect(f"{work}/s/index.sqlite")
doc = json.load(open(f"{work}/m.json"))
text = open(f"{work}/m.txt").read()

def distance(answer, expected):  # min over start i and end j of Levenshtein(answer[i:j], expected)
    best = len(expected)
    for i in range(len(answer) + 1):
        prev = list(range(len(expected) + 1))  # row for answer[i:i]
        best = min(best, prev[-1])
        for j in range(i, len(answer)):
            cur = [0] * (len(expected) + 1)
            cur[0] = j - i + 1
            for k in range(1, len(expected) + 1):
                cur[k] = min(prev[k] + 1, cur[k - 1] + 1, prev[k - 1] + (answer[j] != expected[k - 1]))
            prev = cur
            best = min(best, prev[-1])
    return best

rows = db.execute("""SELECT t.label, c.case_index, c.tokens, c.position, a.answer, a.expected, a.error, r.distance,
                            a.pass, a.format, a.target, a.sweep_id = t.sweep_id
                     FROM scoreboard_results r JOIN scoreboard_cases c USING (corpus, corpus_version, case_index)
                     JOIN scoreboard_targets t USING (corpus, corpus_version, label)
                     JOIN needle_attempts a ON a.attempt_id = r.attempt_id""").fetchall()
labels = [t["label"] for t in doc["targets"]]
assert labels == ["perfect", "early", "late", "down"], labels
outcome = {}
for label, i, tokens, pos, answer, expected, error, dist, passed, fmt, target, same_sweep in rows:
    assert same_sweep
    if error is None:
        assert passed == (expected in answer), (label, i)
        assert dist == distance(answer, expected), (label, i, dist, distance(answer, expected), answer, expected)
        assert (dist == 0) == bool(passed)
        outcome[label, i] = "pass" if passed else "fail"
    else:
        assert dist is None and not passed and label == "down", (label, i, error)
        assert "127.0.0.1" in error, error
        outcome[label, i] = "error"
    api = "messages" if fmt == "anthropic" else "chat/completions"
    assert target.endswith("/v1/" + api), (target, fmt)
n = 48
for label in labels:
    assert sum(1 for (l, _) in outcome if l == label) == n, label
# the fakes' own verdicts: each ran its target's cases in case order, one request each, and logged
# whether it lost the needle
for label in ("early", "late"):
    log = [json.loads(line) for line in open(f"{work}/{label}.log")]
    assert len(log) == n, (label, len(log))
    for i, d in enumerate(log):
        value = db.execute("SELECT a.expected FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id) "
                           "WHERE r.label = ? AND r.case_index = ?", (label, i)).fetchone()[0]
        assert d["needle"] == value, (label, i, d, value)
        assert outcome[label, i] == ("fail" if d["lost"] else "pass"), (label, i, d)
assert all(o == "pass" for (l, _), o in outcome.items() if l == "perfect")
# early loses exactly the needles placed before 40% of the text: the 0.2 column
cases = {i: (t, p) for i, t, p in db.execute("SELECT case_index, tokens, position FROM scoreboard_cases WHERE corpus='t'")}
for (l, i), o in outcome.items():
    if l == "early":
        assert o == ("fail" if cases[i][1] == 0.2 else "pass"), (i, cases[i], o)
# matrix: per target, length and position, counted from the tables
for t in doc["targets"]:
    for c in t["cells"]:
        mine = [i for i, (tok, p) in cases.items() if tok == c["tokens"] and p == c["position"]]
        got = [outcome[t["label"], i] for i in mine]
        wrong = [distance(*db.execute("SELECT a.answer, a.expected FROM scoreboard_results r JOIN needle_attempts a "
                                      "USING (attempt_id) WHERE r.label = ? AND r.case_index = ?", (t["label"], i)).fetchone())
                 for i in mine if outcome[t["label"], i] == "fail"]
        assert c["cases"] == len(mine) == 8 and c["passed"] == got.count("pass"), (t["label"], c)
        assert c["errors"] == got.count("error") and c["wrong"] == got.count("fail") == len(wrong), c
        assert (c["mean_distance"] is None) == (not wrong)
        if wrong:
            assert abs(c["mean_distance"] - sum(wrong) / len(wrong)) < 1e-9, (c, wrong)
    # the printed row shows the same cells
    line = next(l for l in text.splitlines() if l.split() and l.split()[0] == t["label"])
    def cell(c):
        if c["cases"] == 0:
            return "-"
        s = "%d/%d" % (c["passed"], c["cases"])
        if c["wrong"]:
            s += "~%.0f" % c["mean_distance"]
        return s + ("*" if c["errors"] else "")
    assert line.split()[1:1 + len(t["cells"])] == [cell(c) for c in t["cells"]], (line, t["cells"])
# comparisons against the baseline (the first target): Python's own count per case
for cmp in doc["comparisons"]:
    assert cmp["baseline"] == "perfect"
    b, x = cmp["baseline"], cmp["target"]
    both = [i for i in range(n) if outcome[b, i] != "error" and outcome[x, i] != "error"]
    restored = [i for i in both if outcome[b, i] == "fail" and outcome[x, i] == "pass"]
    broken = [i for i in both if outcome[b, i] == "pass" and outcome[x, i] == "fail"]
    assert cmp["compared"] == len(both) and cmp["not_compared"] == n - len(both), cmp
    assert cmp["restored_cases"] == restored and cmp["broken_cases"] == broken, cmp
    assert cmp["sentence"] in text, cmp["sentence"]
early = next(c for c in doc["comparisons"] if c["target"] == "early")
assert early["broken"] == 16 and early["restored"] == 0 and early["baseline_passed"] == 48, early
assert "early restores 0 of the 0 cases perfect fails and breaks 16 of the 48 it passes" in text
down = next(t for t in doc["targets"] if t["label"] == "down")
assert down["status"] == "error" and "every case failed" in down["error"], down
assert re.search(r"^down .* error: every case failed", text, re.M), text
status = dict(db.execute("SELECT label, status FROM scoreboard_targets"))
assert status == {"perfect": "complete", "early": "complete", "late": "complete", "down": "error"}, status
PY
$st scoreboard "${sb[@]}" --json --baseline early >"$work/early.json"
check "--baseline early: late restores what early loses, counted per case in Python" $py - "$work" <<'PY'
import json, sqlite3, sys
work = sys.argv[1]
db = sqlite3.connect(f"{work}/s/index.sqlite")
out = {(l, i): p for l, i, p in db.execute("SELECT label, case_index, pass FROM scoreboard_case_results WHERE error IS NULL")}
cmp = next(c for c in json.load(open(f"{work}/early.json"))["comparisons"] if c["target"] == "late")
restored = [i for i in range(48) if out["early", i] == 0 and out["late", i] == 1]
broken = [i for i in range(48) if out["early", i] == 1 and out["late", i] == 0]
assert len(restored) == 16 and cmp["restored_cases"] == restored and cmp["broken_cases"] == broken, (cmp, restored, broken)
assert cmp["sentence"] == "late restores 16 of the 16 cases early fails and breaks %d of the 32 it passes" % len(broken), cmp
PY
expect_fail "--baseline names a stored target" 1 "has no such target" $st scoreboard "${sb[@]}" --baseline nobody
# the view's cells, for SQL users, against a count over the tables
check "view scoreboard_cells = counts over the tables" $py - "$work/s/index.sqlite" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
view = sorted(db.execute("SELECT label, tokens, position, cases, passed, errors, wrong FROM scoreboard_cells"))
mine = {}
for label, tokens, pos, passed, error in db.execute(
        "SELECT r.label, c.tokens, c.position, a.pass, a.error FROM scoreboard_results r JOIN scoreboard_cases c "
        "USING (corpus, corpus_version, case_index) JOIN needle_attempts a ON a.attempt_id = r.attempt_id"):
    k = mine.setdefault((label, tokens, pos), [0, 0, 0, 0])
    k[0] += 1; k[1] += passed; k[2] += error is not None; k[3] += error is None and not passed
assert view == sorted(k + tuple(v) for k, v in mine.items()), view
PY

# ---------------------------------------------------------------- usage and corpus errors
expect_fail "a changed corpus under the same version is refused" 1 "needs a new version" \
  $st scoreboard --corpus-file "$work/changed.json" --corpus t --store "$work/s" --target x=http://127.0.0.1:$port_perfect
sed 's/"seeds": \[1, 2\], "formats": \["openai-chat", "anthropic"\]/"seeds": [1, 2, 3], "formats": ["openai-chat", "anthropic"]/' \
  "$work/corpora.json" >"$work/grown.json"
expect_fail "a corpus grown under the same version is refused" 1 "holds 48 cases, the definition 72" \
  $st scoreboard --corpus-file "$work/grown.json" --corpus t --store "$work/s" --target x=http://127.0.0.1:$port_perfect
expect_fail "a label already naming another target is refused" 1 "already names http" \
  $st scoreboard "${sb[@]}" --target early=http://127.0.0.1:$port_late
expect_fail "two targets with one label" 1 "two targets are labelled" \
  $st scoreboard "${sb[@]}" --target a=http://127.0.0.1:1 --target a=http://127.0.0.1:2
expect_fail "a bad corpus names the field" 1 'corpus "bad": "kinds"\[1\] = "needle"' \
  $st scoreboard --corpus-file "$work/corpora.json" --corpus bad --store "$work/s2" --target http://127.0.0.1:1
expect_fail "an unknown corpus lists the known ones" 1 "no corpus \"nope\" \(there are: demo, small, standard\)" \
  $st scoreboard --corpus nope --store "$work/s2"
expect_fail "an unknown setting in a target" 2 "rotate" $st scoreboard --model "$tiny" --target engine:rotate=sideways
expect_fail "a target of no known kind" 2 "expected \[LABEL=\]engine" $st scoreboard --target ftp://x
expect_fail "engine targets need --model" 2 "need --model" $st scoreboard --target engine:rotate=q
expect_fail "a store without that scoreboard" 1 "no scoreboard of corpus" $st scoreboard --corpus demo --store "$work/s"

# ---------------------------------------------------------------- engine: resume after kill -9
eb=(--corpus-file "$work/corpora.json" --corpus engine --model "$tiny" --store "$work/e" --threads 1)
$st scoreboard "${eb[@]}" --target q=engine:rotate=q,backend=cpu-ref >"$work/e1.txt" 2>"$work/e1.err" &
sb_pid=$!
pids+=($sb_pid)
for _ in $(seq 6000); do # up to 5 min (a sanitizer build)
  n=$($py -c "import sqlite3; print(sqlite3.connect('file:$work/e/index.sqlite?mode=ro', uri=True).execute(
    'SELECT count(*) FROM scoreboard_results').fetchone()[0])" 2>/dev/null || echo 0)
  [ "$n" -ge 2 ] && break
  sleep 0.05
done
kill -9 $sb_pid 2>/dev/null
wait $sb_pid 2>/dev/null
$py -c "import sqlite3; print('\n'.join('%s %s' % r for r in sqlite3.connect('$work/e/index.sqlite').execute(
  'SELECT case_index, attempt_id FROM scoreboard_results ORDER BY case_index')))" >"$work/before.txt"
echo "killed with $(wc -l <"$work/before.txt") of 8 cases stored"
$st scoreboard "${eb[@]}" --target q=engine:rotate=q,backend=cpu-ref >"$work/e2.txt" 2>"$work/e2.err"
check "the resumed scoreboard runs to the end (exit 0)" test $? -eq 0
cat "$work/e2.txt"
check "resume: the cases stored before the kill are kept, the rest run once" $py - "$work" <<'PY'
import sqlite3, sys
work = sys.argv[1]
db = sqlite3.connect(f"{work}/e/index.sqlite")
before = dict(tuple(map(int, l.split())) for l in open(f"{work}/before.txt"))
after = dict(db.execute("SELECT case_index, attempt_id FROM scoreboard_results"))
assert 2 <= len(before) < 8 and sorted(after) == list(range(8)), (before, after)
assert all(after[i] == a for i, a in before.items()), (before, after)
sweep = db.execute("SELECT sweep_id FROM scoreboard_targets WHERE label = 'q'").fetchone()[0]
n = db.execute("SELECT count(*) FROM needle_attempts WHERE sweep_id = ?", (sweep,)).fetchone()[0]
assert n == 8, n  # no case made twice, no attempt without its result
err = open(f"{work}/e2.err").read()
assert f"{len(before)} of 8 cases already done, {8 - len(before)} run now" in err, err
# every result's engine run is a complete trace in the store
for run_id, in db.execute("SELECT a.run_id FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id)"):
    assert db.execute("SELECT count(*) FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0] == 1, run_id
PY

# ---------------------------------------------------------------- another build, a failing engine target
$st scoreboard "${eb[@]}" --quiet --target q=engine:rotate=q,backend=cpu-ref \
  --target build=binary:$st,rotate=q,backend=cpu-ref --target nobackend=engine:backend=nope \
  --target nofile=binary:$work/no-such-sparsetrace >"$work/b.txt" 2>"$work/b.err"
rc=$?
cat "$work/b.txt"
check "failing targets: exit 1" test $rc -eq 1
check "another build answers like this one, its runs in its own store; failing targets marked" $py - "$work" <<'PY'
import sqlite3, sys, os
work = sys.argv[1]
db = sqlite3.connect(f"{work}/e/index.sqlite")
ans = {}
for label, i, answer, error, run_id, fstore, frun in db.execute(
        "SELECT r.label, r.case_index, a.answer, a.error, a.run_id, r.foreign_store, r.foreign_run_id "
        "FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id)"):
    ans[label, i] = answer
    if label == "build":
        assert error is None and run_id is None and fstore == f"{work}/e/scoreboard-builds/build", (error, fstore)
        other = sqlite3.connect(f"{fstore}/index.sqlite")
        assert other.execute("SELECT count(*) FROM runs WHERE run_id = ? AND rotate = 'q'", (frun,)).fetchone()[0] == 1
for i in range(8):
    assert ans["q", i] == ans["build", i], (i, ans["q", i], ans["build", i])
st = {l: (s, e) for l, s, e in db.execute("SELECT label, status, error FROM scoreboard_targets")}
assert st["build"] == ("complete", None) and st["q"] == ("complete", None), st
assert st["nobackend"][0] == "error" and "unknown backend 'nope'" in st["nobackend"][1], st
assert st["nofile"][0] == "error" and "no-such-sparsetrace" in st["nofile"][1], st
text = open(f"{work}/b.txt").read()
assert "nobackend" in text and "error: unknown backend" in text and "nofile" in text, text
PY

# ---------------------------------------------------------------- a binary that hangs: per-case timeout
# "another build" that hangs on the case of seed 2 (it writes its pid, then sleeps as that pid)
# and on the others answers at once, as needle sweep --json does (an attempt row whose answer
# holds the expected value): that case is killed at --timeout and stored failed with the
# reason, the cases before and after it pass, the scoreboard returns
cat >"$work/hangs-once" <<EOF
#!/usr/bin/env bash
case " \$* " in *" --first-seed 2 "*) echo \$\$ >"$work/hung.pid"; exec sleep 300 ;; esac
echo '{"attempt_rows": [{"needle": "Code: 4411", "expected": "4411", "answer": "It is 4411."}]}'
EOF
chmod +x "$work/hangs-once"
t0=$(date +%s)
$st scoreboard --corpus-file "$work/corpora.json" --corpus hang --model "$tiny" --store "$work/h" --threads 1 --quiet \
  --timeout 3 --target hung=binary:$work/hangs-once >"$work/h.txt" 2>"$work/h.err"
rc=$? t1=$(date +%s)
cat "$work/h.txt"
check "a hung case: the scoreboard returns (exit 1, a case not made) within its timeout and the others" \
  test $rc -eq 1 -a $((t1 - t0)) -lt 60
check "the hung build was killed" bash -c "! kill -0 \$(cat '$work/hung.pid') 2>/dev/null"
check "the hung case is stored failed with the timeout as its reason, the others answered" $py - "$work" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"{sys.argv[1]}/h/index.sqlite")
rows = {seed: (error, answer, passed) for seed, error, answer, passed in db.execute(
    "SELECT a.seed, a.error, a.answer, a.pass FROM scoreboard_results r JOIN needle_attempts a USING (attempt_id) "
    "WHERE r.label = 'hung'")}
assert sorted(rows) == [1, 2, 3], rows
err, answer, passed = rows[2]
assert answer is None and passed == 0 and "hangs-once needle sweep gave no answer within 3 s" in err and "--timeout" in err, rows[2]
assert all(rows[s] == (None, "It is 4411.", 1) for s in (1, 3)), rows
status = db.execute("SELECT status FROM scoreboard_targets WHERE label = 'hung'").fetchone()[0]
assert status == "complete", status  # every case has its row; the failed one counts as '*'
PY

# ---------------------------------------------------------------- sparsetrace serve as a server target
$st serve --model "$needle_v4" --store "$work/v" --port 0 --ready-file "$work/serve.ready" --backend cpu \
  >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do [ -s "$work/serve.ready" ] && break; sleep 0.05; done
url=$(cat "$work/serve.ready")
cat >"$work/v.json" <<'EOF'
{"corpora": [{"name": "v", "version": 1, "kinds": ["path"], "tokens": [512], "positions": [0.6], "seeds": [2],
              "formats": ["openai-chat", "anthropic"], "thinking": "off", "max_new_tokens": 40}]}
EOF
$st scoreboard --corpus-file "$work/v.json" --corpus v --model "$needle_v4" --store "$work/v" --quiet \
  --target served=$url --target engine=engine:backend=cpu >"$work/v.txt" 2>"$work/v.err"
check "serve as a target, in serve's own store: exit 0" test $? -eq 0
cat "$work/v.txt"
check "serve's answers: passed as the engine's, each request a served row of that store" $py - "$work" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"{sys.argv[1]}/v/index.sqlite")
res = {(l, i): (p, a) for l, i, p, a in db.execute("SELECT label, case_index, pass, answer FROM scoreboard_case_results")}
assert len(res) == 4, res
for i in range(2):
    assert res["served", i][0] == res["engine", i][0] == 1, res
served = db.execute("SELECT count(*) FROM requests").fetchone()[0]
assert served >= 2, served
PY

echo "$failures failure(s)"
[ $failures -eq 0 ]

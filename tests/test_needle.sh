#!/usr/bin/env bash
# End to end: `sparsetrace needle make` (determinism, valid requests in all three formats, the
# needle once and at the requested fraction, sizes by the tokenizer) and `sparsetrace needle
# sweep` against tests/needle_fake_server.py on loopback (the pass table's counts, HTTP errors,
# the stored attempts) and against the bundled engine model with a byte-level tokenizer fixture
# (table shape, attempts, traces, needle spans and verdicts). Bounded: well under a minute.
set -uo pipefail
st=${ST_BIN:?}
data=${ST_TEST_DATA:?}
src=${ST_SOURCE_DIR:-$data/../..}
py=/usr/bin/python3
work=$(mktemp -d)
fake_pid=
cleanup() { [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
check() { if "${@:2}"; then ok "$1"; else fail "$1"; fi; }
expect_usage() { # expect_usage DESCRIPTION PATTERN COMMAND...: exit 2, stderr matches
  local out rc
  out=$("${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ] || ! grep -qE -- "$2" <<<"$out"; then fail "$1: exit $rc, '$out'"; else ok "$1"; fi
}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

# A model directory the engine and the tokenizer both read: the bundled tiny model (vocab 264)
# and the byte-level tokenizer fixture made for it (tests/data/needle/make_tiny_tokenizer.py).
model=$work/tiny
mkdir -p "$model"
ln -s "$data/oracle/tiny/config.json" "$data/oracle/tiny/model.safetensors" "$model/"
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$model/"

# ---------------------------------------------------------------- needle make
$st needle make --tokens 8k --position 0.4 --seed 7 --out "$work/a.json" --meta "$work/a.meta" 2>"$work/a.err"
check "make writes a request" test -s "$work/a.json"
check "make says sizes are estimates without a tokenizer" grep -q "estimates at 3.25 bytes per token" "$work/a.err"
$st needle make --tokens 8k --position 0.4 --seed 7 --quiet >"$work/b.json"
check "same seed, same bytes" cmp -s "$work/a.json" "$work/b.json"
$st needle make --tokens 8k --position 0.4 --seed 8 --quiet >"$work/c.json"
check "another seed, other bytes" bash -c "! cmp -s '$work/a.json' '$work/c.json'"

for fmt in anthropic openai-chat openai-responses; do
  for kind in path host key number; do
    $st needle make --tokens 6k --position 0.6 --seed 3 --kind $kind --format $fmt --quiet \
      --out "$work/$fmt-$kind.json" --meta "$work/$fmt-$kind.meta" || fail "make $fmt $kind"
  done
  check "$fmt: valid JSON of the API's shape, the needle once, at 0.6" $py - "$work" "$fmt" <<'PY'
import json, sys
work, fmt = sys.argv[1], sys.argv[2]
for kind in ("path", "host", "key", "number"):
    raw = open(f"{work}/{fmt}-{kind}.json").read()
    req, meta = json.loads(raw), json.load(open(f"{work}/{fmt}-{kind}.meta"))
    assert req["temperature"] == 0 and req["stream"] is False, (fmt, kind)
    if fmt == "anthropic":
        assert req["system"][0]["type"] == "text" and req["max_tokens"] > 0
        assert all("input_schema" in t and t["input_schema"]["type"] == "object" for t in req["tools"])
        assert req["messages"][0]["role"] == "user" and req["messages"][-1]["role"] == "user"
        roles = [m["role"] for m in req["messages"]]
        assert all(a != b for a, b in zip(roles, roles[1:])), roles  # alternating turns
        assert any(b["type"] == "tool_use" for m in req["messages"] for b in m["content"])
        last = req["messages"][-1]["content"][-1]["text"]
    elif fmt == "openai-chat":
        assert req["messages"][0]["role"] == "system" and req["max_tokens"] > 0
        assert all(t["type"] == "function" and "parameters" in t["function"] for t in req["tools"])
        assert any(m["role"] == "tool" for m in req["messages"])
        calls = [c for m in req["messages"] for c in m.get("tool_calls", [])]
        assert calls and all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)
        last = req["messages"][-1]["content"]
    else:
        assert isinstance(req["instructions"], str) and req["max_output_tokens"] > 0
        assert all(t["type"] == "function" and "parameters" in t for t in req["tools"])
        kinds = {i["type"] for i in req["input"]}
        assert {"message", "function_call", "function_call_output"} <= kinds, kinds
        last = req["input"][-1]["content"][0]["text"]
    assert len(req["tools"]) >= 4, len(req["tools"])
    assert meta["label"] + ":" in last, last  # the question names the line it wants
    line, value = meta["needle"], meta["expected"]
    assert line == meta["label"] + ": " + value and meta["kind"] == kind
    assert raw.count(value) == 1 and raw.count(meta["label"] + ": ") == 1, (kind, raw.count(value))
    assert abs(meta["position"] - 0.6) < 0.03, meta["position"]
    assert abs(meta["tokens"] - 6144) <= 0.02 * 6144, meta["tokens"]
PY
done

# the needle's offset, found independently: render the request and look for the line
for p in 0.1 0.5 0.9; do
  $st needle make --tokens 8k --position $p --seed 5 --format openai-chat --quiet --out "$work/p.json" --meta "$work/p.meta"
  $st render --request "$work/p.json" >"$work/p.txt"
  check "needle at byte fraction ~$p of the rendered prompt" $py - "$work" $p <<'PY'
import json, sys
work, p = sys.argv[1], float(sys.argv[2])
text = open(f"{work}/p.txt", "rb").read()
meta = json.load(open(f"{work}/p.meta"))
at = text.find(meta["needle"].encode())
assert at == meta["needle_byte"] and len(text) == meta["prompt_bytes"], (at, meta["needle_byte"])
assert abs(at / len(text) - p) < 0.03, at / len(text)
PY
done

# sizes by the tokenizer: the count agrees with `render --json` (an independent tokenisation)
$st needle make --tokens 3k --position 0.7 --seed 2 --model "$model" --format anthropic --out "$work/t.json" \
  --meta "$work/t.meta" 2>"$work/t.err"
$st render --request "$work/t.json" --model "$model" --json >"$work/t.render"
check "tokenizer-sized: within 2%, needle token at ~0.7, counted as render counts" $py - "$work" <<'PY'
import json, sys
work = sys.argv[1]
meta, r = json.load(open(f"{work}/t.meta")), json.load(open(f"{work}/t.render"))
assert meta["tokens_measure"] == "tokenizer" and meta["tokens"] == r["n_tokens"], (meta["tokens"], r["n_tokens"])
assert abs(meta["tokens"] - 3072) <= 0.02 * 3072, meta["tokens"]
assert abs(meta["needle_token"] / meta["tokens"] - 0.7) < 0.03, meta["needle_token"]
ids = r["ids"]
span = bytes(i for i in ids[meta["needle_token"]:meta["needle_token_end"]] if i < 256)
assert meta["needle"].encode() in span, span  # byte-level vocabulary: ids are the bytes
PY
check "no estimate notice with a tokenizer" bash -c "! grep -q estimates '$work/t.err'"

# decoys: N more lines of the needle's label before it, the last one asked for; checked on the
# rendered prompt (render: an independent pass over the request), every format and both shapes
for fmt in anthropic openai-chat openai-responses; do
  for shape in agent toollist; do
    for kind in path url random; do
      $st needle make --tokens 3k --position 0.75 --seed 4 --kind $kind --format $fmt --shape $shape --decoys 12 \
        --model "$model" --quiet --out "$work/d-$fmt-$shape-$kind.json" --meta "$work/d-$fmt-$shape-$kind.meta" ||
        fail "make --decoys 12 $fmt $shape $kind"
      $st render --request "$work/d-$fmt-$shape-$kind.json" >"$work/d-$fmt-$shape-$kind.txt"
    done
  done
done
check "decoys: 12 earlier lines of the label, values distinct, the needle last and once, at 0.75, 3k" $py - "$work" <<'PY'
import glob, json, re, sys
work = sys.argv[1]
n = 0
for path in sorted(glob.glob(f"{work}/d-*.meta")):
    meta, text = json.load(open(path)), open(path[:-5] + ".txt", "rb").read()  # byte offsets, as meta's
    head = (meta["label"] + ": ").encode()
    # where a line starts with the label (the question quotes it: '"Label: ...'), up to the line's
    # end: a newline, an escaped one (a tool description's JSON), a tag or a special token
    at = [m.start() for m in re.finditer(re.escape(head), text) if text[m.start() - 1:m.start()] != b'"']
    values = [re.split(rb'\\n|["\n]|</|<\xef\xbd\x9c', text[a + len(head):])[0].decode() for a in at]
    lines = list(zip(at, values))
    assert meta["decoys"] == 12 and len(lines) == 13, (path, meta["decoys"], len(lines))
    assert text.count(meta["needle"].encode()) == 1 and lines[-1] == (meta["needle_byte"], meta["expected"]), (path, lines[-1])
    assert len({v for _, v in lines}) == 13, (path, values)
    assert lines[0][0] < meta["needle_byte"] / 2, (path, "decoys bunched near the needle", lines[0][0])
    assert abs(meta["position"] - 0.75) < 0.03 and abs(meta["tokens"] - 3072) <= 0.02 * 3072, (path, meta["position"], meta["tokens"])
    assert re.search("last|most recent|latest|final", meta["question"]) and meta["label"] in meta["question"], meta["question"]
    n += 1
assert n == 18, n
PY
$st needle make --tokens 3k --position 0.75 --seed 4 --decoys 12 --model "$model" --quiet >"$work/d2.json"
check "decoys: same arguments, same bytes" cmp -s "$work/d2.json" "$work/d-anthropic-agent-path.json"
$st needle make --tokens 3k --position 0.02 --seed 4 --decoys 12 --model "$model" --quiet --meta "$work/d3.meta" >/dev/null
check "decoys: a needle near the start gets only the boundaries before it" $py -c "
import json, sys; m = json.load(open('$work/d3.meta')); sys.exit(0 if 0 <= m['decoys'] < 12 else 1)"
expect_usage "make refuses more than 64 decoys" "--decoys" $st needle make --tokens 2k --position 0.5 --seed 1 --decoys 65

expect_usage "make needs --tokens, --position, --seed" "required" $st needle make --tokens 2k
expect_usage "make refuses a position outside [0, 1]" "fraction" $st needle make --tokens 2k --position 1.5 --seed 1
expect_usage "make refuses an unknown kind" "path, host, key, number, ticket, branch, url, email, commit, env, random, assorted, vocab" $st needle make --tokens 2k --position 0.5 --seed 1 --kind color
expect_usage "sweep needs a target" "either --model" $st needle sweep --tokens 2k
check "needle --help" bash -c "$st needle make --help | grep -q -- --position && $st needle sweep --help | grep -q -- --endpoint"

# ---------------------------------------------------------------- sweep against a fake server
# Rules: needles before 40% of bodies over 8000 bytes are lost (the 0.25 column of 4k); needles
# after 80% whose value has an odd byte sum are lost (0.97, depends on the seed); bodies over
# 40000 bytes get 400 (the 16k row). A key is required.
$py "$src/tests/needle_fake_server.py" --port-file "$work/port" --lose-before 0.4 --lose-above-bytes 8000 \
  --lose-odd-after 0.8 --max-body 40000 --require-key sekrit --log "$work/fake.log" >/dev/null 2>&1 &
fake_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
port=$(cat "$work/port")
odd=$($py -c "
import json, subprocess, sys
n = 0
for s in (1, 2, 3):
    subprocess.run(['$st', 'needle', 'make', '--tokens', '1k', '--position', '0.5', '--seed', str(s), '--quiet',
                    '--meta', '$work/s.meta'], stdout=subprocess.DEVNULL, check=True)
    n += sum(json.load(open('$work/s.meta'))['expected'].encode()) % 2
print(n)")
ST_API_KEY=sekrit $st needle sweep --endpoint "http://127.0.0.1:$port" --api openai --tokens 1k,4k,16k \
  --positions 0.25,0.55,0.97 --seeds 3 --set rotate=q --set server=fake --store "$work/srv" \
  >"$work/table.txt" 2>"$work/sweep.err"
rc=$?
cat "$work/table.txt"
check "sweep exits 1 when some attempts could not be made" test $rc -eq 1
late=$((3 - odd))
check "table row 1k: 3/3 3/3 $late/3" grep -qE "^1k \(1[0-9]{3}\) +3/3 +3/3 +$late/3 +$((6 + late))/9 *$" "$work/table.txt"
check "table row 4k: 0/3 3/3 $late/3" grep -qE "^4k \(4[0-9]{3}\) +0/3 +3/3 +$late/3 +$((3 + late))/9 *$" "$work/table.txt"
check "table row 16k: errors marked" grep -qE "^16k \([0-9]+\) +0/3\* +0/3\* +0/3\* +0/9\*" "$work/table.txt"
check "table footer: columns" grep -qE "^all +3/9\* +6/9\* +$((2 * late))/9\* +$((9 + 2 * late))/27\*" "$work/table.txt"
check "stderr names the first error" grep -q "maximum context length" "$work/sweep.err"
check "attempts stored" $py - "$work/srv/index.sqlite" "$port" "$late" <<'PY'
import sqlite3, sys, json
db = sqlite3.connect(sys.argv[1])
port, late = sys.argv[2], int(sys.argv[3])
rows = db.execute("SELECT api, target, format, tokens_requested, tokens_actual, tokens_measure, tokens_reported,"
                  " position, seed, kind, needle, expected, answer, pass, run_id, settings, error"
                  " FROM needle_attempts ORDER BY attempt_id").fetchall()
assert len(rows) == 27, len(rows)
assert len({r[0] for r in rows}) == 1 and rows[0][0] == "openai" and rows[0][2] == "openai-chat"
assert rows[0][1] == f"http://127.0.0.1:{port}/v1/chat/completions", rows[0][1]
assert all(json.loads(r[15]) == {"rotate": "q", "server": "fake"} for r in rows)
for r in rows:
    (api, target, fmt, treq, tact, meas, trep, pos, seed, kind, needle, expected, answer, ok, run_id, _, err) = r
    assert run_id is None and kind == "path" and meas == "estimate" and needle.endswith(expected)
    if treq == 16384:
        assert err and "HTTP 400" in err and answer is None and ok == 0 and trep is None, r
    else:
        assert err is None and trep and trep > 0, r
        assert ok == (expected in answer), r
cells = {(t, p): (a, b, e) for t, p, a, b, e in db.execute(
    "SELECT tokens_requested, position, passed, attempts, errors FROM needle_sweep_cells")}
assert cells[(1024, 0.25)] == (3, 3, 0) and cells[(4096, 0.25)] == (0, 3, 0), cells
assert cells[(4096, 0.97)] == (late, 3, 0) and cells[(16384, 0.55)] == (0, 3, 3), cells
PY

# the other two APIs, and the key check
ST_API_KEY=sekrit $st needle sweep --endpoint "http://127.0.0.1:$port/v1" --api anthropic --tokens 2k \
  --positions 0.5 --seeds 2 --kind key --store "$work/srv2" --quiet --json >"$work/anth.json"
check "anthropic API: answers parsed, both pass" $py -c "
import json; d = json.load(open('$work/anth.json'))
assert d['passed'] == 2 and d['errors'] == 0 and d['cells'] == [{'tokens': 2048, 'position': 0.5, 'passed': 2, 'attempts': 2, 'errors': 0}], d
assert all(r['answer'].startswith('Deploy API key: sk-live-') and r['tokens_reported'] > 0 for r in d['attempt_rows'])"
ST_API_KEY=sekrit $st needle sweep --endpoint "http://127.0.0.1:$port/v1/responses" --api responses --tokens 2k \
  --positions 0.5 --seeds 1 --kind number --store "$work/srv2" --quiet --json >"$work/resp.json"
check "responses API: answer parsed and passes" $py -c "
import json; d = json.load(open('$work/resp.json')); assert d['passed'] == 1, d"
ST_API_KEY=wrong $st needle sweep --endpoint "http://127.0.0.1:$port" --tokens 1k --positions 0.5 --seeds 1 \
  --store "$work/srv2" --quiet >/dev/null 2>"$work/key.err"
rc=$?
check "a refused key is an attempt error (exit 1, HTTP 401)" bash -c "[ $rc -eq 1 ] && grep -q 'HTTP 401' '$work/key.err'"

# ---------------------------------------------------------------- sweep against the engine
# The forward pass dominates: ~1 s per 2k-token attempt normally, ~25 s per 1k under ASan, so the
# sanitizer build runs one cell.
if $st --version | grep -q asan; then grid=(--tokens 1k --positions 0.5); n_cells=1
else grid=(--tokens 1k,2k --positions 0.25,0.8); n_cells=4; fi
start=$(date +%s)
$st needle sweep --model "$model" "${grid[@]}" --seeds 1 --max-new-tokens 8 --threads 1 --store "$work/eng" \
  >"$work/eng.txt" 2>"$work/eng.err"
rc=$?
cat "$work/eng.txt"
echo "engine sweep: $(( $(date +%s) - start )) s, exit $rc"
check "engine sweep runs every attempt" test $rc -eq 0
if [ $n_cells -eq 4 ]; then
  check "engine table: 1k row" grep -qE "^1k \(1[0-9]{3}\) +[01]/1 +[01]/1 +[0-2]/2 *$" "$work/eng.txt"
  check "engine table: 2k row" grep -qE "^2k \(20[0-9]{2}\) +[01]/1 +[01]/1 +[0-2]/2 *$" "$work/eng.txt"
  check "engine table: columns" grep -qE "^all +[0-2]/2 +[0-2]/2 +[0-4]/4 *$" "$work/eng.txt"
else
  check "engine table: one cell" grep -qE "^1k \(1[0-9]{3}\) +[01]/1 +[01]/1 *$" "$work/eng.txt"
fi
check "engine sweep: attempts, traces, needle spans and verdicts" $py - "$work" $n_cells <<'PY'
import sqlite3, sys, os
work, n_cells = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(f"{work}/eng/index.sqlite")
rows = db.execute("SELECT a.run_id, a.needle_start, a.needle_end, a.tokens_actual, a.tokens_measure, a.position_actual,"
                  " a.needle, a.answer, a.render, r.n_prompt, r.trace_path, r.tap_positions, a.api, a.error, a.pass,"
                  " a.expected, a.tokens_requested"
                  " FROM needle_attempts a JOIN runs r USING (run_id) ORDER BY attempt_id").fetchall()
assert len(rows) == n_cells == db.execute("SELECT count(*) FROM needle_attempts").fetchone()[0], rows
for (run_id, s, e, tact, meas, pact, needle, answer, render, n_prompt, trace, positions, api, err, ok, expected,
     treq) in rows:
    assert api == "engine" and err is None and ok == (expected in answer)  # random weights: 0 expected
    assert meas == "tokenizer" and tact == n_prompt and render == "reference" and positions == "last"
    assert 0 <= s < e <= n_prompt
    assert os.path.exists(os.path.join(work, "eng", trace)), trace
    n = db.execute("SELECT token_start, token_end, text FROM needles WHERE run_id = ?", (run_id,)).fetchall()
    assert n == [(s, e, needle)], (n, s, e)
    v = db.execute("SELECT count(*), count(DISTINCT layer) FROM needle_verdicts WHERE run_id = ?", (run_id,)).fetchone()
    assert v[0] > 0 and v[1] == 2, v  # the two CSA layers of the tiny model
    if treq == 2048:
        assert abs(tact - 2048) <= 0.02 * 2048, tact
    try:
        import h5py
    except ImportError:
        continue
    with h5py.File(os.path.join(work, "eng", trace), "r") as f:
        toks = f["tokens"][:]
        assert int(f["tokens"].attrs["n_prompt"]) == n_prompt and len(toks) > n_prompt
        assert needle.encode() in bytes(int(t) for t in toks[s:e] if t < 256)  # byte-level ids
        assert "taps/layers.1.indexer.scores" in f
if n_cells == 4:
    # a 2k prompt of byte tokens is only 2 kB: one sentence is ~5% of it, the slot granularity
    assert abs(rows[2][5] - 0.25) < 0.05 and abs(rows[3][5] - 0.8) < 0.05, [r[5] for r in rows]
PY
expect_usage "engine sweep refuses unknown settings" "rotate" $st needle sweep --model "$model" --set rotate=sideways

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all needle checks passed"

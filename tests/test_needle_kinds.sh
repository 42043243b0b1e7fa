#!/usr/bin/env bash
# `needle sweep` with every needle kind `needle make` writes and with the toollist shape: each
# attempt is stored with its kind and shape (schema 0011 allowed four kinds, so an attempt of any
# other could not be stored and the sweep stopped; 0013 allowed eleven, and the sweep refused
# assorted and vocab). And a store at schema 11, holding attempts, a scoreboard and its results,
# migrated by a sweep to 0014: every row kept, every reference intact, the old attempts
# agent-shaped, without decoys (0013 adds the column) and without a vocab length (0014), the views
# answering as before. And a sweep with decoys stores them with each attempt, one of the vocab
# kind with --vocab-tokens its values' length; a server sweep of the vocab kind without a
# tokenizer is refused. Bounded: a few seconds.
set -uo pipefail
st=${ST_BIN:?}
data=${ST_TEST_DATA:?}
src=${ST_SOURCE_DIR:-$data/../..}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

# the bundled tiny model (random weights: nothing is recalled, every attempt is stored) with the
# byte-level tokenizer fixture made for it
model=$work/tiny
mkdir -p "$model"
ln -s "$data/oracle/tiny/config.json" "$data/oracle/tiny/model.safetensors" "$model/"
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$model/"

# ---------------------------------------------------------------- every kind, both shapes
kinds=(path host key number ticket branch url email commit env random assorted vocab)
for kind in "${kinds[@]}"; do
  for shape in agent toollist; do
    if $st needle sweep --model "$model" --tokens 512 --positions 0.5 --seeds 1 --max-new-tokens 2 \
         --kind "$kind" --shape "$shape" --store "$work/kinds" --quiet >"$work/out.txt" 2>&1; then
      ok "sweep --kind $kind --shape $shape"
    else
      fail "sweep --kind $kind --shape $shape: $(tail -2 "$work/out.txt")"
    fi
  done
done
# vocab's values of 20-24 tokens: the length asked for stored with each attempt, named in the header;
# the option is the vocab kind's alone; a server sweep of vocab needs the served model's tokenizer
if $st needle sweep --model "$model" --tokens 1k --positions 0.5 --seeds 2 --max-new-tokens 2 --kind vocab \
     --vocab-tokens 20-24 --store "$work/voc" >"$work/voc.txt" 2>&1; then
  ok "sweep --kind vocab --vocab-tokens 20-24"
else
  fail "sweep --kind vocab --vocab-tokens 20-24: $(tail -2 "$work/voc.txt")"
fi
grep -q "kind vocab, values of 20-24 tokens" "$work/voc.txt" && ok "the table's header names the values' length" \
  || fail "header: $(head -1 "$work/voc.txt")"
out=$($st needle sweep --model "$model" --tokens 512 --seeds 1 --kind path --vocab-tokens 8 --store "$work/vp" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "give --kind vocab" <<< "$out" && [ ! -e "$work/vp/index.sqlite" ] \
  && ok "--vocab-tokens with --kind path: refused, no store" || fail "--vocab-tokens with --kind path: rc $rc, '$out'"
out=$($st needle sweep --endpoint http://127.0.0.1:9 --tokens 512 --seeds 1 --kind vocab --store "$work/vs" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "give --tokenizer DIR" <<< "$out" && [ ! -e "$work/vs/index.sqlite" ] \
  && ok "a server sweep of kind vocab without --tokenizer: refused, no store" || fail "server vocab sweep: rc $rc, '$out'"
grep -q "kind vocab, shape toollist" "$work/out.txt" && ok "the table's header names a toollist sweep's shape" \
  || fail "header: $(head -1 "$work/out.txt")"
# decoys: asked for in every request of the sweep, stored with each attempt, named in the header
if $st needle sweep --model "$model" --tokens 1k --positions 0.8 --seeds 2 --max-new-tokens 2 --kind url --decoys 6 \
     --store "$work/dec" >"$work/dec.txt" 2>&1; then
  ok "sweep --decoys 6"
else
  fail "sweep --decoys 6: $(tail -2 "$work/dec.txt")"
fi
grep -q "kind url, 6 decoys" "$work/dec.txt" && ok "the table's header names the decoys" || fail "header: $(head -1 "$work/dec.txt")"
$py - "$work/dec/index.sqlite" "$work/kinds/index.sqlite" <<'PY' && ok "decoys stored with each attempt (none in the other sweeps)" \
  || fail "stored decoys"
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("SELECT kind, decoys, error FROM needle_attempts").fetchall()
assert rows == [("url", 6, None)] * 2, rows
others = sqlite3.connect(sys.argv[2]).execute("SELECT DISTINCT decoys FROM needle_attempts").fetchall()
assert others == [(0,)], others
PY
$py - "$work/voc/index.sqlite" "$work/kinds/index.sqlite" <<'PY' && ok "the vocab length stored with each attempt (none in the other sweeps)" \
  || fail "stored vocab lengths"
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "SELECT kind, vocab_tokens_min, vocab_tokens_max, error, length(expected) > 0 FROM needle_attempts").fetchall()
assert rows == [("vocab", 20, 24, None, 1)] * 2, rows
others = sqlite3.connect(sys.argv[2]).execute("SELECT DISTINCT vocab_tokens_min, vocab_tokens_max FROM needle_attempts").fetchall()
assert others == [(None, None)], others
PY
$py - "$work/kinds/index.sqlite" "${kinds[*]}" <<'PY' && ok "every attempt stored with its kind and shape" || fail "stored kinds and shapes"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
kinds = sys.argv[2].split()
got = db.execute("SELECT kind, shape, count(*), sum(error IS NOT NULL) FROM needle_attempts GROUP BY 1, 2").fetchall()
want = sorted((k, s, 1, 0) for k in kinds for s in ("agent", "toollist"))
assert sorted(got) == want, (got, want)
cells = db.execute("SELECT kind, shape, attempts FROM needle_sweep_cells").fetchall()
assert sorted(cells) == sorted((k, s, 1) for k in kinds for s in ("agent", "toollist")), cells
assert db.execute("PRAGMA user_version").fetchone()[0] == 14
PY
$st needle make --tokens 1k --position 0.3 --seed 4 --kind email --shape toollist --model "$model" \
  --out "$work/tl.json" --meta "$work/tl.meta" --quiet
$py - "$work/tl.json" "$work/tl.meta" <<'PY' && ok "make --shape toollist: one system string, one question, the needle in the system" \
  || fail "make --shape toollist"
import json, sys
req, meta = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert meta["shape"] == "toollist" and meta["kind"] == "email", meta
assert "tools" not in req, list(req)
system = req["system"] if isinstance(req["system"], str) else "".join(b["text"] for b in req["system"])
assert meta["needle"] in system, meta["needle"]
assert [m["role"] for m in req["messages"]] == ["user"], [m["role"] for m in req["messages"]]
PY

# ---------------------------------------------------------------- a schema-11 store, migrated
# Built from the committed migrations 0001-0011 as an older build left it, with a sweep's
# attempts and a scoreboard whose results reference them.
$py - "$src/schemas/migrations" "$work/old" <<'PY' || fail "building the schema-11 store"
import glob, os, sqlite3, sys
mig, store = sys.argv[1], sys.argv[2]
os.makedirs(store)
db = sqlite3.connect(os.path.join(store, "index.sqlite"))
db.execute("PRAGMA foreign_keys = ON")
for path in sorted(glob.glob(os.path.join(mig, "00*.sql"))):
    if int(os.path.basename(path)[:4]) <= 11:
        db.executescript(open(path).read())
app = 0x53545243  # recorder/index.h ST_INDEX_APPLICATION_ID ("STRC")
db.executescript(f"PRAGMA user_version = 11; PRAGMA application_id = {app};")
row = ("s1", "2026-01-01T00:00:00Z", "m", "engine", "openai-chat", "reference", 0, 1024, 1020, "tokenizer", None,
       0.5, 0.5, 1, "host", "Host: db-7.internal", "db-7.internal", "Host: db-7.internal", 1, None, 10, 20, 64, "{}",
       None, 0.5)
for seed in (1, 2):
    db.execute("INSERT INTO needle_attempts (sweep_id, created_at, target, api, format, render, thinking, tokens_requested, "
               "tokens_actual, tokens_measure, tokens_reported, position, position_actual, seed, kind, needle, expected, "
               "answer, pass, run_id, needle_start, needle_end, max_new_tokens, settings, error, duration_s) "
               "VALUES (" + ",".join("?" * 26) + ")", row[:13] + (seed,) + row[14:])
db.execute("INSERT INTO scoreboard_cases VALUES ('c', 1, 0, 'host', 1024, 0.5, 1, 'openai-chat')")
cols = [r[1] for r in db.execute("PRAGMA table_info(scoreboard_targets)")]
vals = dict(corpus="c", corpus_version=1, label="t", spec="engine:", target_kind="engine", target="m", settings="{}",
            sweep_id="s1", status="complete", error=None, created_at="2026-01-01T00:00:00Z",
            updated_at="2026-01-01T00:00:00Z")
db.execute(f"INSERT INTO scoreboard_targets ({','.join(c for c in cols if c in vals)}) VALUES "
           f"({','.join('?' for c in cols if c in vals)})", [vals[c] for c in cols if c in vals])
cols = [r[1] for r in db.execute("PRAGMA table_info(scoreboard_results)")]
vals = dict(corpus="c", corpus_version=1, label="t", case_index=0, attempt_id=2, distance=0, foreign_run_id=None)
db.execute(f"INSERT INTO scoreboard_results ({','.join(c for c in cols if c in vals)}) VALUES "
           f"({','.join('?' for c in cols if c in vals)})", [vals[c] for c in cols if c in vals])
db.commit()
assert db.execute("SELECT count(*) FROM scoreboard_case_results").fetchone()[0] == 1
PY
if $st needle sweep --model "$model" --tokens 512 --positions 0.5 --seeds 1 --max-new-tokens 2 --kind commit \
     --store "$work/old" --quiet >"$work/old.txt" 2>&1; then
  ok "a sweep into a schema-11 store"
else
  fail "a sweep into a schema-11 store: $(tail -2 "$work/old.txt")"
fi
$py - "$work/old/index.sqlite" <<'PY' && ok "migrated to 14: rows kept, references intact, old attempts agent-shaped, no decoys, no vocab length" \
  || fail "the migrated store"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
assert db.execute("PRAGMA user_version").fetchone()[0] == 14
rows = db.execute("SELECT attempt_id, seed, kind, shape, expected, pass, decoys, vocab_tokens_min, vocab_tokens_max "
                  "FROM needle_attempts ORDER BY attempt_id").fetchall()
assert rows[:2] == [(1, 1, "host", "agent", "db-7.internal", 1, 0, None, None),
                    (2, 2, "host", "agent", "db-7.internal", 1, 0, None, None)], rows
assert len(rows) == 3 and rows[2][2:4] == ("commit", "agent") and rows[2][6:] == (0, None, None), rows
assert db.execute("PRAGMA foreign_key_check").fetchall() == []
assert db.execute("SELECT label, case_index, kind, pass, attempt_id FROM scoreboard_case_results").fetchall() == \
    [("t", 0, "host", 1, 2)]
assert db.execute("SELECT cases, passed FROM scoreboard_cells").fetchall() == [(1, 1)]
assert db.execute("SELECT passed, attempts FROM needle_sweep_cells WHERE sweep_id = 's1'").fetchall() == [(2, 2)]
names = {r[0] for r in db.execute("SELECT name FROM sqlite_schema")}
assert {"needle_attempts_by_sweep", "needle_attempts_by_run"} <= names and not any(n.endswith(("_0012", "_0014")) for n in names), names
# 0014's CHECK: a vocab length only on a vocab attempt
try:
    db.execute("UPDATE needle_attempts SET vocab_tokens_min = 4, vocab_tokens_max = 8 WHERE kind = 'host'")
    raise SystemExit("a host attempt took a vocab length")
except sqlite3.IntegrityError:
    pass
PY

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all needle kind and shape checks passed"

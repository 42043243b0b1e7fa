#!/usr/bin/env bash
# tools/needle_data.py read_jsonl and tools/train_needle.py encode_sample on what
# `sparsetrace needle make --batch` writes: training takes the C generator's ids as they are
# (prompt ids, then the answer's, then EOS; the loss span is the answer and its EOS; the needle
# token is the span's start), and a held-out file is refused as training data.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=$src/models/needle-v4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
$st needle make --batch 6 --jsonl "$work/t.jsonl" --seed 11 --model "$model" --lengths 512 -q || fail "batch train"
$st needle make --batch 4 --jsonl "$work/h.jsonl" --seed 11 --split heldout --model "$model" --lengths 512 -q \
  || fail "batch heldout"
out=$(/usr/bin/python3 "$src/tools/needle_data.py" jsonl "$work/h.jsonl" 2>&1); rc=$?
[ $rc = 1 ] && grep -q "held out of training" <<< "$out" || fail "a held-out file read as training data: rc $rc, '$out'"
/usr/bin/python3 "$src/tools/needle_data.py" jsonl "$work/h.jsonl" --split heldout > /dev/null \
  || fail "the held-out file with --split heldout"
echo '{"ids": [1, 2]}' > "$work/bad.jsonl"
out=$(/usr/bin/python3 "$src/tools/needle_data.py" jsonl "$work/bad.jsonl" 2>&1); rc=$?
[ $rc = 1 ] && grep -q "bad.jsonl:1" <<< "$out" || fail "a malformed line: rc $rc, '$out'"
exec /usr/bin/python3 - "$src" "$model" "$work" <<'PY'
import json, os, subprocess, sys
src, model, work = sys.argv[1:]
sys.path.insert(0, os.path.join(src, "tools"))
import needle_data as nd
import train_needle as tn
raw = [json.loads(l) for l in open(os.path.join(work, "t.jsonl"), encoding="utf-8")]
vocab = json.load(open(os.path.join(model, "tokenizer.json"), encoding="utf-8"))
added = {t["content"]: t["id"] for t in vocab["added_tokens"]}
class Vocab:  # the one call encode_sample makes on these samples, answered from tokenizer.json
    def token_to_id(self, t): return added[t]
eos = added[nd.EOS]
summary = json.loads(subprocess.run([sys.executable, os.path.join(src, "tools", "needle_data.py"), "jsonl",
                                     os.path.join(work, "t.jsonl")], capture_output=True, check=True).stdout)
want_tokens = sum(len(e["ids"]) + len(e["answer_ids"]) for e in raw)
if summary["examples"] != len(raw) or summary["tokens"] != want_tokens:
    sys.exit(f"FAIL: summary {summary}, expected {len(raw)} examples of {want_tokens} tokens")
for e, s in zip(raw, nd.read_jsonl(os.path.join(work, "t.jsonl"))):
    ids, spans, nt = tn.encode_sample(Vocab(), s)
    if ids != e["ids"] + e["answer_ids"] + [eos]: sys.exit(f"FAIL: example {e['index']}: ids")
    if spans != [(e["answer_span"][0], e["answer_span"][1] + 1)]: sys.exit(f"FAIL: example {e['index']}: spans {spans}")
    if nt != e["needle_span"][0]: sys.exit(f"FAIL: example {e['index']}: needle token {nt}")
    if s.family != "c/" + e["family"] or s.kind != e["kind"]: sys.exit(f"FAIL: example {e['index']}: family/kind")
print(f"{len(raw)} examples: read_jsonl and encode_sample keep the C generator's ids and spans; held-out and "
      "malformed files are refused")
PY

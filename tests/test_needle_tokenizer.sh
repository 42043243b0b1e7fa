#!/usr/bin/env bash
# The engine's C tokenizer on the bundled needle model's tokenizer (models/needle-v4), against
# Hugging Face tokenizers: tests/data/needle-v4/tokenizer.jsonl holds rendered prompts of every
# template family and needle kind, in chat and thinking mode, with answers and follow-ups, and
# the ids HF tokenizers gave each (tools/train_needle.py tokenizer-fixture on the GPU machine).
# `sparsetrace tokenize` must give the same ids, and decoding them must give the text back.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
model=$src/models/needle-v4
fixture=$src/tests/data/needle-v4/tokenizer.jsonl
[ -f "$fixture" ] || { echo "FAIL: $fixture is missing"; exit 1; }
exec /usr/bin/python3 - "$st" "$model" "$fixture" <<'PY'
import json, subprocess, sys
st, model, fixture = sys.argv[1:]
failures = n = tokens = 0
for i, line in enumerate(open(fixture, encoding="utf-8")):
    case = json.loads(line)
    text, want = case["text"], case["ids"]
    enc = subprocess.run([st, "tokenize", "--model", model, "--json", "--no-special"], input=text.encode(),
                         capture_output=True)
    if enc.returncode != 0:
        print(f"FAIL: case {i}: tokenize: {enc.stderr.decode().strip()}"); failures += 1; continue
    got = json.loads(enc.stdout)
    n, tokens = n + 1, tokens + len(want)
    if got != want:
        k = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"FAIL: case {i}: ids differ from HF tokenizers at {k} of {len(want)}: "
              f"engine {got[max(0, k - 3):k + 4]}, HF {want[max(0, k - 3):k + 4]}")
        failures += 1
        continue
    dec = subprocess.run([st, "tokenize", "--model", model, "--decode", "--json"], input=json.dumps(want).encode(),
                         capture_output=True)
    back = json.loads(dec.stdout) if dec.returncode == 0 else None
    if back != text:
        print(f"FAIL: case {i}: decoding the ids does not give the text back"); failures += 1
if n == 0:
    print("FAIL: no case ran"); sys.exit(1)
if failures:
    print(f"{failures} failure(s) of {n}"); sys.exit(1)
print(f"engine = HF tokenizers on all {n} texts ({tokens} tokens), and decoding gives each text back")
PY

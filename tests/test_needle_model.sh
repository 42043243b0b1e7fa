#!/usr/bin/env bash
# The bundled needle models (models/needle-v4 and models/needle-v5, FP8/FP4 releases) through the
# engine, against transformers: tests/data/<model>/oracle.jsonl holds needle prompts and the
# greedy continuation DeepseekV4ForCausalLM produced for each on the same weights (dequantised,
# fp32, no cache; tools/train_needle.py oracle-fixture on the GPU machine, which for needle-v5
# also takes `needle make --batch`'s own prompts: tools/train_needle_gpu.sh oracle). The engine in
# exact mode must produce the same ids, token for token, so it recalls exactly the needles
# transformers recalls and invents exactly what transformers invents; the text run prints for them
# must be what HF tokenizers decodes. ST_NEEDLE_MODEL and ST_NEEDLE_ORACLE: one model and fixture.
# In a sanitizer build (ST_SANITIZE=1, ~15x slower arithmetic) only the prompts of at most
# 2,300 tokens run: the same code paths; the normal build runs every case.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
if [ -n "${ST_NEEDLE_MODEL:-}${ST_NEEDLE_ORACLE:-}" ]; then
  pairs=("${ST_NEEDLE_MODEL:?}:${ST_NEEDLE_ORACLE:?}")
else
  pairs=("$src/models/needle-v4:$src/tests/data/needle-v4/oracle.jsonl"
         "$src/models/needle-v5:$src/tests/data/needle-v5/oracle.jsonl")
fi
for pair in "${pairs[@]}"; do
  if [ ! -f "${pair%%:*}/model.safetensors" ] || [ ! -f "${pair#*:}" ]; then
    echo "skip: ${pair%%:*}'s release or its oracle fixture ${pair#*:} is not committed"; exit 77
  fi
done
top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
failures=0 n=0
for pair in "${pairs[@]}"; do
  model=${pair%%:*} fixture=${pair#*:}
  work=$top/$(basename "$model")
  mkdir -p "$work"
  echo "== $(basename "$model"): $fixture"
  /usr/bin/python3 - "$fixture" "$work" "${ST_SANITIZE:-0}" <<'PY' || { echo "FAIL: reading $fixture"; exit 1; }
import json, sys
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    case = json.loads(line)
    if sys.argv[3] == "1" and len(case["prompt_ids"]) > 2300:
        print(f"case {i}: {len(case['prompt_ids'])} tokens, left to the normal build (sanitizer build)")
        continue
    json.dump(case["prompt_ids"], open(f"{sys.argv[2]}/{i}.prompt.json", "w"))
    json.dump(case, open(f"{sys.argv[2]}/{i}.case.json", "w"))
    open(f"{sys.argv[2]}/{i}.length", "w").write(str(len(case["generated"])))
PY
  for prompt in "$work"/*.prompt.json; do
    i=$(basename "$prompt" .prompt.json)
    want=$(cat "$work/$i.length")
    if ! $st run --model "$model" --prompt-tokens "$prompt" --max-new-tokens "$want" --store "$work/store" \
         --trace "$work/$i.h5" --json > "$work/$i.out" 2> "$work/$i.err"; then
      echo "FAIL: case $i: engine: $(tail -1 "$work/$i.err")"; failures=$((failures + 1)); continue
    fi
    n=$((n + 1))
    /usr/bin/python3 - "$work/$i.case.json" "$work/$i.out" "$i" <<'PY' || failures=$((failures + 1))
import json, sys
case, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
want, got = case["generated"], out["generated"]
where = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), None)
if got == want and out.get("text") != case["text"]:
    print(f"FAIL: case {sys.argv[3]}: same ids, but run's text {out.get('text')!r} is not HF tokenizers' {case['text']!r}")
    sys.exit(1)
if got == want:
    print(f"ok: case {sys.argv[3]} ({case['family']}/{case['kind']}, {len(case['prompt_ids'])} tokens): "
          f"{len(got)} ids as transformers, {'recalled' if case['recalled'] else 'not recalled'}")
    sys.exit(0)
print(f"FAIL: case {sys.argv[3]}: ids differ from transformers at {where if where is not None else min(len(want), len(got))}: "
      f"engine {got[:12]}..., transformers {want[:12]}...")
sys.exit(1)
PY
  done
done
[ "$n" -gt 0 ] || { echo "FAIL: no case ran"; exit 1; }
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "engine = transformers on all $n cases of ${#pairs[@]} model(s)"

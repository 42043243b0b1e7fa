#!/usr/bin/env bash
# Resident memory of a DeepSeek-V4-Flash-shaped layer (tools/make_flash_layer.py: one CSA layer,
# every tensor in its released Flash shape and format, 3.6 GB as stored, ~26 GB as fp32) on each
# CPU backend: `run --json` reports the weights as held (stored formats), the checkpoint's own size
# and the session's backend memory; /usr/bin/time the process's peak RSS (mapped weight pages that
# were touched count). Usage: bench/run_flash_memory.sh [BUILD_DIR] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tokens=${2:-128}
model=$(mktemp -d)
store=$(mktemp -d)
trap 'rm -rf "$model" "$store"' EXIT
/usr/bin/python3 tools/make_flash_layer.py "$model" >/dev/null
/usr/bin/python3 -c "import json; print(json.dumps(list(range(2, 2 + $tokens))))" > "$store/prompt.json"
echo "| backend | tokens | seconds | weights held (MB) | checkpoint (MB) | as fp32 (MB) | session (MB) | peak RSS (MB) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
fp32=$(/usr/bin/python3 -c "
import json, struct
f = open('$model/model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
total = 0
for k, v in h.items():
    if k.endswith('.scale'): continue
    e = 1
    for s in v['shape']: e *= s
    total += e * (2 if v['dtype'] == 'I8' else 1)
print(total * 4)")
for be in cpu cpu-ref; do
  /usr/bin/time -f "%M" -o "$store/rss" "$build/sparsetrace" run --backend "$be" --model "$model" \
    --prompt-tokens "$store/prompt.json" --max-new-tokens 1 --store "$store" --json > "$store/out.json"
  /usr/bin/python3 - "$store/out.json" "$store/rss" "$be" "$tokens" "$fp32" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); rss = int(open(sys.argv[2]).read().split()[-1]) * 1024
m = r["memory"]
print("| %s | %s | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f |" % (sys.argv[3], sys.argv[4], r["seconds"],
      m["weights"] / 1e6, m["checkpoint"] / 1e6, int(sys.argv[5]) / 1e6, m["session"] / 1e6, rss / 1e6))
PY
done

#!/usr/bin/env bash
# tools/needle_data.py renders its training and evaluation prompts in Python (on the GPU machine,
# where the C tool does not run). Its renderer must equal the engine's reference encoder byte for
# byte, or the bundled model would be trained on a format the harness never shows it: generated
# requests (every template family and needle kind, chat and thinking mode) are rendered by both.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v python3 > /dev/null || { echo "skip: no python3"; exit 77; }
python3 "$src/tools/needle_data.py" requests "$work" 24 || { echo "FAIL: needle_data.py requests"; exit 1; }
failures=0
for req in "$work"/*.request.json; do
  base=${req%.request.json}
  if ! $st render --request "$req" --thinking "$(cat "$base.mode")" > "$base.c.txt"; then
    echo "FAIL: sparsetrace render $req"; failures=$((failures + 1)); continue
  fi
  if cmp -s "$base.c.txt" "$base.prompt.txt"; then
    echo "ok: $(basename "$base") ($(wc -c < "$base.prompt.txt") bytes, thinking $(cat "$base.mode"))"
  else
    echo "FAIL: $(basename "$base"): Python and C renderings differ"
    cmp "$base.c.txt" "$base.prompt.txt" | head -1
    failures=$((failures + 1))
  fi
done
# The families and kinds held out of training must show up in what was compared.
python3 - "$src/tools" <<'PY' || failures=$((failures + 1))
import sys
sys.path.insert(0, sys.argv[1])
import needle_data as nd
seen = {(s.family, s.kind) for s in (nd.make_sample(i, chars=1500 + 700 * (i % 5), train=False,
                                                    thinking=bool(i % 2)) for i in range(24))}
fams, kinds = {f for f, _ in seen}, {k for _, k in seen}
missing = (set(nd.FAMILIES) - fams) | (set(nd.NEEDLE_KINDS) - kinds)
print("FAIL: not covered: %s" % sorted(missing) if missing else "ok: every family and kind covered")
train = {(s.family, s.kind) for s in (nd.make_sample(i) for i in range(300))}
leak = [p for p in train if nd.HELDOUT_FAMILY in p or nd.HELDOUT_KIND in p]
print("FAIL: held-out data in training samples: %s" % leak if leak else "ok: 300 training samples hold no held-out family or kind")
sys.exit(1 if missing or leak else 0)
PY
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all renderings identical"

#!/usr/bin/env bash
# tools/needle_soup.py, which mixes two releases of one lineage weight by weight. On needle-v5
# (A) and needle-v4 (B): at alpha 0 and 1 the mix decodes to A's and B's own values, element for
# element, and the engine's greedy answer is A's and B's; at 0.3 it decodes to what the release
# format makes of the weighted mean, the mean computed here from the decoded releases (float64)
# and encoded by convert_release.py to-release on its own; --alpha-for gives the tensors it names
# their own share (each A's or B's own values at 0 and 1); the log records the mix; a pair with
# another tokenizer, an alpha outside [0, 1], an existing DEST and an --alpha-for that names no
# tensor or no share are refused.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
py=/usr/bin/python3
$py -c 'import numpy' 2>/dev/null || { echo "skip: no numpy"; exit 77; }
tool=$src/tools/needle_soup.py
conv=$src/tools/convert_release.py
a=$src/models/needle-v5 b=$src/models/needle-v4

for alpha in 0 1 0.3; do
  $py "$tool" "$a" "$b" "$work/s$alpha" --alpha $alpha >"$work/s$alpha.log" 2>&1 \
    || fail "needle_soup --alpha $alpha: $(tail -2 "$work/s$alpha.log")"
  $py "$conv" to-hf "$work/s$alpha" "$work/s$alpha.hf" --dtype float32 >/dev/null || fail "to-hf of the mix at $alpha"
done
$py "$conv" to-hf "$a" "$work/a.hf" --dtype float32 >/dev/null && $py "$conv" to-hf "$b" "$work/b.hf" --dtype float32 >/dev/null \
  || { echo "FAIL: to-hf of the releases"; exit 1; }

# the weighted mean at 0.3, computed here, and what the release format makes of it
$py - "$src/tools" "$work" <<'PY' || fail "the reference mean"
import os, shutil, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import convert_release as cr
w = sys.argv[2]
ta, tb = cr.open_checkpoint(f"{w}/a.hf"), cr.open_checkpoint(f"{w}/b.hf")
entries = []
for name, x in ta.items():
    if x.dtype == "F32":
        mean = (0.7 * x.values() + 0.3 * tb[name].values()).astype("<f4")
        entries.append((name, "F32", x.shape, lambda m=mean: m.tobytes()))
    else:
        entries.append((name, x.dtype, x.shape, lambda x=x: x.raw().tobytes()))
os.makedirs(f"{w}/mean.hf")
cr.write_safetensors(f"{w}/mean.hf/model.safetensors", entries)
for f in os.listdir(f"{w}/b.hf"):
    if f != "model.safetensors":
        shutil.copy(f"{w}/b.hf/{f}", f"{w}/mean.hf")
PY
$py "$conv" to-release "$work/mean.hf" "$work/mean" >/dev/null && $py "$conv" to-hf "$work/mean" "$work/mean.back" --dtype float32 >/dev/null \
  || fail "the reference mean through the release format"

# decoded values, tensor by tensor: equal, or the largest difference
same() {  # label, dir, dir
  $py - "$src/tools" "$2" "$3" <<'PY' >"$work/cmp.txt" 2>&1
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import convert_release as cr
x, y = cr.open_checkpoint(sys.argv[2]), cr.open_checkpoint(sys.argv[3])
bad = [n for n in x if n not in y or not np.array_equal(x[n].raw(), y[n].raw())]
print(f"{len(x)} tensors, {len(bad)} differ {bad[:3]}")
sys.exit(1 if bad or set(x) != set(y) else 0)
PY
  if [ $? -eq 0 ]; then echo "ok: $1: $(cat "$work/cmp.txt")"; else fail "$1: $(cat "$work/cmp.txt")"; fi
}
same "alpha 0 decodes to A's values" "$work/s0.hf" "$work/a.hf"
same "alpha 1 decodes to B's values" "$work/s1.hf" "$work/b.hf"
same "alpha 0.3 decodes to the mean 0.7 A + 0.3 B as the release format encodes it" "$work/s0.3.hf" "$work/mean.back"
$py - "$src/tools" "$work" <<'PY' || fail "the mix at 0.3 is not between A and B"
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import convert_release as cr
w = sys.argv[2]
s, a, b = (cr.open_checkpoint(f"{w}/{d}") for d in ("s0.3.hf", "a.hf", "b.hf"))
moved = [n for n in a if not np.array_equal(a[n].raw(), b[n].raw())]
nearer_a = sum(np.linalg.norm(s[n].values() - a[n].values()) < np.linalg.norm(s[n].values() - b[n].values()) for n in moved)
print(f"ok: at 0.3, {nearer_a} of the {len(moved)} tensors that differ are nearer A than B")
sys.exit(0 if moved and nearer_a >= 0.9 * len(moved) else 1)
PY

# --alpha-for: B's weights but every indexer's (its compressor too) A's, each tensor A's or B's own
# values exactly (the alpha 0 and 1 round trips above, tensor by tensor)
$py "$tool" "$a" "$b" "$work/sidx" --alpha 1 --alpha-for '*.attn.indexer.*=0' >"$work/sidx.log" 2>&1 \
  && $py "$conv" to-hf "$work/sidx" "$work/sidx.hf" --dtype float32 >/dev/null \
  || fail "needle_soup --alpha-for: $(tail -2 "$work/sidx.log")"
$py - "$src/tools" "$work" <<'PY' || fail "--alpha-for: the tensors are not each A's or B's as their names say"
import fnmatch, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import convert_release as cr
w = sys.argv[2]
s, a, b = (cr.open_checkpoint(f"{w}/{d}") for d in ("sidx.hf", "a.hf", "b.hf"))
idx = [n for n in s if fnmatch.fnmatchcase(n, "*.attn.indexer.*")]
wrong = [n for n in s if not np.array_equal(s[n].raw(), (a if n in idx else b)[n].raw())]
differ = [n for n in idx if not np.array_equal(a[n].raw(), b[n].raw())]
print(f"ok: --alpha-for: {len(idx)} indexer tensors A's ({len(differ)} of them differ from B's), the other "
      f"{len(s) - len(idx)} B's" if not wrong and differ and len(idx) < len(s) else f"wrong: {wrong[:4]}, {len(idx)} matched")
sys.exit(1 if wrong or not differ or len(idx) == len(s) else 0)
PY
grep -q '"alpha_for": {"\*.attn.indexer.\*": 0.0}' "$work/sidx/training/log.jsonl" && echo "ok: --alpha-for is in the log" \
  || fail "--alpha-for not in the log: $(tail -1 "$work/sidx/training/log.jsonl")"

# the engine: the same greedy answer as A at 0, as B at 1
$st needle make --batch 1 --jsonl "$work/e.jsonl" --seed 4 --model "$a" --lengths 512 -q || fail "needle make"
$py -c 'import json, sys; json.dump(json.loads(open(sys.argv[1]).readline())["ids"], open(sys.argv[2], "w"))' \
  "$work/e.jsonl" "$work/prompt.json" || fail "the prompt's ids"
answer() { $st run --model "$1" --prompt-tokens "$work/prompt.json" --max-new-tokens 24 --store "$work/store" -o "$work/$2.h5" \
             --json -q | $py -c 'import json, sys; print(json.load(sys.stdin)["text"])'; }
for pair in "s0 a" "s1 b"; do
  set -- $pair
  got=$(answer "$work/$1" "$1") want=$(answer "$(eval echo \$$2)" "$2")
  [ -n "$want" ] && [ "$got" = "$want" ] && echo "ok: the engine answers $1 as it answers $2: '${want:0:40}'" \
    || fail "the engine on $1: '$got', on $2: '$want'"
done

grep -q '"event": "soup".*"alpha": 0.3' "$work/s0.3/training/log.jsonl" && echo "ok: the mix is in its training log" \
  || fail "no soup event in the log: $(tail -1 "$work/s0.3/training/log.jsonl")"
refused() {  # label, want in stderr, args...
  local label=$1 want=$2; shift 2
  if $py "$tool" "$@" >"$work/r.txt" 2>&1; then fail "$label: accepted"
  elif grep -q "$want" "$work/r.txt"; then echo "ok: $label refused"; else fail "$label: $(tail -1 "$work/r.txt")"; fi
}
mkdir -p "$work/other" && cp "$b"/{model.safetensors,config.json} "$work/other/" && echo '{}' >"$work/other/tokenizer.json"
refused "another tokenizer" "different tokenizer.json" "$a" "$work/other" "$work/x1"
refused "alpha 1.5" "want a share" "$a" "$b" "$work/x2" --alpha 1.5
refused "an existing DEST" "exists" "$a" "$b" "$work/s0"
refused "an --alpha-for that matches no tensor" "matches no tensor" "$a" "$b" "$work/x3" --alpha-for 'layers.*.indexer.*=0'
refused "an --alpha-for share outside [0, 1]" "want GLOB=ALPHA" "$a" "$b" "$work/x4" --alpha-for '*.indexer.*=2'

[ "$failures" -eq 0 ] && echo "test_needle_soup: all passed" || echo "test_needle_soup: $failures failed"
exit $((failures > 0))

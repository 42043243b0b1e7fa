#!/usr/bin/env bash
# The needle model's recall on `needle make`'s own prompts, measured by the engine itself
# (CPU, no GPU): every needle kind as trained (assorted and vocab too: lines no other kind's
# pattern predicts, copied or not), the bug-report shape (toollist), and the path kind
# under every fault the harness emulates. One store, one sweep per line; each table is the
# sweep's own (view needle_sweep_cells).
# When MODEL/README.md has the markers <!-- engine-sweeps --> ... <!-- /engine-sweeps -->, the
# file goes between them.
#   tools/needle_engine_sweeps.sh MODEL OUT.txt [TOKENS] [SEEDS]
# BACKEND: the engine's (default cpu). KINDS, SHAPES and FAULTS (space-separated) choose the
# sweeps (default: every kind, the toollist shape, every fault);
# APPEND=1 adds to OUT.txt instead of starting it. CARD_ONLY=1 runs no sweep: it only writes an
# existing OUT.txt (one from the GPU machine's `train_needle_gpu.sh sweep`) into MODEL's card.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: tools/needle_engine_sweeps.sh MODEL OUT.txt [TOKENS] [SEEDS]} out=${2:?}
tokens=${3:-1k,2k,4k,8k,16k} seeds=${4:-3}
st=${ST_BIN:-build/sparsetrace} backend=${BACKEND:-cpu}
if [ "${CARD_ONLY:-0}" != 1 ]; then
  store=$(mktemp -d)
  trap 'rm -rf "$store"' EXIT
  [ "${APPEND:-0}" = 1 ] || : > "$out"
  # the command as run, OUT by its name: where the file was written is no part of what it measured
  {
    echo "# $model: needle sweep on the engine (--backend $backend), tokens $tokens, seeds 1..$seeds, positions 0.25/0.55/0.8/0.97"
    echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; command:${KINDS+ KINDS=\"$KINDS\"}${SHAPES+ SHAPES=\"$SHAPES\"}${FAULTS+ FAULTS=\"$FAULTS\"}${APPEND:+ APPEND=$APPEND} tools/needle_engine_sweeps.sh $model $(basename "$out")${3:+ $3}${4:+ $4}"
  } >> "$out"
  sweep() {
    local label=$1; shift
    local t0=$SECONDS
    echo "== $label" | tee -a "$out"
    "$st" needle sweep --backend "$backend" --model "$model" --tokens "$tokens" --seeds "$seeds" --store "$store" --quiet "$@" 2>&1 \
      | awk '/^tokens/ {t = 1} t && /^$/ {exit} t' | tee -a "$out"
    echo "($((SECONDS - t0)) s)" >> "$out"
  }
  for kind in ${KINDS-path host key number ticket branch url email commit env random assorted vocab}; do
    sweep "kind $kind, as trained" --kind "$kind"
  done
  for shape in ${SHAPES-toollist}; do
    sweep "kind path, shape $shape, as trained" --kind path --shape "$shape"
  done
  for fault in ${FAULTS-rotate=q rotate=k rotate=both index_k=fp8_e4m3fn_as_fnuz index_rope=neox compress_rope_theta=40000 topk=4}; do
    sweep "kind path, $fault" --kind path --set "$fault"
  done
fi
# the model card shows the sweeps as one table (each sweep's passed/attempts per length and over
# all), between its markers; the file keeps every cell
card=$model/README.md
if [ -f "$card" ] && grep -q '<!-- engine-sweeps -->' "$card"; then
  /usr/bin/python3 - "$card" "$out" <<'PY'
import os, sys
card, out = sys.argv[1], sys.argv[2]
blocks, cur, lengths = [], None, []
for line in open(out):
    if line.startswith("== "):
        cur = (line[3:].strip(), {})
        blocks.append(cur)
    elif cur and line.strip() and not line.startswith(("tokens", "(", "#")):
        name, last = line.split()[0], line.split()[-1]
        cur[1][name] = last
        if name != "all" and name not in lengths:
            lengths.append(name)
rows = ["| sweep | " + " | ".join(lengths) + " | all |", "|---|" + "---:|" * (len(lengths) + 1)]
for label, cells in blocks:
    # a sweep of one length has no "all" row: that length's own total is the sweep's
    total = cells.get("all", next(iter(cells.values())) if len(cells) == 1 else "")
    rows.append(f"| {label} | " + " | ".join(cells.get(L, "") for L in lengths) + f" | **{total}** |")
head = [l[2:].strip() for l in open(out) if l.startswith("# ")][:2]
body = ("<!-- engine-sweeps -->\n" + "\n".join(rows) + "\n\nPassed / attempts; " + head[0].split(": ", 1)[1]
        + f". Every cell by needle position: `{os.path.relpath(out, os.path.dirname(card))}`.\n")
s = open(card).read()
a, b = s.index("<!-- engine-sweeps -->"), s.index("<!-- /engine-sweeps -->")
open(card, "w").write(s[:a] + body + s[b:])
PY
fi

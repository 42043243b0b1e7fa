#!/usr/bin/env bash
# tools/needle_engine_sweeps.sh, whose file and table the model card carries: each sweep's table
# is the engine's own (`needle sweep`'s rows, nothing after them: no scratch store's path), and
# the card's table between its markers gives each sweep's cells and total as that file has them.
# One sweep of one length (4 runs at 1k) and one of two lengths, on needle-v5 in a scratch copy
# whose card holds only the markers.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
model=$work/model
mkdir -p "$model"
for f in "$src"/models/needle-v5/*; do
  case $(basename "$f") in README.md) ;; *) ln -s "$f" "$model/" ;; esac
done
printf '# card\n\n<!-- engine-sweeps -->\n<!-- /engine-sweeps -->\n' >"$model/README.md"
sweeps() { ST_BIN=$st KINDS=path SHAPES= FAULTS= "$src/tools/needle_engine_sweeps.sh" "$model" "$@"; }

# the card's row of sweep LABEL: its cells, " | "-separated
card_row() { grep -F "| $1 |" "$model/README.md" | sed 's/^| [^|]* | //; s/ |$//; s/\*\*//g'; }
# a sweep's block of OUT: its lines from "== LABEL" to the next "(N s)"
block() { awk -v l="== $2" '$0 == l {p = 1; next} p && /^\([0-9]+ s\)$/ {exit} p' "$1"; }

sweeps "$work/one.txt" 1k 1 >/dev/null 2>&1 || fail "the sweep of one length failed"
b=$(block "$work/one.txt" "kind path, as trained")
if grep -q -e "stored:" -e "index.sqlite" "$work/one.txt"; then
  fail "one length: the file holds what is not the sweep's table: $(grep -e stored: -e index.sqlite "$work/one.txt" | head -2)"
fi
[ "$(printf '%s\n' "$b" | head -1 | awk '{print $1, $NF}')" = "tokens all" ] \
  || fail "one length: the block does not start at the table's header: $(printf '%s\n' "$b" | head -1)"
rows=$(printf '%s\n' "$b" | grep -c '^1k (')
[ "$rows" = 1 ] || fail "one length: $rows rows of 1k, expected 1"
cell=$(printf '%s\n' "$b" | awk '/^1k \(/ {print $NF}')
case $cell in [0-4]/4) ;; *) fail "one length: the 1k row's total is '$cell', expected passed/4" ;; esac
want=$(printf '%s\n' "$b" | awk '/^1k \(/ {print $NF " | " $NF}')
got=$(card_row "kind path, as trained")
[ "$got" = "$want" ] && echo "ok: one length: file row $cell, card row '$got'" \
  || fail "one length: the card's row is '$got', the file's cells say '$want'"

sweeps "$work/two.txt" 512,1k 1 >/dev/null 2>&1 || fail "the sweep of two lengths failed"
b=$(block "$work/two.txt" "kind path, as trained")
want=$(printf '%s\n' "$b" | awk '/^512 \(/ {a = $NF} /^1k \(/ {c = $NF} /^all / {t = $NF} END {print a " | " c " | " t}')
got=$(card_row "kind path, as trained")
[ "$got" = "$want" ] && echo "ok: two lengths: card row '$got'" \
  || fail "two lengths: the card's row is '$got', the file's cells say '$want'"
grep -q -e "stored:" -e "index.sqlite" "$work/two.txt" && fail "two lengths: the scratch store's path in the file"
head=$(grep -c '^| sweep | 512 | 1k | all |$' "$model/README.md")
[ "$head" = 1 ] || fail "two lengths: the card's header is not 'sweep | 512 | 1k | all': $(grep '^| sweep' "$model/README.md")"

[ $failures -eq 0 ] && echo "all needle_engine_sweeps checks passed" || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# README.md and docs/*.md point only at what a clone has: every relative markdown link
# [text](path) resolves (relative to the file that holds it; a #fragment is dropped), and every
# path-like `code span` naming a .md, .sql, .def, .json, .sh or .py file resolves against the
# repository root or the file's folder (no ../shared/DESIGN.md of a steering repository). And
# the README's walk-through uses only traces it made: every *.h5 that a `$st diff`, `replay`,
# `bisect` or `inspect` line reads is written by an earlier line of the same code block
# (--out / --trace of a run or an import). Bounded: well under a second.
set -uo pipefail
data=${ST_TEST_DATA:-}
src=$(cd "${ST_SOURCE_DIR:-${data:+$data/../..}}" 2>/dev/null && pwd) || src=$(cd "$(dirname "$0")/.." && pwd)
failures=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failures=$((failures + 1)); }

files=("$src/README.md")
for f in "$src"/docs/*.md; do [ -f "$f" ] && files+=("$f"); done
[ -f "$src/docs/design.md" ] && ok "docs/design.md exists" || bad "docs/design.md is missing"
grep -q '](docs/design.md)' "$src/README.md" && ok "README links docs/design.md" || bad "README does not link docs/design.md"

for f in "${files[@]}"; do
  dir=$(dirname "$f")
  rel=${f#"$src"/}
  n=0
  # markdown links, outside fenced code blocks
  while IFS= read -r target; do
    t=${target%%#*}
    [ -z "$t" ] && continue
    n=$((n + 1))
    [ -e "$dir/$t" ] || bad "$rel: link ($target) does not resolve"
    case $(cd "$dir" && realpath -m "$t") in "$src"/*|"$src") ;; *) bad "$rel: link ($target) leaves the repository" ;; esac
  done < <(awk '/^```/ { fence = !fence; next } !fence' "$f" | grep -o '\]([^)]*)' | sed 's/^](//; s/)$//' |
           grep -v -E '^(https?:|mailto:|#)')
  # path-like code spans naming files
  while IFS= read -r p; do
    n=$((n + 1))
    [ -e "$src/$p" ] || [ -e "$dir/$p" ] || compgen -G "$src/$p" >/dev/null || bad "$rel: \`$p\` names a file that is not in the repository"
  done < <(awk '/^```/ { fence = !fence; next } !fence' "$f" | grep -o '`[^` ]*`' | tr -d '`' |
           grep -E '/' | grep -E '\.(md|sql|def|json|sh|py)$' | grep -v -E '^(https?:|<|\$)' |
           grep -v -E '(^|/)(prompt|req|needle|meta|out|FILE)\.json$|^traces/|<')
  ok "$rel: $n references checked"
done

# the walk-through: every trace a command reads was written before, in the same block
if out=$(awk '
  /^```/ { if (fence) { delete made } fence = !fence; next }
  !fence { next }
  /\\$/ { held = held substr($0, 1, length($0) - 1) " "; next }   # a continued command line
  { line = held $0; held = ""; sub(/#.*/, "", line); n = split(line, w, /[ \t]+/)
    for (i = 1; i <= n; i++) if ((w[i] == "--out" || w[i] == "--trace" || w[i] == "-o") && w[i + 1] ~ /\.h5$/) {
      if (line ~ /[ \t](run|import)[ \t]/) made[w[i + 1]] = 1
    }
    if (line ~ /[ \t](diff|replay|bisect|inspect)[ \t]/)
      for (i = 1; i <= n; i++) if (w[i] ~ /^[A-Za-z0-9_.\/-]+\.h5$/ && !(w[i] in made) && w[i] !~ /</)
        printf "line %d reads %s, which no earlier command of the block writes\n", NR, w[i]
  }' "$src/README.md") && [ -z "$out" ]; then ok "the walk-through reads only traces it recorded"; else bad "README walk-through: $out"; fi

[ $failures -eq 0 ] || { echo "$failures failure(s)"; exit 1; }

#!/usr/bin/env bash
# The build's identity as `sparsetrace --version` prints it: "sparsetrace REVISION (COMPILER, TYPE;
# sources SOURCES)". In a checkout whose source paths (cmake/build_info.cmake's source_paths) are
# as committed, REVISION is HEAD's and SOURCES the first 12 hex digits of the sha256 of the paths'
# git object ids at HEAD, one per line, worked out here with git and sha256sum; with a source path
# modified, "REVISION-dirty" and "modified". A change outside the source paths (a model, a doc)
# changes neither. Run after the build it tests: a source edited since makes the binary stale.
set -uo pipefail
st=${ST_BIN:?}
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
. "$(dirname "$0")/work_checks.sh"   # $work, fail, $failures
git -C "$src" rev-parse HEAD >/dev/null 2>&1 || { echo "skip: $src is not a git checkout"; exit 77; }

version=$("$st" --version) || fail "--version exited $?"
re='^sparsetrace ([0-9a-f]{12})(-dirty)? \((.+), (.+); sources ([0-9a-f]{12}|modified|unknown)\)$'
[[ $version =~ $re ]] || { echo "FAIL: --version printed '$version'"; exit 1; }
rev=${BASH_REMATCH[1]} dirty=${BASH_REMATCH[2]} sources=${BASH_REMATCH[5]}
echo "ok: --version: $version"

read -r -a paths <<<"$(sed -n 's/^set(source_paths \(.*\))$/\1/p' "$src/cmake/build_info.cmake")"
[ "${#paths[@]}" -gt 3 ] || fail "no source_paths in cmake/build_info.cmake"
[ "$rev" = "$(git -C "$src" rev-parse --short=12 HEAD)" ] && echo "ok: the revision is HEAD's" \
  || fail "revision $rev, HEAD $(git -C "$src" rev-parse --short=12 HEAD)"
if [ -n "$(git -C "$src" status --porcelain --untracked-files=normal -- "${paths[@]}")" ]; then
  [ "$dirty$sources" = "-dirtymodified" ] && echo "ok: source paths modified: -dirty, sources modified" \
    || fail "source paths modified, but --version says '$dirty' and sources $sources"
else
  want=$(for p in "${paths[@]}"; do git -C "$src" rev-parse "HEAD:$p"; done | sha256sum | cut -c1-12)
  [ -z "$dirty" ] && [ "$sources" = "$want" ] && echo "ok: sources $sources, the digest of ${#paths[@]} paths' git objects" \
    || fail "sources '$dirty' $sources, git says $want"
fi

# the source paths are what the binary is built from: every directory holding C, CUDA or C++
# sources but the tests' and the benchmarks' own programs (a directory left off the list would let
# its edits pass as clean)
for d in $(git -C "$src" ls-files '*.c' '*.h' '*.cu' '*.cpp' | grep -v '^tests/\|^bench/' | cut -d/ -f1 | sort -u); do
  case " ${paths[*]} " in *" $d "*) ;; *) fail "$d holds sources but is not in source_paths" ;; esac
done

[ "$failures" = 0 ] && echo "test_build_info: all checks passed" || echo "test_build_info: $failures check(s) FAILED"
[ "$failures" = 0 ]

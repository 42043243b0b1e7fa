#!/usr/bin/env bash
# test_content_digest.sh — issue 14 #9, last part: a trace is identified by its content. The
# writer records content_digest (FNV-1a 64 over every dataset, schemas/trace-layout.md) before
# marking the file complete, the index records it for the run (runs.content_digest, migration
# 0009), `replay` recomputes it and refuses a trace whose content differs, and `store check`
# reports a trace whose content differs from its row.
# Before: a copy with one float of layers.1.indexer.q changed (h5py) replayed with exit status 0
# and its replays were stored under the original run's id; a copy with the digest attribute
# removed too was indistinguishable from the recording; store check reported the modified
# trace in the store as consistent.
set -u
st=${ST_BIN:-}
model=${ST_TEST_DATA:-}/oracle/tiny
PY=/usr/bin/python3
if [[ -z "$st" || ! -x "$st" || ! -f $model/config.json ]] || ! "$PY" -c 'import h5py, numpy' 2>/dev/null; then
  echo "skip: need ST_BIN, ST_TEST_DATA/oracle/tiny and /usr/bin/python3 with h5py and numpy"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/st_test_digest.XXXXXX")
trap 'rm -rf "$work"' EXIT
S=$work/s
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
awk 'BEGIN { s = 7; printf "["; for (i = 0; i < 48; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/p.json"
"$st" run --model "$model" --prompt-tokens "$work/p.json" --tap 'layers.1.*' --store "$S" \
  >/dev/null 2>&1 || { echo "FAIL: run"; exit 1; }
q() { "$st" query --store "$S" --json "$1" | tr -d ' \n'; }
trace=$S/$(q "SELECT trace_path FROM runs" | sed 's/.*"trace_path":"\([^"]*\)".*/\1/')
row=$(q "SELECT content_digest FROM runs" | sed 's/.*"content_digest":"\([^"]*\)".*/\1/')
attr=$("$PY" -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r").attrs["content_digest"])' "$trace")
[[ "$row" =~ ^fnv1a64:[0-9a-f]{16}$ ]] && ok || bad "index row digest: '$row'"
[[ "$attr" == "$row" ]] && ok || bad "attribute '$attr' != row '$row'"
# The digest as documented, recomputed independently (numpy for the bytes, a Python FNV-1a).
"$PY" - "$trace" "$attr" <<'PYEOF' && ok || bad "independent recomputation differs"
import h5py, numpy as np, sys
P = 0x100000001b3
def fnv(h, b):
    a = np.frombuffer(b, dtype=np.uint8)
    for x in a.tolist():
        h = ((h ^ x) * P) & 0xFFFFFFFFFFFFFFFF
    return h
f = h5py.File(sys.argv[1], "r")
names = []
f.visititems(lambda n, o: names.append("/" + n) if isinstance(o, h5py.Dataset) else None)
h = 0xcbf29ce484222325
for n in sorted(names, key=lambda s: s.encode()):
    d = f[n]
    t = d.dtype
    tag = ("f" if t.kind == "f" else "u" if t.kind in "ub" else "i") + str(t.itemsize) + ("be" if t.byteorder == ">" else "le")
    h = fnv(h, n.encode() + b"\0" + tag.encode() + b"\0")
    h = fnv(h, int(d.ndim).to_bytes(8, "little"))
    for x in d.shape: h = fnv(h, int(x).to_bytes(8, "little"))
    h = fnv(h, np.ascontiguousarray(d[()]).tobytes())
got = "fnv1a64:%016x" % h
print("python:", got, "writer:", sys.argv[2])
sys.exit(0 if got == sys.argv[2] else 1)
PYEOF
replays() { q "SELECT count(*) AS n FROM replays" | tr -dc '0-9'; }
bump() { # bump FILE [drop-attr]: one float of layers.1.indexer.q moves to the next float up
  "$PY" - "$@" <<'PYEOF'
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    d = f["taps/layers.1.indexer.q"]
    row = d[0]
    row.flat[0] = np.nextafter(row.flat[0], np.float32(np.inf))
    d[0] = row
    if len(sys.argv) > 2: del f.attrs["content_digest"]
PYEOF
}
replay() { out=$("$st" replay --trace "$1" --model "$model" --layer 1 --stage indexer --store "$S" 2>&1); rc=$?; }

# 1. a copy with one float changed: refused (its own attribute no longer matches), nothing stored
cp "$trace" "$work/mod.h5"; bump "$work/mod.h5" || bad "h5py edit"
before=$(replays)
replay "$work/mod.h5"
if [[ $rc -eq 1 && "$out" == *"replay refused"* && "$out" == *"changed after recording"* && "$out" != *"bit for bit"* ]]; then ok
else bad "modified copy: rc=$rc: $out"; fi
[[ $(replays) == "$before" ]] && ok || bad "a replay of the modified copy was stored"
# 2. the same with the attribute removed: the index row still tells
cp "$trace" "$work/mod2.h5"; bump "$work/mod2.h5" drop || bad "h5py edit"
replay "$work/mod2.h5"
if [[ $rc -eq 1 && "$out" == *"is not the trace indexed for run"* && "$out" == *"$row"* ]]; then ok
else bad "modified copy without attribute: rc=$rc: $out"; fi
[[ $(replays) == "$before" ]] && ok || bad "a replay of the attribute-less copy was stored"
# 3. store check: consistent, then the stored trace modified in place is reported (not repaired)
out=$("$st" store check --store "$S" 2>&1); rc=$?
[[ $rc -eq 0 ]] && ok || bad "clean store check: rc=$rc: $out"
cp "$trace" "$work/orig.h5"; bump "$trace"
out=$("$st" store check --store "$S" 2>&1); rc=$?
if [[ $rc -eq 1 && "$out" == *"content differs from its row"* ]]; then ok; else bad "store check of a modified trace: rc=$rc: $out"; fi
out=$("$st" store check --store "$S" --repair 2>&1); rc=$?
[[ $rc -eq 1 && -f "$trace" && $(q "SELECT count(*) AS n FROM runs" | tr -dc '0-9') == 1 ]] && ok \
  || bad "--repair must leave a modified trace and its row alone: rc=$rc: $out"
cp "$work/orig.h5" "$trace"
out=$("$st" store check --store "$S" 2>&1); rc=$?
[[ $rc -eq 0 ]] && ok || bad "restored store check: rc=$rc: $out"
# 4. the untouched trace (and an exact copy) still replays bit for bit, and is stored
for t in "$trace" "$work/orig.h5"; do
  before=$(replays)
  replay "$t"
  if [[ $rc -eq 0 && "$out" == *"reproduce the recorded tensors bit for bit"* ]]; then ok; else bad "clean replay of $t: $out"; fi
  [[ $(replays) -gt $before ]] && ok || bad "clean replay not stored"
done

echo "test_content_digest: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

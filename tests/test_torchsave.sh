#!/usr/bin/env bash
# test_torchsave.sh — the torch.save reader (recorder/import/torchsave.c) through `sparsetrace
# import show`, against references it did not make (tests/torchsave_check.py says which):
# Python's pickle module on plain data; archives laid out as torch.save lays them out, built with
# zipfile (STORED, zip64, views, Parameter, fp8 through _rebuild_tensor_v3) and their hostile
# variants (clear error, exit 1, never a crash, every metadata byte flipped); and real torch.save
# files with torch's own manifest of every leaf: the committed set (tests/data/import/torchsave,
# written by tools/make_import_fixtures.py --torchsave-only with Debian's torch 1.13, which has no
# float8 dtypes: the fp8 / _rebuild_tensor_v3 path is checked on the zipfile-built archives only
# until a torch 2.x set is committed) and, where this machine's python3 has torch (Debian's
# python3-torch, tools/deps.sh), a set written now by that torch.
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
DATA=${ST_TEST_DATA:-$SRC/tests/data}
PY=/usr/bin/python3
T=$(mktemp -d /tmp/st_torchsave.XXXXXX)
trap 'rm -rf "$T"' EXIT
dirs=()
if [ -f "$DATA/import/torchsave/manifest.json" ]; then
  dirs+=("$DATA/import/torchsave")
else
  echo "note: no committed fixture set (tests/data/import/torchsave)"
fi
if $PY -c "import torch" 2>/dev/null; then
  $PY "$SRC/tools/make_import_fixtures.py" "$T/local" --torchsave-only >"$T/make.log" 2>&1 ||
    { cat "$T/make.log"; echo "FAIL: tools/make_import_fixtures.py --torchsave-only"; exit 1; }
  dirs+=("$T/local/torchsave")
  echo "local torch $($PY -c 'import torch; print(torch.__version__)') wrote a fixture set"
else
  echo "note: no torch for $PY: no locally written torch.save set"
fi
[ ${#dirs[@]} -gt 0 ] || { echo "FAIL: no real torch.save files to check (install python3-torch: tools/deps.sh)"; exit 1; }
exec $PY "$SRC/tests/torchsave_check.py" "$BIN" "$T/work" "${dirs[@]}"

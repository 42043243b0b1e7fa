#!/usr/bin/env bash
# test_import_planted.sh — the planted-bug test on transformers' own exports (issue 19 item 5;
# tests/import_planted_check.py says what is checked): the committed tools/export_hf.py output
# of DeepseekV4ForCausalLM on the tiny oracle model, unpatched and with the indexer query alone
# Hadamard-rotated, imported and compared with the reference engine's exact run of the same
# prompt; the first divergence must be layer 1's indexer and replay must say rotate=q
# reproduces it. The exports are made where torch and transformers are, by
# tools/make_import_fixtures.py (tests/data/import/).
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
DATA=${ST_TEST_DATA:-$SRC/tests/data}
HF=$DATA/import/hf
[ -f "$HF/exact/export.json" ] && [ -f "$HF/rotate_q/export.json" ] ||
  { echo "skip: no transformers exports in $HF (tools/make_import_fixtures.py on the GPU machine)"; exit 77; }
T=$(mktemp -d /tmp/st_import_planted.XXXXXX)
trap 'rm -rf "$T"' EXIT
exec /usr/bin/python3 "$SRC/tests/import_planted_check.py" "$BIN" "$HF" "$DATA/oracle/tiny" "$T"

#!/usr/bin/env bash
# test_import.sh — `sparsetrace import hf` and `import sglang-dumper` on dumps that
# tests/import_check.py writes with real torch.save (Debian's python3-torch) for the tiny oracle
# model, every expected value derived there from the saved arrays: layouts aligned (batch axis,
# kept positions, a two-request flat axis over two steps), top-k as sorted sets, bf16 widened,
# /tokens, the import attributes and notes (and inspect showing them), the index row; replay of
# imported indexer taps says which of rotate=none / rotate=q reproduces the recorded top-k (the
# planted bug: the query alone Hadamard-rotated), diff names layer 1's indexer as the first
# divergence; bad shapes, maps and requests fail with messages that name file and tensor.
# The planted-bug test on transformers' own exports is test_import_planted.sh.
set -u
BIN=${ST_BIN:?ST_BIN must point at the sparsetrace binary}
SRC=$(cd "${ST_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
PY=/usr/bin/python3
$PY -c "import torch, h5py, numpy" 2>/dev/null || { echo "skip: $PY lacks torch/h5py/numpy (tools/deps.sh)"; exit 77; }
T=$(mktemp -d /tmp/st_import.XXXXXX)
trap 'rm -rf "$T"' EXIT
exec $PY "$SRC/tests/import_check.py" "$BIN" "$T"

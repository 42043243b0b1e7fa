#!/usr/bin/env bash
# tools/needle_fast.py (the needle model's training and evaluation forward) against brute-force
# masked attention: tests/needle_fast_check.py. Exit 77 where python3 has no torch.
set -u
src=$(cd "${ST_SOURCE_DIR:?}" && pwd)
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIP: no torch in /usr/bin/python3"; exit 77; }
/usr/bin/python3 "$src/tests/needle_fast_check.py"

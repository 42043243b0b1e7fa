#!/usr/bin/env bash
# The GPU backend's checks and benchmarks on a GPU machine, from a bundle built elsewhere:
#
#   tools/gpu_bundle.sh                      # here: -DST_WITH_CUDA=ON build, then .bundle/
#   tools/gpu_check.sh OUT [STEP...]         # there, in the repository root
#
# Steps (default: ops engine digests demo):
#   ops      test_backend_ops: every op on cuda against cpu-ref (the full table in OUT/backend_ops.txt)
#   engine   test_engine on cuda: the transformers oracle fixtures and the engine's invariants
#   digests  test_digests --backend cuda --runs 5: five runs of every case bit for bit, the digests
#            to OUT/cuda.txt (committed as tests/data/digests/cuda.txt), and compared when committed
#   demo     tools/demo.sh on the bundled needle model with every run on cuda
#   bench    bench_prefill on a 2-layer V4-Flash-shaped model (tools/make_flash_layer.py) at
#            BENCH_TOKENS (default 8192,32768)
#   peer     bench/peer_flash_transformers.py on the same model at PEER_TOKENS (default 8k,16k)
# Each step prints its verdict line; the outputs stay in OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/gpu_check.sh OUT [STEP...]}
shift
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(ops engine digests demo)
# the bundle as carried (tools/gpu_bundle.sh's archive), unpacked once
[ -d .bundle ] || [ ! -f build-carry/bundle.tar.xz ] || tar xJf build-carry/bundle.tar.xz
export LD_LIBRARY_PATH=$PWD/.bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$PWD/.bundle/bin
mkdir -p "$out"
flash=${FLASH_DIR:-/tmp/flash2}
for step in "${steps[@]}"; do
  t0=$SECONDS
  case $step in
  ops)
    timeout 400 "$bin/test_backend_ops" >"$out/backend_ops.txt" 2>&1
    rc=$?
    grep -E " FAIL|^summary" "$out/backend_ops.txt" | head -60 ;;
  engine)
    ST_TEST_BACKEND=cuda ST_TEST_DATA=$PWD/tests/data timeout 400 "$bin/test_engine" >"$out/engine.txt" 2>&1
    rc=$?
    grep -vE "^\[ (RUN|  +OK) " "$out/engine.txt" | tail -40 ;;
  digests)
    ST_SOURCE_DIR=$PWD timeout 400 "$bin/test_digests" --backend cuda --runs 5 --write "$out/cuda.txt" \
      >"$out/digests.txt" 2>&1
    rc=$?
    tail -5 "$out/digests.txt"
    if [ $rc -eq 0 ] && [ -f tests/data/digests/cuda.txt ]; then
      ST_SOURCE_DIR=$PWD "$bin/test_digests" --backend cuda >>"$out/digests.txt" 2>&1
      rc=$?
      tail -2 "$out/digests.txt"
    fi ;;
  demo)
    ST_BIN=$bin/sparsetrace ST_DEMO_BACKEND=cuda timeout 400 tools/demo.sh >"$out/demo.txt" 2>&1
    rc=$?
    tail -25 "$out/demo.txt" ;;
  bench)
    [ -f "$flash/model.safetensors" ] || python3 tools/make_flash_layer.py "$flash" --layers 2
    timeout 500 "$bin/bench_prefill" "$flash" "${BENCH_TOKENS:-8192,32768}" --backend cuda 2>&1 |
      tee "$out/bench.txt"
    rc=${PIPESTATUS[0]} ;;
  peer)
    [ -f "$flash/model.safetensors" ] || python3 tools/make_flash_layer.py "$flash" --layers 2
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/peer_flash_transformers.py "$flash" \
      "${PEER_TOKENS:-8k,16k}" 2>&1 | tee "$out/peer.txt" | grep -v Warning
    rc=${PIPESTATUS[0]} ;;
  *) echo "gpu_check: unknown step $step" >&2; rc=2 ;;
  esac
  echo "== $step: rc $rc, $((SECONDS - t0)) s"
done

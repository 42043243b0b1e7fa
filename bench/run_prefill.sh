#!/usr/bin/env bash
# CPU prefill benchmark of the reference engine; writes bench/prefill-results.md.
# Model: a random-weight DeepSeek-V4 in the shape of the bundled tiny model (4 layers: sliding,
# CSA, HCA, CSA; D 128, 4 heads of 128, window 128, 4 indexer heads of 128, top-k 64), made by
# tools/make_random_checkpoint.py. Usage: bench/run_prefill.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
model=$(mktemp -d)
store=$(mktemp -d)
trap 'rm -rf "$model" "$store"' EXIT
/usr/bin/python3 tools/make_random_checkpoint.py "$model" --index-heads 4 --topk 64 --window 128
bench="$build/bench/bench_prefill"
out=bench/prefill-results.md
{
  echo "# CPU prefill: tokens/s, peak memory, where the cost goes"
  echo
  echo "Command: \`bench/run_prefill.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), build $(git rev-parse --short HEAD))."
  echo "Each row is one prefill of N tokens in its own process (peak RSS is that run's)."
  echo "GFLOP counts the work the engine does (cost model in bench/bench_prefill.c); 'of peak' is"
  echo "against the cpu-ref matmul's own GFLOP/s measured first in the same invocation;"
  echo "'dense-attention GFLOP' is what attention would cost if every query saw every token."
  echo
  echo "## Context length (top-k 64)"
  echo
  "$bench" "$model" 1k,4k,16k,64k
  echo
  echo "## Top-k at 16k tokens"
  echo
  "$bench" "$model" 16k --set topk=512
  "$bench" "$model" 16k --set topk=all
  echo
  echo "## Recording overhead: every indexer tap armed (q, k, q_used, k_used, weights, scores, top-k of both CSA layers), written to HDF5"
  echo
  "$bench" "$model" 1k,4k,16k --tap 'layers.*.indexer.*' --store "$store"
  echo
  echo "Trace sizes: $(du -sh "$store" | cut -f1) for the three runs above."
} | tee "$out"

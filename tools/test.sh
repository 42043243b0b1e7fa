#!/usr/bin/env bash
# The test suite, as CI runs it: a normal build and an AddressSanitizer + UndefinedBehaviorSanitizer
# build, each running every ctest test. GPU tests exit 77 (skipped) where there is no GPU. Between
# the builds and the tests, every libFuzzer fuzzer (tools/fuzz.sh) runs ST_FUZZ_SECONDS (default 10),
# two at a time: about 2 minutes on 2 cores with the fuzz build. ctest's summary stays the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

echo "== build (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DST_SANITIZE=ON -DCMAKE_C_FLAGS=-O1 >/dev/null
cmake --build build-asan -j"$jobs"

echo "== build (GPU backends, compile only: nvcc -arch=sm_90a, hipcc --offload-arch=gfx90a)"
gpu_targets=(sparsetrace test_backend_ops test_engine test_digests bench_prefill)
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc" ]; then
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DST_WITH_CUDA=ON -DST_NVCC="$nvcc" >/dev/null
  if grep -q '^ST_CUDART:FILEPATH=.*NOTFOUND' build-cuda/CMakeCache.txt; then
    # an nvcc without its runtime library: the kernels compile, nothing can link against them
    cmake --build build-cuda -j"$jobs" --target st_kernels >/dev/null
    echo "cuda backend: kernels compiled, not linked (no CUDA runtime library beside $nvcc)"
  else
    cmake --build build-cuda -j"$jobs" --target "${gpu_targets[@]}" >/dev/null
    echo "cuda backend: built ($("$nvcc" --version | tail -1))"
  fi
else
  echo "cuda backend: SKIPPED (no nvcc on this machine: the CUDA toolkit is not a Debian package)"
fi
cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=RelWithDebInfo -DST_WITH_HIP=ON >/dev/null
cmake --build build-hip -j"$jobs" --target "${gpu_targets[@]}" >/dev/null
hip_version=$(hipcc --version 2>/dev/null | sed -n 's/^HIP version: //p' | head -1 | tr -d '\r' || true)
echo "hip backend: built (HIP ${hip_version:-version unknown})"

echo "== fuzz (libFuzzer, every parser of untrusted input, ${ST_FUZZ_SECONDS:-10} s each)"
tools/fuzz.sh "${ST_FUZZ_SECONDS:-10}"

echo "== tests, ASan + UBSan build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$PWD/tools/lsan.supp:print_suppressions=0 \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" \
  -E '^(test_digests|test_demo|test_needle_engine_sweeps|test_needle_engine_batch|test_needle_copy_probe|test_needle_adopt|test_needle_soup|test_needle_grow|test_needle_model)$'
# (the digest tests hold every tap's bits of 11 whole-model runs per backend, and test_demo runs
# tools/demo.sh's two 16k-token runs and its sweeps: pure arithmetic that the sanitizers slow 15x,
# past ctest's timeout or for over 25 minutes; they run in the normal build below, and the same
# code paths run under the sanitizers in test_engine, test_devemu_cli, test_replay, test_needle,
# test_scoreboard and the rest; test_needle_engine_sweeps tests a script's tables, and its 12
# needle sweep runs took 179 s there, the paths test_needle runs. The Python tools' tests --
# needle_engine_batch, needle_copy_probe, needle_adopt, needle_soup, needle_grow -- and
# test_needle_model drive `sparsetrace run` on the bundled models, the C paths test_engine,
# test_cli_run, test_needle and test_verdicts run under the sanitizers: 978 s there against 318 s
# in the normal build, on 2 cores, 2026-12-06. They run in the normal build below)
echo "== tests, RelWithDebInfo build"
ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs"

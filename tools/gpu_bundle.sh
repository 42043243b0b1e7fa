#!/usr/bin/env bash
# Builds the cuda backend here (-DST_WITH_CUDA=ON into build-cuda/, nvcc -arch=sm_90a) and
# collects the programs tools/gpu_check.sh runs, with the shared libraries a GPU machine may lack,
# into .bundle/ (ignored), and packs it into build-carry/bundle.tar.xz (4-5 MB: carry
# build-carry, and the working tree with every model still fits the 64 MiB a device call takes;
# bench/run_gpu.sh and tools/gpu_check.sh unpack it). Usage: tools/gpu_bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DST_WITH_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target sparsetrace test_backend_ops \
  test_engine test_digests bench_prefill >/dev/null
rm -rf .bundle
exes=("$build/sparsetrace" "$build/tests/test_backend_ops" "$build/tests/test_engine"
      "$build/tests/test_digests" "$build/bench/bench_prefill")
bundle=${ST_DEVICE_BUNDLE:-../shared/device/bundle}
"$bundle" .bundle "${exes[@]}"
# The GPU machine has its own libcurl (and the TLS, Kerberos and LDAP libraries under it): use it,
# which keeps the bundle and the working tree inside the 64 MiB a call carries.
(cd .bundle/lib && rm -f libcurl* libcrypto* libssl* libgnutls* libunistring* libp11-kit* libkrb5* \
  libk5crypto* libgssapi* libldap* liblber* libsasl2* libnettle* libhogweed* libgmp* libssh2* \
  libidn2* librtmp* libpsl* libnghttp2* libtasn1* libffi* libkeyutils* libcom_err* libbrotli*)
strip --strip-unneeded .bundle/bin/* .bundle/lib/* 2>/dev/null || true
mkdir -p build-carry
tar cJf build-carry/bundle.tar.xz .bundle
du -sh .bundle build-carry/bundle.tar.xz

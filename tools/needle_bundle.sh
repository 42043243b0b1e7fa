#!/usr/bin/env bash
# Builds sparsetrace here (CPU only, build/) and collects it with the shared libraries the GPU
# machine lacks into .bundle/ (ignored; carried), for tools/train_needle_gpu.sh's `needle make
# --batch`. Usage: tools/needle_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target sparsetrace >/dev/null
rm -rf .bundle
"${ST_DEVICE_BUNDLE:-../shared/device/bundle}" .bundle build/sparsetrace
# the GPU machine's own libcurl and what is under it (tools/gpu_bundle.sh)
(cd .bundle/lib && rm -f libcurl* libcrypto* libssl* libgnutls* libunistring* libp11-kit* libkrb5* \
  libk5crypto* libgssapi* libldap* liblber* libsasl2* libnettle* libhogweed* libgmp* libssh2* \
  libidn2* librtmp* libpsl* libnghttp2* libtasn1* libffi* libkeyutils* libcom_err* libbrotli*)
strip --strip-unneeded .bundle/bin/* .bundle/lib/* 2>/dev/null || true
du -sh .bundle

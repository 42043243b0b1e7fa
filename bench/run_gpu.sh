#!/usr/bin/env bash
# The GPU benchmark table of bench/gpu-results.md, in one device call (tools/gpu_bundle.sh here,
# carry build-carry): the checks first, then every figure side by side on the same GPU.
#
#   bench/run_gpu.sh OUT [STEP...]     steps: checks peaks prefill recording peer demo ncu
#                                       (default all but ncu)
#
# 1. test_backend_ops, test_engine on cuda, test_digests --backend cuda (against the committed
#    digests, 5 runs bit for bit)
# 2. bench/peak_torch.py: torch's bf16 matmul and fp8 _scaled_mm peaks, the device copy bandwidth
# 3. bench_prefill on the 2-layer V4-Flash-shaped model (tools/make_flash_layer.py): 8k in
#    reference and exact precision with ST_PROFILE (time per operation), then 32k and 128k
#    (reference, one process each) with decode; recording: 32k unprofiled without taps, then with
#    layers.*.indexer.* recorded at the last 64 positions
# 4. bench/peer_flash_transformers.py at 8k (DeepseekV4ForCausalLM, bf16; 16k runs out of memory)
# 5. tools/demo.sh with every run on cuda, when time is left
# ncu: Nsight Compute's speed-of-light, occupancy and warp-stall sections for the first launch of
#    the indexer scores, the sparse attention, the MoE GEMM and a dense GEMM at 8k (reference)
# Each step's output is in OUT (packed into OUT/results.tgz at the end, as the device tool brings
# back only a few files); the summary lines go to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/run_gpu.sh OUT [STEP...]}
shift
steps=" ${*:-checks peaks prefill recording peer demo} "
checks=${CHECKS:-ops engine digests}
want() { [[ $steps == *" $1 "* ]]; }
mkdir -p "$out"
[ -d .bundle ] || [ ! -f build-carry/bundle.tar.xz ] || tar xJf build-carry/bundle.tar.xz
export LD_LIBRARY_PATH=$PWD/.bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bin=$PWD/.bundle/bin flash=${FLASH_DIR:-/dev/shm/flash2}
SECONDS=0
step() { echo "== $1 ($SECONDS s)"; }
[ -f "$flash/model.safetensors" ] || python3 tools/make_flash_layer.py "$flash" --layers 2 >"$out/flash_gen.txt" 2>&1
if want checks; then
  step checks
  tools/gpu_check.sh "$out" $checks 2>&1 | grep -E "FAIL|summary|== |logits|greedy|same bits|digests"
fi
if want peaks; then
  step peaks
  timeout 120 python3 bench/peak_torch.py 8192,16384 2>&1 | tee "$out/peaks.txt" | grep -v Warning
fi
if want prefill; then
step prefill
for p in reference exact; do
  ST_PROFILE=1 timeout 90 "$bin/bench_prefill" "$flash" 8192 --backend cuda --set precision=$p >"$out/prefill8k_$p.txt" 2>&1
  grep -E "^\| 8192" "$out/prefill8k_$p.txt"
done
for t in 32768 131072; do # one process a length: each profile is that length's alone
  ST_PROFILE=1 timeout 150 "$bin/bench_prefill" "$flash" $t --backend cuda --set precision=reference \
    --decode 8 >"$out/prefill_$t.txt" 2>&1
  grep -E "^\| [0-9]|^  (indexer_scores|topk|sparse_attention|moe_experts|matmul) " "$out/prefill_$t.txt"
done
fi
if want recording; then
step recording
# side by side, neither profiled: the same 32k prefill without taps, then recording
timeout 120 "$bin/bench_prefill" "$flash" 32768 --backend cuda --set precision=reference \
  >"$out/prefill_notaps.txt" 2>&1
grep -E "^\| [0-9]" "$out/prefill_notaps.txt"
timeout 120 "$bin/bench_prefill" "$flash" 32768 --backend cuda --set precision=reference \
  --tap 'layers.*.indexer.*' --positions 32704: --store /tmp/st-bench >"$out/prefill_taps.txt" 2>&1
grep -E "^\| [0-9]" "$out/prefill_taps.txt"
fi
if want peer; then
step peer
FLASH_DIR=$flash PEER_TOKENS=8k tools/gpu_check.sh "$out" peer 2>&1 | grep -E "^\||transformers|== "
fi
if want ncu; then
  step ncu
  sections=(--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats)
  timeout 150 ncu --clock-control none --target-processes all "${sections[@]}" --launch-count 3 \
    -k 'regex:^(k_gemm_moe|k_sparse_attention_tc|k_indexer_scores_tc)$' \
    "$bin/bench_prefill" "$flash" 8192 --backend cuda --set precision=reference >"$out/ncu.txt" 2>&1
  timeout 100 ncu --clock-control none --target-processes all "${sections[@]}" --launch-skip 12 \
    --launch-count 1 -k 'regex:^k_gemm$' \
    "$bin/bench_prefill" "$flash" 8192 --backend cuda --set precision=reference >"$out/ncu_gemm.txt" 2>&1
  grep -hE "^  [a-z_]+<?|  k_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Stall|One or More" \
    "$out/ncu.txt" "$out/ncu_gemm.txt" | head -80
fi
if want demo && [ $SECONDS -lt 420 ]; then
  step demo
  tools/gpu_check.sh "$out" demo 2>&1 | tail -12
fi
step done
(cd "$out" && tar czf ../results.tgz . && mv ../results.tgz results.tgz && find . -type f ! -name results.tgz -delete)

#!/usr/bin/env bash
# issue 14 defect 7: config.json values are bounded and checked against the checkpoint's tensor
# shapes before anything is sized from them. Each mutated copy of the tiny oracle fixture must end
# with one clear message naming config.json, the field (and the tensor, for a shape mismatch),
# exit 1 or 2, within seconds, and no sanitizer report (CI runs this under ASan/UBSan too).
set -uo pipefail
st=${ST_BIN:?}
fixture=${ST_TEST_DATA:?}/oracle/tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
cp -r "$fixture" "$work/m"
echo '[1, 2, 3, 4, 5]' >"$work/prompt.json"

# mutate 'JSON-OBJECT-MERGED-INTO-CONFIG' PATTERN...: every pattern must appear in the message
mutate() {
  local patch=$1; shift
  python3 - "$fixture/config.json" "$work/m/config.json" "$patch" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for k, v in json.loads(sys.argv[3]).items():
    if isinstance(v, dict) and isinstance(c.get(k), dict):
        for k2, v2 in v.items():
            if isinstance(v2, dict) and isinstance(c[k].get(k2), dict): c[k][k2].update(v2)
            else: c[k][k2] = v2
    else: c[k] = v
json.dump(c, open(sys.argv[2], "w"))
PY
  local out rc
  out=$(timeout 30 "$st" run --model "$work/m" --prompt-tokens "$work/prompt.json" --max-new-tokens 2 \
        --store "$work/store" 2>&1); rc=$?
  rm -rf "$work/store"
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
    echo "FAIL: $patch: exit $rc (124: ran past 30 s): $out"; failures=$((failures + 1)); return
  fi
  if grep -qE 'runtime error|Sanitizer|out of memory' <<<"$out"; then
    echo "FAIL: $patch: $out"; failures=$((failures + 1)); return
  fi
  for p in config.json "$@"; do
    if ! grep -qF -- "$p" <<<"$out"; then
      echo "FAIL: $patch: message '$out' lacks '$p'"; failures=$((failures + 1)); return
    fi
  done
  echo "ok: $patch -> $out"
}

# bounds (the message gives the range)
mutate '{"num_attention_heads": 1000000000}' num_attention_heads '[1, 1024]'
mutate '{"num_attention_heads": 1e9}' num_attention_heads '[1, 1024]'
mutate '{"hidden_size": 1000000000}' hidden_size '[1, 65536]'
mutate '{"hc_sinkhorn_iters": 1e9}' hc_sinkhorn_iters '[1, 1000]'
mutate '{"vocab_size": 2147483647}' vocab_size
mutate '{"n_routed_experts": 100000}' n_routed_experts '[1, 4096]'
mutate '{"moe_intermediate_size": 2000000000}' moe_intermediate_size
mutate '{"head_dim": 100000}' head_dim
mutate '{"q_lora_rank": 1000000000}' q_lora_rank
mutate '{"o_lora_rank": 1000000000}' o_lora_rank
mutate '{"index_n_heads": 1000000000}' index_n_heads
mutate '{"index_topk": 2000000000}' index_topk
mutate '{"sliding_window": 2000000000}' sliding_window
mutate '{"hc_mult": 1000}' hc_mult
mutate '{"num_experts_per_tok": 1000, "n_routed_experts": 2000}' num_experts_per_tok
mutate '{"max_position_embeddings": 9000000000000000}' max_position_embeddings
mutate '{"rope_theta": 1e300}' rope_theta
mutate '{"swiglu_limit": 1e300}' swiglu_limit
mutate '{"rms_norm_eps": 5}' rms_norm_eps
mutate '{"compress_rates": {"compressed_sparse_attention": 1000000000}}' compress_rates
mutate '{"rope_parameters": {"compress": {"rope_type": "yarn", "type": "yarn", "factor": 1e300}}}' factor
# in range, but not what the checkpoint holds: named with the tensor, before any allocation
mutate '{"num_attention_heads": 1024}' num_attention_heads layers.0.attn.wq_b.weight
mutate '{"num_attention_heads": 8}' num_attention_heads layers.0.attn.wq_b.weight
mutate '{"hidden_size": 65536}' hidden_size embed.weight
mutate '{"vocab_size": 4000000}' vocab_size embed.weight
mutate '{"n_routed_experts": 4096}' n_routed_experts layers.0.ffn.gate.weight
mutate '{"n_routed_experts": 3}' n_routed_experts layers.0.ffn.gate.weight
mutate '{"num_experts_per_tok": 3}' num_experts_per_tok tid2eid
mutate '{"moe_intermediate_size": 262144}' moe_intermediate_size shared_experts.w1
mutate '{"q_lora_rank": 64}' q_lora_rank layers.0.attn.wq_a.weight
mutate '{"o_groups": 4}' o_groups layers.0.attn.wo_a.weight
mutate '{"index_n_heads": 1024}' index_n_heads indexer.wq_b.weight
mutate '{"hc_mult": 16}' hc_mult hc_head_base
# a per-layer tensor sized from the config (the CSA compressor's ape [ratio, 2d]): a shape error
# from the layer's load, not an allocation of what the config claims
mutate '{"compress_rates": {"compressed_sparse_attention": 65536}}' compress_rates layers.1.attn.compressor.ape

# the unmutated fixture still runs
cp "$fixture/config.json" "$work/m/config.json"
if "$st" run --model "$work/m" --prompt-tokens "$work/prompt.json" --max-new-tokens 2 --store "$work/store" >/dev/null 2>&1; then
  echo "ok: unmutated fixture runs"
else
  echo "FAIL: unmutated fixture"; failures=$((failures + 1))
fi
echo "$failures failure(s)"
[ $failures -eq 0 ]

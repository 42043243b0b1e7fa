#!/usr/bin/env bash
# CPU prefill side by side, one invocation, same machine, same cores: sparsetrace's cpu-ref and cpu
# backends against transformers' DeepseekV4ForCausalLM (fp32, eager) on the same checkpoint and
# token counts, every program pinned to the same CPUS with the same thread count. Prints each
# program's table, then the ratios (tokens/s of sparsetrace over transformers'). Needs torch and
# transformers (the GPU machine has them). Writes nothing; bench/cpu-peer-results.md holds the
# latest output with the command that made it.
#   bench/run_cpu_peer.sh BENCH_PREFILL [MODEL] [TOKENS] [CPUS]
set -euo pipefail
bench=$1
model=${2:-tests/data/oracle/tiny}
sizes=${3:-1k,4k,16k}
cpus=${4:-0,1}
threads=$(( $(echo "$cpus" | tr -cd , | wc -c) + 1 ))
export OMP_NUM_THREADS=$threads OMP_PROC_BIND=true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')); pinned to CPUs $cpus, $threads threads"
echo "model: $model; tokens: $sizes"
echo
for be in cpu-ref cpu; do
  echo "### sparsetrace --backend $be"
  taskset -c "$cpus" "$bench" "$model" "$sizes" --backend "$be" | tee "$tmp/$be.md"
  echo
done
echo "### transformers"
taskset -c "$cpus" python3 bench/peer_transformers.py "$model" "$sizes" --device cpu --threads "$threads" | tee "$tmp/hf.md"
echo
echo "### ratios (tokens/s over transformers' tokens/s)"
echo
echo "| tokens | transformers tok/s | cpu-ref tok/s | cpu-ref / transformers | cpu tok/s | cpu / transformers | cpu / cpu-ref |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
rows() { awk -F'|' '$2 ~ /^ *[0-9]+ *$/ && $4 ~ /[0-9]/ {gsub(/ /,"",$2); gsub(/ /,"",$4); print $2, $4}' "$1"; }
join <(rows "$tmp/hf.md" | sort) <(rows "$tmp/cpu-ref.md" | sort) | join - <(rows "$tmp/cpu.md" | sort) | sort -n |
  awk '{printf "| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f |\n", $1, $2, $3, $3/$2, $4, $4/$2, $4/$3}'

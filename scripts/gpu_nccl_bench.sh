#!/usr/bin/env bash
# On a GPU machine with >= 2 GPUs (needs PyTorch, no hetplan build): NCCL all-reduce, all-gather and
# reduce-scatter bus bandwidth against size (8 KiB .. 1 GiB) over the node's GPUs (NCCL_BENCH_GPUS, default
# all), once with NCCL's own algorithm choice and once each with NCCL_ALGO=Ring and NCCL_ALGO=Tree
# (all-reduce only uses Tree), and the GEMM slowdown while an all-reduce stream shares the SMs
# (scripts/gpu_nccl_bench.py). Under 3 minutes on 2 x H100. Results: $OUT/nccl_bench.tgz holding
# nccl_<algo>.json, nccl_<algo>.log and env.txt.
#   OUT=/tmp/out bash scripts/gpu_nccl_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out/nccl"
work=$out/nccl
source scripts/gpu_env.sh
n=${NCCL_BENCH_GPUS:-$(nvidia-smi -L | wc -l)}
{ nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; } \
  > "$work/env.txt" 2>&1
for algo in default Ring Tree; do
  ( [[ $algo == default ]] || export NCCL_ALGO=$algo
    [[ $algo == Tree ]] && export BENCH_ALLREDUCE_ONLY=1
    timeout 100 python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
      scripts/gpu_nccl_bench.py "$work/nccl_$algo.json" ) > "$work/nccl_$algo.log" 2>&1
  echo "$algo: rc $?"; tail -n 30 "$work/nccl_$algo.log"
done
tar -C "$out" -czf "$out/nccl_bench.tgz" nccl && rm -rf "$work"
ls -l "$out"

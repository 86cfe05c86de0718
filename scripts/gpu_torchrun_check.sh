#!/usr/bin/env bash
# On a 2-GPU machine (after scripts/gpu_build.sh; it sources scripts/gpu_env.sh):
# exports a 2-stage pipeline plan (one GPU per stage) with
# `hetplan export --to torchrun`, runs the two generated per-host scripts as two
# single-GPU "nodes" on this host (hosts 127.0.0.1 and 127.0.0.2 of the plan's
# hostfile, CUDA_VISIBLE_DEVICES=0 and 1, real torchrun: python3 -m
# torch.distributed.run, c10d rendezvous), then one `hetplan replay` of the same
# plan on both GPUs, and prints both iteration times and their ratio (goal:
# within 5%). Results under $1: plan.json, launch/ (scripts, logs), single.json,
# single.log, result.txt.
#
#   scripts/gpu_torchrun_check.sh OUT
set -uo pipefail
out=${1:?usage: scripts/gpu_torchrun_check.sh OUT}
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$PWD/build-gpu/hetplan
[ -x "$bin" ] || { echo "no $bin: run scripts/gpu_build.sh first" | tee "$out/result.txt"; exit 1; }
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 2 ] || { echo "needs 2 GPUs, found $gpus" | tee "$out/result.txt"; exit 1; }
type=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | grep -oE 'H200|H100|A100' | head -1)
type=${type:-H200}

# The plan: Metis's GPT shape (hidden 4096, seq 1024, vocab 51200, 32 heads)
# with 16 blocks, 8 per stage (about 50 GB per GPU), global batch 32 in 8
# micro-batches of 4, 1F1B; each stage on one GPU of its own "host". The
# stages compute ~40 TFLOP per micro-batch and send 32 MB of activations,
# so the p2p path (NCCL over shared memory between the two CUDA_VISIBLE_DEVICES
# "nodes", NVLink within the single replay) stays a small share.
printf '127.0.0.1 slots=1\n127.0.0.2 slots=1\n' >"$out/hostfile"
cat >"$out/clusterfile.json" <<EOF
{"127.0.0.1": {"instance_type": "$type", "inter_bandwidth": 50, "intra_bandwidth": 450, "memory": 80},
 "127.0.0.2": {"instance_type": "$type", "inter_bandwidth": 50, "intra_bandwidth": 450, "memory": 80}}
EOF
cat >"$out/plan.json" <<EOF
{"node_sequence": ["$type"], "device_groups": [1, 1], "strategies": [[1, 1], [1, 1]], "batches": 8,
 "layer_partition": [0, 9, 18], "gbs": 32, "cost": 0, "schedule": "1f1b",
 "model": {"num_layers": 18, "hidden_size": 4096, "sequence_length": 1024, "vocab_size": 51200, "attention_heads": 32},
 "hostfile": "$out/hostfile", "clusterfile": "$out/clusterfile.json"}
EOF
iters="--iters 20 --warmup 5"
port=$((29400 + RANDOM % 500))
"$bin" export --plan "$out/plan.json" --to torchrun --out "$out/launch" --rdzv-endpoint "127.0.0.1:$port" \
  --replay-args "$iters" | tee "$out/export.log" || exit 1

# Two "nodes": one launcher per generated script, one GPU each.
export TORCHRUN="python3 -m torch.distributed.run" HETPLAN="$bin"
t0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 400 bash "$out"/launch/launch_0_*.sh >"$out/launch/node0.log" 2>&1 & p0=$!
CUDA_VISIBLE_DEVICES=1 timeout 400 bash "$out"/launch/launch_1_*.sh >"$out/launch/node1.log" 2>&1 & p1=$!
wait $p0; r0=$?
wait $p1; r1=$?
echo "torchrun nodes: exit $r0 and $r1 after $(( $(date +%s) - t0 )) s"
tail -5 "$out/launch/node0.log"; tail -3 "$out/launch/node1.log"
tr_ms=$(grep -oE 'iteration_ms median [0-9.]+' "$out/launch/node0.log" | awk '{print $3}' | tail -1)

# One replay of the same plan on both GPUs (hetplan's own launcher).
CUDA_VISIBLE_DEVICES=0,1 timeout 400 "$bin" replay --plan "$out/plan.json" $iters --out "$out/single.json" \
  >"$out/single.log" 2>&1
rs=$?
tail -8 "$out/single.log"
single_ms=$(grep -oE '^iteration_ms: median [0-9.]+' "$out/single.log" | awk '{print $3}')

{
  echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0), torch $(python3 -c 'import torch; print(torch.__version__)')"
  echo "torchrun (2 nodes x 1 GPU): exit $r0/$r1, iteration_ms median ${tr_ms:-none}"
  echo "hetplan replay (1 launcher, 2 GPUs): exit $rs, iteration_ms median ${single_ms:-none}"
  if [ -n "${tr_ms:-}" ] && [ -n "${single_ms:-}" ]; then
    ratio=$(python3 -c "print(f'{$tr_ms / $single_ms:.4f}')")
    ok=$(python3 -c "print(int(0.95 <= $tr_ms / $single_ms <= 1.05))")
    echo "ratio torchrun / replay: $ratio ($([ "$ok" = 1 ] && echo PASS || echo FAIL): goal 0.95 to 1.05)"
  else
    echo "ratio: n/a (FAIL: a run reported no iteration time; see launch/node*.log and single.log)"
  fi
} | tee "$out/result.txt"

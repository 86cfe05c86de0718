#!/usr/bin/env bash
# Host-side micro-benchmarks of eager PyTorch for hetplan's host-time model (issue 32; sim/runtime_overheads.md):
# per-op, per-module, per-autograd-node, per-checkpoint-region, per-DDP-parameter, per-FSDP2-module,
# per-optimizer-tensor and per-decode-layer host costs, the CUDA graph replay floor, the op counts of the
# validation model's code at a tiny width, a DDP/FSDP2 memory census, and ZeRO-Offload's host figures (CPU
# AdamW, the fp32 -> bf16 cast, pinned copies: host_probe_offload.json) (scripts/gpu_host_probe.py). Each
# process pinned as the whatif validation's (scripts/host_pinning.py: its GPU's share of the cores; the offload
# figures with all of them); the cases whose differences the model reads are timed round-robin.
# No build needed. On a machine of two GPUs (kind nvidia-h200-x2 or nvidia-h100-x2); with one GPU the
# distributed part is skipped.
#
#   OUT=/some/dir bash scripts/gpu_host_probe.sh
#
# Results: $OUT/host_probe.tgz (host_probe_micro.json, host_probe_dist.json, host_probe_offload.json, logs,
# machine.txt) and the JSON files themselves. About 2 minutes; each step has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
work=$(mktemp -d)
res="$work/host_probe"
mkdir -p "$res" "$out"
[ -f scripts/gpu_env.sh ] && source scripts/gpu_env.sh
source scripts/gpu_lib.sh
t0=$SECONDS
echo "machine: $(gpu_machine)" | tee "$res/machine.txt"
{ lscpu | head -20; nvidia-smi; } >> "$res/machine.txt" 2>&1
ngpu=$(nvidia-smi -L | wc -l)

run() {  # run LIMIT_S NAME CMD...
  local limit=$1 name=$2; shift 2
  echo "== $name ($((SECONDS - t0)) s)"
  gpu_timed "$limit" "$res/$name.log" "$@"
  local rc=$?
  tail -40 "$res/$name.log"
  [ $rc -eq 0 ] || echo "!! $name: exit $rc"
}
run 150 micro python3 scripts/gpu_host_probe.py micro --out "$res"
if [ "$ngpu" -ge 2 ]; then
  run 150 dist python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_host_probe.py dist --out "$res"
else
  echo "!! one GPU: the DDP/FSDP2 part not measured"
fi
echo "total $((SECONDS - t0)) s"
tar czf "$out/host_probe.tgz" -C "$work" host_probe
cp "$res"/host_probe_*.json "$out/" 2>/dev/null
ls -l "$out"

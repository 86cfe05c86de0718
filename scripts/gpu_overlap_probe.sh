#!/usr/bin/env bash
# On a GPU machine with >= 2 GPUs (PyTorch only, no hetplan build; < 60 s): the compute slowdown beside overlapped
# fp32 reduce-scatters and bf16 all-gathers of replay's bucket sizes (scripts/gpu_overlap_probe.py), written as
# the comm_overlap.json that `hetplan simulate` and `search` read from a profile folder (sim/dp_overlap.md).
#
#   OUT=/tmp/out bash scripts/gpu_overlap_probe.sh [PROFILE_DIR ...]
#
# Writes $OUT/comm_overlap.json and $OUT/comm_overlap.log, and copies the JSON into each PROFILE_DIR given
# (created if missing), so every plan simulated from those profiles uses it. The GEMM shapes default to the
# GPT of issue 34's suite (hidden 2560, ffn 10240, 2 sequences of 2048 tokens) and the buckets to one of its
# blocks (12 h^2 parameters: 315 MB of fp32 gradients, 157 MB of bf16 weights); PROBE_ARGS passes others.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out"
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh
n=${PROBE_GPUS:-2}
t0=$SECONDS
# shellcheck disable=SC2086
timeout 120 python3 -m torch.distributed.run --standalone --nproc_per_node="$n" scripts/gpu_overlap_probe.py \
  --out "$out/comm_overlap.json" ${PROBE_ARGS:-} > "$out/comm_overlap.log" 2>&1
rc=$?
echo "gpu_overlap_probe: exit $rc in $((SECONDS - t0)) s"
if [[ $rc != 0 || ! -s $out/comm_overlap.json ]]; then
  tail -n 30 "$out/comm_overlap.log"
  echo "gpu_overlap_probe: no comm_overlap.json; the simulator keeps its default (kCommComputeSlowdown)"
  exit 1
fi
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("compute_slowdown", j["compute_slowdown"])' \
  "$out/comm_overlap.json"
for d in "$@"; do
  mkdir -p "$d" && cp "$out/comm_overlap.json" "$d/comm_overlap.json" && echo "copied into $d/"
done

#!/usr/bin/env bash
# On a GPU machine with >= 2 GPUs, all of them by default (PyTorch only, no hetplan build; ~10-20 s): the compute slowdown beside overlapped
# fp32 reduce-scatters and bf16 all-gathers of replay's bucket sizes (scripts/gpu_overlap_probe.py), written as
# the comm_overlap.json that `hetplan simulate` and `search` read from a profile folder (sim/dp_overlap.md).
#
#   OUT=/tmp/out bash scripts/gpu_overlap_probe.sh [PROFILE_DIR ...]
#
# Writes $OUT/comm_overlap.json and $OUT/comm_overlap.log, and copies the JSON into each PROFILE_DIR given
# (created if missing), so every plan simulated from those profiles uses it. The GEMM shapes default to the
# GPT of issue 34's suite (hidden 2560, ffn 10240, 2 sequences of 2048 tokens) and the buckets to one of its
# blocks (12 h^2 parameters: 315 MB of fp32 gradients, 157 MB of bf16 weights); PROBE_ARGS passes others
# (PROBE_ARGS="--ring-bytes 20971520" adds context parallelism's ring step: the GPT's 21 MB K/V at cp 2).
# PROBE_GPUS: how many GPUs (default: every GPU nvidia-smi lists). It fails fast rather than hangs: a collective
# that waits PROBE_NCCL_TIMEOUT_S (default 30) seconds aborts the ranks, and the whole probe is killed after
# PROBE_TIMEOUT_S (default 60) seconds; $OUT/comm_overlap.log then says, per rank, which step it reached.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out"
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh
n=${PROBE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
if [[ ! $n -ge 2 ]]; then
  echo "gpu_overlap_probe: needs >= 2 GPUs (PROBE_GPUS=${PROBE_GPUS:-unset}, nvidia-smi lists ${n:-none})"
  exit 1
fi
t0=$SECONDS
# shellcheck disable=SC2086
timeout --kill-after=5 "${PROBE_TIMEOUT_S:-60}" python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
  scripts/gpu_overlap_probe.py --out "$out/comm_overlap.json" --nccl-timeout-s "${PROBE_NCCL_TIMEOUT_S:-30}" \
  ${PROBE_ARGS:-} > "$out/comm_overlap.log" 2>&1
rc=$?
echo "gpu_overlap_probe: exit $rc in $((SECONDS - t0)) s on $n GPUs"
grep -h '\[rank [0-9]*/[0-9]* ' "$out/comm_overlap.log" | tail -n $((2 * n))
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

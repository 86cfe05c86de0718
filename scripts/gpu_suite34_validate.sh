#!/usr/bin/env bash
# On a GPU machine (the device tool): issue 34's validation suite, simulated then replayed.
#   2 GPUs (kind nvidia-h200-x2): scripts/validation/h200x2-suite34.json, 13 plans written before
#     measuring: interleaved 1F1B (pp 2 x v 2), ZeRO-2/3 with overlapped reduce-scatters and a ZeRO-1
#     baseline, sequence parallelism at tp 2, context parallelism at cp 2; the committed H200 profiles.
#   4 GPUs (kind nvidia-h200-x4 or nvidia-h100-x4): SUITE=scripts/validation/h200x4-suite34.json with
#     --profile (tp 4 profiles are not committed): pp 4 x v 2 against plain 1F1B, tp 4 with and without
#     sequence parallelism.
# Packs the run into $OUT/validate.tgz (scripts/gpu_validate.sh): predicted and measured time and per-rank
# memory per plan, with the time and memory MAPE and the machine. A fresh machine builds first
# (scripts/gpu_build.sh, a few minutes); pass --only NAME,NAME to split the suite over calls.
set -uo pipefail
cd "$(dirname "$0")/.."
export HETPLAN_DEADLINE_S=${HETPLAN_DEADLINE_S:-470}
exec bash scripts/gpu_validate.sh --suite "${SUITE:-scripts/validation/h200x2-suite34.json}" --iters 8 --warmup 2 "$@"

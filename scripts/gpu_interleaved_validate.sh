#!/usr/bin/env bash
# On a 2-GPU H200 machine (the device tool, kind nvidia-h200-x2): the interleaved-1F1B validation suite
# (scripts/validation/h200x2-interleaved.json, 8 plans written before measuring: pp 2 x v 2 and v 3 and
# the same pipelines under plain 1F1B), simulated then replayed, with the committed H200 profiles (no
# profiling). Packs the run into $OUT/validate.tgz (scripts/gpu_validate.sh). About 3-4 minutes once
# build-gpu/ exists; a fresh machine builds first (scripts/gpu_build.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
export HETPLAN_DEADLINE_S=${HETPLAN_DEADLINE_S:-470}
exec bash scripts/gpu_validate.sh --suite scripts/validation/h200x2-interleaved.json --iters 8 --warmup 2 "$@"

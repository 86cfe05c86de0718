#!/usr/bin/env bash
# Validates hetplan's predictions on real GPUs: simulate, then replay, each
# plan of a suite (any model, hostfile and layer count), and write a table of
# predicted against measured iteration time and per-rank peak memory, with
# each MAPE, under logs/. See scripts/validate_plans.py --help.
#
#   scripts/validate_plans.sh --suite scripts/validation/h200x2.json --bin build-gpu/hetplan --profile
#   scripts/validate_plans.sh --table logs/validate/<run> [--resimulate]
#
# On the GPU machines: build with scripts/gpu_build.sh first (this sources
# scripts/gpu_env.sh). Runs of the previous script (logs/validate/2026112*,
# plan<N>.json files) are kept as they were reported.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh
exec python3 scripts/validate_plans.py "$@"

#!/usr/bin/env bash
# On a GPU machine (the device tool, any kind; one GPU, < 1 minute, needs no build): checks that ATen's
# flash kernel masks bottom-right aligned when s_q < s_k (what replay's context-parallel attention relies
# on, profiler/context_parallel.cc) and times the old masked attention against the new per-chunk flash calls at the
# suite's cp 2 shapes. Writes $OUT/cp_attention.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
out=${OUT:-/tmp/out}
mkdir -p "$out"
timeout 300 python3 scripts/gpu_cp_attention_check.py 2>&1 | tee "$out/cp_attention.txt"
exit "${PIPESTATUS[0]}"

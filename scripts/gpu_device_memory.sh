#!/usr/bin/env bash
# Issue 33 item 3, on a 2-GPU machine (the device tool, kind nvidia-h100-x2 or
# nvidia-h200-x2): the device memory in use that `hetplan simulate` predicts
# per rank (allocated peak + allocator reserve + framework constant + NCCL,
# sim/device_memory.h) against what `hetplan replay` measures
# (cudaMemGetInfo's total - free, with the caching allocator's peak allocated
# and reserved), for the 14 plans of logs/validate/device-memory/plans/suite.json
# (committed before any was measured). Every plan is simulated before any is
# replayed (scripts/validate_plans.py), then scripts/device_memory_table.py
# writes the table and the MAPE.
#
#   bash scripts/gpu_device_memory.sh            (from the repo root; carry .deps, and build-gpu if built)
#
# Builds build-gpu/ first if it is missing (scripts/gpu_build.sh, ~2-4 min on
# 16 cores). Results: $OUT/device_memory.tgz (the run folder, with the table
# device_memory.md) and $OUT/device_memory.md. Stops replaying at
# HETPLAN_DEADLINE_S (default 450 s from the start) so it ends within 8 minutes;
# what finished is packed either way.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
t0=$SECONDS
if [[ ! -x build-gpu/hetplan ]]; then
  bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
fi
source scripts/gpu_env.sh
source scripts/gpu_lib.sh
export HETPLAN_MACHINE="$(gpu_machine 2>/dev/null)"
echo "machine: $HETPLAN_MACHINE"
run=logs/validate/device-memory/run-$(date -u +%Y%m%d-%H%M%S)
left=$(( ${HETPLAN_DEADLINE_S:-450} - SECONDS ))
# Memory settles in the first iterations: 2 warm-up and 3 timed iterations are enough for peaks.
timeout "$left" python3 scripts/validate_plans.py --suite logs/validate/device-memory/plans/suite.json \
  --bin build-gpu/hetplan --iters 3 --warmup 2 --out "$run" --report "$run/validate_table.md"
rc=$?
echo "validate_plans exit $rc after $((SECONDS - t0)) s"
python3 scripts/device_memory_table.py "$run" --out "$run/device_memory.md"
trc=$?
cp "$run/device_memory.md" "$out/device_memory.md" 2>/dev/null
{ nvidia-smi; nvidia-smi topo -m; } > "$run/machine.txt" 2>&1
tar czf "$out/device_memory.tgz" --exclude='*.trace.json' "$run" 2>/dev/null
echo "total $((SECONDS - t0)) s"
exit $trc

#!/usr/bin/env bash
# On a GPU machine (the device tool): build if needed, record the machine,
# run scripts/validate_plans.py with the given arguments, and pack the run
# folder, the profiles it wrote and the logs into $OUT/validate.tgz.
#
#   scripts/gpu_validate.sh --suite scripts/validation/h200x2.json --profile [--only ...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [[ ! -x build-gpu/hetplan ]]; then
  t0=$SECONDS
  bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
fi
source scripts/gpu_env.sh
source scripts/gpu_lib.sh
export HETPLAN_MACHINE="$(gpu_machine)"
echo "machine: $HETPLAN_MACHINE"
before=$(ls -d logs/validate/*/ 2>/dev/null | sort)
# Within the device call's limit: what finished is packed either way.
left=$(( ${HETPLAN_DEADLINE_S:-570} - SECONDS ))
timeout "$left" python3 scripts/validate_plans.py --bin build-gpu/hetplan "$@"
rc=$?
after=$(ls -d logs/validate/*/ 2>/dev/null | sort)
new=$(comm -13 <(echo "$before") <(echo "$after"))
{ nvidia-smi; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
tar czf "$out/validate.tgz" $new $(ls -d profiles/*/ 2>/dev/null) logs/validate_*.md "$out/machine.txt" 2>/dev/null
exit $rc

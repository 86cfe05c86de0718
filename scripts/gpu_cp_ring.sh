#!/usr/bin/env bash
# On a 2-GPU machine (the device tool, kind nvidia-h200-x2, carry [".deps"]), from the repo root: replay's
# ring attention for context parallelism (profiler/context_parallel.h) on issue 34's three cp plans, in one
# call under a deadline (DEADLINE_S, default 470 s from the start):
#   1. build build-gpu/ (scripts/gpu_build.sh; ~210 s on a fresh machine) unless SKIP_BUILD=1;
#   2. correctness: scripts/gpu_cp_equivalence.sh on DIR's cp plans (the ring's losses against the dp twin's
#      within the bf16 tolerance, and the no-exchange control outside it; ~70 s);
#   3. speed: each cp plan replayed (--iters 8 --warmup 2, as the suite) with the ring's default kernel
#      (cuDNN), then with HETPLAN_CP_ATTENTION=flash, and its dp twin (context_parallel removed: same
#      global batch): median iteration ms side by side, with the simulator's figure from DIR's *.sim.json
#      (that run's profiles: compare only where this machine's GPU is the one DIR names);
#   4. Kineto: gpt-cp2-m4 against its dp twin (scripts/gpu_replay_kineto.sh), if time is left.
#
#   OUT=/some/dir bash scripts/gpu_cp_ring.sh [DIR]     (DIR: default logs/validate/suite34-h100x2-run4)
#
# Results: $OUT/cp_ring.md (the tables), $OUT/cp_equivalence.md, $OUT/kineto_summary.md, $OUT/cp_ring.tgz
# (plans, logs, replay JSON). Exit 0 when every step ran; 1 when a replay or the build failed; the
# equivalence check's own status (0 equal, 1 different, 3 inconclusive) is in cp_equivalence.md.
# A dry run of the CPU-side parts: SKIP_BUILD=1 DRY_RUN=1 HETPLAN_BIN=build/hetplan GPU_TYPE=H100
# ITERS=1 WARMUP=0 REPLAY_FLAGS="--dtype fp32" bash scripts/gpu_cp_ring.sh (no equivalence, no Kineto).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_lib.sh
start=$SECONDS; deadline=${DEADLINE_S:-470}
out=${OUT:-/tmp/out}; dir=${1:-logs/validate/suite34-h100x2-run4}
work=$(mktemp -d); res="$work/cp_ring"; mkdir -p "$res" "$out"
table="$out/cp_ring.md"
bin=${HETPLAN_BIN:-build-gpu/hetplan}
left() { echo $((deadline - (SECONDS - start))); }
status=0

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  bash scripts/gpu_build.sh > "$res/build.log" 2>&1 || { tail -30 "$res/build.log"; exit 1; }
fi
if [[ ${DRY_RUN:-0} == 1 ]]; then
  gpu=${GPU_TYPE:-H100}; machine="dry run on $(hostname)"
else
  source scripts/gpu_env.sh
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00')
  machine=$(gpu_machine 2>/dev/null || nvidia-smi -L | head -1)
fi
gpu_local_hostfile "$gpu" "$res/local.hostfile" || { echo "no clusterfile address for $gpu" >&2; exit 1; }
echo "# Replay's cp ring attention ($machine); build $(git rev-parse --short HEAD 2>/dev/null); plans from $dir" > "$table"
echo "build: $((SECONDS - start)) s" >> "$table"

# 2. Correctness first: a fast ring that trains another model is worth nothing.
if [[ ${DRY_RUN:-0} != 1 ]]; then
  eq_limit=$(($(left) - 150)); ((eq_limit > 100)) && eq_limit=100  # 5 replays of ~12 s; leave the speed step ~150 s
  OUT="$out" SKIP_BUILD=1 timeout "$eq_limit" bash scripts/gpu_cp_equivalence.sh "$dir" > "$res/equivalence.log" 2>&1
  echo "cp equivalence (scripts/gpu_cp_equivalence.sh): exit $? after $((SECONDS - start)) s (0 equal, 1 different or failed, 3 inconclusive; tables in cp_equivalence.md)" >> "$table"
fi

# 3. Speed.
replay() {  # label, plan, hf config, [HETPLAN_CP_ATTENTION]
  local label=$1 plan=$2 hf=$3 kernel=${4:-}
  local limit; limit=$(left); ((limit > 60)) && limit=60
  ((limit < 15)) && { echo "- $label: not run (deadline)" >> "$res/runs.txt"; return 1; }
  HETPLAN_CP_ATTENTION=$kernel timeout "$limit" "$bin" replay --plan "$plan" --hf-config "$hf" --schedule 1f1b \
    --iters "${ITERS:-8}" --warmup "${WARMUP:-2}" ${REPLAY_FLAGS:-} --out "$res/$label.replay.json" > "$res/$label.log" 2>&1
  local rc=$?
  echo "- $label: exit $rc${kernel:+ (HETPLAN_CP_ATTENTION=$kernel)}" >> "$res/runs.txt"
  return $rc
}
# This build's simulator on DIR's own profiles (DIR/profiles/<folder>, as DIR's run measured them), where
# DIR has them: the prediction the new ring is checked against (DIR's *.sim.json predate this build).
resim() {  # name, hf config -> median ms or "-"
  local name=$1 hf=$2
  python3 - "$res/$name.plan.json" "$res/$name.resim.plan.json" "$dir" <<'PY' || { echo "-"; return; }
import json, os, sys
src, dst, d = sys.argv[1:4]
p = json.load(open(src))
folder = os.path.join(d, "profiles", os.path.basename(p["profile_dir"].rstrip("/")))
if not os.path.isdir(folder):
    sys.exit(1)
p["profile_dir"] = folder
json.dump(p, open(dst, "w"), indent=1)
PY
  "$bin" simulate --plan "$res/$name.resim.plan.json" --hf-config "$hf" --json "$res/$name.sim.json" > "$res/$name.sim.log" 2>&1 &&
    python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['iteration_ms'], 1))" "$res/$name.sim.json" || echo "-"
}
ms() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['iteration_ms']['median'], 1))" "$1" 2>/dev/null || echo "-"; }
sim_ms() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['iteration_ms'], 1))" "$1" 2>/dev/null || echo "-"; }
rows=()
for name in gpt-cp2-m4 llama-cp2-m4 llama-cp2-zero1-m4; do
  [[ -f "$dir/$name.plan.json" ]] || continue
  hf=$(python3 -c "import json; print(json.load(open('$dir/$name.meta.json'))['hf_config'])")
  gpu_localize_plan "$dir/$name.plan.json" "$res/$name.plan.json" 0 "$gpu" "$res/local.hostfile"
  gpu_localize_plan "$dir/$name.plan.json" "$res/$name-dp.plan.json" 1 "$gpu" "$res/local.hostfile"
  replay "$name" "$res/$name.plan.json" "$hf" || status=1
  replay "$name-flash" "$res/$name.plan.json" "$hf" flash || status=1
  replay "$name-dp" "$res/$name-dp.plan.json" "$hf" || status=1
  sim_new=$(resim "$name" "$hf"); ring=$(ms "$res/$name.replay.json")
  err=$(python3 -c "import sys; m, p = float(sys.argv[1]), float(sys.argv[2]); print(f'{(m - p) / m * 100:+.1f}%')" "$ring" "$sim_new" 2>/dev/null || echo "-")
  rows+=("| $name | $(sim_ms "$dir/$name.sim.json") | $sim_new | $ring | $err | $(ms "$res/$name-flash.replay.json") | $(ms "$res/$name-dp.replay.json") | $(ms "$dir/$name.replay.json") |")
done
{ echo; echo "| plan | simulated ms ($dir) | simulated ms (this build, $dir's profiles) | ring, default kernel (cuDNN) ms | error | ring, flash ms | dp twin ms | $dir's replay ms |"
  echo "|---|---|---|---|---|---|---|---|"; printf '%s\n' "${rows[@]}"; echo; cat "$res/runs.txt"
  echo; echo "Median of 8 iterations after 2 warmup. error = (ring - this build's simulation) / ring. Both simulated columns use"
  echo "$dir's profiles: comparable only where this machine's GPUs are the ones $dir names."; } >> "$table"

# 4. Kineto, if time is left.
if [[ ${DRY_RUN:-0} != 1 ]] && (($(left) > 80)); then
  OUT="$out" timeout $(($(left) - 10)) bash scripts/gpu_replay_kineto.sh "$dir" gpt-cp2-m4:dp > "$res/kineto.log" 2>&1
  echo "kineto: exit $? after $((SECONDS - start)) s (kineto_summary.md)" >> "$table"
fi
echo "total: $((SECONDS - start)) s" >> "$table"
tar czf "$out/cp_ring.tgz" -C "$work" cp_ring
cat "$table"
exit $status

#!/usr/bin/env bash
# On a 2-GPU machine (the device tool, kind nvidia-h200-x2), from the repo root: checks that replay's
# context-parallel attention (profiler/context_parallel.h) trains the same model as plain data
# parallelism, before a suite run relies on it. For the suite's cp 2 plans (GPT: learned positions;
# Llama: RoPE, grouped-query heads) it replays the plan and its dp twin (context_parallel removed: the
# same global batch, weights and data) for 5 iterations from the start (no warmup) and compares the
# per-iteration losses (replay JSON 'losses') within the bf16 tolerance of scripts/cp_equivalence_check.py.
# A control replays the GPT's cp plan with the K/V exchange taken out (HETPLAN_TEST_DISABLE=cp-kv-exchange:
# each rank attends to its own tokens only), which must land outside the tolerance, or the check could
# not tell. About 60 s after the build (5 replays of ~11 s, mostly start-up).
#
#   OUT=/some/dir bash scripts/gpu_cp_equivalence.sh [DIR]     (DIR: default logs/validate/suite34-h100x2-run2)
#
# Builds build-gpu/hetplan first (scripts/gpu_build.sh, needs .deps; incremental where build-gpu/ is kept:
# a binary left by an earlier call may predate this tree). Exit 0: both models
# equal and the control told apart; 1: a model's cp losses differ from its twin's (do not trust the cp
# rows of a suite run on this build), or a replay failed; 3: the control stayed inside the tolerance
# (inconclusive). Results: $OUT/cp_equivalence.md (the tables) and $OUT/cp_equivalence.tgz (plans, logs,
# replay JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_lib.sh
out=${OUT:-/tmp/out}; dir=${1:-logs/validate/suite34-h100x2-run2}
work=$(mktemp -d); res="$work/cp_equivalence"; mkdir -p "$res" "$out"
summary="$out/cp_equivalence.md"
# A dry run of this script on a CPU machine: SKIP_BUILD=1 (build-gpu/hetplan as it is), REPLAY_FLAGS="--dtype fp32".
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  bash scripts/gpu_build.sh > "$res/build.log" 2>&1 || { tail -30 "$res/build.log"; exit 1; }
fi
source scripts/gpu_env.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00')
gpu_local_hostfile "$gpu" "$res/local.hostfile" || { echo "no clusterfile address for $gpu" >&2; exit 1; }
echo "# Context-parallel replay against its dp twin ($(gpu_machine 2>/dev/null || nvidia-smi -L | head -1)); build $(git rev-parse --short HEAD 2>/dev/null)" > "$summary"

localize() { gpu_localize_plan "$1" "$2" "$3" "$gpu" "$res/local.hostfile"; }  # plan, output, drop_cp
replay() {  # label, plan file, hf config, [HETPLAN_TEST_DISABLE value]
  local label=$1 plan=$2 hf=$3 disable=${4:-}
  local t0=$SECONDS
  HETPLAN_TEST_DISABLE=$disable timeout 60 build-gpu/hetplan replay --plan "$plan" --hf-config "$hf" \
    --schedule 1f1b --warmup 0 --iters 5 ${REPLAY_FLAGS:-} --out "$res/$label.replay.json" > "$res/$label.log" 2>&1
  local rc=$?
  echo "- $label: replay exit $rc in $((SECONDS - t0)) s${disable:+ (HETPLAN_TEST_DISABLE=$disable)}" >> "$summary"
  return $rc
}

status=0
for name in gpt-cp2-m4 llama-cp2-m4; do
  hf=$(python3 -c "import json; print(json.load(open('$dir/$name.meta.json'))['hf_config'])")
  localize "$dir/$name.plan.json" "$res/$name.plan.json" 0
  localize "$dir/$name.plan.json" "$res/$name-dp.plan.json" 1
  replay "$name" "$res/$name.plan.json" "$hf" || { tail -20 "$res/$name.log"; status=1; continue; }
  replay "$name-dp" "$res/$name-dp.plan.json" "$hf" || { tail -20 "$res/$name-dp.log"; status=1; continue; }
  control=()
  if [[ $name == gpt-cp2-m4 ]]; then
    if replay "$name-no-kv-exchange" "$res/$name.plan.json" "$hf" cp-kv-exchange; then
      control=(--control "$res/$name-no-kv-exchange.replay.json")
    else tail -20 "$res/$name-no-kv-exchange.log"; status=1; fi
  fi
  python3 scripts/cp_equivalence_check.py "$res/$name.replay.json" "$res/$name-dp.replay.json" \
    ${control[@]+"${control[@]}"} --label "$name" >> "$summary" 2>&1
  rc=$?
  if [[ $rc -ne 0 && $status -ne 1 ]]; then status=$rc; fi
done
echo >> "$summary"; echo "exit status: $status (0 equal, 1 different or a replay failed, 3 inconclusive)" >> "$summary"
tar czf "$out/cp_equivalence.tgz" -C "$work" cp_equivalence
cat "$summary"
exit $status

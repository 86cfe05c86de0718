#!/usr/bin/env bash
# On a 2-GPU machine (the device tool, kind nvidia-h200-x2), from the repo root: Kineto traces of
# `hetplan replay` for a few plan files, one traced step each, and per-kernel breakdowns, to find where
# replay's step differs from the simulator's (issue 34's suite: cp and ZeRO-2/3 rows).
#
#   OUT=/some/dir bash scripts/gpu_replay_kineto.sh DIR NAME[:REF] ...
#
# DIR holds NAME.plan.json and NAME.meta.json (a validate_plans.py run folder, e.g.
# logs/validate/suite34-h100x2-run2). For NAME:REF the script also writes the kernel table of NAME
# against REF (REF "dp" means NAME's plan with context_parallel removed, i.e. the same plan at dp; "nosp" NAME's
# plan with sequence_parallel removed: its tp all-reduces against SP's all-gathers and reduce-scatters).
# Needs build-gpu/hetplan (built here first if missing). Results: $OUT/kineto.tgz (rank 0's traces,
# breakdowns and kernel tables) and $OUT/kineto_summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_lib.sh
out=${OUT:-/tmp/out}; dir=$1; shift
work=$(mktemp -d); res="$work/kineto"; mkdir -p "$res" "$out"
[[ -x build-gpu/hetplan ]] || bash scripts/gpu_build.sh > "$res/build.log" 2>&1 || { tail -30 "$res/build.log"; exit 1; }
source scripts/gpu_env.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00')
gpu_local_hostfile "$gpu" "$res/local.hostfile" || { echo "no clusterfile address for $gpu" >&2; exit 1; }
gpu_machine > "$res/machine.txt" 2>/dev/null || nvidia-smi -L > "$res/machine.txt"
summary="$out/kineto_summary.md"; echo "# Replay Kineto breakdowns ($(cat "$res/machine.txt" | head -1))" > "$summary"
localize() { gpu_localize_plan "$1" "$2" "$3" "$gpu" "$res/local.hostfile"; }  # plan, output, drop_cp
trace() {  # label, plan file, hf config
  local label=$1 plan=$2 hf=$3
  local sched; sched=$(python3 -c "import json; print(json.load(open('$plan')).get('schedule', '1f1b'))")
  HETPLAN_KINETO_DIR="$res/$label" timeout 90 build-gpu/hetplan replay --plan "$plan" --hf-config "$hf" \
    --schedule "$sched" --iters 3 --warmup 2 --out "$res/$label.replay.json" > "$res/$label.log" 2>&1
  echo "- $label: replay exit $? ($(python3 -c "import json; d=json.load(open('$res/$label.replay.json')); print(round(d.get('iteration_ms', d.get('median_iteration_ms', -1)), 1), 'ms')" 2>/dev/null))" >> "$summary"
  local t; t=$(ls "$res/$label"/*rank0*.json 2>/dev/null | head -1)
  [[ -n "$t" ]] && python3 scripts/gpu_zero3_race.py analyze --trace "$t" --label "$label rank0" >> "$summary" 2>&1
}
for item in "$@"; do
  name=${item%%:*}; ref=""; [[ "$item" == *:* ]] && ref=${item#*:}
  hf=$(python3 -c "import json; print(json.load(open('$dir/$name.meta.json'))['hf_config'])")
  localize "$dir/$name.plan.json" "$res/$name.plan.json" 0
  trace "$name" "$res/$name.plan.json" "$hf"
  if [[ -n "$ref" ]]; then
    if [[ "$ref" == dp ]]; then refname="$name-dp"; localize "$dir/$name.plan.json" "$res/$refname.plan.json" 1
      trace "$refname" "$res/$refname.plan.json" "$hf"
    elif [[ "$ref" == nosp ]]; then refname="$name-nosp"; localize "$dir/$name.plan.json" "$res/$refname.plan.json" sp
      trace "$refname" "$res/$refname.plan.json" "$hf"
    else refname=$ref; localize "$dir/$ref.plan.json" "$res/$ref.plan.json" 0; trace "$ref" "$res/$ref.plan.json" "$hf"; fi
    a=$(ls "$res/$name"/*rank0*.json 2>/dev/null | head -1); b=$(ls "$res/$refname"/*rank0*.json 2>/dev/null | head -1)
    if [[ -n "$a" && -n "$b" ]]; then
      { echo; echo "### $name against $refname (columns 'replay' = $name, 'FSDP2' = $refname)"; echo
        python3 scripts/gpu_zero3_race.py kernels --replay "$a" --fsdp2 "$b" --top 30; echo; } >> "$summary" 2>&1
    fi
  fi
done
find "$res" -name '*rank1*' -delete
tar czf "$out/kineto.tgz" -C "$work" kineto
cat "$summary"

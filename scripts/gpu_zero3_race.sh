#!/usr/bin/env bash
# Issue 34, "Replay speed": `hetplan replay`'s ZeRO-3 step (overlap on) against PyTorch FSDP2 (fully_shard,
# bf16 parameters, fp32 reduce) on the same model, batch and GPUs, side by side on one machine in one run.
# On a 2-GPU machine (the device tool, kind nvidia-h200-x2 or nvidia-h100-x2), from the repo root:
#
#   OUT=/some/dir bash scripts/gpu_zero3_race.sh
#
# Needs build-gpu/hetplan (scripts/gpu_build.sh; built here first if missing, which costs ~3-4 minutes).
# Model: the held-out GPT of scripts/gpu_whatif_validate.py (hidden 2048, 24 blocks, seq 2048, tied; ~1.3B
# parameters + positions), dp 2, 4 sequences per GPU (one micro-batch), bf16 weights, fp32 masters/reduce.
# Runs ROUNDS (default 3) rounds of one replay launch and one FSDP2 launch, in alternating order
# (replay first in odd rounds), each WARMUP (3) + ITERS (8) steps; then one Kineto-traced step of each
# (replay: HETPLAN_KINETO_DIR, where the binary has it; FSDP2: torch.profiler) and their breakdowns:
# compute, exposed all-gather / reduce-scatter, GPU idle (host gaps), host syncs, cudaMalloc/Free.
# Extras while the budget lasts: replay ZeRO-3 with overlapped reduce-scatters only (no prefetched gathers)
# and with neither, ZeRO-1 with and without overlapped reduce-scatters.
# Results: $OUT/summary.md (+ summary.json) and $OUT/zero3_race.tgz (all JSONs, logs, traces).
# Each step has its own time limit; the whole run stays under 5 minutes once built.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
work=$(mktemp -d)
res="$work/zero3_race"
mkdir -p "$res" "$out"
t0=$SECONDS
if [[ ! -x build-gpu/hetplan ]]; then
  bash scripts/gpu_build.sh > "$res/build.log" 2>&1 || { tail -30 "$res/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
fi
t0=$SECONDS  # the budget counts from here
[ -f scripts/gpu_env.sh ] && source scripts/gpu_env.sh
source scripts/gpu_lib.sh
bin=${HETPLAN_BIN:-build-gpu/hetplan}
rounds=${ROUNDS:-3} warmup=${WARMUP:-3} iters=${ITERS:-8} budget=${BUDGET_S:-285}
echo "machine: $(gpu_machine); hetplan ${HETPLAN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}" | tee "$res/machine.txt"
{ nvidia-smi; nvidia-smi topo -m; } >> "$res/machine.txt" 2>&1

py=(python3 scripts/gpu_zero3_race.py)
"${py[@]}" plan --out "$res/plan.json" --dp 2 --micro-batch 4
"${py[@]}" plan --out "$res/plan_no_overlap.json" --dp 2 --micro-batch 4 --no-overlap
step() {  # step LIMIT_S NAME CMD...: one launch, its log kept, never longer than LIMIT_S nor past the budget
  local limit=$1 name=$2; shift 2
  if [ "$(gpu_step_limit 20 "$budget" "$t0")" -lt 20 ]; then echo "!! $name skipped: budget spent"; return 1; fi
  limit=$(gpu_step_limit "$limit" "$budget" "$t0")
  echo "== $name ($((SECONDS - t0)) s)"
  gpu_timed "$limit" "$res/$name.log" "$@"
  local rc=$?
  grep -E "iteration_ms|fsdp2:|error|Error" "$res/$name.log" | tail -3
  [ $rc -eq 0 ] || { echo "!! $name: exit $rc"; tail -5 "$res/$name.log"; }
  return $rc
}
replay() {  # replay NAME PLAN ZERO [more flags]
  local name=$1 plan=$2 zero=$3; shift 3
  step 70 "$name" "$bin" replay --plan "$res/$plan.json" --device cuda --dtype bf16 --zero "$zero" \
    --iters "$iters" --warmup "$warmup" --out "$res/$name.json" "$@"
}
fsdp2() {  # fsdp2 NAME [more flags]
  local name=$1; shift
  step 80 "$name" python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_zero3_race.py \
    fsdp2 --micro-batch 4 --warmup "$warmup" --iters "$iters" --out "$res/$name.json" "$@"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    replay "replay_r$r" plan 3 --overlap-grad-reduce; fsdp2 "fsdp2_r$r"
  else
    fsdp2 "fsdp2_r$r"; replay "replay_r$r" plan 3 --overlap-grad-reduce
  fi
done
# One traced step of each (a short run: 2 warm-up steps, then the traced one).
HETPLAN_KINETO_DIR="$res/kineto-replay" step 60 replay_kineto "$bin" replay --plan "$res/plan.json" --device cuda \
  --dtype bf16 --zero 3 --overlap-grad-reduce --iters 1 --warmup 2 --out "$res/replay_kineto.json"
[ -d "$res/kineto-replay" ] || echo "!! this hetplan writes no Kineto trace (HETPLAN_KINETO_DIR): replay's own spans only"
step 70 fsdp2_kineto python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_zero3_race.py \
  fsdp2 --micro-batch 4 --warmup 2 --iters 1 --out "$res/fsdp2_kineto.json" --kineto-dir "$res/kineto-fsdp2"
[ -f "$res/replay_r1.trace.json" ] && "${py[@]}" spans --trace "$res/replay_r1.trace.json" > "$res/replay_spans.txt"
# Extras, while the budget lasts (not part of the race).
replay extra_zero3_reduce_overlap_only plan_no_overlap 3 --overlap-grad-reduce  # no prefetched gathers
replay extra_zero3_no_overlap plan_no_overlap 3
replay extra_zero1_overlap plan 1 --overlap-grad-reduce
replay extra_zero1_no_overlap plan_no_overlap 1
"${py[@]}" summary --dir "$res" --out "$res/summary.md" || true
cp "$res/summary.md" "$res/summary.json" "$out/" 2>/dev/null
echo "total $((SECONDS - t0)) s"
rm -rf "$res"/*.ranks
tar czf "$out/zero3_race.tgz" -C "$work" zero3_race
ls -l "$out"

#!/usr/bin/env bash
# On a 4-GPU machine (the device tool, kind nvidia-h100-x4), from the repo root: is issue 34's tp 4 GPT row
# pair (gpt-tp4-m4 104.8 ms, gpt-tp4-sp-m4 137.7 ms in logs/validate/suite34-h100x4-run1, iteration spreads
# 15.7% and 30.6%) host-paced, and how much of sequence parallelism's extra time is GPU work?
#
#   OUT=/some/dir bash scripts/gpu_tp4_host.sh [RUN_DIR]      (RUN_DIR: logs/validate/suite34-h100x4-run1)
#
# Device tool: run(command="OUT=$OUT bash scripts/gpu_tp4_host.sh", kind="nvidia-h100-x4", carry=[".deps"])
# (.deps as scripts/gpu_fetch_debs.sh fills it, for gpu_build.sh on a fresh machine; REPS=2 to save a minute).
#
# 1. Repeatability: the three tp 4 plans (gpt-tp4-m4, gpt-tp4-sp-m4, llama-tp4-sp-m4 as the GPU-bound control)
#    replayed untraced, in turn, REPS times (default 3) at 12 iterations after 3 warm-up ones. A GPU-bound
#    step repeats within ~1% (llama-tp4-sp-m4's micro-batch spans agreed to 0.2% in run 1); a host-paced one
#    varies run to run and span to span.
# 2. GPU work: one Kineto-traced step of gpt-tp4-sp-m4 against the same plan without sequence parallelism
#    (scripts/gpu_replay_kineto.sh NAME:nosp): the kernel time per class. If the SP plan's kernels add far
#    less than the ~33 ms its untraced step adds, the rest is the host (or GPU idle waiting on it).
# Results: $OUT/tp4host.tgz (replay JSONs, traces, logs), $OUT/tp4host_summary.md (printed at the end) and
# $OUT/kineto.tgz + $OUT/kineto_summary.md (step 2). Needs about 4-6 minutes on a fresh machine (it builds
# build-gpu first, about a minute).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_lib.sh
out=${OUT:-/tmp/out}; run=${1:-logs/validate/suite34-h100x4-run1}; reps=${REPS:-3}
work=$(mktemp -d); res="$work/tp4host"; mkdir -p "$res" "$out"
[[ -x build-gpu/hetplan ]] || bash scripts/gpu_build.sh > "$res/build.log" 2>&1 || { tail -30 "$res/build.log"; exit 1; }
source scripts/gpu_env.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00')
[[ $(nvidia-smi -L | wc -l) -ge 4 ]] || { echo "gpu_tp4_host.sh: needs 4 GPUs, found $(nvidia-smi -L | wc -l)" >&2; exit 1; }
gpu_local_hostfile "$gpu" "$res/local.hostfile" || { echo "no clusterfile address for $gpu" >&2; exit 1; }
gpu_machine > "$res/machine.txt" 2>/dev/null || nvidia-smi -L > "$res/machine.txt"
plans=(gpt-tp4-m4 gpt-tp4-sp-m4 llama-tp4-sp-m4)
for name in "${plans[@]}"; do
  gpu_localize_plan "$run/$name.plan.json" "$res/$name.plan.json" 0 "$gpu" "$res/local.hostfile"
done
for rep in $(seq 1 "$reps"); do
  for name in "${plans[@]}"; do
    hf=$(python3 -c "import json; print(json.load(open('$run/$name.meta.json'))['hf_config'])")
    timeout 120 build-gpu/hetplan replay --plan "$res/$name.plan.json" --hf-config "$hf" --schedule 1f1b \
      --iters 12 --warmup 3 --out "$res/$name.rep$rep.replay.json" > "$res/$name.rep$rep.log" 2>&1
    echo "$name rep $rep: exit $?" >> "$res/exits.txt"
  done
done
python3 - "$res" "$reps" "${plans[@]}" > "$out/tp4host_summary.md" <<'PY'
import json, os, statistics as st, sys
res, reps, plans = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"# tp 4 host-pace check ({open(os.path.join(res, 'machine.txt')).readline().strip()})\n")
print("| plan | rep | median ms | min | max | spread | forward spans ms (rank 0) | backward spans ms (rank 0) |")
print("|---|---|---|---|---|---|---|---|")
for name in plans:
    for rep in range(1, reps + 1):
        f = os.path.join(res, f"{name}.rep{rep}.replay.json")
        if not os.path.exists(f):
            print(f"| {name} | {rep} | failed | | | | | |")
            continue
        it = json.load(open(f))["iteration_ms"]
        spans = {"forward": [], "backward": []}
        for t in (f[: -len(".json")] + ".trace.json", f[: -len(".replay.json")] + ".replay.trace.json"):
            if os.path.exists(t):
                for e in json.load(open(t))["traceEvents"]:
                    if e.get("ph") == "X" and e.get("pid") == 0 and e.get("name") in spans:
                        spans[e["name"]].append(round(e["dur"] / 1e3, 2))
                break
        print(f"| {name} | {rep} | {it['median']:.1f} | {it['min']:.1f} | {it['max']:.1f} | {100 * it['spread']:.1f}% "
              f"| {spans['forward']} | {spans['backward']} |")
PY
tar czf "$out/tp4host.tgz" -C "$work" tp4host
OUT="$out" bash scripts/gpu_replay_kineto.sh "$run" gpt-tp4-sp-m4:nosp > "$res/kineto.out" 2>&1 || tail -20 "$res/kineto.out"
cat "$out/tp4host_summary.md"
echo; cat "$out/kineto_summary.md" 2>/dev/null | head -80

#!/usr/bin/env bash
# On a machine of as many GPUs as the suite's hostfile has (the device tool: kind nvidia-h200-x2 for the 2-GPU
# suite, nvidia-h200-x4 for SUITE=scripts/validation/h200x4-suite34.json), from the repo root, in one call:
#   1. build build-gpu/ (scripts/gpu_build.sh; a fresh machine: ~3-4 minutes) unless it is built;
#   2. scripts/gpu_cp_attention_check.sh: the flash kernel's bottom-right causal mask that replay's cp
#      attention relies on, and the old against the new cp attention's time (< 1 minute; time-limited);
#   3. issue 34's suite (SUITE, default the 13-plan scripts/validation/h200x2-suite34.json; each written
#      before measuring) on
#      FRESH profiles: `hetplan profile` of this build measures both models into profiles/fresh/<model
#      folder> (not the committed profiles/), then every plan is simulated from them before any replay,
#      then replayed (scripts/validate_plans.py; --iters 8 --warmup 2 as scripts/gpu_suite34_validate.sh).
# Everything runs under one deadline, DEADLINE_S (default 530) seconds from the start: what finished is
# packed, and $OUT/summary.txt names the plans not run.
#
#   OUT=/some/dir [SUITE=...] [DEVICE_KIND=nvidia-h200-x4] bash scripts/gpu_suite34_fresh.sh [--only NAME,NAME]
#       [--no-cp-check]
#
# The GPU count is the suite's hostfile's (the sum of its slots); the script stops unless nvidia-smi lists at
# least that many. The suite is written for H200 (the clusterfile's node 0.0.0.6); where the device lends H100s
# for the kind, the same plans run on hostfiles/h100_<count>.hostfile (node 0.0.0.5) with H100 profiles. The run
# folder is logs/validate/suite34-<type>x<count>-run<RUN_NUMBER> (e.g. suite34-h100x4-run1; RUN_NUMBER defaults to
# the first that no folder in logs/validate/ has); a RUN_NAME given has its <type>x<count> part (e.g. h200x4)
# set to what ran. DEVICE_KIND (the kind the device
# call named) heads the machine line. The 4-GPU suite on a fresh nvidia-h200-x4 (an estimate, ~450 s):
#   SUITE=scripts/validation/h200x4-suite34.json DEVICE_KIND=nvidia-h200-x4 DEADLINE_S=500 \
#     OUT=$OUT bash scripts/gpu_suite34_fresh.sh --no-cp-check
#
# Expected on a fresh 2 x H200: build ~210 s, cp check ~40 s, profiles ~100 s (run 1's logs: 46-51 s a
# model), 13 plans ~180 s (run 1: 11-15 s a replay): ~530 s. Give the device call timeout_s 600.
# A follow-up call for plans the deadline cut: unpack the first call's suite.tgz in the repo root (its
# profiles/fresh/ is git-ignored: name it in the call's carry), and run
#   RUN_NAME=suite34-h200x2-run2b [SUITE=...] bash scripts/gpu_suite34_fresh.sh --no-cp-check --only NAME,NAME
# which reuses profiles/fresh/ (it profiles only when a model's folder there is empty).
# Set HETPLAN_COMMIT to the commit run (the device's copy of .git may be stale).
# Results: $OUT/suite.tgz (logs/validate/$RUN_NAME/ with the table, profiles/fresh/, the logs) and
# $OUT/summary.txt (machine, timings, the table).
# DRY_RUN=1 (checking the CPU-side parts here): no build, no nvidia-smi, no cp check; HETPLAN_BIN names
# the binary (e.g. build/hetplan), GPU_TYPE=H100 takes the H100 path; put profiles in profiles/fresh/
# first and a small DEADLINE_S, or the CPU replays run until the deadline.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
deadline=${DEADLINE_S:-530}
suite_src=${SUITE:-scripts/validation/h200x2-suite34.json}
[[ -f $suite_src ]] || { echo "gpu_suite34_fresh: SUITE=$suite_src: no such file" >&2; exit 2; }
fresh=profiles/fresh
only="" cp_check=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --no-cp-check) cp_check=0; shift ;;
    *) echo "gpu_suite34_fresh: unknown argument $1 (expected --only NAME,NAME or --no-cp-check)" >&2; exit 2 ;;
  esac
done
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" >> "$summary"; }
# The GPUs the suite's plans use: the sum of its hostfile's slots.
gpus=$(python3 - "$suite_src" <<'PY'
import json, re, sys
host = json.load(open(sys.argv[1]))["hostfile"]
print(sum(int(m.group(1)) for line in open(host) for m in [re.search(r"slots=(\d+)", line.split("#")[0])] if m))
PY
) || { echo "gpu_suite34_fresh: cannot read the hostfile of $suite_src" >&2; exit 2; }
if [[ -z "${DRY_RUN:-}" ]]; then
  have=$(nvidia-smi -L | grep -c '^GPU')
  if [[ $have -lt $gpus ]]; then
    echo "gpu_suite34_fresh: $suite_src needs $gpus GPUs (its hostfile); nvidia-smi lists $have" | tee "$summary"
    exit 1
  fi
fi
bin=${HETPLAN_BIN:-build-gpu/hetplan}
if [[ -z "${DRY_RUN:-}" && ! -x build-gpu/hetplan ]]; then
  t0=$SECONDS
  bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  say "built in $((SECONDS - t0)) s"
fi
[[ -z "${DRY_RUN:-}" ]] && source scripts/gpu_env.sh
source scripts/gpu_lib.sh
if [[ -z "${DRY_RUN:-}" ]]; then
  machine=$(gpu_machine)
else
  machine="dry run: $(hostname); $(nproc) CPU cores"
fi
# The GPUs' type as hostfiles/clusterfile.json names it: the suite is written for H200 (node 0.0.0.6); where
# the device lends H100s for the kind, the same plans run on the clusterfile's H100 node (0.0.0.5) with
# profiles of the H100 (the run folder and the profile folders say which).
gpu_type=${GPU_TYPE:-H200}
if [[ -z "${DRY_RUN:-}" ]] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100; then
  gpu_type=H100
fi
run_tag="${gpu_type,,}x${gpus}"
if [[ -z "${RUN_NAME:-}" && -z "${RUN_NUMBER:-}" ]]; then
  RUN_NUMBER=1  # the first number no run folder (committed ones included) has yet
  while [[ -e logs/validate/suite34-${run_tag}-run$RUN_NUMBER ]]; do RUN_NUMBER=$((RUN_NUMBER + 1)); done
fi
run_name=${RUN_NAME:-suite34-${run_tag}-run${RUN_NUMBER}}
run_name=$(sed -E "s/h[0-9]+x[0-9]+/${run_tag}/" <<< "$run_name")
export HETPLAN_MACHINE="${machine}; hetplan ${HETPLAN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
say "machine: $HETPLAN_MACHINE"
say "suite: $suite_src on $gpus x $gpu_type; run folder logs/validate/$run_name"

if [[ $cp_check == 1 && -z "${DRY_RUN:-}" ]]; then
  t0=$SECONDS
  OUT="$out" timeout 120 bash scripts/gpu_cp_attention_check.sh > /dev/null 2>&1
  say "cp attention check: exit $? in $((SECONDS - t0)) s ($out/cp_attention.txt)"
fi

# The suite with each model's profile folder moved under profiles/fresh/ (same folder names).
mkdir -p build-gpu/suite34 "$fresh"
suite="build-gpu/suite34/$(basename "$suite_src")"
python3 - "$suite_src" "$suite" "$fresh" "$gpu_type" "$gpus" <<'EOF'
import json, os, sys
src, dst, fresh, gpu, gpus = sys.argv[1:6]
s = json.load(open(src))
for m in s["models"].values():
    folder = os.path.basename(os.path.normpath(m["profiles"]))
    m["profiles"] = os.path.join(fresh, folder.replace("H200", gpu))
s["_about"] = s.get("_about", "") + " [Run on fresh profiles: " + fresh + ", measured by this build.]"
if gpu != "H200":
    # The committed one-node hostfile of this type and count (hostfiles/h100_4.hostfile: the clusterfile's
    # H100 node, 0.0.0.5), else one written beside the suite.
    host = f"hostfiles/{gpu.lower()}_{gpus}.hostfile"
    if not os.path.exists(host):
        addr = next(a for a, v in json.load(open(s["clusterfile"])).items() if v["instance_type"] == gpu)
        host = os.path.join(os.path.dirname(dst), f"{gpu.lower()}_{gpus}.hostfile")
        open(host, "w").write(f"# One node of {gpus} {gpu} GPUs (the device lent {gpu}s).\n{addr} slots={gpus}\n")
    s["hostfile"] = host
    s["_about"] += f" [On {gpus} x {gpu}: hostfile {host}.]"
json.dump(s, open(dst, "w"), indent=1)
EOF
need_profile=0
for d in $(python3 -c "import json,sys; print(' '.join(m['profiles'] for m in json.load(open('$suite'))['models'].values()))"); do
  ls "$d"/DeviceType.*.json > /dev/null 2>&1 || need_profile=1
done
profile_flag=()
if [[ $need_profile == 1 ]]; then
  profile_flag=(--profile)
  say "profiling afresh into $fresh/"
else
  say "reusing the profiles in $fresh/"
fi
# The compute slowdown beside overlapped collectives (scripts/gpu_overlap_probe.sh, < 60 s), measured on these
# GPUs before any plan is simulated and copied into each model's profile folder as comm_overlap.json, which
# `hetplan simulate` reads (sim/dp_overlap.md, "SM sharing"); NO_OVERLAP_PROBE=1 skips it (the simulator then
# keeps its default factor).
if [[ -z "${DRY_RUN:-}" && -z "${NO_OVERLAP_PROBE:-}" ]]; then
  t0=$SECONDS
  # shellcheck disable=SC2046
  # With the cp ring's step (the GPT's 21 MB K/V at cp 2; ran on 2 x H100: logs/validate/ring-probe-h100x2) unless
  # PROBE_ARGS says otherwise: the simulator's ring stretch then comes from it, not from the all-gather's.
  OUT="$out/overlap_probe" PROBE_GPUS=$gpus PROBE_ARGS="${PROBE_ARGS---ring-bytes 20971520}" bash scripts/gpu_overlap_probe.sh \
    $(python3 -c "import json; print(' '.join(m['profiles'] for m in json.load(open('$suite'))['models'].values()))") \
    > "$out/overlap_probe.txt" 2>&1
  say "overlap probe: exit $? in $((SECONDS - t0)) s: $(grep compute_slowdown "$out/overlap_probe.txt" | head -1)"
fi
work="logs/validate/$run_name"
left=$(( deadline - SECONDS ))
say "suite: $left s left for profiling, simulating and replaying"
t0=$SECONDS
timeout "$left" python3 scripts/validate_plans.py --bin "$bin" --suite "$suite" --iters "${ITERS:-8}" \
  --warmup "${WARMUP:-2}" --out "$work" --report "$work/report.md" ${only:+--only "$only"} "${profile_flag[@]}" \
  > "$out/validate.log" 2>&1
rc=$?
say "validate_plans: exit $rc in $((SECONDS - t0)) s"
# What the deadline cut (a replay that wrote no result), and the table of what finished.
python3 - "$work" >> "$summary" 2>&1 <<'EOF'
import json, os, sys
work = sys.argv[1]
order = json.load(open(f"{work}/order.json")) if os.path.exists(f"{work}/order.json") else []
missing = [n for n in order if not os.path.exists(f"{work}/{n}.replay.json")]
print("plans simulated:", len(order), "; replayed:", len(order) - len(missing))
print("not replayed:", ",".join(missing) if missing else "none")
EOF
if [[ -f "$work/order.json" && ! -f "$work/table.md" ]]; then
  python3 scripts/validate_plans.py --table "$work" --report "$work/table.md" > /dev/null 2>&1
fi
[[ -f "$work/table.md" ]] && cat "$work/table.md" >> "$summary"
cp "$suite" "$work/" 2>/dev/null
tar czf "$out/suite.tgz" "$work" "$fresh" "$out/validate.log" $( [[ -f "$out/build.log" ]] && echo "$out/build.log") \
  $( [[ -f "$out/cp_attention.txt" ]] && echo "$out/cp_attention.txt") 2>/dev/null
cat "$summary"
exit $rc

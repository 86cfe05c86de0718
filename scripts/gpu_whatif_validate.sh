#!/usr/bin/env bash
# issue 32, item 6: `hetplan whatif` against plain PyTorch, all measured side by side on one machine of two GPUs
# (kind nvidia-h200-x2 or nvidia-h100-x2; carry [".deps"] for the build).
#
#   OUT=/some/dir scripts/gpu_whatif_validate.sh            (FRESH_PROBE=0: measure and compare only, no build;
#                                                            BUILD=0: use an existing build-gpu/hetplan)
#
# In order, one device call:
#   1. scripts/gpu_build.sh (LibTorch build into build-gpu/; needs .deps/);
#   2. the host probe of THIS machine, trimmed to what hetplan's host model reads
#      (scripts/gpu_host_probe.py micro|dist --model-only; issue 32 item 1: the probe measures the machine), and
#      ZeRO-Offload's host figures (CPU AdamW, the cast, pinned copies: host_probe_offload.json);
#      pinned as the cases are (HOST_PIN, below); and the GPU's compute stretch beside overlapped fp32
#      reductions (scripts/gpu_overlap_probe.sh at the GPT's shapes and DDP's 25 MiB buckets: comm_overlap.json,
#      which whatif --profiles reads for DDP's all-reduces beside the backward);
#   3. scripts/whatif_validate_predict.py --host-probe <that probe> -> predictions_<GPU>_probe.json, written BEFORE
#      anything is measured (its UTC time and sha256 go to predictions_probe.log and into $OUT at once);
#   4. the measurements (scripts/gpu_whatif_validate.py): a ~1.3B GPT (hidden 2048, 24 blocks, seq 2048),
#      micro-batch 1 and 4, with and without activation checkpointing: single-GPU AMP, DDP (2 GPUs), FSDP2 (2 GPUs);
#      CPU-offloaded Adam (ZeRO-Offload's path, one GPU, micro-batch 4); decode of a Llama-3.2-3B shape at batch 1
#      in eager mode and with CUDA graphs; and a DDP and FSDP2 memory census of the same GPT (bytes per phase);
#      Around each case (REPROBE=1, the default): a short probe of the host's speed (about 1 s; 3 s for decode), the
#      case's own prediction with that speed (whatif --host-speed) written and logged (UTC, sha256) BEFORE the case
#      is built, then the case, then the short probe again: the host's drift over the case, in the summaries;
#   5. summaries: summary<_tag>.md per committed scripts/validation/whatif/predictions_<GPU>[_tag].json,
#      summary_probe.md for the fresh-probe predictions, summary_reprobe.md for the per-case re-probed ones.
# Nothing in steps 1-3 reads a measurement of step 4; no constant is set from them.
# Results: $OUT/whatif_validate.tgz (everything), $OUT/predictions_<GPU>_probe.json, $OUT/summary*.md.
# Each step has its own time limit, and all stay inside BUDGET_S (default 450 s) from the start.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
# The work folder is outside $OUT (the device tool brings back at most 8 files): $OUT gets the tarball and the
# summaries only.
work=$(mktemp -d)
res="$work/whatif_validate"
mkdir -p "$res" "$out"
[ -f scripts/gpu_env.sh ] && source scripts/gpu_env.sh
source scripts/gpu_lib.sh
t0=$SECONDS
machine=$(gpu_machine)
echo "machine: $machine" | tee "$res/machine.txt"
{ nvidia-smi; nvidia-smi topo -m; lscpu | head -20; } >> "$res/machine.txt" 2>&1

# The catalogue entry of GPU 0 (the same longest-name match hetplan's profiler uses).
gpu=$(python3 scripts/gpu_catalogue_entry.py name)
echo "catalogue GPU: $gpu"
ngpu=$(nvidia-smi -L | wc -l)

# Host pinning (scripts/host_pinning.py; HOST_PIN=0 turns it off): every process that drives one GPU runs on that
# GPU's share of the cores with one CPU thread per core -- the probe's tiny steps on GPU 0's, each DDP/FSDP2 rank on
# its own -- and the CPU-offloaded Adam (and the probe's measurement of it) on all of them, so that the probe and
# the cases it predicts run on the same cores with the same thread settings.
if [ "${HOST_PIN:-1}" = 1 ]; then pin=(--pin share); else pin=(--pin none); fi
py=(python3 scripts/gpu_whatif_validate.py)
budget=${BUDGET_S:-450}  # 7.5 minutes (one process per training case adds ~80 s): the kernel profile, last, then the census are skipped or cut first
run() {  # run LIMIT_S NAME CMD...: one step, its log kept, never longer than LIMIT_S nor past the budget
  local limit=$1 name=$2; shift 2
  limit=$(gpu_step_limit "$limit" "$budget" "$t0")
  if [ "$limit" -lt 10 ]; then echo "!! $name: skipped (the ${budget} s budget is spent)"; return 1; fi
  echo "== $name ($((SECONDS - t0)) s, limit $limit s)"
  gpu_timed "$limit" "$res/$name.log" "$@"
  local rc=$?
  tail -8 "$res/$name.log"
  [ $rc -eq 0 ] || echo "!! $name: exit $rc"
  return $rc
}

# 1-3: build, probe this host, predict with its figures: all before the first measurement.
probe_pred=""
if [ "${FRESH_PROBE:-1}" = 1 ]; then
  if { [ "${BUILD:-1}" = 0 ] && [ -x build-gpu/hetplan ]; } || run 150 build bash scripts/gpu_build.sh; then
    mkdir -p "$res/host_probe"
    run 75 probe_micro python3 scripts/gpu_host_probe.py micro --model-only "${pin[@]}" --out "$res/host_probe"
    if [ "$ngpu" -ge 2 ]; then
      run 75 probe_dist python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_host_probe.py dist \
        --model-only "${pin[@]}" --out "$res/host_probe"
      # The GPU's compute stretch beside overlapped fp32 reductions (DDP's all-reduces beside the backward;
      # sim/dp_overlap.md): the validation GPT's GEMMs (hidden 2048, ffn 8192, a sequence of 2048 tokens) beside
      # chains of DDP's 25 MiB buckets (6553600 fp32 gradients), ~10-20 s; whatif --profiles reads it.
      run 40 probe_overlap env OUT="$res/overlap" PROBE_GPUS=2 PROBE_TIMEOUT_S=35 \
        PROBE_ARGS="--hidden 2048 --ffn 8192 --tokens 2048 --reduce-params 6553600" bash scripts/gpu_overlap_probe.sh
    fi
    overlap=()
    [ -s "$res/overlap/comm_overlap.json" ] && overlap=(--profiles "$res/overlap")
    if [ -f "$res/host_probe/host_probe_micro.json" ]; then
      pp="$res/predictions_${gpu}_probe.json"
      if run 60 predict_probe python3 scripts/whatif_validate_predict.py --bin build-gpu/hetplan --gpu "$gpu" \
           --host-probe "$res/host_probe/host_probe_micro.json" "${overlap[@]}" --out "$pp"; then
        probe_pred=$pp
        { echo "written $(date -u +%Y-%m-%dT%H:%M:%SZ), before any measurement"
          sha256sum "$pp" "$res"/host_probe/host_probe_*.json "$res"/overlap/comm_overlap.json 2>/dev/null; } \
          | tee "$res/predictions_probe.log"
        cp "$pp" "$res/predictions_probe.log" "$out/"
      fi
    fi
  fi
  [ -n "$probe_pred" ] || echo "!! no fresh-probe predictions (see the build/probe/predict logs)"
fi
# The host's speed re-probed around each case (gpu_whatif_validate.py, class Reprobe): a short probe, the case's
# prediction with whatif --host-speed written to $res/reprobe/<case>.json (UTC time and sha256 appended to
# predictions_probe.log) BEFORE the case is built, then the case, then the probe again (its drift).
reprobe=()
if [ -n "$probe_pred" ] && [ "${REPROBE:-1}" = 1 ]; then
  reprobe=(--reprobe-dir "$res/reprobe" --reprobe-bin build-gpu/hetplan --reprobe-gpu "$gpu"
           --reprobe-probe "$res/host_probe/host_probe_micro.json" --reprobe-log "$res/predictions_probe.log")
  [ -s "$res/overlap/comm_overlap.json" ] && reprobe+=(--reprobe-profiles "$res/overlap")
fi
# Each case in its own process, as a user's training job is: an earlier case in the same process left FSDP2's
# unsharded bf16 copy of the model (2.45 GiB) allocated into the next case's peak in runs 6 and 7, through
# gc.collect() and empty_cache() (release_previous_case); a fresh process starts from nothing.
cases="mb1-ckpt0 mb1-ckpt1 mb4-ckpt0 mb4-ckpt1"
dist_run=(python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_whatif_validate.py)
for c in $cases; do
  run 30 "single-$c" "${py[@]}" train --mode single --cases "$c" "${pin[@]}" --out "$res" "${reprobe[@]}"
done
if [ "$ngpu" -ge 2 ]; then
  for mode in ddp fsdp2; do
    for c in $cases; do
      run 40 "$mode-$c" "${dist_run[@]}" train --mode "$mode" --cases "$c" "${pin[@]}" --out "$res" "${reprobe[@]}"
    done
  done
else
  echo "!! one GPU: DDP and FSDP2 not measured"
fi
run 100 offload "${py[@]}" train --mode offload --cases mb4-ckpt0 --warmup 2 --iters 6 "${pin[@]}" --out "$res" "${reprobe[@]}"
run 80 decode "${py[@]}" decode --runtimes eager,graphs "${pin[@]}" --out "$res" "${reprobe[@]}"
if [ "$ngpu" -ge 2 ]; then  # after the timed cases: a diagnosis, compared with nothing (skipped when the budget is spent)
  run 60 memory_census python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_whatif_validate.py \
    memory-census "${pin[@]}" --out "$res"
fi
# Last, in its own process: one profiled step per single-GPU batch size (a diagnosis: kernels' GPU time against
# the wall, gpu_kernels_single.json; the summary prints it). About 15 s; the first step cut when the budget is spent.
run 30 kernels "${py[@]}" kernels --cases mb1-ckpt0,mb4-ckpt0 "${pin[@]}" --out "$res"

# Every committed prediction set for this GPU: predictions_<GPU>.json -> summary.md, predictions_<GPU>_<tag>.json
# -> summary_<tag>.md (_calibrated: with profiles/<GPU>'s calibration; _run3: the host-time model's defaults).
found=0
for pred in scripts/validation/whatif/predictions_"${gpu}".json scripts/validation/whatif/predictions_"${gpu}"_*.json; do
  [ -f "$pred" ] || continue
  found=1
  kind=${pred#scripts/validation/whatif/predictions_"${gpu}"}
  kind=${kind%.json}
  "${py[@]}" summary --pred "$pred" --meas "$res" --machine "$machine" --out "$res/summary${kind}.md" || true
done
[ $found -eq 1 ] || echo "!! no scripts/validation/whatif/predictions_${gpu}*.json: nothing to compare with"
if [ -n "$probe_pred" ]; then
  "${py[@]}" summary --pred "$probe_pred" --meas "$res" --machine "$machine" --out "$res/summary_probe.md" || true
  cp "$res/summary_probe.md" "$out/" 2>/dev/null
fi
if [ -d "$res/reprobe" ]; then
  "${py[@]}" summary --pred-dir "$res/reprobe" --meas "$res" --machine "$machine" --out "$res/summary_reprobe.md" || true
  cp "$res/summary_reprobe.md" "$out/" 2>/dev/null
  cp "$res/predictions_probe.log" "$out/"  # now with every case's line
fi
echo "total $((SECONDS - t0)) s"
tar czf "$out/whatif_validate.tgz" -C "$work" whatif_validate
ls -l "$out"

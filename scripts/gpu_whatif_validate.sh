#!/usr/bin/env bash
# issue 32, item 6: `hetplan whatif` against plain PyTorch, all measured side by side on one machine of two GPUs
# (kind nvidia-h100-x2; an H200 pair works too). No build needed: the predictions were written and committed
# before measuring (scripts/whatif_validate_predict.py -> scripts/validation/whatif/predictions_<GPU>[_calibrated].json);
# this script only measures (scripts/gpu_whatif_validate.py) and compares (its `summary`).
#
#   OUT=/some/dir scripts/gpu_whatif_validate.sh
#
# Cases: a ~1.3B GPT (hidden 2048, 24 blocks, seq 2048), micro-batch 1 and 4, with and without activation
# checkpointing: single-GPU AMP, DDP (2 GPUs), FSDP2 (2 GPUs); CPU-offloaded Adam (ZeRO-Offload's path, one
# GPU, micro-batch 4); decode of a Llama-3.2-3B shape at batch 1 in eager mode and with CUDA graphs.
# Results: $OUT/whatif_validate.tgz (measurements, logs, machine) and $OUT/summary.md (+ summary_<tag>.md for each
# predictions_<GPU>_<tag>.json: _calibrated with profiles/H200's calibration, _run3 with the host-time model).
# Each step has its own time limit; the whole run stays under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
# The work folder is outside $OUT (the device tool brings back at most 8 files): $OUT gets the tarball and the
# summaries only.
work=$(mktemp -d)
res="$work/whatif_validate"
mkdir -p "$res" "$out"
[ -f scripts/gpu_env.sh ] && source scripts/gpu_env.sh
t0=$SECONDS
machine=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | paste -sd';')
torchv=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
machine="${DEVICE_KIND:-GPU machine}: ${machine}; torch ${torchv}; $(nproc) CPU cores"
echo "machine: $machine" | tee "$res/machine.txt"
{ nvidia-smi; nvidia-smi topo -m; lscpu | head -20; } >> "$res/machine.txt" 2>&1

# The catalogue entry of GPU 0 (the same longest-name match hetplan's profiler uses).
gpu=$(python3 scripts/gpu_catalogue_entry.py name)
echo "catalogue GPU: $gpu"
ngpu=$(nvidia-smi -L | wc -l)

py=(python3 scripts/gpu_whatif_validate.py)
run() {  # run LIMIT_S NAME CMD...: one step, its log kept, never longer than LIMIT_S
  local limit=$1 name=$2; shift 2
  echo "== $name ($((SECONDS - t0)) s)"
  timeout --kill-after=10 "$limit" "$@" > "$res/$name.log" 2>&1
  local rc=$?
  tail -8 "$res/$name.log"
  [ $rc -eq 0 ] || echo "!! $name: exit $rc"
}
cases=mb1-ckpt0,mb1-ckpt1,mb4-ckpt0,mb4-ckpt1
run 80 single "${py[@]}" train --mode single --cases $cases --out "$res"
if [ "$ngpu" -ge 2 ]; then
  run 110 ddp python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_whatif_validate.py train --mode ddp --cases $cases --out "$res"
  run 110 fsdp2 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu_whatif_validate.py train --mode fsdp2 --cases $cases --out "$res"
else
  echo "!! one GPU: DDP and FSDP2 not measured"
fi
run 100 offload "${py[@]}" train --mode offload --cases mb4-ckpt0 --warmup 2 --iters 4 --out "$res"
run 70 decode "${py[@]}" decode --runtimes eager,graphs --out "$res"

# Every committed prediction set for this GPU: predictions_<GPU>.json -> summary.md, predictions_<GPU>_<tag>.json
# -> summary_<tag>.md (_calibrated: with profiles/<GPU>'s calibration; _run3: the host-time model's defaults).
found=0
for pred in scripts/validation/whatif/predictions_"${gpu}".json scripts/validation/whatif/predictions_"${gpu}"_*.json; do
  [ -f "$pred" ] || continue
  found=1
  kind=${pred#scripts/validation/whatif/predictions_"${gpu}"}
  kind=${kind%.json}
  "${py[@]}" summary --pred "$pred" --meas "$res" --machine "$machine" --out "$res/summary${kind}.md" || true
  cp "$res/summary${kind}.md" "$out/" 2>/dev/null
done
[ $found -eq 1 ] || echo "!! no scripts/validation/whatif/predictions_${gpu}*.json: nothing to compare with"
echo "total $((SECONDS - t0)) s"
tar czf "$out/whatif_validate.tgz" -C "$work" whatif_validate
ls -l "$out"

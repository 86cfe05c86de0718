#!/usr/bin/env bash
# Issue 32's transfer validation, the GPU part (one call per GPU kind; all
# prediction happens later, on a CPU, in scripts/transfer_tables.sh):
#   1. build if needed (scripts/gpu_build.sh);
#   2. probe this GPU whole and restricted to 66 SMs (hetplan gpu-probe --out);
#   3. profile the two models (a GPT-2 and a Llama shape, tp 1, bs 1,2,4) on it:
#      the profile files record the kernel classes the transfer scales;
#   4. replay the plans of logs/validate/transfer/plans/<TYPE>/ and
#      <TYPE>-66sm/ (written and committed before anything was measured);
#   5. pack everything into $OUT/transfer_<TYPE>.tgz.
# The type comes from nvidia-smi (H100 or H200). Within HETPLAN_DEADLINE_S
# (default 450 s) of the start: what does not fit is skipped and reported;
# a second call on the same warm machine goes on where the first stopped
# (finished profiles and replays are kept in the working tree).
#
#   scripts/gpu_transfer_validate.sh            (kind nvidia-h200, then nvidia-h100-x1; carry .deps)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
deadline=${HETPLAN_DEADLINE_S:-450}
out=${OUT:-/tmp/out}
mkdir -p "$out"
left() { local l=$(( deadline - (SECONDS - start) )); (( l < 1 )) && l=1; echo $l; }  # never 0: timeout 0 is no limit
if [[ ! -x build-gpu/hetplan ]]; then
  t0=$SECONDS
  bash scripts/gpu_build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "built in $((SECONDS - t0)) s"
fi
source scripts/gpu_env.sh
bin=build-gpu/hetplan
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) type=H200 ;;
  *H100*) type=H100 ;;
  *) echo "gpu_transfer_validate: unexpected GPU '$name' (H100 or H200)"; exit 1 ;;
esac
machine="${DEVICE_KIND:-GPU machine}: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1); torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)'); $(nproc) CPU cores"
echo "machine: $machine (type $type)"
work=logs/validate/transfer/measured-$type
mkdir -p "$work"
echo "$machine" > "$work/MACHINE.txt"
log=$work/log.txt

pack() {
  { nvidia-smi; } > "$work/nvidia-smi.txt" 2>&1
  tar czf "$out/transfer_$type.tgz" "$work" profiles/transfer/measured-*-"$type" 2>/dev/null
  echo "packed $out/transfer_$type.tgz ($(( SECONDS - start )) s)"
}
trap pack EXIT

# 2. The probe (what converts between GPUs), whole GPU and 66 SMs.
if [[ ! -f profiles/transfer/probe-$type/gpu_probe.$type-66sm.json ]]; then
  timeout "$(left)" $bin gpu-probe --out "profiles/transfer/probe-$type" --device-type "$type" --sms 0,66 --iters 8 \
    >> "$log" 2>&1 || echo "probe failed (see $log)"
  mkdir -p "$work/probe" && cp profiles/transfer/probe-$type/*.json "$work/probe/" 2>/dev/null
fi

# 3. Profiles of each model on this GPU.
declare -A cfg=([gpt2-2560-10l]=scripts/validation/gpt2-2560-10l.json [llama-3.2-1b-8l]=scripts/validation/llama-3.2-1b-8l.json)
for m in gpt2-2560-10l llama-3.2-1b-8l; do
  dir=profiles/transfer/measured-$m-$type
  [[ -f $dir/DeviceType.${type}_tp1_bs4.json ]] && continue
  layers=$(python3 -c "import json; c=json.load(open('${cfg[$m]}')); print(int(c.get('n_layer', c.get('num_hidden_layers'))) + 2)")
  (( $(left) > 60 )) || { echo "skipped profile $m: out of time"; continue; }
  echo "+ profile $m" | tee -a "$log"
  timeout "$(left)" $bin profile --hf-config "${cfg[$m]}" --num-layers "$layers" --seq-len 2048 --tp 1 --bs 1,2,4 \
    --iters 6 --device-type "$type" --out "$dir" >> "$log" 2>&1 || echo "profile $m failed (see $log)"
  cp profiles/transfer/probe-$type/*.json "$dir/" 2>/dev/null
done

# 4. Replays of the plans written before any measurement.
for t in "$type" "$type-66sm"; do
  for plan in logs/validate/transfer/plans/$t/*.plan.json; do
    n=$(basename "$plan" .plan.json)
    r=$work/$t.$n.replay.json
    [[ -f $r ]] && continue
    (( $(left) > 40 )) || { echo "skipped replay $t/$n: out of time"; continue; }
    hf=$(python3 -c "import json; print(json.load(open('$plan'))['hf_config'])")
    echo "+ replay $t/$n" | tee -a "$log"
    timeout "$(left)" $bin replay --plan "$plan" --hf-config "$hf" --iters 5 --warmup 2 --out "$r" >> "$log" 2>&1 \
      || { echo "replay $t/$n failed (see $log)"; rm -f "$r"; }
  done
done
echo "done: $(ls $work/*.replay.json 2>/dev/null | wc -l) replays in $work"

#!/usr/bin/env bash
# issue 32: `hetplan whatif` on the published DeepSpeed setups the issue quotes (Llama-2-7B on V100 and MI210,
# sequence 350, micro-batch 1), beside the figures the issue gives: ZeRO-3 measured 1.6-5x slower than the
# previous (bandwidth-only) prediction, ZeRO-3 with parameter offload 1.7-6x slower than ZeRO-2 with offload.
# The raw published tables were not found (see logs/whatif_deepspeed_published.md); this prints the ratios
# that can be checked against the issue's ranges, with the previous predictions (logs/whatif_published.md).
#   scripts/whatif_deepspeed_published.sh [HETPLAN_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
HET=${1:-build-nt/hetplan}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# DeepSpeed's defaults, and the configs the issue names: ZeRO-3 at bucket sizes 1e8, and ZeRO-3 + offload.
cat > "$tmp/z3_1e8.json" <<'J'
{"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1,
 "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e8, "stage3_prefetch_bucket_size": 1e8,
                       "stage3_param_persistence_threshold": 1e5, "stage3_max_live_parameters": 1e9}}
J
cat > "$tmp/z3_off.json" <<'J'
{"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1,
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                       "offload_param": {"device": "cpu", "pin_memory": true}}}
J
echo "| setup | ZeRO-3 ms (previous) | ZeRO-3 ms now | now / previous (issue: measured 1.6-5x the previous) | ZeRO-3 @1e8 ms | ZeRO-2+offload ms | ZeRO-3+offload ms | ZeRO-3+offload / ZeRO-2+offload (issue: 1.7-6x) | ds_config ZeRO-3+offload (pinned) ms |"
echo "|---|---|---|---|---|---|---|---|---|"
row() {  # label gpu gpus previous_zero3_ms
  local label=$1 gpu=$2 gpus=$3 prev=$4
  local base=(--hf-config tests/data/hf/llama-2-7b.json --gpu "$gpu" --gpus "$gpus" --seq 350 --precision fp16)
  "$HET" whatif "${base[@]}" --rows "ZeRO-3,ZeRO-2+offload,ZeRO-3+offload" --json "$tmp/d.json" > /dev/null
  "$HET" whatif "${base[@]}" --deepspeed-config "$tmp/z3_1e8.json" --rows ds_config --json "$tmp/b.json" > /dev/null
  "$HET" whatif "${base[@]}" --deepspeed-config "$tmp/z3_off.json" --rows ds_config --json "$tmp/o.json" > /dev/null
  python3 - "$tmp" "$label" "$prev" <<'PY'
import json, sys
t, label, prev = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = {r["strategy"]: r for r in json.load(open(f"{t}/d.json"))["rows"]}
b = json.load(open(f"{t}/b.json"))["rows"][0]
o = json.load(open(f"{t}/o.json"))["rows"][0]
z3, z2o, z3o = d["ZeRO-3"]["step_ms"], d["ZeRO-2+offload"]["step_ms"], d["ZeRO-3+offload"]["step_ms"]
print(f"| {label} | {prev:.0f} | {z3:.0f} | {z3 / prev:.2f}x | {b['step_ms']:.0f} | {z2o:.0f} | {z3o:.0f} | {z3o / z2o:.2f}x | {o['step_ms']:.0f} |")
PY
}
row "Llama-2-7B, 8 x V100 32GB, seq 350, mb 1" V100 8 470
row "Llama-2-7B, 2 x MI210 64GB, seq 350, mb 1" MI210 2 351
row "Llama-2-7B, 3 x MI210 64GB, seq 350, mb 1" MI210 3 369

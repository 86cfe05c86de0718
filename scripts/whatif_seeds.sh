#!/usr/bin/env bash
# Issue 10's seed setups through `hetplan whatif`, as a markdown table of time per step and peak memory per
# GPU (logs/whatif_published.md puts it beside the published measurements).
#   scripts/whatif_seeds.sh [HETPLAN_BINARY] [--profiles DIR ...extra whatif flags]
set -euo pipefail
cd "$(dirname "$0")/.."
HET=${1:-build/hetplan}
shift || true
EXTRA=("$@")
H=tests/data/hf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
run() {  # label, whatif args...
  local label=$1
  shift
  n=$((n + 1))
  "$HET" whatif "$@" "${EXTRA[@]}" --json "$tmp/$n.json" > /dev/null
  python3 - "$tmp/$n.json" "$label" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["rows"]:
    name = r.get("strategy") or r.get("weights")
    if not r.get("offered", True):
        print(f"| {sys.argv[2]} | {name} | not offered: {r['not_offered']} | | |")
    elif "step_ms" in r:
        print(f"| {sys.argv[2]} | {name} | {r['step_ms']:.0f} ms/step | {r['memory_per_gpu_bytes'] / 2**30:.2f} GiB | {'yes' if r['fits'] else 'no'} |")
    else:
        print(f"| {sys.argv[2]} | {name} | TTFT {r['ttft_ms']:.1f} ms, {r['decode_ms_per_token']:.2f} ms/token | {r['total_bytes'] / 2**30:.2f} GiB | {'yes' if r['fits'] else 'no'} |")
PY
}
echo "| setup | row | time | memory/GPU | fits |"
echo "|---|---|---|---|---|"
R7="ZeRO-2+offload,ZeRO-3,ZeRO-3+offload,8-bit base+8-bit Adam+GC"
run "Llama-2-7B, 8 x V100 32GB, seq 350, mb 1" --hf-config $H/llama-2-7b.json --gpu V100 --gpus 8 --seq 350 --rows "$R7"
run "Llama-2-7B, 2 x MI210 64GB, seq 350, mb 1" --hf-config $H/llama-2-7b.json --gpu MI210 --gpus 2 --seq 350 --rows "$R7"
run "Llama-2-7B, 3 x MI210 64GB, seq 350, mb 1" --hf-config $H/llama-2-7b.json --gpu MI210 --gpus 3 --seq 350 --rows "$R7"
run "Llama-3.2-3B, 1 x RTX 5090, batch 4, seq 512, LoRA r=8 qkvo" --hf-config $H/llama-3.2-3b.json --gpu RTX5090 \
  --gpus 1 --micro-batch 4 --seq 512 --lora-rank 8 --lora-targets qkvo \
  --rows "LoRA,LoRA+GC,QLoRA,QLoRA+GC,LoRA+ZeRO-2,LoRA+ZeRO-3,QLoRA+ZeRO-2,QLoRA+ZeRO-3"
run "Llama-3.2-3B inference, 1 x RTX 5090, batch 1, prompt 512, output 128" --inference \
  --hf-config $H/llama-3.2-3b.json --gpu RTX5090 --micro-batch 1 --weights fp16,nf4
for m in gpt2-xl llama-3.1-70b; do
  for p in bf16 fp8; do
    run "$m, 8 x H200, seq 2048, mb 1, $p" --hf-config $H/$m.json --gpu H200 --gpus 8 --seq 2048 --flash-attention \
      --precision $p --rows "single GPU,DDP,FSDP"
    run "$m, 8 x H200, seq 2048, mb 1, $p, ckpt every 2nd block" --hf-config $H/$m.json --gpu H200 --gpus 8 \
      --seq 2048 --flash-attention --precision $p --recompute full --recompute-every 2 --rows "single GPU,DDP,FSDP"
  done
done

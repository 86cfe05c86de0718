#!/usr/bin/env bash
# Must-show of issue 13: replay's throughput on a single-GPU plan within 10%
# of plain PyTorch training of the same model and batch (AMP bf16, fused
# AdamW, SDPA), both measured in this one run on this GPU.
#
# On the GPU machine, after scripts/gpu_build.sh and `source scripts/gpu_env.sh`:
#   scripts/gpu_throughput_check.sh OUT_DIR [gpt|llama ...]
# For each shape (default: gpt llama) it writes OUT_DIR/<shape>.plan.json,
# <shape>.replay.json (hetplan replay: bf16 weights, fp32 main grads and
# masters, Adam fused on CUDA, 1 rank), <shape>.plain.json
# (scripts/plain_pytorch_train.py) and a table OUT_DIR/throughput.md with
# tokens/s of both and their ratio; exit status 1 if a ratio is below 0.90.
# Env: HETPLAN_BIN (default build-gpu/hetplan), MB (micro-batch, 4),
# ACCUM (micro-batches per step, 2), ITERS (10), WARMUP (3).
set -euo pipefail
out=${1:?usage: scripts/gpu_throughput_check.sh OUT_DIR [gpt|llama ...]}
shift
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(gpt llama)
cd "$(dirname "$0")/.."
mkdir -p "$out"
bin=${HETPLAN_BIN:-build-gpu/hetplan}
mb=${MB:-4} accum=${ACCUM:-2} iters=${ITERS:-10} warmup=${WARMUP:-3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1 || true
status=0
for shape in "${shapes[@]}"; do
  echo "== $shape" >&2
  py=(python3 scripts/plain_pytorch_train.py --shape "$shape" --micro-batch "$mb" --accum "$accum"
      --iters "$iters" --warmup "$warmup")
  hf=()
  if [ "$shape" = llama ]; then
    "${py[@]}" --emit-plan "$out/$shape.plan.json" --emit-hf-config "$out/$shape.config.json"
    hf=(--hf-config "$out/$shape.config.json")
  else
    "${py[@]}" --emit-plan "$out/$shape.plan.json"
  fi
  "$bin" replay --plan "$out/$shape.plan.json" ${hf[@]+"${hf[@]}"} --device cuda --dtype bf16 --schedule 1f1b \
    --iters "$iters" --warmup "$warmup" --out "$out/$shape.replay.json" > "$out/$shape.replay.log" 2>&1 \
    || { echo "replay of $shape failed:" >&2; tail -20 "$out/$shape.replay.log" >&2; status=1; continue; }
  tail -6 "$out/$shape.replay.log" >&2
  "${py[@]}" --out "$out/$shape.plain.json" 2>&1 | tee "$out/$shape.plain.log" >&2 \
    || { echo "plain PyTorch run of $shape failed" >&2; status=1; continue; }
done
python3 - "$out" "${shapes[@]}" <<'PY' | tee "$out/throughput.md" || status=1
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
rows, bad = [], False
print("| shape | parameters | gbs x seq | replay tokens/s (ms) | plain PyTorch tokens/s (ms) | ratio | replay peak alloc / reserved / in use MB | plain peak alloc / reserved MB |")
print("|---|---|---|---|---|---|---|---|")
for s in shapes:
    rp, pp = f"{out}/{s}.replay.json", f"{out}/{s}.plain.json"
    if not (os.path.exists(rp) and os.path.exists(pp)):
        print(f"| {s} | missing results | | | | | | |"); bad = True; continue
    r, p = json.load(open(rp)), json.load(open(pp))
    ratio = r["tokens_per_s"] / p["tokens_per_s"]
    bad |= ratio < 0.90
    rk = r["ranks"][0]
    f = lambda v: "n/a" if v is None else f"{v:.0f}"
    print(f"| {s} | {r['model']['parameters']/1e6:.1f}M (plain {p['parameters']/1e6:.1f}M) | {p['gbs']} x {p['seq']} | "
          f"{r['tokens_per_s']:.0f} ({r['iteration_ms']['median']:.1f}) | {p['tokens_per_s']:.0f} ({p['iteration_ms']['median']:.1f}) | "
          f"{ratio:.3f} | {f(rk.get('peak_allocated_mb'))} / {f(rk.get('peak_reserved_mb'))} / {f(rk.get('device_used_mb'))} | "
          f"{p['peak_allocated_mb']:.0f} / {p['peak_reserved_mb']:.0f} |")
print(f"\nratio = replay tokens/s / plain PyTorch tokens/s; must-show: >= 0.90 ({'met' if not bad else 'NOT met'}). "
      f"Device: {open(out + '/gpu.txt').read().strip().splitlines()[-1] if os.path.exists(out + '/gpu.txt') else '?'}")
sys.exit(1 if bad else 0)
PY
exit $status

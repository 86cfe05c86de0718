#!/usr/bin/env bash
# On a GPU machine (after scripts/gpu_build.sh; sources scripts/gpu_env.sh):
#   scripts/gpu_gemm_ratio.sh OUT [TYPE ...]
# Profiles GEMM-bound layers (scripts/validation/gemm-bound-8192-2l.json: Llama-3.1-70B's block, hidden
# 8192, ffn 28672) on the whole GPU and on each emulated TYPE of hostfiles/clusterfile_h200_emulated.json
# (default H200-33sm H200-66sm), and prints each type's block time over the whole GPU's (issue 14: the
# profile of H200-33sm's GEMM-bound layers against the GEMM probe table). Each type runs on its own GPU
# when the machine has enough (CUDA_VISIBLE_DEVICES), else one after another. Results: OUT/<type>/ and
# OUT/ratios.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:?usage: scripts/gpu_gemm_ratio.sh OUT [TYPE ...]}; shift
types=("$@"); [[ ${#types[@]} -gt 0 ]] || types=(H200-33sm H200-66sm)
source scripts/gpu_env.sh
het=${HETPLAN_BIN:-build-gpu/hetplan}
cfg=scripts/validation/gemm-bound-8192-2l.json
# GPUs to use (GEMM_GPUS="2 3" on a shared machine): one type per GPU at a time.
read -r -a gpus <<< "${GEMM_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd' ')}"
mkdir -p "$out"
common=(profile --hf-config "$cfg" --num-layers 4 --seq-len 2048 --tp 1 --bs 1,2,4 --iters 6 --boost-idle-ms 30)
i=0
for t in H200 "${types[@]}"; do
  (( i > 0 && i % ${#gpus[@]} == 0 )) && wait
  gpu=${gpus[$(( i % ${#gpus[@]} ))]}; i=$((i + 1))
  args=("${common[@]}" --out "$out/$t")
  [[ $t == H200 ]] || args+=(--device-type "$t" --clusterfile hostfiles/clusterfile_h200_emulated.json)
  echo "$t on GPU $gpu"
  CUDA_VISIBLE_DEVICES=$gpu "$het" "${args[@]}" > "$out/$t.log" 2>&1 &
done
wait
python3 - "$out" H200 "${types[@]}" <<'PY'
import json, sys, os
out, base, types = sys.argv[1], sys.argv[2], sys.argv[3:]
def blocks(t):
    p = os.path.join(out, t, "profile_run.json")
    return {r["bs"]: r for r in json.load(open(p)) if r.get("ok")} if os.path.exists(p) else {}
b = blocks(base)
# block_ms: the block's forward + backward in the chained pass (layer_compute_total_ms); block_boost_ms: each timed on
# its own after idle (layer_boost_ms, boost clocks; 0 where not measured).
def boost(r):
    return r.get("block_boost_ms", 0) or 0
lines = ["| type | bs | block ms | whole H200 block ms | slowdown | block TFLOP/s | from idle: block ms | whole H200 ms | slowdown |",
         "|---|---|---|---|---|---|---|---|---|"]
for t in types:
    for bs, r in sorted(blocks(t).items()):
        if bs in b:
            idle = (f"{boost(r):.2f} | {boost(b[bs]):.2f} | {boost(r) / boost(b[bs]):.2f}x" if boost(r) and boost(b[bs])
                    else "- | - | -")
            lines.append(f"| {t} | {bs} | {r['block_ms']:.2f} | {b[bs]['block_ms']:.2f} | "
                         f"{r['block_ms'] / b[bs]['block_ms']:.2f}x | {r['block_tflops']:.0f} | {idle} |")
for bs, r in sorted(b.items()):
    lines.append(f"| {base} | {bs} | {r['block_ms']:.2f} | - | 1.00x | {r['block_tflops']:.0f} | "
                 f"{boost(r):.2f} | - | 1.00x |")
text = "\n".join(lines)
print(text)
open(os.path.join(out, "ratios.md"), "w").write(text + "\n")
PY

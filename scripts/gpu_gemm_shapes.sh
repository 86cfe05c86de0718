#!/usr/bin/env bash
# On a GPU machine (needs PyTorch only; no hetplan build): times every published row's GEMMs at their own
# per-rank shapes, forward / input-gradient / weight-gradient, in fp16 and bf16 (scripts/gpu_gemm_shapes.py;
# issue 34's 1T rows: does a GEMM's aspect, not only its size, set its rate?). Under 2 minutes on one H100.
# Results: $OUT/gemm_shapes.tgz holding gemm_shapes.json, gemm_shapes.log and env.txt.
#   OUT=/tmp/out bash scripts/gpu_gemm_shapes.sh
# Then, here: tar xzf gemm_shapes.tgz; python3 scripts/analytic_gemm_check.py --shapes gemm_shapes/gemm_shapes.json
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/out}
work=$out/gemm_shapes
mkdir -p "$work"
source scripts/gpu_env.sh
{ nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; } > "$work/env.txt" 2>&1
timeout 420 python3 scripts/gpu_gemm_shapes.py "$work/gemm_shapes.json" > "$work/gemm_shapes.log" 2>&1
echo "rc $?"; tail -n 20 "$work/gemm_shapes.log"
tar -C "$out" -czf "$out/gemm_shapes.tgz" gemm_shapes && rm -rf "$work"
ls -l "$out"

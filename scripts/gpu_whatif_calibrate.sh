#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_build.sh and `source scripts/gpu_env.sh`:
#   scripts/gpu_whatif_calibrate.sh OUT
# Measures, by micro-benchmarks, the mechanism constants `hetplan whatif` takes from a profile folder
# (host pinned copy bandwidth, CPU Adam, the host's fp32->bf16 cast, GEMM efficiency, attention and
# elementwise efficiency of one block, QLoRA dequantisation, the decode GEMVs' HBM efficiency per format,
# the int4 kernel's per-row cost, the per-kernel floor and a decode step's kernel count) into
# OUT/whatif_calibration.json, and checks whatif against end-to-end measurements on this machine, which
# calibrate nothing (issue 10's must-show):
#   - offload: a replayed ~1B Llama-shaped step on one GPU, no offload / ZeRO-2-style optimizer offload /
#     ZeRO-3-style parameter offload, against `whatif --profiles OUT` (target: within 15%);
#   - decode: a Llama-3.2-3B-shaped decode loop at bf16 and INT4, batch 1 and 8, against
#     `whatif --inference --profiles OUT` (target: within 10%; both batches are checks).
# Results: OUT/measurements.json, OUT/whatif_calibration.json, OUT/pred_*.json and OUT/summary.md.
# A few minutes on one H100/H200. Copy OUT/whatif_calibration.json into a profile folder (e.g.
# profiles/H200/) and pass --profiles that folder to whatif to use it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_whatif_calibrate.sh OUT}
mkdir -p "$OUT"
HET=${HETPLAN_BIN:-build-gpu/hetplan}
[ -x "$HET" ] || { echo "no $HET: run scripts/gpu_build.sh first" >&2; exit 1; }

# The catalogue entry of GPU 0 (the same longest-name match hetplan's profiler uses).
read -r GPU HBM PEAK < <(python3 scripts/gpu_catalogue_entry.py --require name memory_bw_gbs peak_bf16)
echo "GPU: $GPU (HBM $HBM GB/s, bf16 peak $PEAK TFLOP/s)"

HETPLAN_BIN="$HET" HETPLAN_GPU="$GPU" HETPLAN_HBM_GBS=$HBM HETPLAN_PEAK_TFLOPS=$PEAK python3 scripts/gpu_whatif_calibrate.py --out "$OUT" | tee "$OUT/calibrate.log"

# Predictions with the calibration (the replayed shape: llama, hidden 2048, 20 blocks, ffn 5632, vocab 512).
REPLAY="--family llama --hidden-size 2048 --layers 20 --heads 16 --kv-heads 16 --ffn-size 5632 --vocab-size 512"
"$HET" whatif $REPLAY --seq 1024 --micro-batch 4 --gpus 1 --gpu "$GPU" --flash-attention --profiles "$OUT" \
  --rows "single GPU,ZeRO-2+offload,ZeRO-3+offload" --json "$OUT/pred_offload.json" > "$OUT/pred_offload.txt"
for b in 1 8; do
  "$HET" whatif --inference --hf-config tests/data/hf/llama-3.2-3b.json --gpu "$GPU" --micro-batch $b \
    --prompt 512 --output 128 --weights bf16,awq --profiles "$OUT" --json "$OUT/pred_decode_b$b.json" \
    > "$OUT/pred_decode_b$b.txt"
done

python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
m = json.load(open(os.path.join(out, "measurements.json")))
lines = ["# whatif against measurements on " + m["device"], "",
         "| check | predicted | measured | error |", "|---|---|---|---|"]
def row(name, p, q, unit):
    lines.append(f"| {name} | {p:.2f} {unit} | {q:.2f} {unit} | {100 * (p - q) / q:+.1f}% |")
try:
    pred = {r["strategy"]: r for r in json.load(open(os.path.join(out, "pred_offload.json")))["rows"]}
    for meas in m.get("offload", []):
        name = {"none": "single GPU", "zero2_offload": "ZeRO-2+offload", "zero3_offload": "ZeRO-3+offload"}[meas["mode"]]
        row(name + " step", pred[name]["step_ms"], meas["step_ms"], "ms")
        p_mem = (pred[name]["memory_per_gpu_bytes"] - pred[name]["framework_bytes"]) / 2**30
        row(name + " memory (allocated, no framework constant)", p_mem, meas["peak_allocated_bytes"] / 2**30, "GiB")
except Exception as e:
    lines.append(f"| offload | error | {e!r} | |")
for b in (1, 8):
    try:
        pred = json.load(open(os.path.join(out, f"pred_decode_b{b}.json")))["rows"]
        for meas in m.get("decode", []):
            if meas["batch"] != b:
                continue
            p = pred[0] if meas["format"] == "bf16" else pred[1]
            row(f"decode {meas['format']} batch {b} ms/token", p["decode_ms_per_token"], meas["ms_per_token"], "ms")
            p_mem = (p["weights_bytes"] + p["kv_cache_bytes"]) / 2**30
            row(f"decode {meas['format']} batch {b} weights + KV", p_mem, meas["peak_allocated_bytes"] / 2**30, "GiB")
    except Exception as e:
        lines.append(f"| decode b{b} | error | {e!r} | |")
try:
    cal = json.load(open(os.path.join(out, "whatif_calibration.json")))
    lines += ["", "## mechanism constants (micro-benchmarks; read by whatif)", "", "| key | value |", "|---|---|"]
    for sec in ("host", "training", "inference"):
        for k, v in cal.get(sec, {}).items():
            lines.append(f"| {sec}.{k} | {json.dumps(v)} |")
    lines += ["", "## diagnostics (not read by whatif)", ""]
    for r in m.get("offload", []):
        lines.append(f"- offload {r['mode']}: synchronised phases (ms) {json.dumps({k: round(v, 2) for k, v in r.get('phases_ms_synchronised', {}).items()})}")
    for r in m.get("decode", []):
        lines.append(f"- decode {r['format']} b{r['batch']}: kernels/step {r.get('kernels_per_step')}, micro (ms) "
                     f"{json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.get('micro', {}).items()})}")
    if "kernels" in m:
        lines.append(f"- kernel floor: {json.dumps(m['kernels'])}")
    if "block" in m:
        lines.append(f"- block: {json.dumps(m['block'])}")
except Exception as e:
    lines.append(f"(mechanism table: {e!r})")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

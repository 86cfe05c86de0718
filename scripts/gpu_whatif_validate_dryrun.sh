#!/usr/bin/env bash
# A CPU dry run of scripts/gpu_whatif_validate.sh: every step runs as on the device, in order, except that
# nvidia-smi and the steps needing a GPU (the probe, the measurements, the census) are stand-ins that copy
# recorded files (logs/validate/host-probe-h200, logs/validate/whatif-h200x2-run2) instead of measuring, and
# build-nt/hetplan stands in for build-gpu/hetplan (BUILD=0). The measuring steps run the real
# gpu_whatif_validate.py in its dry mode (WHATIF_VALIDATE_DRYRUN: recorded results instead of measurements; the
# per-case re-probe and predictions real, the host's speed a stand-in). It checks the script's plumbing: the probe's
# files reach whatif_validate_predict.py --host-probe, the fresh predictions and their log are written (and
# copied to $OUT) before the first measurement step, every case's re-probed prediction is logged with its sha256
# before that case is measured, and every summary is written. Its figures are run 2's.
#
#   scripts/gpu_whatif_validate_dryrun.sh [OUT_DIR]      (needs build-nt/hetplan)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ -x build-nt/hetplan ] || { echo "build build-nt/hetplan first" >&2; exit 2; }
out=${1:-$(mktemp -d)}
mkdir -p "$out"
stub=$(mktemp -d)
real_py=$(command -v python3)
mkdir -p "$stub/bin" build-gpu
made_link=0
[ -e build-gpu/hetplan ] || { ln -s ../build-nt/hetplan build-gpu/hetplan; made_link=1; }
cat > "$stub/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--query-gpu*) printf 'NVIDIA H200, 143771 MiB, stub\nNVIDIA H200, 143771 MiB, stub\n' ;;
  -L) printf 'GPU 0: NVIDIA H200 (stub)\nGPU 1: NVIDIA H200 (stub)\n' ;;
  *) echo "nvidia-smi stand-in: $*" ;;
esac
EOF
cat > "$stub/bin/python3" <<EOF
#!/usr/bin/env bash
# Stand-ins for the steps that need a GPU; everything else runs the real python3.
args=("\$@")
if [ "\$1" = -m ] && [ "\$2" = torch.distributed.run ]; then
  while [ \${#args[@]} -gt 0 ] && [[ "\${args[0]}" != *.py ]]; do args=("\${args[@]:1}"); done
fi
outdir=; mode=
for ((i = 0; i < \${#args[@]}; i++)); do
  [ "\${args[\$i]}" = --out ] && outdir=\${args[\$((i + 1))]}
  [ "\${args[\$i]}" = --mode ] && mode=\${args[\$((i + 1))]}
done
rec=$root/logs/validate
case "\${args[0]} \${args[1]:-}" in
  "-c import torch"*) echo "stand-in cuda -"; exit 0 ;;
  "scripts/gpu_catalogue_entry.py name") echo H200; exit 0 ;;
  "scripts/gpu_host_probe.py micro") cp \$rec/host-probe-h200/host_probe_micro.json "\$outdir/"
    # A stand-in of the offload figures (no host measured here): the H100 defaults' own rates, so that the
    # plumbing (whatif --host-probe reading host_probe_offload.json) runs and the figures stay the defaults'.
    printf '{"stand_in": true, "cpu_adamw_fused": {"params_per_s": 3.3333333333e9}, "cpu_cast_fp32_bf16": {"params_per_s": 1.6666666667e10}, "pinned_copy": {"h2d_bytes_per_s": 5.12e10, "d2h_bytes_per_s": 5.12e10}}\n' > "\$outdir/host_probe_offload.json"
    exit 0 ;;
  "scripts/gpu_host_probe.py dist") cp \$rec/host-probe-h200/host_probe_dist.json "\$outdir/"; exit 0 ;;
  "scripts/gpu_overlap_probe.py --out") cp \$rec/suite34-h200x2-run3-subset/profiles/H200-gpt2-2560-10l/comm_overlap.json "\$outdir"; exit 0 ;;
  "scripts/gpu_whatif_validate.py train"|"scripts/gpu_whatif_validate.py decode")
    # The real script in its dry mode: run 2's recorded results instead of measuring, the re-probe real (its
    # host speed a stand-in: 5% slower before each case, 10% after), its predictions from build-gpu/hetplan.
    WHATIF_VALIDATE_DRYRUN=\$rec/whatif-h200x2-run2/whatif_validate exec $real_py "\${args[@]}" ;;
  "scripts/gpu_whatif_validate.py memory-census") echo "census stand-in"; exit 0 ;;
  "scripts/gpu_whatif_validate.py kernels") echo "kernels stand-in"; exit 0 ;;
esac
exec $real_py "\$@"
EOF
chmod +x "$stub/bin/"*
PATH="$stub/bin:$PATH" BUILD=0 OUT="$out" bash scripts/gpu_whatif_validate.sh > "$out/dryrun.log" 2>&1
rm -rf "$stub"
[ $made_link = 0 ] || rm -f build-gpu/hetplan
# The order: the fresh predictions were written before the first measurement step began.
pred_line=$(grep -n "^written .*before any measurement" "$out/dryrun.log" | cut -d: -f1)
meas_line=$(grep -n "^== single" "$out/dryrun.log" | head -1 | cut -d: -f1)
[ -n "$pred_line" ] && [ -n "$meas_line" ] && [ "$pred_line" -lt "$meas_line" ] \
  || { echo "FAIL: no fresh predictions before the measurements ($out/dryrun.log)"; exit 1; }
echo "ok: predictions written at log line $pred_line, measurements from line $meas_line"
# The re-probe: every case's own prediction logged (UTC, sha256) before that case's measurement began, each
# log line's sha256 that of the file it names, and the summary's drift table with every case written first.
log="$out/predictions_probe.log"
n=$(grep -c "written before measuring: sha256" "$log" || true)
[ "$n" = 15 ] || { echo "FAIL: $n re-probed predictions logged, 15 expected ($log)"; exit 1; }
while read -r sha path; do
  [ "$(sha256sum "$path" | cut -d' ' -f1)" = "$sha" ] || { echo "FAIL: sha256 of $path"; exit 1; }
done < <(grep "written before measuring: sha256" "$log" | sed 's/.*sha256 \([0-9a-f]*\)  \(.*\)/\1 \2/')
rows=$(grep -c "| yes |$" "$out/summary_reprobe.md" || true)
[ "$rows" = 15 ] && ! grep -q "| NO |$" "$out/summary_reprobe.md" \
  || { echo "FAIL: summary_reprobe.md: $rows of 15 cases written before measured"; exit 1; }
grep -q "drift (after/before)" "$out/summary_probe.md" || { echo "FAIL: no drift table in summary_probe.md"; exit 1; }
echo "ok: 15 re-probed predictions, each logged with its sha256 before its case was measured"
# The probe's offload figures reached the ZeRO-Offload prediction (whatif --host-probe, host_probe_offload.json).
grep -q 'CPU Adam [0-9.]*e9 params/s per host (probe [^)]*host_probe_offload.json' "$out"/predictions_*_probe.json \
  || { echo "FAIL: the offload prediction does not use the probe's host_probe_offload.json"; exit 1; }
echo "ok: the offload row's CPU Adam, cast and copies from the probe's host_probe_offload.json"
# The overlap probe's comm_overlap.json reached the DDP rows (whatif --profiles).
grep -q "DDP's all-reduces beside the backward: its compute stretched x[0-9.]* ([^)]*comm_overlap.json" \
  "$out"/predictions_*_probe.json \
  || { echo "FAIL: the DDP predictions do not use the fresh comm_overlap.json"; exit 1; }
echo "ok: the DDP rows' compute stretch from the overlap probe's comm_overlap.json"
# Every measuring step asked for the pinned cores (scripts/host_pinning.py).
grep -q -- "--pin" scripts/gpu_whatif_validate.sh && [ "$(grep -c -- '"\${pin\[@\]}"' scripts/gpu_whatif_validate.sh)" = 8 ] \
  || { echo "FAIL: not every probe and measuring step is pinned"; exit 1; }
grep -q "^Host cores (scripts/host_pinning.py; the probe's the same): .*single: share" "$out/summary_probe.md" \
  && grep -q "offload: all" "$out/summary_probe.md" \
  || { echo "FAIL: summary_probe.md does not name the cores each step ran on"; exit 1; }
echo "ok: the probe (micro, dist), the six measuring steps and the kernel profile pass --pin; the summary names their cores"
grep "^MAPE\|^Host drift" "$out"/summary*.md
ls "$out"

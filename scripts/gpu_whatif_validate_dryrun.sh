#!/usr/bin/env bash
# A CPU dry run of scripts/gpu_whatif_validate.sh: every step runs as on the device, in order, except that
# nvidia-smi and the steps needing a GPU (the probe, the measurements, the census) are stand-ins that copy
# recorded files (logs/validate/host-probe-h200, logs/validate/whatif-h200x2-run2) instead of measuring, and
# build-nt/hetplan stands in for build-gpu/hetplan (BUILD=0). It checks the script's plumbing: the probe's
# files reach whatif_validate_predict.py --host-probe, the fresh predictions and their log are written (and
# copied to $OUT) before the first measurement step, and every summary is written. Its figures are run 2's.
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
  "scripts/gpu_host_probe.py micro") cp \$rec/host-probe-h200/host_probe_micro.json "\$outdir/"; exit 0 ;;
  "scripts/gpu_host_probe.py dist") cp \$rec/host-probe-h200/host_probe_dist.json "\$outdir/"; exit 0 ;;
  "scripts/gpu_whatif_validate.py train") cp \$rec/whatif-h200x2-run2/whatif_validate/train_\$mode.json "\$outdir/"; exit 0 ;;
  "scripts/gpu_whatif_validate.py decode") cp \$rec/whatif-h200x2-run2/whatif_validate/decode.json "\$outdir/"; exit 0 ;;
  "scripts/gpu_whatif_validate.py memory-census") echo "census stand-in"; exit 0 ;;
esac
exec $real_py "\$@"
EOF
chmod +x "$stub/bin/"*
PATH="$stub/bin:$PATH" BUILD=0 OUT="$out" bash scripts/gpu_whatif_validate.sh > "$out/dryrun.log" 2>&1
rm -rf "$stub"
[ $made_link = 0 ] || rm -f build-gpu/hetplan
# The order: the fresh predictions were written before the first measurement step began.
pred_line=$(grep -n "^written .*before any measurement" "$out/dryrun.log" | cut -d: -f1)
meas_line=$(grep -n "^== single" "$out/dryrun.log" | cut -d: -f1)
[ -n "$pred_line" ] && [ -n "$meas_line" ] && [ "$pred_line" -lt "$meas_line" ] \
  || { echo "FAIL: no fresh predictions before the measurements ($out/dryrun.log)"; exit 1; }
echo "ok: predictions written at log line $pred_line, measurements from line $meas_line"
grep "^MAPE" "$out"/summary*.md
ls "$out"

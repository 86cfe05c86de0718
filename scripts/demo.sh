#!/usr/bin/env bash
# The main job on the embedded default, from a fresh clone:
# installs what is missing, builds, writes roofline profiles for A100 and V100
# (no outside data needed), and searches the 16-GPU A100/V100 cluster in
# hostfiles/. Outputs go to logs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh

out=logs/demo
mkdir -p "$out"
./build/hetplan gen-profiles --analytic 10 64 --types A100,V100 --max-tp 16 --out "$out/profiles"
./build/hetplan search \
  --hostfile_path hostfiles/a100_v100_16.hostfile \
  --clusterfile_path hostfiles/clusterfile.json \
  --profile_data_path "$out/profiles" \
  --num_layers 10 --gbs 64 --top 5 --reject-dropped-layers --json "$out/plan.json" | tee "$out/search.txt"
echo "demo: results in $out/search.txt and $out/plan.json"

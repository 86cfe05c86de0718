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
# Profiles measured on H200 GPUs (profiles/H200), on one 4-GPU node.
./build/hetplan search \
  --hostfile_path hostfiles/h200_4.hostfile \
  --clusterfile_path hostfiles/clusterfile.json \
  --profile_data_path profiles/H200 \
  --num_layers 10 --gbs 64 --top 3 --json "$out/plan_h200.json" | tee "$out/search_h200.txt"
echo "demo: results in $out/search.txt, $out/plan.json and $out/*_h200.*"

#!/usr/bin/env bash
# The main job on the embedded default, from a fresh clone:
# installs what planning needs (no LibTorch), builds the planner and simulator
# into build-demo/ (no LibTorch parts, no tests), writes analytic profiles of
# a Llama-3.2-3B shape for A100 and V100 (the layer time model on datasheet
# numbers: no outside data needed), and searches the 16-GPU A100/V100 cluster
# in hostfiles/. Outputs go to logs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --no-torch
b=build-demo
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETPLAN_WITH_TORCH=OFF -DHETPLAN_BUILD_TESTS=OFF >/dev/null
cmake --build $b --parallel "$(nproc)"

out=logs/demo
mkdir -p "$out"
rm -rf "$out/profiles"  # a set from an earlier run (other layers or tp) would mix with this one
hf=tests/data/hf/llama-3.2-3b.json  # 28 blocks: 30 Metis layers (embedding + blocks + head)
./$b/hetplan gen-profiles --analytic --hf-config $hf --seq-len 2048 --types A100,V100 --max-tp 8 30 16 \
  --out "$out/profiles"
./$b/hetplan search \
  --hostfile_path hostfiles/a100_v100_16.hostfile \
  --clusterfile_path hostfiles/clusterfile.json \
  --profile_data_path "$out/profiles" --hf-config $hf \
  --num_layers 30 --hidden_size 3072 --heads 24 --vocab_size 128256 --sequence_length 2048 \
  --gbs 64 --top 5 --json "$out/plan.json" | tee "$out/search.txt"
# The best plan, explained: the same iteration time, per-rank memory, a Chrome trace.
./$b/hetplan simulate --plan "$out/plan.json" --hf-config $hf --trace "$out/plan.trace.json" | tee "$out/simulate.txt"
# Profiles measured on H200 GPUs (profiles/H200), on one 4-GPU node.
./$b/hetplan search \
  --hostfile_path hostfiles/h200_4.hostfile \
  --clusterfile_path hostfiles/clusterfile.json \
  --profile_data_path profiles/H200 \
  --num_layers 10 --gbs 64 --top 3 --json "$out/plan_h200.json" | tee "$out/search_h200.txt"
echo "demo: results in $out/search.txt, $out/plan.json and $out/*_h200.*"
echo "demo: $b/hetplan plans and simulates; for 'hetplan profile' and 'hetplan replay' (LibTorch),"
echo "      run scripts/install_deps.sh and scripts/build.sh, then use build/hetplan"

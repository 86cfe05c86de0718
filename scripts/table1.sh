#!/usr/bin/env bash
# Regenerates the rows of Table 1 of the Metis paper (search steps and time of
# plain Metis vs stratified pruning) with hetplan, and prints a Markdown table
# to the terminal and to logs/table1.md.
#
#   scripts/table1.sh [METIS_SAMPLES_DIR]     (default: ../shared/metis-samples)
#
# Rows: (layers, GPUs per type) = (10, 16), (20, 32), (20, 64), (40, 128); gbs 128,
# max tp 128, max bs 128, variance 1, permute length 128.
set -euo pipefail
cd "$(dirname "$0")/.."
samples=$(realpath "${1:-../shared/metis-samples}")
[[ -f "$samples/DeviceType.A100_tp1_bs1.json" ]] || { echo "table1: no Metis samples in $samples" >&2; exit 2; }
[[ -x build/hetplan ]] || scripts/build.sh
work=logs/table1
mkdir -p "$work"

now() { date +%s.%N; }
row_md() { # row layers gpus
  local row=$1 layers=$2 gpus=$3
  ./build/hetplan gen-profiles "$layers" 128 --samples "$samples" --out "$work/profiles$layers" >/dev/null
  ./build/hetplan gen-hostfile "$gpus" --out "$work/hostfile$gpus" >/dev/null
  local mode out t0 t1
  declare -A count ms cost wall
  for mode in metis strat; do
    local flag=""
    [[ $mode == strat ]] && flag=--use_strat
    t0=$(now)
    out=$(./build/hetplan search -q --cost-model metis --num_layers "$layers" --gbs 128 --hostfile_path "$work/hostfile$gpus" \
      --clusterfile_path "$samples/clusterfile.json" --profile_data_path "$work/profiles$layers" \
      --max_profiled_tp_degree 128 --max_profiled_batch_size 128 --min_group_scale_variance 1 \
      --max_permute_len 128 $flag --json "$work/row${row}_$mode.json" 2>/dev/null)
    t1=$(now)
    count[$mode]=$(sed -n 's/^count: //p' <<<"$out")
    ms[$mode]=$(sed -n 's/^Average time: \(.*\) ms$/\1/p' <<<"$out")
    cost[$mode]=$(sed -n 's/^1, \([^,]*\),.*/\1/p' <<<"$out")
    wall[$mode]=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')
  done
  awk -v r="$row" -v l="$layers" -v g="$gpus" -v cm="${count[metis]}" -v cs="${count[strat]}" \
      -v mm="${ms[metis]}" -v ms="${ms[strat]}" -v km="${cost[metis]}" -v ks="${cost[strat]}" \
      -v wm="${wall[metis]}" -v ws="${wall[strat]}" 'BEGIN{
    printf "| %d | %d | %d+%d | %d | %d | %.1f | %.1f | %.3f | %.3f | %s | %s | %.1f%% | %.2fx |\n",
      r, l, g, g, cm, cs, mm, ms, wm, ws, km, ks, 100*(1-cs/cm), mm/ms }'
}

{
  echo "## Table 1: Metis search vs stratified pruning (hetplan, $(nproc) cores)"
  echo
  echo "| row | layers | A100+V100 | steps Metis | steps strat | search ms Metis | search ms strat | wall s Metis | wall s strat | best cost Metis | best cost strat | step reduction | speedup |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  row_md 1 10 16
  row_md 2 20 32
  row_md 3 20 64
  row_md 4 40 128
  echo
  echo "steps: the reference's search-step count. search ms: the search itself; wall s: the whole process."
  echo "step reduction = 1 - steps strat / steps Metis; speedup = search ms Metis / search ms strat."
} | tee logs/table1.md

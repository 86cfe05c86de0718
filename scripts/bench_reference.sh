#!/usr/bin/env bash
# Benchmark: hetplan against the Python Metis reference, side by side in one
# run, on the rows of Table 1. Prints a Markdown table, also written to
# logs/bench_reference_rows<ROWS>.md, with each side's count, best cost, wall
# time and the speed ratio. It checks that counts and best costs agree.
#
#   scripts/bench_reference.sh --ref METIS_DIR [--rows "1 2 3"] [--samples DIR]
#
# METIS_DIR is a checkout of livingshade/Metis (commit 900445f) that you
# obtained yourself; hetplan does not ship it. It runs through
# scripts/metis_reference.py, which makes it deterministic without editing it.
# Needs /usr/bin/python3 with numpy (Debian: python3-numpy). Row 4 takes the
# reference about 20 minutes (both modes) on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ref="" rows="1 2 3" samples="../shared/metis-samples"
while (($#)); do
  case "$1" in
    --ref) ref=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    *) echo "bench_reference: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$ref" && -f "$ref/cost_het_cluster.py" ]] || { echo "bench_reference: --ref must name a Metis checkout" >&2; exit 2; }
/usr/bin/python3 -c 'import numpy' 2>/dev/null || { echo "bench_reference: /usr/bin/python3 needs numpy (apt-get install python3-numpy)" >&2; exit 2; }
samples=$(realpath "$samples")
[[ -x build/hetplan ]] || scripts/build.sh
work=logs/bench_reference
mkdir -p "$work"

declare -A LAYERS=([1]=10 [2]=20 [3]=20 [4]=40) GPUS=([1]=16 [2]=32 [3]=64 [4]=128)
now() { date +%s.%N; }
common() { # layers gpus
  echo --model_name GPT --model_size 1.5B --num_layers "$1" --gbs 128 --hidden_size 4096 --sequence_length 1024 \
    --vocab_size 51200 --hostfile_path "$work/hostfile$2" --clusterfile_path "$samples/clusterfile.json" \
    --profile_data_path "$work/profiles$1" --max_profiled_tp_degree 128 --max_profiled_batch_size 128 \
    --min_group_scale_variance 1 --max_permute_len 128
}

table="| row | mode | count hetplan | count reference | best cost hetplan | best cost reference | wall s hetplan | wall s reference | ratio |
|---|---|---|---|---|---|---|---|---|"
status=0
for row in $rows; do
  L=${LAYERS[$row]} G=${GPUS[$row]}
  ./build/hetplan gen-profiles "$L" 128 --samples "$samples" --out "$work/profiles$L" >/dev/null
  ./build/hetplan gen-hostfile "$G" --out "$work/hostfile$G" >/dev/null
  for mode in metis strat; do
    flag=""; [[ $mode == strat ]] && flag=--use_strat
    t0=$(now); ours=$(./build/hetplan search -q --cost-model metis $(common "$L" "$G") --trials 1 $flag 2>/dev/null); t1=$(now)
    echo "row $row $mode: running the reference..." >&2
    t2=$(now); theirs=$(/usr/bin/python3 scripts/metis_reference.py --ref "$ref" $(common "$L" "$G") --trials 1 $flag); t3=$(now)
    printf '%s\n' "$theirs" > "$work/reference_row${row}_$mode.txt"
    c1=$(sed -n 's/^count: //p' <<<"$ours"); c2=$(sed -n 's/^count: //p' <<<"$theirs")
    k1=$(sed -n 's/^1, \([^,]*\),.*/\1/p' <<<"$ours"); k2=$(sed -n 's/^1, \([^,]*\),.*/\1/p' <<<"$theirs")
    [[ "$c1" == "$c2" && "$k1" == "$k2" ]] || { echo "bench_reference: row $row $mode differs" >&2; status=1; }
    line=$(awk -v r="$row" -v m="$mode" -v c1="$c1" -v c2="$c2" -v k1="$k1" -v k2="$k2" \
      -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN{
      printf "| %d | %s | %s | %s | %s | %s | %.3f | %.2f | %.0fx |", r, m, c1, c2, k1, k2, b-a, d-c, (d-c)/(b-a) }')
    table+=$'\n'"$line"
    echo "$line" >&2
  done
done
{
  echo "## hetplan vs Python Metis (livingshade/Metis 900445f), $(nproc) cores, $(date -u +%Y-%m-%d)"
  echo
  echo "$table"
  echo
  echo "wall s: whole process (profile loading included), one trial each, run back to back in this script."
} | tee "logs/bench_reference_rows${rows// /-}.md"
exit $status

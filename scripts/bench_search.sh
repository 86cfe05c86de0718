#!/usr/bin/env bash
# Benchmarks the default search (simulated iteration time) against the Metis
# formula, side by side in one run: wall time and peak RSS of the whole
# `hetplan search` process, on this machine. A benchmark, not a test: it
# prints figures and ratios and checks nothing.
#
#   scripts/bench_search.sh [--bin build/hetplan] [--samples DIR] [--cases "row2 threads 32 48 3x256 settings"]
#
# Cases:
#   row2      Table-1 row 2 (20 layers, 32 V100 + 32 A100, Metis's synthetic profiles
#             from DIR, default ../shared/metis-samples; skipped without them):
#             default search vs --cost-model metis. Goal: default <= 2x Metis.
#   threads   row 2 with --threads 1 vs --threads 2. Goal: >= 1.8x. Also the machine's ceiling for
#             two threads: two one-thread searches at once against one alone, in the same rounds
#             (see threads_rounds()).
#   32        16 V100 + 16 A100, 24 layers, analytic profiles. Goal: <= 10 s, <= 1 GB.
#   48        A100 + V100 + H100, 16 each, 40 layers. Goal: <= 30 s.
#   3x256     A100 + V100 + H100, 256 each, 8 per node (stages of whole nodes: the default above 256 GPUs). Goal: <= 60 s.
#   settings  the 32 case with --zero auto --recompute auto vs plain. Goal: <= 3x.
# The row-2 cases run their two commands in turn, A B A B ..., HETPLAN_BENCH_REPEATS times each
# (default 15) and print medians and the median of the pairs' ratios. HETPLAN_BENCH_BUDGET (seconds,
# default 240) cuts a long case short; it then reports its best so far.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/hetplan
samples=../shared/metis-samples
cases="row2 threads 32 48 3x256 settings"
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "bench_search: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "bench_search: no $bin (run scripts/build.sh)" >&2; exit 2; }
work=logs/bench_search
mkdir -p "$work"

# run NAME ARGS...: prints "wall_s rss_mb" of one hetplan run, keeps its output in $work/NAME.out.
run() {
  local name=$1; shift
  "$proc_time" -r "$work/$name.time" -- "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err" || {
    echo "bench_search: $name failed: $(tail -1 "$work/$name.err")" >&2; echo "nan nan"; return 0; }
  awk '{printf "%.3f %.0f\n", $1, $2/1024}' "$work/$name.time"
}
# search_s FILE: the search's own time ("time: S s") in a search's output.
search_s() { sed -n 's/.*, time: \([0-9.e+-]*\) s.*/\1/p' "$1" | head -1; }
source scripts/bench_lib.sh  # median, proc_time_build
# Times and peak RSS of hetplan's own process (scripts/proc_time.cc), not of a shell around it.
proc_time=$(proc_time_build "$work")
# pair NAME_A NAME_B N: runs the commands in arrays cmd_a and cmd_b in turn, A B A B ..., N times each
# (one run of each first, not counted), and prints "median_wall_a median_wall_b median_ratio_a/b
# max_rss_a_mb max_rss_b_mb median_search_ratio_a/b": pairing keeps the ratio meaningful when the
# machine's speed drifts. The last is the ratio of the searches' own times (the "time: S s" each
# prints: the search alone, without starting the process and reading the inputs).
pair() {
  local a=$1 b=$2 n=$3 i t r wa=() wb=() sa=() sb=() ra=0 rb=0
  for ((i = 0; i <= n; i++)); do
    "$proc_time" -r "$work/$a.time" -- "$bin" "${cmd_a[@]}" >"$work/$a.out" 2>"$work/$a.err"
    read -r t r _ <"$work/$a.time"; ((r > ra)) && ra=$r
    ((i > 0)) && wa+=("$t") && sa+=("$(search_s "$work/$a.out")")
    "$proc_time" -r "$work/$b.time" -- "$bin" "${cmd_b[@]}" >"$work/$b.out" 2>"$work/$b.err"
    read -r t r _ <"$work/$b.time"; ((r > rb)) && rb=$r
    ((i > 0)) && wb+=("$t") && sb+=("$(search_s "$work/$b.out")")
  done
  ratios() { paste <(printf '%s\n' "$@" | head -n "$n") <(printf '%s\n' "$@" | tail -n "$n") |
    awk '$1 != "" && $2 > 0 {print $1 / $2}' | median; }
  printf '%.3f %.3f %.2f %.0f %.0f %s\n' "$(printf '%s\n' "${wa[@]}" | median)" "$(printf '%s\n' "${wb[@]}" | median)" \
    "$(ratios "${wa[@]}" "${wb[@]}")" "$((ra / 1024))" "$((rb / 1024))" "$(r=$(ratios "${sa[@]}" "${sb[@]}"); echo "${r:--}")"
}
# threads_rounds N: N rounds (one first, not counted) of: the search on two threads (cmd_a), the same on
# one thread (cmd_b), and two one-thread searches started together (the machine's own limit for two
# threads on this work: what a perfect split of one search over two threads would give, with the two
# cores' sharing, the hypervisor and the serial parts of two processes included). Measured in the same
# round, so that the share of that limit is not moved by the machine's changes of state between runs.
# Prints "median_wall_a median_wall_b max_rss_a_mb max_rss_b_mb" and the medians of the rounds' ratios:
# "wall_b/wall_a search_b/search_a ceiling ceiling_search share share_search", where ceiling is
# 2 x wall_b / wall_together, its search form uses the slower of the two searches' own times, and share
# is a round's ratio over its ceiling.
threads_rounds() {
  local n=$1 i r wa=() wb=() ratio=() sratio=() ceil=() sceil=() share=() sshare=() ra=0 rb=0 ta tb tt sa sb s1 s2
  local t1 t2 t3 t4 t5 t6
  for ((i = 0; i <= n; i++)); do
    "$proc_time" -r "$work/threads_a.time" -- "$bin" "${cmd_a[@]}" >"$work/threads_a.out" 2>"$work/threads_a.err"
    "$proc_time" -r "$work/threads_b.time" -- "$bin" "${cmd_b[@]}" >"$work/threads_b.out" 2>"$work/threads_b.err"
    "$proc_time" -r "$work/threads_together.time" -n 2 -o "$work/threads_together" -- "$bin" "${cmd_b[@]}"
    ((i > 0)) || continue
    read -r ta r _ <"$work/threads_a.time"; ((r > ra)) && ra=$r
    read -r tb r _ <"$work/threads_b.time"; ((r > rb)) && rb=$r
    read -r tt _ <"$work/threads_together.time"
    sa=$(search_s "$work/threads_a.out"); sb=$(search_s "$work/threads_b.out")
    s1=$(search_s "$work/threads_together1.out"); s2=$(search_s "$work/threads_together2.out")
    wa+=("$ta"); wb+=("$tb")
    read -r t1 t2 t3 t4 t5 t6 < <(awk -v ta="$ta" -v tb="$tb" -v tt="$tt" -v sa="$sa" -v sb="$sb" -v s1="$s1" -v s2="$s2" 'BEGIN{
      m = s1 > s2 ? s1 : s2; r = tb / ta; rs = sb / sa; c = 2 * tb / tt; cs = 2 * sb / m
      printf "%.6f %.6f %.6f %.6f %.6f %.6f\n", r, rs, c, cs, r / c, rs / cs}')
    ratio+=("$t1"); sratio+=("$t2"); ceil+=("$t3"); sceil+=("$t4"); share+=("$t5"); sshare+=("$t6")
  done
  med() { printf '%s\n' "$@" | median; }
  printf '%.3f %.3f %.0f %.0f %.2f %.2f %.2f %.2f %.0f %.0f\n' "$(med "${wa[@]}")" "$(med "${wb[@]}")" "$((ra / 1024))" \
    "$((rb / 1024))" "$(med "${ratio[@]}")" "$(med "${sratio[@]}")" "$(med "${ceil[@]}")" "$(med "${sceil[@]}")" \
    "$(awk -v x="$(med "${share[@]}")" 'BEGIN{print 100 * x}')" "$(awk -v x="$(med "${sshare[@]}")" 'BEGIN{print 100 * x}')"
}
best() {
  local b; b=$(sed -n 's/^1, \([^,]*\),.*/\1/p' "$work/$1.out" | head -1)
  if grep -q "cut short" "$work/$1.out"; then echo "$b (cut short at the budget)"; else echo "$b"; fi
}
# A budget so that a case past its goal still ends (and reports its best so far).
budget=(--time-budget "${HETPLAN_BENCH_BUDGET:-240}")
reps=${HETPLAN_BENCH_REPEATS:-15}  # paired runs of the row-2 cases

analytic() { # layers types out
  [[ -d $3 ]] || "$bin" gen-profiles --analytic "$1" 64 --types "$2" --max-tp 8 --hidden-size 4096 --seq-len 2048 \
    --out "$3" >/dev/null
}
hostfile() { # per-type types slots out
  "$bin" gen-hostfile "$1" --types "$2" --slots "$3" --clusterfile hostfiles/clusterfile.json --out "$4" >/dev/null
}

echo "| case | command | wall s | peak RSS MB | best cost | ratio | goal |"
echo "|---|---|---|---|---|---|---|"
row() { printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$@"; }

for c in $cases; do
  case $c in
    row2|threads)
      if [[ ! -f $samples/DeviceType.A100_tp1_bs1.json ]]; then
        row "$c" "skipped: no Metis samples in $samples (scripts/fetch_reference_data.sh)" - - - - -; continue
      fi
      "$bin" gen-profiles 20 128 --samples "$samples" --out "$work/row2" >/dev/null
      "$bin" gen-hostfile 32 --out "$work/row2.hostfile" >/dev/null
      common=(search -q --num_layers 20 --gbs 128 --hostfile "$work/row2.hostfile"
              --clusterfile "$samples/clusterfile.json" --profiles "$work/row2")
      # Medians of $reps paired runs: a whole search here takes a tenth of a second.
      if [[ $c == row2 ]]; then
        cmd_a=("${common[@]}")
        cmd_b=("${common[@]}" --cost-model metis --max_profiled_tp_degree 128 --max_profiled_batch_size 128
               --min_group_scale_variance 1 --max_permute_len 128)
        read -r wd wm ratio rd rm sratio < <(pair row2_default row2_metis "$reps")
        row "row 2" "--cost-model metis" "$wm" "$rm" "$(best row2_metis)" - -
        row "row 2" "default" "$wd" "$rd" "$(best row2_default)" "${ratio}x metis (median of $reps pairs)" "<= 2x"
      else
        cmd_a=("${common[@]}" --threads 2)
        cmd_b=("${common[@]}" --threads 1)
        read -r w2 w1 r2 r1 ratio sratio cw cs share sshare < <(threads_rounds "$reps")
        row "row 2" "default --threads 1" "$w1" "$r1" "$(best threads_b)" - -
        row "row 2" "default --threads 2" "$w2" "$r2" "$(best threads_a)" \
          "${ratio}x faster; the search alone ${sratio}x (medians of $reps rounds)" ">= 1.8x"
        row "row 2" "two --threads 1 at once, against one alone" - - - \
          "the machine's ceiling for two threads: ${cw}x; the searches alone ${cs}x; two threads reach ${share}% of it, the search alone ${sshare}% (medians of the same $reps rounds)" -
      fi ;;
    32|settings)
      analytic 26 A100,V100 "$work/p26"
      hostfile 16 V100,A100 4 "$work/h32"
      common=(search -q --num_layers 26 --gbs 128 --hostfile "$work/h32" --clusterfile hostfiles/clusterfile.json
              --profiles "$work/p26" --hidden-size 4096 --sequence-length 2048)
      if [[ $c == 32 ]]; then
        read -r w r < <(run c32 "${common[@]}")
        row "16 V100 + 16 A100, 24 blocks" default "$w" "$r" "$(best c32)" - "<= 10 s, <= 1024 MB"
      else
        read -r w r < <(run c32_plain "${common[@]}")
        read -r wa ra < <(run c32_auto "${common[@]}" --zero auto --recompute auto)
        row "16 V100 + 16 A100" default "$w" "$r" "$(best c32_plain)" - -
        row "16 V100 + 16 A100" "--zero auto --recompute auto" "$wa" "$ra" "$(best c32_auto)" "$(awk -v a="$wa" -v b="$w" 'BEGIN{printf "%.2fx plain", a/b}')" "<= 3x"
      fi ;;
    48)
      analytic 42 A100,H100,V100 "$work/p42"
      hostfile 16 A100,V100,H100 8 "$work/h48"
      read -r w r < <(run c48 search -q --num_layers 42 --gbs 128 --hostfile "$work/h48" --clusterfile hostfiles/clusterfile.json \
        --profiles "$work/p42" --hidden-size 4096 --sequence-length 2048 "${budget[@]}")
      row "A100 + V100 + H100, 16 each, 40 blocks" default "$w" "$r" "$(best c48)" - "<= 30 s" ;;
    3x256)
      analytic 42 A100,H100,V100 "$work/p42"
      hostfile 256 A100,V100,H100 8 "$work/h768"
      read -r w r < <(run c768 search -q --num_layers 42 --gbs 1536 --hostfile "$work/h768" --clusterfile hostfiles/clusterfile.json \
        --profiles "$work/p42" --hidden-size 4096 --sequence-length 2048 "${budget[@]}")
      row "A100 + V100 + H100, 256 each, 40 blocks" "default (above 256 GPUs: stages of whole nodes)" "$w" "$r" "$(best c768)" - "<= 60 s" ;;
    *) echo "bench_search: unknown case $c" >&2; exit 2 ;;
  esac
done
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1e6}' /proc/meminfo); $(date -u +%Y-%m-%dT%H:%MZ); outputs in $work/"

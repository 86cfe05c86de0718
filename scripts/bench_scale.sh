#!/usr/bin/env bash
# Benchmarks the anytime search at scale (issue 33), side by side in one run: for each case the wall
# time and peak RSS of the whole `hetplan search` process, the seconds to its first plan, its best plan,
# the lower bound on the optimum it proved, the gap between them, and the machine's load when it ran.
# A benchmark, not a test: it prints figures and checks nothing.
#
#   scripts/bench_scale.sh [--bin build-nt/hetplan] [--main /tmp/hetplan-main] [--cases "70b 2x256 3x256 3x512 small settings"]
#
# Cases (8-GPU nodes; 40 blocks + embedding + head, analytic profiles, unless said):
#   70b       Llama-3.1-70B (tests/data/hf) on 64 H100 (8 nodes), gbs 1024, seq 4096, default flags.
#             Goal: a fitting plan in <= 10 s, gap <= 1% in <= 60 s.
#   2x256     256 A100 + 256 H100, gbs 128 and gbs 2048. Goal: gap <= 1% in <= 60 s each.
#   3x256     256 each of A100, V100, H100, gbs 128 and gbs 2048. Goal: gap <= 1% in <= 60 s each.
#   3x512     512 each of A100, V100, H100, gbs 2048, --gap 0.02. Goal: gap <= 2% in <= 120 s.
#   small     up to 48 GPUs (16 V100 + 16 A100, 4 per node; 16 each of A100, V100, H100, 8 per node):
#             this build (default flags, and --gap 0) against --main's binary, paired runs, medians.
#             Goal: no slower than main (within 10%).
#   settings  --zero auto --recompute auto (the default since issue 33 item 6) against --zero 0 --recompute
#             none on the small cases (paired runs, medians) and 70b (one run each). Goal: <= 1.5x.
# Each long case runs with --time-budget (the goal's seconds, HETPLAN_BENCH_SLACK x it; default 1):
# a case past its goal reports its best, bound and gap at the budget.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build-nt/hetplan
main_bin=
cases="70b 2x256 3x256 3x512 small settings"
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --main) main_bin=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "bench_scale: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "bench_scale: no $bin (build it first)" >&2; exit 2; }
work=logs/bench_scale
mkdir -p "$work"
source scripts/bench_lib.sh  # median, proc_time_build
proc_time=$(proc_time_build "$work")
slack=${HETPLAN_BENCH_SLACK:-1}
reps=${HETPLAN_BENCH_REPEATS:-5}
load() { cut -d' ' -f1 /proc/loadavg; }

# run NAME BIN ARGS...: one search; prints "wall_s rss_mb load" and keeps its output in $work/NAME.out.
run() {
  local name=$1 b=$2 l; shift 2
  l=$(load)
  "$proc_time" -r "$work/$name.time" -- "$b" "$@" >"$work/$name.out" 2>"$work/$name.err" || true
  awk -v l="$l" '{printf "%.2f %.0f %s\n", $1, $2/1024, l}' "$work/$name.time"
}
# The proof line of a search's output: "first_s best bound gap proven".
proof() {
  local f=$work/$1.out
  if ! grep -q '^best: ' "$f"; then
    local b; b=$(sed -n 's/^1, \([^,]*\),.*/\1/p' "$f" | head -1)
    echo "- ${b:-none} - - -"; return
  fi
  sed -n 's/^best: \([^,]*\), lower bound: \([^,]*\), gap: \([^ ,]*\) (\([^)]*\)), first plan after \(.*\) s$/\5|\1|\2|\3|\4/p' "$f" |
    awk -F'|' '{gsub(/ ms/, "", $2); gsub(/ ms/, "", $3); printf "%s %s %s %s %s\n", $1, $2, $3, $4, ($5 ~ /^proven/ ? "yes" : "no")}'
}
why_failed() { [[ -s $work/$1.err ]] && grep -m1 -o 'hetplan: .*' "$work/$1.err" | cut -c1-160 || true; }

analytic() { # layers types out [extra...]
  local l=$1 t=$2 o=$3; shift 3
  [[ -d $o ]] || "$bin" gen-profiles --analytic "$l" 64 --types "$t" --max-tp 8 --hidden-size 4096 --seq-len 2048 \
    --out "$o" "$@" >/dev/null
}
hostfile() { # per-type types slots out
  "$bin" gen-hostfile "$1" --types "$2" --slots "$3" --clusterfile hostfiles/clusterfile.json --out "$4" >/dev/null
}

echo "| case | binary, flags | wall s | peak RSS MB | load | first plan s | best ms | lower bound ms | gap | proven | goal |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
row() { printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$@"; }
# long NAME LABEL GOAL BUDGET ARGS...: one budgeted search of this build, one row.
long() {
  local name=$1 label=$2 goal=$3 budget=$4 w r l f b lb g p; shift 4
  read -r w r l < <(run "$name" "$bin" search -q --time-budget "$(awk -v b="$budget" -v s="$slack" 'BEGIN{print b * s}')" "$@")
  read -r f b lb g p < <(proof "$name")
  row "$name" "$label" "$w" "$r" "$l" "$f" "$b" "$lb" "$g" "$p" "$goal"
  local e; e=$(why_failed "$name"); [[ -z $e || $b != "none" ]] || echo "|   | $e | | | | | | | | | |"
}

m70=(--num_layers 82 --hidden-size 8192 --sequence-length 4096 --vocab-size 128256 --heads 64
     --hf-config tests/data/hf/llama-3.1-70b.json --gbs 1024)
prep_70b() {
  [[ -d $work/p70b ]] || "$bin" gen-profiles --analytic --hf-config tests/data/hf/llama-3.1-70b.json 82 16 \
    --types H100 --max-tp 8 --seq-len 4096 --out "$work/p70b" >/dev/null
  hostfile 64 H100 8 "$work/h64"
}
common42=(--num_layers 42 --hidden-size 4096 --sequence-length 2048 --clusterfile hostfiles/clusterfile.json)

for c in $cases; do
  case $c in
    70b)
      prep_70b
      long 70b "default flags" "plan <= 10 s; gap <= 1% in <= 60 s" 60 "${m70[@]}" --hostfile "$work/h64" \
        --clusterfile hostfiles/clusterfile.json --profiles "$work/p70b" ;;
    2x256)
      analytic 42 A100,H100 "$work/p42ah"
      hostfile 256 A100,H100 8 "$work/h2x256"
      for gbs in 128 2048; do
        long "2x256_gbs$gbs" "256 A100 + 256 H100, default" "gap <= 1% in <= 60 s" 60 "${common42[@]}" --gbs "$gbs" \
          --hostfile "$work/h2x256" --profiles "$work/p42ah"
      done ;;
    3x256|3x512)
      analytic 42 A100,H100,V100 "$work/p42"
      n=${c#3x}
      hostfile "$n" A100,V100,H100 8 "$work/h$c"
      if [[ $c == 3x256 ]]; then
        for gbs in 128 2048; do
          long "3x256_gbs$gbs" "256 each A100, V100, H100, default" "gap <= 1% in <= 60 s" 60 "${common42[@]}" \
            --gbs "$gbs" --hostfile "$work/h$c" --profiles "$work/p42"
        done
      else
        long "3x512_gbs2048" "512 each A100, V100, H100, --gap 0.02" "gap <= 2% in <= 120 s" 120 "${common42[@]}" \
          --gbs 2048 --gap 0.02 --hostfile "$work/h$c" --profiles "$work/p42"
      fi ;;
    small|settings)
      analytic 26 A100,V100 "$work/p26"
      hostfile 16 V100,A100 4 "$work/h32"
      analytic 42 A100,H100,V100 "$work/p42"
      hostfile 16 A100,V100,H100 8 "$work/h48"
      c32=(search -q --num_layers 26 --gbs 128 --hostfile "$work/h32" --clusterfile hostfiles/clusterfile.json
           --profiles "$work/p26" --hidden-size 4096 --sequence-length 2048)
      c48=(search -q --num_layers 42 --gbs 128 --hostfile "$work/h48" --clusterfile hostfiles/clusterfile.json
           --profiles "$work/p42" --hidden-size 4096 --sequence-length 2048)
      if [[ $c == small ]]; then
        [[ -n $main_bin && -x $main_bin ]] || { row small "skipped: no --main binary" - - - - - - - - -; continue; }
        for k in 32 48; do
          declare -n cmd="c$k"
          # Paired runs, A (main) B (this, default) C (this, --gap 0) in turn, $reps times: medians.
          wa=(); wb=(); wc=(); la=()
          for ((i = 0; i <= reps; i++)); do
            read -r w r l < <(run "small${k}_main" "$main_bin" "${cmd[@]}"); ((i > 0)) && wa+=("$w") && la+=("$l"); ra=$r
            read -r w r l < <(run "small${k}_new" "$bin" "${cmd[@]}"); ((i > 0)) && wb+=("$w"); rb=$r
            read -r w r l < <(run "small${k}_gap0" "$bin" "${cmd[@]}" --gap 0); ((i > 0)) && wc+=("$w"); rc=$r
          done
          ma=$(printf '%s\n' "${wa[@]}" | median); mb=$(printf '%s\n' "${wb[@]}" | median); mc=$(printf '%s\n' "${wc[@]}" | median)
          ml=$(printf '%s\n' "${la[@]}" | median)
          read -r f b lb g p < <(proof "small${k}_main")
          row "small$k" "main $(basename "$main_bin") (exact)" "$ma" "$ra" "$ml" "$f" "$b" "$lb" "$g" "$p" "median of $reps"
          read -r f b lb g p < <(proof "small${k}_new")
          row "small$k" "this, default (--gap 0.01)" "$mb" "$rb" "$ml" "$f" "$b" "$lb" "$g" "$p" \
            "$(awk -v a="$mb" -v b="$ma" 'BEGIN{printf "%.2fx main", a / b}') (<= 1.10x)"
          read -r f b lb g p < <(proof "small${k}_gap0")
          row "small$k" "this, --gap 0" "$mc" "$rc" "$ml" "$f" "$b" "$lb" "$g" "$p" \
            "$(awk -v a="$mc" -v b="$ma" 'BEGIN{printf "%.2fx main", a / b}') (<= 1.10x)"
          unset -n cmd
        done
      else
        prep_70b
        c70=(search -q "${m70[@]}" --hostfile "$work/h64" --clusterfile hostfiles/clusterfile.json --profiles "$work/p70b"
             --time-budget 120)
        for k in 32 48 70; do
          declare -n cmd="c$k"
          # Paired runs, plain then auto in turn ($reps times, medians; the 70B case once: it takes a minute).
          n=$reps; [[ $k == 70 ]] && n=1
          wa=(); wb=(); la=()
          for ((i = 0; i < n; i++)); do
            read -r w r l < <(run "set${k}_plain" "$bin" "${cmd[@]}" --zero 0 --recompute none); wa+=("$w"); la+=("$l"); ra=$r
            read -r w r l < <(run "set${k}_auto" "$bin" "${cmd[@]}" --zero auto --recompute auto); wb+=("$w"); rb=$r
          done
          ma=$(printf '%s\n' "${wa[@]}" | median); mb=$(printf '%s\n' "${wb[@]}" | median); ml=$(printf '%s\n' "${la[@]}" | median)
          read -r f b lb g p < <(proof "set${k}_plain")
          row "settings $k" "--zero 0 --recompute none" "$ma" "$ra" "$ml" "$f" "$b" "$lb" "$g" "$p" "median of $n"
          read -r f b lb g p < <(proof "set${k}_auto")
          row "settings $k" "--zero auto --recompute auto (default)" "$mb" "$rb" "$ml" "$f" "$b" "$lb" "$g" "$p" \
            "$(awk -v a="$mb" -v b="$ma" 'BEGIN{printf "%.2fx plain", a / b}') (<= 1.5x)"
          unset -n cmd
        done
      fi ;;
    *) echo "bench_scale: unknown case $c" >&2; exit 2 ;;
  esac
done
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1e6}' /proc/meminfo); load $(cat /proc/loadavg | cut -d' ' -f1-3);" \
  "$(date -u +%Y-%m-%dT%H:%MZ); outputs in $work/"
# Which binary gave these figures (a binary built from a tree with local edits once stood for a commit).
echo "binary: $bin, sha256 $(sha256sum "$bin" | cut -c1-16), built $(date -u -r "$bin" +%Y-%m-%dT%H:%MZ);" \
  "tree: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- . ':!logs' 2>/dev/null || echo ' with local edits')"

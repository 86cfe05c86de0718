# Helpers sourced by the benchmark scripts (bench_search.sh, bench_vcpu_pair.sh).

# The median of the numbers on stdin, one per line (the mean of the middle two for an even count).
median() { sort -g | awk '{v[NR] = $1} END{print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

# proc_time_build DIR: builds scripts/proc_time.cc (the wall time and peak RSS of a command's own
# processes; see its header) into DIR/proc_time where missing or older than the source, and prints
# that path. Uses $CXX, else g++ (install_deps.sh installs it).
proc_time_build() {
  local dir=$1 src; src="$(dirname "${BASH_SOURCE[0]}")/proc_time.cc"
  if [[ ! -x $dir/proc_time || $src -nt $dir/proc_time ]]; then
    "${CXX:-g++}" -O2 -std=c++17 -o "$dir/proc_time" "$src" || { echo "bench: cannot build $src" >&2; return 1; }
  fi
  echo "$dir/proc_time"
}

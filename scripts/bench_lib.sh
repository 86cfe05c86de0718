# Helpers sourced by the benchmark scripts (bench_search.sh, bench_vcpu_pair.sh).

# The median of the numbers on stdin, one per line (the mean of the middle two for an even count).
median() { sort -g | awk '{v[NR] = $1} END{print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

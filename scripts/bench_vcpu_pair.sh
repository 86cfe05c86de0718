#!/usr/bin/env bash
# What this machine gives a second thread, by kind of work: each loop below runs alone, then two copies
# at once (one per CPU), ROUNDS times; it prints the medians and 2 x alone / together (2.00x: the second
# CPU is a whole core's worth; less: the two CPUs share a core's execution units or caches, as SMT
# siblings do, or the host gives them less).
#   scripts/bench_vcpu_pair.sh [ROUNDS]      (default 7; needs cc)
# Loops (about 0.3-0.7 s each):
#   chain   one dependent multiply chain: latency-bound, one instruction in flight (low IPC);
#   ilp     eight independent add/xor chains: issue-bound (high IPC), as the planner's search loops are;
#   l2      pointer chasing over 1 MiB: L2-resident loads;
#   dram    pointer chasing over 16 MiB: L3 / memory.
# Why: scripts/bench_search.sh's `threads` case compares 2 threads with 1 on the row-2 search and reports
# the machine's ceiling for that search (two one-thread searches at once); this shows which resources set it.
set -euo pipefail
rounds=${1:-7}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/loop.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  const char* kind = argv[1];
  unsigned long sink = 0;
  double t0;
  if (!strcmp(kind, "chain")) {
    unsigned long y = 1;
    t0 = now();
    for (long i = 0; i < 200000000L; i++) y = y * 6364136223846793005UL + 1442695040888963407UL;
    sink = y;
  } else if (!strcmp(kind, "ilp")) {
    unsigned long a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7, h = 8;
    t0 = now();
    for (long i = 0; i < 300000000L; i++) {
      a += b ^ i; b += c ^ a; c += d ^ i; d += e ^ c; e += f ^ i; f += g ^ e; g += h ^ i; h += a ^ g;
      __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g), "+r"(h));
    }
    sink = a + b + c + d + e + f + g + h;
  } else {
    const size_t bytes = !strcmp(kind, "l2") ? (1u << 20) : (16u << 20), n = bytes / sizeof(size_t);
    const long steps = !strcmp(kind, "l2") ? 30000000L : 8000000L;
    size_t* next = malloc(bytes);
    for (size_t i = 0; i < n; i++) next[i] = i;
    srand(1);  /* one random cycle (Sattolo) */
    for (size_t i = n - 1; i > 0; i--) { size_t j = (size_t)rand() % i, t = next[i]; next[i] = next[j]; next[j] = t; }
    size_t k = 0;
    t0 = now();
    for (long i = 0; i < steps; i++) k = next[k];
    sink = k;
    free(next);
  }
  printf("%.6f %lu\n", now() - t0, sink & 1);
  return 0;
}
EOF
cc -O2 -o "$work/loop" "$work/loop.c"
source "$(dirname "$0")/bench_lib.sh"  # median
printf '| loop | alone s | two at once s (slower copy) | 2 x alone / together |\n|---|---|---|---|\n'
for kind in chain ilp l2 dram; do
  : > "$work/alone"; : > "$work/both"
  for ((i = 0; i < rounds; i++)); do
    "$work/loop" "$kind" | cut -d' ' -f1 >> "$work/alone"
    ( "$work/loop" "$kind" & "$work/loop" "$kind" & wait ) | cut -d' ' -f1 | sort -g | tail -1 >> "$work/both"
  done
  a=$(median < "$work/alone"); b=$(median < "$work/both")
  printf '| %s | %.3f | %.3f | %.2fx |\n' "$kind" "$a" "$b" "$(echo "2 * $a / $b" | bc -l)"
done
echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); $(date -u +%Y-%m-%dT%H:%MZ); $rounds rounds"

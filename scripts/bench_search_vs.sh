#!/usr/bin/env bash
# Runs scripts/bench_search.sh for two builds side by side in one run: for each case, the old
# binary then the new, then the new then the old (ABBA, so a drift of the machine's speed
# cancels), and prints each case's rows for both with the ratio of the new build's wall time
# to the old's (the mean of the two rounds). A benchmark, not a test: it checks nothing.
#
#   scripts/bench_search_vs.sh --old BIN --new BIN [--samples DIR] [--cases "row2 threads 32 48 3x256 settings"]
set -euo pipefail
cd "$(dirname "$0")/.."
old="" new="" samples=../shared/metis-samples cases="row2 threads 32 48 3x256 settings"
while (($#)); do
  case "$1" in
    --old) old=$2; shift 2 ;;
    --new) new=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "bench_search_vs: unknown argument $1 (expected --old, --new, --samples, --cases)" >&2; exit 2 ;;
  esac
done
[[ -x $old && -x $new ]] || { echo "bench_search_vs: --old BIN and --new BIN must be executables" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# rows BIN CASE FILE: the case's table rows (no header) for BIN.
rows() { bash scripts/bench_search.sh --bin "$1" --samples "$samples" --cases "$2" | grep '^| ' | grep -v -e '^| case' -e '^|---' >"$3"; }
# walls FILE: the wall-time column (3rd) of each row, one per line.
walls() { awk -F' \\| ' '{print $3}' "$1"; }
echo "| case | command | old wall s (AB, BA) | new wall s (AB, BA) | new/old | old best | new best |"
echo "|---|---|---|---|---|---|---|"
for c in $cases; do
  rows "$old" "$c" "$tmp/o1"; rows "$new" "$c" "$tmp/n1"
  rows "$new" "$c" "$tmp/n2"; rows "$old" "$c" "$tmp/o2"
  paste -d'\t' <(awk -F' \\| ' '{print $1 "|" $2}' "$tmp/o1" | sed 's/^| //') <(walls "$tmp/o1") <(walls "$tmp/o2") \
    <(walls "$tmp/n1") <(walls "$tmp/n2") <(awk -F' \\| ' '{print $5}' "$tmp/o1") <(awk -F' \\| ' '{print $5}' "$tmp/n1") |
    awk -F'\t' '{split($1, k, "|"); r = ($2 + $3 > 0 && $4 ~ /^[0-9.]+$/) ? sprintf("%.3f", ($4 + $5) / ($2 + $3)) : "-";
      printf "| %s | %s | %s, %s | %s, %s | %s | %s | %s |\n", k[1], k[2], $2, $3, $4, $5, r, $6, $7}'
done
echo
echo "old: $old ($(sha256sum "$old" | cut -c1-12)); new: $new ($(sha256sum "$new" | cut -c1-12)); machine: $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"

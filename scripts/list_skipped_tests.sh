#!/usr/bin/env bash
# Lists the tests of the last ctest run in BUILD_DIR (default build/) that
# skipped for want of outside data, grouped by the reason they printed
# ("HETPLAN_SKIP: <reason>", tests/fixtures.h).
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[[ -f "$log" ]] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = substr($0, index($0, "Test: ") + 6); next }
  /HETPLAN_SKIP: / && !(name in seen) {
    seen[name] = 1; ++n; reason = $0; sub(/.*HETPLAN_SKIP: /, "", reason)
    if (!(reason in count)) order[++r] = reason
    names[reason] = names[reason] "\n    " name; ++count[reason]
  }
  END {
    if (n == 0) exit
    printf "%d test(s) skipped for want of outside data:\n", n
    for (i = 1; i <= r; ++i) printf "  %d skipped: %s%s\n", count[order[i]], order[i], names[order[i]]
  }' "$log"

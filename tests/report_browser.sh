#!/usr/bin/env bash
# The HTML report in a real browser: plans a heterogeneous cluster (the demo's
# 16-GPU A100/V100 hostfile, roofline profiles), writes `hetplan report`, loads
# it in headless Chromium and checks that the page's script counted one SVG
# lane per rank (body data-lanes, set once the page has run), then keeps a
# screenshot. Skips (HETPLAN_SKIP, tests/CMakeLists.txt) without Chromium.
# Usage: report_browser.sh HETPLAN_BINARY SOURCE_DIR OUT_DIR
set -euo pipefail
hetplan=$1 src=$2 out=$3
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null; then browser=$b; break; fi
done
if [[ -z "$browser" ]]; then
  echo "HETPLAN_SKIP: no headless browser (chromium) is installed; scripts/install_deps.sh --browser installs it"
  exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$hetplan" gen-profiles --analytic 10 64 --types A100,V100 --max-tp 4 --out "$work/profiles" >/dev/null
"$hetplan" search -q --hostfile "$src/hostfiles/a100_v100_16.hostfile" --clusterfile "$src/hostfiles/clusterfile.json" \
  --profiles "$work/profiles" --num_layers 10 --gbs 64 --top 1 --json "$work/plan.json" >/dev/null
"$hetplan" report --plan "$work/plan.json" --out "$work/report.html"
# The ranks: one memory bar each (the Catch2 tests of tests/test_report.cc pin that against the plan).
ranks=$(grep -o '<g class="membar"' "$work/report.html" | wc -l)
[[ "$ranks" -gt 0 ]] || { echo "report_browser: the report has no memory bars"; exit 1; }
flags=(--headless --disable-gpu --no-sandbox --no-first-run --user-data-dir="$work/chrome" --hide-scrollbars)
dom=$(timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$work/report.html" 2>/dev/null)
if ! grep -q "data-lanes=\"$ranks\"" <<<"$dom"; then
  echo "report_browser: expected the page to count $ranks lanes; its body says:"
  grep -o '<body[^>]*>' <<<"$dom" || echo "(no body: the page did not load)"
  exit 1
fi
echo "report_browser: $browser counted $ranks lanes, one per rank"
timeout 120 "$browser" "${flags[@]}" --screenshot="$out/report_screenshot.png" --window-size=1400,1000 \
  "file://$work/report.html" >/dev/null 2>&1
[[ -s "$out/report_screenshot.png" ]] || { echo "report_browser: no screenshot"; exit 1; }
cp "$work/report.html" "$out/report.html"
echo "report_browser: screenshot in $out/report_screenshot.png"

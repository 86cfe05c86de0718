#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest). Tests whose
# outside data is absent (Metis's sample profiles: scripts/fetch_reference_data.sh;
# the golden Table-1 values) are skipped, and listed with the reason at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
rc=0
ctest --test-dir build --output-on-failure --parallel "$(nproc)" || rc=$?
scripts/list_skipped_tests.sh build
exit $rc

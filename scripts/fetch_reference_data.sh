#!/usr/bin/env bash
# Downloads Metis's published sample profiles (the 9 DeviceType.A100_tp*_bs*.json
# files and clusterfile.json of livingshade/Metis at a pinned commit), checks
# each file's SHA-256, and puts them where the tests look:
# $HETPLAN_SHARED/metis-samples (default: ../shared next to this checkout).
# HETPLAN_REFERENCE_URL overrides the base URL (https:// or file://) that the
# repository-relative paths below are appended to.
# The golden Table-1 values (golden/table1.json) are not public; the tests
# that need them skip without them.
set -euo pipefail
cd "$(dirname "$0")/.."

commit=900445fec77f99590236c4004a44fc1c0bc65149
base="${HETPLAN_REFERENCE_URL:-https://raw.githubusercontent.com/livingshade/Metis/$commit}"
base="${base%/}"
dest="${HETPLAN_SHARED:-$PWD/../shared}/metis-samples"

# SHA-256 and path in the repository at $commit.
files=(
  "6276cfb79ed60d9bee413e637e25b0a9b29aac3204a5a1b3e115736b0c99fe72 profile_data_samples/DeviceType.A100_tp1_bs1.json"
  "7d020d361577c64cfce7feef769743468c9d74d2c0f7bed7c0335819be228bf5 profile_data_samples/DeviceType.A100_tp1_bs2.json"
  "454b71a36683fefb20d788350cda67e9c6ed2a72a036fc0c93c55e26026e82ad profile_data_samples/DeviceType.A100_tp1_bs4.json"
  "6337791a3a9260ec23796f67fe53a64fcbaed092dd733cd49ba05c57869b8edf profile_data_samples/DeviceType.A100_tp2_bs1.json"
  "0986203dce83dc29ea92f322b70747bd9d5bb4bb56124ea909bd05627e1c49a7 profile_data_samples/DeviceType.A100_tp2_bs2.json"
  "aa3f9cb6fd945758f1833c5c0f4529b73a518cec7dd583e36ccc00c8dbd2837e profile_data_samples/DeviceType.A100_tp2_bs4.json"
  "4264c6253463a99c1a9ae89011856b6d27d41ef088df626f2b9836e19ef88b03 profile_data_samples/DeviceType.A100_tp4_bs1.json"
  "1dac9a77d2467317932642c8591f19cbf15f74afaa237cc0d23fb8bb89fd1501 profile_data_samples/DeviceType.A100_tp4_bs2.json"
  "2dd6ef84c370e77f2781a361b602feb2b451932414fb274a606e1b9b9c66d83e profile_data_samples/DeviceType.A100_tp4_bs4.json"
  "5cac51a0a3795e69f7d2641e295bcd3f896c0f6aab90d635c89a99a0d1f7791b clusterfile.json"
)

sha() { sha256sum "$1" | cut -c1-64; }

# Already there and intact: nothing to do.
ok=1
for entry in "${files[@]}"; do
  read -r want path <<<"$entry"
  f="$dest/$(basename "$path")"
  if [[ ! -f "$f" || "$(sha "$f")" != "$want" ]]; then ok=0; break; fi
done
if ((ok)); then
  echo "fetch_reference_data: $dest already holds the ${#files[@]} files (SHA-256 checked)"
  exit 0
fi

command -v curl >/dev/null || { echo "fetch_reference_data: needs curl (apt-get install curl)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for entry in "${files[@]}"; do
  read -r want path <<<"$entry"
  name=$(basename "$path")
  if ! curl -fsSL --retry 3 -o "$tmp/$name" "$base/$path"; then
    echo "fetch_reference_data: could not download $base/$path" >&2
    exit 1
  fi
  got=$(sha "$tmp/$name")
  if [[ "$got" != "$want" ]]; then
    echo "fetch_reference_data: $base/$path: SHA-256 $got, expected $want; nothing written" >&2
    exit 1
  fi
done
# Every file checked: only now touch the destination.
mkdir -p "$dest"
for entry in "${files[@]}"; do
  read -r _ path <<<"$entry"
  install -m 0644 "$tmp/$(basename "$path")" "$dest/"
done
echo "fetch_reference_data: ${#files[@]} files of livingshade/Metis@$commit in $dest (SHA-256 checked)"

#!/usr/bin/env bash
# Installs hetplan's build dependencies from Debian's packages, if missing:
# the toolchain, TBB, Boost.Graph, nlohmann-json, CLI11, Catch2, and CPU
# LibTorch 1.13 with the Gloo headers (profiler). --no-torch skips LibTorch
# (the planner and simulator build without it). --fuzz adds clang 14 and
# its runtime libraries (libFuzzer, sanitizers) for scripts/fuzz.sh.
# Usage: install_deps.sh [--no-torch] [--fuzz]
set -euo pipefail

torch=1 fuzz=0
for a in "$@"; do
  case "$a" in
    --no-torch) torch=0 ;;
    --fuzz) fuzz=1 ;;
    *) echo "install_deps: unknown option $a (expected --no-torch, --fuzz)" >&2; exit 2 ;;
  esac
done
pkgs=(cmake ninja-build g++ libtbb-dev libboost-graph-dev nlohmann-json3-dev libcli11-dev catch2 time)
if ((torch)); then pkgs+=(libtorch-dev libgloo-dev); fi
if ((fuzz)); then pkgs+=(clang-14 libclang-rt-14-dev); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all present (${pkgs[*]})"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
echo "install_deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Installs hetplan's build dependencies from Debian's packages, if missing:
# the toolchain, TBB, Boost.Graph, nlohmann-json, CLI11, Catch2, and CPU
# LibTorch 1.13 with the Gloo headers (profiler). --no-torch skips LibTorch
# (the planner and simulator build without it). --fuzz adds clang 14 and
# its runtime libraries (libFuzzer, sanitizers) for scripts/fuzz.sh.
# --browser adds headless Chromium (Debian's `chromium`), an optional piece:
# only the browser test of `hetplan report` uses it (it skips without it),
# and a failed install of it is a warning. The full install (no --no-torch)
# includes it unless --no-browser.
# Usage: install_deps.sh [--no-torch] [--fuzz] [--browser|--no-browser]
set -euo pipefail

torch=1 fuzz=0 browser=-1
for a in "$@"; do
  case "$a" in
    --no-torch) torch=0 ;;
    --fuzz) fuzz=1 ;;
    --browser) browser=1 ;;
    --no-browser) browser=0 ;;
    *) echo "install_deps: unknown option $a (expected --no-torch, --fuzz, --browser, --no-browser)" >&2; exit 2 ;;
  esac
done
if ((browser < 0)); then browser=$torch; fi
pkgs=(cmake ninja-build g++ libtbb-dev libboost-graph-dev nlohmann-json3-dev libcli11-dev catch2 time)
if ((torch)); then pkgs+=(libtorch-dev libgloo-dev); fi
if ((fuzz)); then pkgs+=(clang-14 libclang-rt-14-dev); fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
want_browser=0
if ((browser)) && ! installed chromium; then want_browser=1; fi
if ((${#missing[@]} == 0 && want_browser == 0)); then
  echo "install_deps: all present (${pkgs[*]}$( ((browser)) && echo " chromium"))"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
"${sudo[@]}" apt-get update -qq
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ((want_browser)); then
  echo "install_deps: installing chromium (optional: the browser test of hetplan report)"
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core ||
    echo "install_deps: warning: chromium did not install; the browser test of hetplan report will skip" >&2
fi

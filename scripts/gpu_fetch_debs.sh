#!/usr/bin/env bash
# Here (a Debian machine with apt): downloads the .deb files of hetplan's
# non-Torch dependencies into .deps/ (git-ignored), for GPU machines that
# have CUDA, PyTorch, CMake and ninja but no package registry. Name .deps in
# the device run's `carry`; scripts/gpu_build.sh unpacks and builds there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
apt-get download libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 nlohmann-json3-dev libcli11-dev catch2 \
  libboost1.74-dev libboost-graph1.74-dev libboost-graph1.74.0
du -sh .

#!/usr/bin/env bash
# There (a GPU machine): unpacks .deps/*.deb into /opt/deps (never into /),
# finds PyTorch's LibTorch, and builds hetplan with CUDA into build-gpu/.
# Source scripts/gpu_env.sh before running the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /opt/deps
for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
mkdir -p build-gpu
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETPLAN_BUILD_TESTS="${HETPLAN_BUILD_TESTS:-OFF}" \
  -DCMAKE_PREFIX_PATH="$torch_prefix;/opt/deps/usr/lib/x86_64-linux-gnu/cmake;/opt/deps/usr/share/cmake;/opt/deps/usr" \
  > build-gpu/configure.log 2>&1 || { tail -40 build-gpu/configure.log; exit 1; }
grep -E "hetplan: LibTorch" build-gpu/configure.log || true
cmake --build build-gpu --parallel "$(nproc)"

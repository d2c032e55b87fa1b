#!/usr/bin/env bash
# Builds hotmoe into build/release (CUDA kernels too when nvcc is found). Prints the binary path.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
mkdir -p build
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >build/cmake-release.log 2>&1 \
  || { cat build/cmake-release.log; exit 1; }
cmake --build build/release -j"$(nproc)" >&2
echo "$PWD/build/release/hotmoe"

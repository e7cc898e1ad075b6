#!/usr/bin/env bash
# Cross-builds the CPU kernels and their unit tests for 64-bit Arm Linux (cmake/toolchains/aarch64-linux-gnu.cmake,
# -DLATHE_KERNELS_ONLY=ON) and runs the tests under qemu-user. Usage: scripts/cross_arm64.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-arm64}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DLATHE_KERNELS_ONLY=ON -DLATHE_WERROR=ON >/dev/null
cmake --build "$dir" -j"$(nproc)"
(cd "$dir" && ctest -L kernels -j"$(nproc)" --output-on-failure --timeout 1200)

#!/usr/bin/env bash
# Runs every test CI runs: formatting, the warning-clean build with all test labels but cuda, then the
# ASan/UBSan build over the unit and parity suites.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
# npm packages of the server's SDK end-to-end tests (a no-op when node_modules is current).
tests/e2e/node/ensure_deps.sh

echo "=== clang-format check ==="
git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs -r clang-format --dry-run --Werror

echo "=== build (Release, -Wall -Wextra -Werror) ==="
scripts/build.sh build -DLATHE_WERROR=ON
(cd build && ctest -LE cuda -j"$jobs" --output-on-failure --timeout 600)

echo "=== build (ASan + UBSan) ==="
# -O1 without debug info keeps this build (the slower of the two) well inside CI's time; asserts stay on.
scripts/build.sh build-asan -DLATHE_SANITIZE=ON -DLATHE_WERROR=ON -DLATHE_BENCH=OFF -DLATHE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest -LE cuda -j"$jobs" --output-on-failure --timeout 900)
echo "all tests passed"

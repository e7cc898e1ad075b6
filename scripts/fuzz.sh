#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs each for a bounded time.
# Usage: scripts/fuzz.sh [seconds-per-target (default 20)] [target...]
# LATHE_FUZZ_PHASE=build or run does only that half (CI runs the targets beside another build).
# New inputs go to a scratch corpus (build-fuzz/corpus/<target>); tests/fuzz/corpus/<target> is read, not
# written. A crash leaves its input in build-fuzz/artifacts/: add it to tests/fuzz/corpus/<target>/ with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
phase=${LATHE_FUZZ_PHASE:-all}
if [ "$phase" != run ]; then
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang -DLATHE_FUZZ=ON -DLATHE_CUDA=OFF -DLATHE_BENCH=OFF ${LATHE_FUZZ_CMAKE_ARGS:-} >/dev/null
  cmake --build build-fuzz -j"$(nproc)" --target lathe_fuzz_targets
fi
[ "$phase" = build ] && exit 0
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$f" .cc)"); done
fi
mkdir -p build-fuzz/artifacts
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  seeds="tests/fuzz/corpus/$t"
  [ -d "$seeds" ] || seeds=""
  echo "=== fuzz $t (${secs}s) ==="
  # Inputs up to 64 KB, 2 GB of memory and 10 s each: beyond those the target itself is at fault. A fixed seed
  # (LATHE_FUZZ_SEED to vary it) makes a CI finding reproducible here with the same tree and time.
  "build-fuzz/tests/$t" -seed="${LATHE_FUZZ_SEED:-1}" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$t-" "build-fuzz/corpus/$t" $seeds 2>&1 | tail -n 12
done
echo "fuzzing passed"

#!/usr/bin/env bash
# Crash durability of the SSD prompt cache, the issue's 100-run version of tests/e2e/node/test/ssd_kill.test.js:
# `lathe serve --ssd-cache` killed with SIGKILL around its spills RUNS times over one directory; after every kill
# each committed file verifies, the restart deletes the .tmp orphans and indexes exactly the files on disk, and
# every answer equals its cold output.
# Usage: bench/ssd_kill_loop.sh [build-dir] [runs] [seed]   -> one JSON line of counts on stdout
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
runs=${2:-100}
seed=${3:-$RANDOM}
report=$(mktemp)
trap 'rm -f "$report"' EXIT
cd "$root/tests/e2e/node"
LATHE_BINARY="$build/lathe" LATHE_SOURCE_DIR="$root" LATHE_SSD_KILL_RUNS="$runs" LATHE_SSD_KILL_SEED="$seed" \
  LATHE_SSD_KILL_REPORT="$report" node --test --test-timeout=3600000 test/ssd_kill.test.js >&2
cat "$report"

#!/usr/bin/env bash
# One command for a new user: install dependencies, build, and run lathe on the bundled demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
# The demo model answers in upper case; these ids are the ChatML prompt for "Write a haiku about the sea."
echo "--- lathe run on the bundled demo model (models/demo) ---"
./build/lathe run --model models/demo --ids 1,87,264,84,201,57,325,273,268,395,67,75,77,87,268,68,295,86,277,442,67,16,2,201,1,466,334,285,308,86,201 --max-tokens 24

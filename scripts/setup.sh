#!/usr/bin/env bash
# One command for a new user: install dependencies, build, and run lathe on the bundled demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
echo "--- lathe generate on the bundled demo model (models/demo answers in upper case) ---"
./build/lathe generate --model models/demo --chat --prompt "hello from lathe" --max-tokens 32

#!/usr/bin/env bash
# One command for a new user: install dependencies, build, and serve the bundled demo model over HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
echo "--- lathe serve on the bundled demo model (models/demo answers in upper case); Ctrl-C stops it ---"
echo "try: curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' \\"
echo "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}]}'"
exec ./build/lathe serve "$@"

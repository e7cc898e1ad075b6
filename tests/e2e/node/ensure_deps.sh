#!/bin/sh
# Installs the e2e tests' npm packages (package-lock.json) unless node_modules is already current, so that a
# run without network access works once they are installed.
set -eu
cd "$(dirname "$0")"
if [ -f node_modules/.package-lock.json ] && [ ! package-lock.json -nt node_modules/.package-lock.json ]; then
  exit 0
fi
exec npm ci --no-audit --no-fund --loglevel=error

#!/usr/bin/env bash
# Installs the Debian packages lathe builds against (skips what is already there).
set -euo pipefail
PKGS=(build-essential cmake pkg-config git nlohmann-json3-dev libcli11-dev libpcre2-dev libicu-dev zlib1g-dev
      libgtest-dev libgmock-dev libbenchmark-dev clang-format xz-utils
      libcpp-httplib-dev libboost-dev libssl-dev libbrotli-dev libxxhash-dev libsqlite3-dev
      chromium clang libclang-rt-14-dev  # chromium: the CORS e2e test; clang + libFuzzer: tests/fuzz
      g++-aarch64-linux-gnu qemu-user)  # the Arm cross build of the CPU kernels, its tests under qemu
missing=()
# node + npm: the server's end-to-end tests drive it with the official SDKs (tests/e2e/node). Judged by the
# commands, not the packages: a NodeSource nodejs bundles npm and conflicts with Debian's npm package.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

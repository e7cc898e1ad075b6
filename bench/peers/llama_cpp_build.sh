#!/usr/bin/env bash
# Build llama.cpp's CPU tools (llama-bench, llama-quantize) from a source tree, outside this repository.
# Usage: bench/peers/llama_cpp_build.sh SRC [BUILD_DIR]      -> prints BUILD_DIR/bin on stdout
#   SRC: a llama.cpp source directory, or a git directory (bare or not) whose HEAD is checked out first into
#        BUILD_DIR/src (files whose blobs the git directory lacks, e.g. large test vocabularies in a partial
#        mirror, are skipped: none of them is needed to build).
#   BUILD_DIR: default ${LATHE_PEER_DIR:-~/.cache/lathe-peers}/llama.cpp (re-used: a second call only rebuilds what changed).
#   LLAMA_EXTRA_TARGETS (environment): more targets, e.g. llama-tokenize to check a converted vocabulary.
#   LLAMA_NO_AMX=1 (environment): build without ggml's AMX kernels, for a VM whose CPU reports AMX but where
#        llama-bench dies in ggml_backend_amx_mul_mat (explicit -mno flags win over -march=native).
# Release, CPU only, -DGGML_NATIVE=ON (the build uses every ISA extension this CPU has), no tests, no server, no
# network (LLAMA_CURL/LLAMA_OPENSSL off). Nothing here is ever committed.
set -euo pipefail
src=${1:?usage: llama_cpp_build.sh SRC [BUILD_DIR]}
out=${2:-${LATHE_PEER_DIR:-$HOME/.cache/lathe-peers}/llama.cpp}
mkdir -p "$out"
src=$(cd "$src" && pwd)
if [ ! -f "$src/CMakeLists.txt" ] && git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  gitdir=$src
  head=$(git --git-dir="$gitdir" rev-parse HEAD)
  src=$out/src
  if [ "$(cat "$out/src.commit" 2>/dev/null)" != "$head" ]; then
    echo "llama_cpp_build: checking out $head from $gitdir into $src" >&2
    rm -rf "$src" && mkdir -p "$src"
    idx=$(mktemp)
    export GIT_DIR=$gitdir GIT_INDEX_FILE=$idx
    git read-tree HEAD
    # Blobs a partial mirror lacks (skipped; none is a build input).
    missing=$(git ls-files -s | awk '{print $2}' | git cat-file --batch-check | awk '$2 == "missing" {print $1}')
    if [ -n "$missing" ]; then
      git ls-files -s | grep -F "$missing" | cut -f2 | tee /dev/stderr | xargs -r git update-index --force-remove
    fi
    git checkout-index -a --prefix="$src/"
    unset GIT_DIR GIT_INDEX_FILE
    rm -f "$idx"
    echo "$head" > "$out/src.commit"
  fi
fi
[ -f "$src/CMakeLists.txt" ] || { echo "llama_cpp_build: $src is not a llama.cpp source tree" >&2; exit 1; }
# A build directory configured from another source tree: start it again.
if [ -f "$out/build/CMakeCache.txt" ] &&
  ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$out/build/CMakeCache.txt"; then
  rm -rf "$out/build"
fi
# Trees before llama.cpp's tools/ folder (early 2025) keep llama-bench and llama-quantize under examples/.
examples=OFF
[ -d "$src/tools" ] || examples=ON
# LLAMA_NO_AMX=1: -mno-amx-* beside -march=native (see the header).
amx=()
if [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  amx=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
fi
cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$examples -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF "${amx[@]}" >&2
cmake --build "$out/build" --target llama-bench llama-quantize ${LLAMA_EXTRA_TARGETS:-} -j "$(nproc)" >&2
echo "$out/build/bin"

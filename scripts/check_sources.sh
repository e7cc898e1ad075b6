#!/usr/bin/env bash
# The CMake source lists are explicit (no GLOB), so a file left out of them would silently not be compiled or
# tested. Compares the files git tracks (src/**/*.cc, src/tensor/cuda/*.cu, tests/{unit,parity,e2e,cuda}/*.cc,
# tests/fuzz/*_fuzz.cc, tests/e2e/node/test/*.test.js, bench/*.cc) with the path lines of the lists
# (cmake/sources.cmake, tests/sources.cmake, bench/CMakeLists.txt); prints each file missing from them, each
# listed path that is not a tracked file, each path listed twice and each list out of byte order (the order keeps
# the unity batches). Exits 1 on any of these.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C
lists=(cmake/sources.cmake tests/sources.cmake bench/CMakeLists.txt)
path_line='^[[:space:]]+(src|tests|bench)/[^[:space:]]+$'

on_disk=$(git ls-files ':(glob)src/**/*.cc' ':(glob)src/tensor/cuda/*.cu' ':(glob)tests/unit/*.cc' \
  ':(glob)tests/parity/*.cc' ':(glob)tests/e2e/*.cc' ':(glob)tests/cuda/*.cc' ':(glob)tests/fuzz/*_fuzz.cc' \
  ':(glob)tests/e2e/node/test/*.test.js' ':(glob)bench/*.cc' | sort)
listed=$(grep -hE "$path_line" "${lists[@]}" | sed 's/^[[:space:]]*//' | sort)

rc=0
while read -r f; do
  [ -n "$f" ] || continue
  echo "check_sources: $f is not in ${lists[*]}"
  rc=1
done < <(comm -23 <(echo "$on_disk") <(echo "$listed" | uniq))
while read -r f; do
  [ -n "$f" ] || continue
  echo "check_sources: listed but not a tracked source: $f"
  rc=1
done < <(comm -13 <(echo "$on_disk") <(echo "$listed" | uniq))
while read -r f; do
  [ -n "$f" ] || continue
  echo "check_sources: listed twice: $f"
  rc=1
done < <(echo "$listed" | uniq -d)
# Each list (a run of path lines) in plain byte order, as GLOB gave it.
for l in "${lists[@]}"; do
  if ! awk -v re="$path_line" -v file="$l" '
      $0 ~ re { sub(/^[[:space:]]+/, ""); if (prev != "" && $0 < prev) { print "check_sources: " file ": " $0 " is out of order (after " prev ")"; bad = 1 } prev = $0; next }
      { prev = "" }
      END { exit bad }' "$l"; then
    rc=1
  fi
done
if [ "$rc" -ne 0 ]; then
  echo "check_sources: update the source lists (one path a line, sorted) to match the tracked files"
fi
exit "$rc"

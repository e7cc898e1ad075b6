#!/usr/bin/env bash
# `lathe quantize` throughput on the CPU: a synthetic bf16 checkpoint (`lathe synth --bits 16`) quantized to
# 4-bit g64 (and 8-bit g32), reported as GB/s of source weights, with peak resident memory (GNU time) against
# the source size. The source is read once from a warm page cache first, so the figure is the quantizer's, not
# the disk's. The peer is the copy bandwidth of the same file (`cat` to /dev/null from the page cache).
# Usage: bench/quantize_cpu.sh [build-dir] [like] [threads]   -> JSON lines on stdout
set -euo pipefail
build=${1:-build}
like=${2:-qwen3-4b}
threads=${3:-2}
dir=${TMPDIR:-/tmp}/lathe-synth-$like-16
[ -f "$dir/model.safetensors" ] || "$build/lathe" synth --like "$like" --bits 16 --out "$dir" >&2
src_bytes=$(stat -c %s "$dir/model.safetensors")
start=$(date +%s.%N); cat "$dir/model.safetensors" > /dev/null; end=$(date +%s.%N)
start=$(date +%s.%N); cat "$dir/model.safetensors" > /dev/null; end=$(date +%s.%N)
copy_gbs=$(python3 -c "print(round($src_bytes / 1e9 / ($end - $start), 3))")
for spec in "4 64" "8 32"; do
  set -- $spec
  out=${TMPDIR:-/tmp}/lathe-quantized-$like-$1-$2
  rm -rf "$out"
  /usr/bin/time -f '%M' -o "$out.rss" "$build/lathe" --threads "$threads" quantize --model "$dir" --out "$out" \
    --bits "$1" --group-size "$2" --eval-tokens 0 2>/dev/null > "$out.json"
  python3 -c "
import json
s = json.load(open('$out.json'))
rss_kib = int(open('$out.rss').read().split()[-1])
print(json.dumps({'like': '$like', 'bits': $1, 'group': $2, 'threads': $threads, 'source_gb': round(s['source_bytes'] / 1e9, 3),
                  'seconds': round(s['seconds'], 2), 'source_gb_per_s': round(s['source_gb_per_s'], 3),
                  'page_cache_copy_gb_per_s': $copy_gbs, 'peak_rss_mib': round(rss_kib / 1024, 1),
                  'output_gb': round(s['output_bytes'] / 1e9, 3), 'bits_per_weight': s['bits_per_weight']}))"
  rm -rf "$out" "$out.rss" "$out.json"
done

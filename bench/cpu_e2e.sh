#!/usr/bin/env bash
# End-to-end CPU figures for `lathe run` on a synthetic checkpoint: prefill and decode tok/s, and resident
# memory after load against the weight file size (weights are mapped, not copied).
# Usage: bench/cpu_e2e.sh [build-dir] [like] [bits] [group] [run flags, e.g. --exact]   -> JSON lines on stdout
# Each line also carries the process CPU seconds (user + sys): on a shared, loaded machine wall-clock tok/s
# mostly measures the scheduler, CPU seconds what lathe spent.
set -euo pipefail
build=${1:-build}
like=${2:-qwen3-0.6b}
bits=${3:-4}
group=${4:-64}
flags=${5:-}
dir=${TMPDIR:-/tmp}/lathe-synth-$like-$bits-$group
[ -f "$dir/model.safetensors" ] || "$build/lathe" synth --like "$like" --bits "$bits" --group-size "$group" --out "$dir" >&2
ids=$(python3 -c "print(','.join(str((i * 7919) % 150000) for i in range(128)))")
# Warm the page cache once so load time and RSS reflect a mapped, resident file.
cat "$dir/model.safetensors" > /dev/null
for threads in 2 1; do
  /usr/bin/time -f '%U %S' -o "$dir.cpu" "$build/lathe" --threads "$threads" run --model "$dir" --ids "$ids" \
    --max-tokens 65 --ignore-eos --json $flags |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
u, s = open('$dir.cpu').read().split()[-2:]
print(json.dumps({'like': '$like', 'bits': $bits, 'group': $group, 'threads': $threads, 'flags': '$flags',
                  'cpu_s': round(float(u) + float(s), 2), 'prompt_tokens': j['prompt_tokens'],
                  'prefill_tok_s': round(j['prefill_tok_s'], 2), 'decode_tok_s': round(j['decode_tok_s'], 2),
                  'load_ms': round(j['load_ms'], 1), 'rss_after_load_mib': round(j['rss_after_load_mib'], 1), 'rss_after_decode_mib': round(j['rss_after_decode_mib'], 1),
                  'weights_file_mib': round(j['weights_file_mib'], 1)}))"
done

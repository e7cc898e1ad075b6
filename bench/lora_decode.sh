#!/usr/bin/env bash
# [lora] decode figures for `lathe run` on a synthetic checkpoint: decode tok/s with 0, 1 and 2 stacked
# adapters at each rank (all seven targets: q/k/v/o/gate/up/down of every layer; random adapters from
# `lathe synth --lora-rank`), and the time to mount a ~100 MB adapter (adapter_mount_ms). Configurations are
# interleaved REPS times (base, r8, r8+r8, r16, ...) so drift hits all alike; the summary takes each one's median.
# Usage: bench/lora_decode.sh [build-dir] [like] [threads] [device cpu|cuda] [ranks] [reps] [mount-rank]
#   -> one JSON line per run, then one {"summary": ...} line per configuration (ratio = median / base median).
set -euo pipefail
build=${1:-build}
like=${2:-qwen3-0.6b}
threads=${3:-2}
device=${4:-cpu}
ranks=${5:-8 16 64}
reps=${6:-5}
mount_rank=${7:-40}  # 40 on qwen3-0.6b = 100.9 MB of F32 factors; 12 on qwen3-4b = 99 MB
tmp=${TMPDIR:-/tmp}
lathe=$build/lathe
[ -x "$lathe" ] || lathe=$build/bin/lathe
bits=${LORA_BITS:-4} gs=${LORA_GS:-64}
dir=$tmp/lathe-synth-$like-$bits-$gs
[ -f "$dir/model.safetensors" ] || "$lathe" synth --like "$like" --bits "$bits" --group-size "$gs" --out "$dir" >&2
cat "$dir/model.safetensors" > /dev/null
adapter() {  # rank seed -> dir
  local d=$tmp/lathe-lora-$like-r$1-s$2
  [ -f "$d/adapters.safetensors" ] || "$lathe" synth --like "$like" --lora-rank "$1" --seed "$2" --out "$d" >&2
  echo "$d"
}
dev_args=()
[ "$device" = cuda ] && dev_args=(--device cuda --dtype bf16)
ids=$(seq 0 31 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 150000}')
configs=("none")
for r in $ranks; do configs+=("r$r" "r$r+r$r"); done
run() {  # config rep
  local args=()
  if [ "$1" != none ]; then
    IFS=+ read -r -a parts <<< "$1"
    local seed=1
    for p in "${parts[@]}"; do args+=(--adapter "$(adapter "${p#r}" "$seed")"); seed=$((seed + 1)); done
  fi
  "$lathe" --threads "$threads" run --model "$dir" --ids "$ids" --max-tokens "${LORA_STEPS:-64}" --ignore-eos --json "${dev_args[@]}" \
    "${args[@]}" | python3 -c "
import json, sys
j = json.load(sys.stdin)
steps = max(1, j['decode_steps'])
print(json.dumps({'like': '$like', 'device': '$device', 'threads': $threads, 'adapters': '$1', 'rep': '$2',
                  'decode_tok_s': round(j['decode_tok_s'], 3), 'decode_cpu_ms_per_token': round(j['decode_cpu_ms'] / steps, 3),
                  'prefill_tok_s': round(j['prefill_tok_s'], 2), 'adapter_mount_ms': round(j['adapter_mount_ms'], 1)}))"
}
# Writes the adapters and warms the page cache (LORA_WARM=0 skips the runs and only writes the adapters).
for c in "${configs[@]}"; do
  [ "$c" = none ] && continue
  if [ "${LORA_WARM:-1}" = 0 ]; then for p in ${c//+/ }; do adapter "${p#r}" 1 > /dev/null; adapter "${p#r}" 2 > /dev/null; done
  else run "$c" 0 > /dev/null; fi
done
raw=$(mktemp)
for rep in $(seq 1 "$reps"); do
  for c in "${configs[@]}"; do run "$c" "$rep" | tee -a "$raw"; done
done
m=$(adapter "$mount_rank" 1)
for rep in 1 2 3; do
  run "r$mount_rank" "mount$rep" | python3 -c "
import json, os, sys
j = json.loads(sys.stdin.read()); j['adapter_bytes'] = os.path.getsize('$m/adapters.safetensors'); print(json.dumps(j))"
done
python3 - "$raw" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows: by.setdefault(r['adapters'], []).append(r)
base = statistics.median(r['decode_tok_s'] for r in by['none'])
base_cpu = statistics.median(r['decode_cpu_ms_per_token'] for r in by['none'])
for k, v in by.items():
    tps = statistics.median(r['decode_tok_s'] for r in v)
    cpu = statistics.median(r['decode_cpu_ms_per_token'] for r in v)
    print(json.dumps({'summary': k, 'like': v[0]['like'], 'device': v[0]['device'], 'runs': len(v),
                      'decode_tok_s_median': round(tps, 3), 'ratio_to_base': round(tps / base, 4),
                      'cpu_ms_per_token_median': cpu, 'cpu_ratio_base_over_this': round(base_cpu / cpu, 4)}))
PY
rm -f "$raw"

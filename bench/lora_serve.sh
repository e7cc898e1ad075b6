#!/usr/bin/env bash
# [lora] mixed adapters through `lathe serve`: N streaming clients (bench/serve_load) where every client uses
# the same rank-R adapter ("x1") against N clients on N different adapters ("xN", one mixed batch per step),
# with the base ("none") for reference. All N adapters are mounted at serve start in every case; the three
# cases are interleaved REPS times in one server each. Goal: xN ≥ 85% of x1.
# Usage: bench/lora_serve.sh [build-dir] [like] [clients] [rank] [max-tokens] [reps] [serve args ...]
#   -> serve_load's JSON line per case, then one {"summary": ...} line.
set -euo pipefail
build=${1:-build}
like=${2:-qwen3-0.6b}
n=${3:-8}
rank=${4:-16}
max_tokens=${5:-32}
reps=${6:-3}
shift $(( $# < 6 ? $# : 6 ))
tmp=${TMPDIR:-/tmp}
lathe=$build/lathe
[ -x "$lathe" ] || lathe=$build/bin/lathe
serve_load=$build/bench/serve_load
[ -x "$serve_load" ] || serve_load=$build/bin/serve_load
bits=${LORA_BITS:-4} gs=${LORA_GS:-64}
dir=$tmp/lathe-synth-$like-$bits-$gs
[ -f "$dir/model.safetensors" ] || "$lathe" synth --like "$like" --bits "$bits" --group-size "$gs" --out "$dir" >&2
for f in tokenizer.json tokenizer_config.json; do  # a synthetic checkpoint has no tokenizer: the real Qwen3 one
  [ -f "$dir/$f" ] || zcat "$(dirname "$0")/../tests/fixtures/tokenizers/qwen3-real/$f.gz" > "$dir/$f"
done
cat "$dir/model.safetensors" > /dev/null
adapter_args=() all=() ids=()
for i in $(seq 1 "$n"); do
  d=$tmp/lathe-lora-$like-r$rank-s$i
  [ -f "$d/adapters.safetensors" ] || "$lathe" synth --like "$like" --lora-rank "$rank" --seed "$i" --out "$d" >&2
  adapter_args+=(--adapter "$d")
  ids+=("lathe-lora-$like-r$rank-s$i")
done
mixed=$(IFS=';'; echo "${ids[*]}")
serve_args=()
for a in "$@"; do serve_args+=("--serve-arg=$a"); done
raw=$(mktemp)
for rep in $(seq 1 "$reps"); do
  for mix in "${ids[0]}" "$mixed" none; do
    "$serve_load" --lathe "$lathe" --model "$dir" --clients "$n" --prompt-tokens 32 --max-tokens "$max_tokens" \
      "${adapter_args[@]}" --mix "$mix" "${serve_args[@]}" | tee -a "$raw"
  done
done
python3 - "$raw" "$n" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
def case(r):
    m = r['mix']
    return 'none' if m == ['none'] else 'x1' if len(m) == 1 else f'x{len(m)}'
by = {}
for r in rows: by.setdefault(case(r), []).append(r['runs'][0])
med = {k: statistics.median(x['aggregate_tok_s'] for x in v) for k, v in by.items()}
cpu = {k: statistics.median(x['server_cpu_ms_per_token'] for x in v) for k, v in by.items()}
print(json.dumps({'summary': 'lora_serve', 'clients': n, 'aggregate_tok_s_median': med,
                  'server_cpu_ms_per_token_median': cpu,
                  'mixed_over_single': round(med[f'x{n}'] / med['x1'], 4),
                  'mixed_over_single_cpu': round(cpu['x1'] / cpu[f'x{n}'], 4),
                  'single_over_base': round(med['x1'] / med['none'], 4)}))
PY
rm -f "$raw"

#!/usr/bin/env bash
# CPU LoRA figures for `lathe run` on a synthetic checkpoint: decode tok/s with 0, 1 and 2 stacked adapters at
# ranks 8, 16 and 64 on all seven targets (q/k/v/o/gate/up/down of every layer), and the time to mount an
# adapter of ~100 MB (rank 40 on qwen3-0.6b: load_ms with the adapter minus load_ms without).
# Usage: bench/lora_cpu.sh [build-dir] [like] [threads]   -> JSON lines on stdout
set -euo pipefail
build=${1:-build}
like=${2:-qwen3-0.6b}
threads=${3:-2}
tmp=${TMPDIR:-/tmp}
dir=$tmp/lathe-synth-$like-4-64
[ -f "$dir/model.safetensors" ] || "$build/lathe" synth --like "$like" --bits 4 --group-size 64 --out "$dir" >&2
cat "$dir/model.safetensors" > /dev/null
# Random mlx-lm adapters shaped for the checkpoint's config.
make_adapter() {  # out-dir rank seed
  python3 - "$dir/config.json" "$1" "$2" "$3" <<'PY'
import json, os, random, struct, sys
cfg = json.load(open(sys.argv[1])); out, r, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h, i = cfg["hidden_size"], cfg["intermediate_size"]
hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
shapes = {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
          "self_attn.o_proj": (q, h), "mlp.gate_proj": (h, i), "mlp.up_proj": (h, i), "mlp.down_proj": (i, h)}
os.makedirs(out, exist_ok=True)
rng = random.Random(seed)
block = struct.pack("<4096f", *[rng.uniform(-0.01, 0.01) for _ in range(4096)])
header, chunks, off = {}, [], 0
for l in range(cfg["num_hidden_layers"]):
    for m, (fin, fout) in shapes.items():
        for suffix, shape in ((".lora_a", [fin, r]), (".lora_b", [r, fout])):
            n = shape[0] * shape[1] * 4
            header[f"model.layers.{l}.{m}{suffix}"] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
            chunks.append(n); off += n
hj = json.dumps(header).encode(); hj += b" " * (-len(hj) % 8)
with open(out + "/adapters.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hj))); f.write(hj)
    for n in chunks:
        while n > 0:
            k = min(n, len(block)); f.write(block[:k]); n -= k
json.dump({"fine_tune_type": "lora", "lora_parameters": {"rank": r, "scale": 2.0}}, open(out + "/adapter_config.json", "w"))
PY
}
ids=$(python3 -c "print(','.join(str((i * 7919) % 150000) for i in range(32)))")
run() {  # label adapters...
  local label=$1; shift
  local args=()
  for a in "$@"; do args+=(--adapter "$a"); done
  "$build/lathe" --threads "$threads" run --model "$dir" --ids "$ids" --max-tokens 33 --ignore-eos --json "${args[@]}" |
    python3 -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'like': '$like', 'threads': $threads, 'adapters': '$label', 'decode_tok_s': round(j['decode_tok_s'], 2),
                  'prefill_tok_s': round(j['prefill_tok_s'], 2), 'load_ms': round(j['load_ms'], 1)}))"
}
run none
for r in 8 16 64; do
  make_adapter "$tmp/lathe-lora-$like-r$r-a" "$r" 1
  make_adapter "$tmp/lathe-lora-$like-r$r-b" "$r" 2
  run "r$r x1" "$tmp/lathe-lora-$like-r$r-a"
  run "r$r x2" "$tmp/lathe-lora-$like-r$r-a" "$tmp/lathe-lora-$like-r$r-b"
done
make_adapter "$tmp/lathe-lora-$like-r40" 40 3
ls -l "$tmp/lathe-lora-$like-r40/adapters.safetensors" | awk '{print "{\"adapter_bytes\": " $5 "}"}'
run "r40 (mount time)" "$tmp/lathe-lora-$like-r40"
run "none (mount baseline)"

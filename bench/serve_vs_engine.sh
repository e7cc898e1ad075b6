#!/usr/bin/env bash
# `lathe serve` against the engine's own decode rate on the CPU (issue #15: at most 3% apart). One streaming client
# through bench/serve_load and `lathe run` on the same checkpoint, the same 128-token prompt (serve_load's first
# prompt) and 64 decode steps (or [steps]), alternated (the order flips every round) so machine drift hits both alike; medians.
# Serve's decode rate is the median stream's first-to-last token rate as the client reads it (HTTP and SSE included);
# the engine's is `lathe run --json`'s decode_tok_s.
# A tiny model's 64 steps last ~15 ms, where one scheduler hiccup moves a round by 10%: give it more steps.
# Usage: bench/serve_vs_engine.sh [build-dir] [model-dir (default: the bundled demo)] [rounds] [threads] [steps]
#   -> one JSON line on stdout (each round's figures on stderr)
set -euo pipefail
build=${1:-build}
model=${2:-models/demo}
rounds=${3:-5}
threads=${4:-2}
steps=${5:-64}
py=$(command -v /usr/bin/python3 || command -v python3)
# Both sides decode the same steps: the server stops a request at the model's context (the demo's is 1024
# positions), where `lathe run` would go on, deeper and slower, so the steps are capped to what fits.
ctx=$("$py" -c "import json, sys; c = json.load(open(sys.argv[1] + '/config.json')); print(c.get('max_position_embeddings') or c.get('text_config', {}).get('max_position_embeddings') or 0)" "$model")
if ((ctx > 0 && steps > ctx - 129)); then
  echo "decode steps capped at $((ctx - 129)) (the model's context is $ctx, the prompt 128 tokens)" >&2
  steps=$((ctx - 129))
fi
ids=$("$py" -c "print(','.join(str(5 + (k * 7) % 500) for k in range(128)))")
engine() {
  "$build/lathe" --threads "$threads" run --model "$model" --ids "$ids" --max-tokens $((steps + 1)) --ignore-eos --json |
    "$py" -c "import json, sys; print(json.load(sys.stdin)['decode_tok_s'])"
}
serve() {
  "$build/bench/serve_load" --lathe "$build/lathe" --model "$model" --clients 1 --prompt-tokens 128 --max-tokens "$steps" \
    --rounds 3 --serve-arg=--threads --serve-arg="$threads" 2>/dev/null |
    "$py" -c "import json, sys; r = json.load(sys.stdin)['runs'][0]; print(r['stream_decode_tok_s_p50'], r['engine']['step_ms'])"
}
e_all=() s_all=() step_all=()
for ((r = 0; r < rounds; ++r)); do
  if ((r % 2 == 0)); then
    e=$(engine)
    read -r s step < <(serve)
  else
    read -r s step < <(serve)
    e=$(engine)
  fi
  echo "round $r: engine $e tok/s, serve $s tok/s (server step mean $step ms)" >&2
  e_all+=("$e") s_all+=("$s") step_all+=("$step")
done
"$py" - "$model" "$threads" "$steps" "${e_all[*]}" "${s_all[*]}" <<'EOF'
import json, statistics, sys
model, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
e, s = list(map(float, sys.argv[4].split())), list(map(float, sys.argv[5].split()))
stat = lambda v: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2), "n": len(v)}
pairs = [b / a for a, b in zip(e, s)]
print(json.dumps({"bench": "serve_vs_engine", "model": model, "threads": threads, "prompt_tokens": 128,
                  "decode_steps": steps, "engine_decode_tok_s": stat(e), "serve_decode_tok_s": stat(s),
                  "serve_over_engine_median": round(statistics.median(s) / statistics.median(e), 4),
                  "serve_over_engine_per_round": [round(x, 4) for x in pairs],
                  "goal_within_3_percent": abs(statistics.median(s) / statistics.median(e) - 1) <= 0.03}))
EOF

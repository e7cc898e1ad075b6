#!/usr/bin/env bash
# Runs on the device machine from the repository root, over what scripts/cuda_pack.sh put in .device/.
# Usage: .device/cuda_device.sh test|kernels [--gemv-only]|gtest FILTER|e2e LIKE BITS GS|batched LIKE BITS GS B,B..
# [ENV=VAL ..] [cuda_e2e args ..]|ktrace LIKE BITS GS ROWS [cuda_e2e args ..]|ktrace-prefill LIKE BITS GS B [args ..]|serve LIKE BITS GS N,N.. [serve_load args]|kvq LIKE BITS GS|peer LIKE ...|
# lora LIKE BITS GS ["RANKS"] [REPS] [SERVE_REPS]|cache LIKE BITS GS T,T.. [serve_cache args]|
# llama-build SRC.tar.xz|peer-gguf LIKE SRC.tar.xz [BIN.tar.xz]|peer-serve LIKE N,N.. [SLOTS [ARG..]]|
# peer-probe LIKE LABEL [ARGS]|kvq-ab LIKE BITS GS CTX,CTX [ROUNDS];
# results go to $OUT
# (or ./out).
set -uo pipefail
out=${OUT:-$PWD/out}
mkdir -p "$out"
dev=$PWD/.device
[ -d "$dev/lib" ] || tar -xJf "$dev/lib.tar.xz" -C "$dev"  # packed compressed by cuda_pack.sh
[ -d "$dev/bin" ] || tar -xJf "$dev/bin.tar.xz" -C "$dev"
t=$dev/ctest/tests/lathe_cuda_tests
[ -f "$t" ] || { [ -f "$t.xz" ] && xz -dk "$t.xz"; }
export LATHE_FIXTURES_DIR=$PWD/tests/fixtures
export LD_LIBRARY_PATH=$dev/lib:${LD_LIBRARY_PATH:-}
# cuBLAS: the toolkit's, else the one in the image's Python wheels.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
done
synth() {  # synth LIKE BITS GS -> prints the checkpoint dir
  local dir=/tmp/ckpt/$1-$2-$3
  [ -f "$dir/config.json" ] || "$dev/bin/lathe" synth --like "$1" --bits "$2" --group-size "$3" --out "$dir" >&2
  echo "$dir"
}
synth_tok() {  # synth_tok LIKE BITS GS: synth, with the real Qwen3 tokenizer from the fixtures (a synthetic
  # checkpoint has none; its ids stay below that vocabulary) -> prints the checkpoint dir
  local dir
  dir=$(synth "$1" "$2" "$3")
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$dir/$f" ] || zcat "tests/fixtures/tokenizers/qwen3-real/$f.gz" > "$dir/$f"
  done
  echo "$dir"
}
case "$1" in
  test)
    # ctest files name the build tree where it was built: recreate that path as links into .device.
    b=$(cat "$dev/build_dir")
    mkdir -p "$b/tests" "$b/bench" && touch "$b/bench/CTestTestfile.cmake" && cp "$dev"/ctest/CTestTestfile.cmake "$b/" && cp "$dev"/ctest/tests/* "$b/tests/"
    # The log names the build tree as "build": it is committed under bench/results, and the path is this machine's.
    (cd "$b" && ctest -L cuda --output-on-failure --timeout 300 2>&1 | sed "s|^Test project .*|Test project build|" |
      tee "$out/ctest.log" | tail -25)
    ;;
  kernels) shift; "$dev/bin/cuda_kernels" "$@" | tee -a "$out/kernels.json" ;;
  gtest)  # one gtest filter over the CUDA test binary, without ctest
    "$dev/ctest/tests/lathe_cuda_tests" --gtest_filter="$2" 2>&1 | tee -a "$out/gtest.log" | grep -E "^\[  (FAILED|PASSED) |FAILED|Failure|bf16\]" | head -60
    ;;
  e2e)
    shift
    while [ $# -ge 3 ]; do
      d=$(synth "$1" "$2" "$3")
      "$dev/bin/cuda_e2e" --model "$d" | tee -a "$out/e2e.jsonl"
      shift 3
    done
    ;;
  batched)  # batched LIKE BITS GS BATCHES [ENV=VAL ...] [cuda_e2e args ...]: bench/cuda_e2e --batch (batched decode tok/s)
    d=$(synth "$2" "$3" "$4")
    b=$5
    shift 5
    vars=() args=()
    for a in "$@"; do if [[ $a == *=* && $a != --* ]]; then vars+=("$a"); else args+=("$a"); fi; done
    env "${vars[@]}" "$dev/bin/cuda_e2e" --model "$d" --batch "$b" "${args[@]}" | tee -a "$out/batched.jsonl"
    ;;
  ktrace)  # ktrace LIKE BITS GS ROWS [cuda_e2e args ...]: GPU time per kernel of ROWS-row steps (bench/kernel_trace)
    d=$(synth "$2" "$3" "$4")
    rows=$5
    shift 5
    LD_PRELOAD=$dev/bin/kernel_trace.so LATHE_KTRACE_OUT=$out/ktrace_$rows.json "$dev/bin/cuda_e2e" --model "$d" \
      --batch "$rows" --batch-steps 32 "$@" | tee -a "$out/batched.jsonl" >/dev/null
    python3 "$dev/kernel_trace_report.py" "$out/ktrace_$rows.json" --steps 32
    ;;
  ktrace-prefill)  # ktrace-prefill LIKE BITS GS B [cuda_e2e args ...]: GPU time per kernel of one forward that
    # prefills B prompts of --batch-context tokens (default 128): the admission step behind B streams' TTFT
    d=$(synth "$2" "$3" "$4")
    b=$5
    shift 5
    LD_PRELOAD=$dev/bin/kernel_trace.so LATHE_KTRACE_OUT=$out/ktrace_prefill_$b.json "$dev/bin/cuda_e2e" --model "$d" \
      --prefill-batch "$b" "$@" | tee -a "$out/prefill_batched.jsonl"
    python3 "$dev/kernel_trace_report.py" "$out/ktrace_prefill_$b.json" --steps 1 --top 25
    ;;
  serve)  # serve LIKE BITS GS CLIENTS [serve_load args ...]: bench/serve_load through `lathe serve --device cuda`
    d=$(synth_tok "$2" "$3" "$4")
    c=$5
    shift 5
    # SERVE_TOKENS: tokens a stream (128 unless set; longer streams cross the K/V caches' growth steps)
    "$dev/bin/serve_load" --lathe "$dev/bin/lathe" --model "$d" --clients "$c" --prompt-tokens 128 \
      --max-tokens "${SERVE_TOKENS:-128}" \
      --serve-arg=--device --serve-arg=cuda --serve-arg=--dtype --serve-arg=bf16 --serve-arg=--max-batch \
      --serve-arg=128 --serve-arg=--max-batch-tokens --serve-arg=8192 --serve-arg=--max-queue --serve-arg=512 "$@" |
      tee -a "$out/serve_load.jsonl"
    ;;
  lora)  # lora LIKE BITS GS ["RANKS"] [REPS] [SERVE_REPS]: [lora] decode with 0/1/2 adapters per rank, ~100 MB mount, 8×8 vs 8×1
    like=$2
    mount_rank=40  # ~100 MB of F32 factors on qwen3-0.6b; 12 on qwen3-4b
    [ "$like" = qwen3-4b ] && mount_rank=12
    export TMPDIR=/tmp LORA_BITS=$3 LORA_GS=$4 LORA_WARM=${LORA_WARM:-0}
    bash "$dev/lora_decode.sh" "$dev" "$like" 8 cuda "${5:-8 16 64}" "${6:-3}" "$mount_rank" | tee -a "$out/lora_decode.jsonl"
    bash "$dev/lora_serve.sh" "$dev" "$like" 8 16 128 "${7:-2}" --device cuda --dtype bf16 --max-batch 128 |
      tee -a "$out/lora_serve.jsonl"
    ;;
  cache)  # cache LIKE BITS GS T,T.. [serve_cache args ...]: bench/serve_cache (cold / RAM hit / SSD hit TTFT)
    d=$(synth_tok "$2" "$3" "$4")
    t=$5
    shift 5
    # The medium under the SSD tier: the working directory's disk, read once with O_DIRECT as a second figure.
    mkdir -p "$PWD/ssd-cache-probe" && dd if=/dev/urandom of="$PWD/ssd-cache-probe/f" bs=16M count=64 status=none &&
      sync && dd if="$PWD/ssd-cache-probe/f" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | tee "$out/dd_direct.txt"
    rm -rf "$PWD/ssd-cache-probe"
    "$dev/bin/serve_cache" --lathe "$dev/bin/lathe" --model "$d" --dir "$PWD/ssd-cache-bench" --tokens "$t" \
      --serve-arg=--device --serve-arg=cuda --serve-arg=--dtype --serve-arg=bf16 "$@" | tee -a "$out/serve_cache.jsonl"
    ;;
  kvq)  # quantized-KV quality and bytes per token (bench/cuda_kv_quant)
    shift
    while [ $# -ge 3 ]; do
      d=$(synth "$1" "$2" "$3")
      "$dev/bin/cuda_kv_quant" --model "$d" | tee -a "$out/kv_quant.jsonl"
      shift 3
    done
    ;;
  kvq-ab)  # kvq-ab LIKE BITS GS CTX,CTX [ROUNDS]: quantized-KV decode with the cache dequantized every step vs read in
    # place (LATHE_CUDA_KV_IN_PLACE=0 / 1, alternated), bench/cuda_kv_quant at each context
    d=$(synth "$2" "$3" "$4")
    for ctx in ${5//,/ }; do
      for ((r = 0; r < ${6:-2}; ++r)); do
        for v in 0 1; do
          echo "{\"ctx\": $ctx, \"in_place\": $v, \"result\": $(LATHE_CUDA_KV_IN_PLACE=$v "$dev/bin/cuda_kv_quant" --model "$d" --ctx "$ctx" --steps 64 | tr -d '\n')}" |
            tee -a "$out/kvq_ab.jsonl"
        done
      done
    done
    ;;
  llama-build)  # llama-build SRC.tar.xz: llama.cpp's llama-server and llama-quantize, CUDA for sm_90, into /tmp/llama;
    # the binaries also come back as $OUT/llama-bin.tar.xz (carry them as .device-llama/llama-bin.tar.xz next time)
    [ -f /tmp/llama/src/CMakeLists.txt ] || { mkdir -p /tmp/llama/src && tar -xJf "$2" -C /tmp/llama/src; }
    # Trees before llama.cpp's tools/ folder (early 2025) keep llama-server and llama-quantize under examples/.
    examples=OFF
    [ -d /tmp/llama/src/tools ] || examples=ON
    cmake -S /tmp/llama/src -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=$examples -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF \
      -DBUILD_SHARED_LIBS=OFF > "$out/llama-build.log" 2>&1 &&
      cmake --build /tmp/llama/build --target llama-server llama-quantize -j "$(nproc)" >> "$out/llama-build.log" 2>&1 &&
      strip /tmp/llama/build/bin/llama-server /tmp/llama/build/bin/llama-quantize &&
      tar -cJf "$out/llama-bin.tar.xz" -C /tmp/llama/build bin/llama-server bin/llama-quantize
    echo "llama-build rc=$?"; tail -3 "$out/llama-build.log"
    ;;
  peer-gguf)  # peer-gguf LIKE SRC.tar.xz [BIN.tar.xz]: the LIKE shape's bf16 synthetic weights as a Q4_0 GGUF
    # (/tmp/ckpt/LIKE-q4_0.gguf), through bench/peers/qwen3_to_gguf.py and llama-quantize (llama.cpp's default Q4_0 mix,
    # as in measured-peers.md)
    [ -d /tmp/llama/src ] || { mkdir -p /tmp/llama/src && tar -xJf "$3" -C /tmp/llama/src; }
    [ -x /tmp/llama/build/bin/llama-quantize ] || [ -z "${4:-}" ] || { mkdir -p /tmp/llama/build && tar -xJf "$4" -C /tmp/llama/build; }
    d=$(synth "$2" 16 64)
    g=/tmp/ckpt/$2-q4_0.gguf
    f16=/tmp/ckpt/$2-f16.gguf
    # A llama.cpp from before its Qwen3 support (2025-04) runs the same matrices as arch "llama" (no q/k norms).
    as_llama=()
    grep -qE '^\s*QWEN3\s*=' /tmp/llama/src/gguf-py/gguf/constants.py || as_llama=(--as-llama)
    [ -f "$g" ] || [ -f "$f16" ] || PYTHONPATH=/tmp/llama/src/gguf-py python3 bench/peers/qwen3_to_gguf.py \
      "${as_llama[@]}" "$d" tests/fixtures/tokenizers/qwen3-real "$f16"
    # The F16 file stays until llama-quantize exists (llama-build may still be running beside this).
    if [ ! -f "$g" ] && [ -x /tmp/llama/build/bin/llama-quantize ]; then
      /tmp/llama/build/bin/llama-quantize "$f16" "$g" Q4_0 > "$out/llama-quantize.log" 2>&1 && rm -f "$f16"
    fi
    ls -la /tmp/ckpt/*.gguf
    ;;
  peer-serve)  # peer-serve LIKE CLIENTS [SLOTS [ARG..]]: bench/serve_load against llama-server -np SLOTS (default 64)
    # on the Q4_0 GGUF from peer-gguf, same prompts and lengths as the serve verb; ARGs go to llama-server too
    like=$2
    g=/tmp/ckpt/$2-q4_0.gguf
    clients=$3
    slots=${4:-64}
    shift $(($# < 4 ? $# : 4))
    extra=()
    for x in "$@"; do extra+=(--serve-arg="$x"); done
    # -fa takes on|off|auto since mid-2025; before, it was a bare switch.
    fa_on=(--serve-arg=on)
    /tmp/llama/build/bin/llama-server --help 2>&1 | grep -qE -- '--flash-attn +(\[on|FA)' || fa_on=()
    # --model: the lathe checkpoint's tokenizer, from which serve_load bans the tokens that are not UTF-8 alone
    "$dev/bin/serve_load" --peer-server /tmp/llama/build/bin/llama-server --model "$(synth_tok "$like" 4 64)" \
      --clients "$clients" --prompt-tokens 128 --max-tokens 128 --serve-arg=-m --serve-arg="$g" --serve-arg=--port \
      --serve-arg=18090 --serve-arg=-np --serve-arg="$slots" --serve-arg=-c --serve-arg=$((slots * 512)) \
      --serve-arg=-fa "${fa_on[@]}" --serve-arg=-ngl --serve-arg=999 "${extra[@]}" \
      --server-log "$out/peer-serve-$clients.log" | tee -a "$out/peer_serve.jsonl"
    ;;
  peer-probe)  # peer-probe LIKE LABEL [llama-server args]: one greedy ignore_eos completion through llama-server's
    # /completion on the peer-gguf GGUF: stop type, last tokens (PROBE_N_PROBS=N: and their top N candidates), the
    # HTTP error body if any, the server's log in $OUT/probe-LABEL.log (why streams end early)
    g=/tmp/ckpt/$2-q4_0.gguf
    label=$3
    shift 3
    python3 bench/peers/llama_server_probe.py --server /tmp/llama/build/bin/llama-server --label "$label" \
      --n-probs "${PROBE_N_PROBS:-0}" --log "$out/probe-$label.log" -- -m "$g" -ngl 999 "$@" |
      tee -a "$out/peer_probe.jsonl"
    ;;
  peer)
    shift
    for like in "$@"; do
      d=$(synth "$like" 16 64)
      PYTHONUNBUFFERED=1 python3 "$dev/hf_transformers.py" "$d" | tee -a "$out/peer.jsonl"
    done
    ;;
esac

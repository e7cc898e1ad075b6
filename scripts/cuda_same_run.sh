#!/usr/bin/env bash
# lathe serve against llama-server on the device machine, in one lease (issue #13's serving comparison).
#   Here:   scripts/cuda_same_run.sh pack LLAMA_SRC_DIR   -> .device-llama/src.tar.xz (a llama.cpp source tree
#           without docs, models and examples: ~6.5 MB), next to the .device/ pack from scripts/cuda_pack.sh
#   Device: scripts/cuda_same_run.sh run                 (run carrying [".device", ".device-llama"]), or
#           scripts/cuda_same_run.sh start, then at once     the same in two calls, each well inside 600 s
#           scripts/cuda_same_run.sh finish
# On the device it builds llama-server from that source (~330 s on 16 cores) while converting the synthetic
# Qwen3-4B shape's bf16 weights to a GGUF, quantizes it to Q4_0, then drives both servers with bench/serve_load
# at 1/8/32/64/128 streams (llama-server -np 64; -np 128 for 128 streams). The device tool returns at most 8
# files from $OUT: scripts/cuda_device.sh writes under /tmp/o here and only three files are copied back.
set -u
cd "$(dirname "$0")/.." || exit 1
case "${1:-}" in
  pack)
    src=${2:?usage: cuda_same_run.sh pack LLAMA_SRC_DIR}
    mkdir -p .device-llama
    # Trees before the tools/ folder (early 2025) keep llama-server under examples/.
    ex=(--exclude=./examples)
    [ -d "$src/tools" ] || ex=()
    tar -C "$src" --exclude=./docs --exclude=./models --exclude=./.git --exclude=./benches "${ex[@]}" \
      --exclude=./ggml/src/ggml-sycl --exclude=./ggml/src/ggml-vulkan --exclude=./ggml/src/ggml-opencl \
      --exclude=./tools/ui/tests -cJf .device-llama/src.tar.xz .
    du -sh .device-llama/src.tar.xz
    ;;
  run | start | finish)
    # run: everything in one call (~550 s on 16 cores, close to the device tool's 600 s a call). start + finish:
    # the same in two calls on one warm machine (issue finish at once: an idle machine goes back after 30 s);
    # start leaves llama-server building in a session of its own, which outlives the call.
    final=${OUT:-$PWD/out}
    mkdir -p "$final"
    export OUT=/tmp/o
    mkdir -p "$OUT"
    t0=$(date +%s)
    el() { echo "[$(($(date +%s) - t0)) s] $*"; }
    summ() {
      python3 -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    for r in d['runs']:
        print(d['server'], r['clients'], round(r['aggregate_tok_s'], 1), 'ttft50', round(r['ttft_ms_p50'], 1),
              'itl50', round(r['itl_ms_p50'], 2), 'short', r['short_streams'], 'failed', r['failed_requests'])" "$1"
    }
    if [ "$1" != finish ]; then
      bash .device/cuda_device.sh gtest 'CudaBatchGraphs*' > /tmp/gtest.out 2>&1  # also unpacks the binaries
      grep -E "batch graphs|PASSED|FAILED" /tmp/gtest.out
      mkdir -p /tmp/llama/src && tar -xJf .device-llama/src.tar.xz -C /tmp/llama/src
      setsid bash .device/cuda_device.sh llama-build .device-llama/src.tar.xz > /tmp/build.out 2>&1 < /dev/null &
      bash .device/cuda_device.sh peer-gguf qwen3-4b .device-llama/src.tar.xz > /tmp/gguf1.out 2>&1
      el "f16 GGUF: $(tail -1 /tmp/gguf1.out)"
      [ "$1" = start ] && exit 0
    fi
    # llama-build prints its rc line last, built or not.
    until grep -q "llama-build rc" /tmp/build.out 2>/dev/null; do
      [ $(($(date +%s) - t0)) -gt 480 ] && { el "llama-server still building"; exit 1; }
      sleep 5
    done
    el "llama-server: $(grep "llama-build rc" /tmp/build.out)"
    bash .device/cuda_device.sh peer-gguf qwen3-4b .device-llama/src.tar.xz > /tmp/gguf2.out 2>&1
    el "Q4_0: $(tail -1 /tmp/gguf2.out)"
    bash .device/cuda_device.sh serve qwen3-4b 4 64 1,8,32,64,128 > /tmp/lathe.out 2>&1
    el lathe && summ "$OUT/serve_load.jsonl"
    bash .device/cuda_device.sh peer-serve qwen3-4b 1,8,32,64 64 > /tmp/peer64.out 2>&1
    bash .device/cuda_device.sh peer-serve qwen3-4b 128 128 > /tmp/peer128.out 2>&1
    el llama-server && summ "$OUT/peer_serve.jsonl"
    cp "$OUT/serve_load.jsonl" "$OUT/peer_serve.jsonl" "$OUT/gtest.log" "$final/" 2>/dev/null
    ;;
  *)
    echo "usage: scripts/cuda_same_run.sh pack LLAMA_SRC_DIR | run | start | finish" >&2
    exit 2
    ;;
esac

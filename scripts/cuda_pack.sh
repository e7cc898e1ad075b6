#!/usr/bin/env bash
# Packs what the device machine needs from a CUDA build into DEST (default: the main checkout's .device/,
# which the device tool carries): the lathe binary, the CUDA test binary with its CTest files, the CUDA
# benchmarks, the peer script and scripts/cuda_device.sh. Usage: scripts/cuda_pack.sh [build-dir] [dest]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
# The device tool carries the session's main checkout: from a worktree, pass that checkout's .device/.
dest=${2:-${LATHE_DEVICE_DIR:-$(pwd)/.device}}
src_root=$(pwd)
rm -rf "$dest" && mkdir -p "$dest/bin" "$dest/ctest/tests"
cp "$build/lathe" "$dest/bin/"
# LATHE_PACK_BENCHES picks fewer CUDA benchmarks when the pack must leave room in the 64 MiB the tool carries.
for b in ${LATHE_PACK_BENCHES:-cuda_e2e cuda_kernels cuda_kv_quant train_step}; do [ -x "$build/bench/$b" ] && cp "$build/bench/$b" "$dest/bin/"; done
[ -x "$build/bench/serve_load" ] && cp "$build/bench/serve_load" "$dest/bin/"  # HTTP load on `lathe serve`
[ -x "$build/bench/serve_cache" ] && cp "$build/bench/serve_cache" "$dest/bin/"  # prompt-cache TTFT through serve
strip "$dest"/bin/* 2>/dev/null || true
# The host-side sampling profiler (bench/host_sampler): LD_PRELOAD it on the device, symbolize here.
cc -shared -fPIC -O2 -o "$dest/bin/host_sampler.so" bench/host_sampler/host_sampler.c -lrt -ldl
# The GPU kernel tracer (bench/kernel_trace) over CUPTI, with the toolkit's libcupti beside it.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$cuda_home/include/cupti.h" ]; then
  c++ -std=c++20 -shared -fPIC -O2 -I"$cuda_home/include" -o "$dest/bin/kernel_trace.so" \
    bench/kernel_trace/kernel_trace.cc -L"$cuda_home/lib64" -lcupti -Wl,-rpath,'$ORIGIN'
  cp -L "$cuda_home"/lib64/libcupti.so.[0-9]* "$dest/bin/" 2>/dev/null || true
  cp bench/kernel_trace/report.py "$dest/kernel_trace_report.py"
fi
cp bench/peers/hf_transformers.py scripts/cuda_device.sh bench/lora_decode.sh bench/lora_serve.sh "$dest/"
# Shared libraries from Debian packages the device image lacks (the tokenizer's PCRE2 and ICU, the server's
# cpp-httplib with its brotli codecs).
mkdir -p "$dest/lib"
ldd "$build/lathe" | awk '/libpcre2|libicu|libcpp-httplib|libbrotli|libsqlite3|libxxhash/ {print $3}' | xargs -r -I{} cp -L {} "$dest/lib/"
# The device tool carries at most 64 MiB with the working tree: ICU's data library is most of the pack, so the
# libraries travel xz-compressed (cuda_device.sh unpacks them).
tar -cJf "$dest/lib.tar.xz" -C "$dest" lib && rm -rf "$dest/lib"
# The binaries too: with the fixtures in the working tree they no longer fit uncompressed.
# xz -9e: less than half of tar -J's default level for these binaries (the serve and bench ones share most code).
tar -c -C "$dest" bin | xz -9e -T0 > "$dest/bin.tar.xz" && rm -rf "$dest/bin"
# CTest files reference the build tree by absolute path; cuda_device.sh recreates that path as a link.
cp "$build/CTestTestfile.cmake" "$dest/ctest/"
if [ -x "$build/tests/lathe_cuda_tests" ]; then
  cp "$build"/tests/lathe_cuda_tests* "$dest/ctest/tests/"
  strip "$dest/ctest/tests/lathe_cuda_tests"
  xz -T0 "$dest/ctest/tests/lathe_cuda_tests"  # a quarter of the size; cuda_device.sh unpacks it
fi
grep -F 'lathe_cuda_tests' "$build/tests/CTestTestfile.cmake" > "$dest/ctest/tests/CTestTestfile.cmake"  # cuda only
echo "$(cd "$build" && pwd)" > "$dest/build_dir"
echo "$src_root" > "$dest/source_dir"
du -sh "$dest"

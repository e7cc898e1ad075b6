// CPU quantized GEMV benchmark: achieved weight-read GB/s of the 4-bit fused dequant-GEMV at decode shapes,
// next to this machine's copy bandwidth measured in the same run. Weights are cycled through a working set
// larger than the caches so every call streams from DRAM. Prints a table and one JSON line.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/affine.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

using namespace lathe;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// STREAM-style copy: bytes read + bytes written per second, all threads.
double copy_bandwidth_gbs() {
  const size_t n = size_t{512} << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = Clock::now();
    parallel_for(static_cast<int64_t>(n), 1 << 20,
                 [&](int64_t s, int64_t e) { std::memcpy(b.data() + s, a.data() + s, static_cast<size_t>(e - s)); });
    best = std::max(best, 2.0 * static_cast<double>(n) / seconds_since(t) / 1e9);
  }
  return best;
}

QuantizedMatrix random_packed(int64_t rows, int64_t cols, int bits, int group, uint32_t seed) {
  // Random codes and scales directly in the MLX layout (quantizing floats would take longer than the benchmark).
  std::mt19937 rng(seed);
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group;
  q.w = Tensor::empty({rows, cols * bits / 32}, DType::U32);
  q.scales = Tensor::empty({rows, cols / group}, DType::BF16);
  q.biases = Tensor::empty({rows, cols / group}, DType::BF16);
  for (int64_t i = 0; i < q.w.numel(); ++i) q.w.data<uint32_t>()[i] = rng();
  for (int64_t i = 0; i < q.scales.numel(); ++i) {
    q.scales.data<uint16_t>()[i] = f32_to_bf16(0.001f * static_cast<float>(rng() % 100 + 1));
    q.biases.data<uint16_t>()[i] = f32_to_bf16(-0.01f);
  }
  return q;
}

}  // namespace

int main() {
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("threads: %d, copy bandwidth (read+write): %.1f GB/s\n", num_threads(), copy_gbs);
  nlohmann::json results = nlohmann::json::array();
  struct Shape {
    int64_t out, in;
    int bits, group;
  };
  for (const Shape s : {Shape{4096, 4096, 4, 64}, Shape{14336, 4096, 4, 64}, Shape{4096, 14336, 4, 64},
                        Shape{4096, 4096, 8, 32}, Shape{14336, 4096, 8, 64}}) {
    const size_t bytes = static_cast<size_t>(s.out * s.in * s.bits / 8 + 2 * 2 * s.out * (s.in / s.group));
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{384} << 20) / bytes));
    std::vector<Weight> ws(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      ws[static_cast<size_t>(c)].quantized = true;
      ws[static_cast<size_t>(c)].q = random_packed(s.out, s.in, s.bits, s.group, static_cast<uint32_t>(c + 1));
    }
    std::vector<float> xv(static_cast<size_t>(s.in), 0.5f);
    const Tensor x = Tensor::from_floats(xv, {1, s.in});
    for (int c = 0; c < copies; ++c) linear(x, ws[static_cast<size_t>(c)]);  // warm up (page in)
    const int iters = std::max(20, copies * 4);
    const auto t = Clock::now();
    for (int i = 0; i < iters; ++i) linear(x, ws[static_cast<size_t>(i % copies)]);
    const double sec = seconds_since(t) / iters;
    const double gbs = static_cast<double>(bytes) / sec / 1e9;
    std::printf("%2d-bit g%-3d [%5ld x %5ld]: %7.3f ms  %6.1f GB/s  (%4.0f%% of copy bandwidth)\n", s.bits, s.group,
                static_cast<long>(s.out), static_cast<long>(s.in), sec * 1e3, gbs, 100.0 * gbs / copy_gbs);
    results.push_back({{"bits", s.bits},
                       {"group", s.group},
                       {"out", s.out},
                       {"in", s.in},
                       {"ms", sec * 1e3},
                       {"gb_s", gbs},
                       {"pct_copy", 100.0 * gbs / copy_gbs}});
  }
  std::printf("%s\n",
              nlohmann::json{{"copy_gb_s", copy_gbs}, {"threads", num_threads()}, {"gemv", results}}.dump().c_str());
  return 0;
}

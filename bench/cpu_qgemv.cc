// CPU quantized matmul benchmark: achieved weight-read GB/s of the default integer-dot kernel (int8
// activations over weights packed at load) and of the exact f32 kernel at decode (M = 1), batched decode
// (M = 2, 4, 8) and prefill (M = 64, 128) shapes of Qwen3-0.6B, next to this machine's copy bandwidth measured
// in the same run. `--int8-only` skips the exact kernel; `--isa all` runs the int8 kernel once per instruction
// set this CPU has (else the default choice, which LATHE_CPU_ISA lowers); `--rows 1,4` picks the row counts.
// Weights are cycled through a working set larger than the caches so every decode call streams from DRAM.
// Also prints the process CPU time per call: on a busy shared machine wall time mostly measures the
// scheduler, CPU time what the kernel costs. Prints a table and one JSON line.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_main.h"
#include "quant/affine.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

using namespace lathe;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

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

// "1,4,64" -> {1, 4, 64}; stops at the first non-number.
std::vector<int64_t> parse_rows(const char* s) {
  std::vector<int64_t> v;
  for (char* end = nullptr;; s = end + 1) {
    const long n = std::strtol(s, &end, 10);
    if (end == s || n <= 0) break;
    v.push_back(n);
    if (*end != ',') break;
  }
  return v;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  bool int8_only = false, all_isas = false;
  std::vector<int64_t> row_counts{1, 2, 4, 8, 64, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--int8-only") int8_only = true;
    if (a == "--isa" && i + 1 < argc) all_isas = std::string(argv[++i]) == "all";
    if (a == "--rows" && i + 1 < argc) row_counts = parse_rows(argv[++i]);
  }
  std::vector<cpu::Isa> isas{cpu::active_isa()};
  if (all_isas) {
    isas.clear();
    for (cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::AvxVnni, cpu::Isa::Avx512Vnni})
      if (cpu::isa_supported(isa)) isas.push_back(isa);
  }
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("threads: %d, copy bandwidth (read+write): %.1f GB/s\n", num_threads(), copy_gbs);
  nlohmann::json results = nlohmann::json::array();
  struct Shape {
    int64_t out, in;
    int bits, group;
  };
  for (const Shape s : {Shape{3072, 1024, 4, 64}, Shape{1024, 3072, 4, 64}, Shape{151936, 1024, 4, 64},
                        Shape{3072, 1024, 8, 32}, Shape{1024, 3072, 8, 32}}) {
    const size_t bytes = static_cast<size_t>(s.out * s.in * s.bits / 8 + 2 * 2 * s.out * (s.in / s.group));
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{384} << 20) / bytes));
    std::vector<Weight> exact(static_cast<size_t>(copies)), packed(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      Weight& e = exact[static_cast<size_t>(c)];
      e.quantized = true;
      e.q = random_packed(s.out, s.in, s.bits, s.group, static_cast<uint32_t>(c + 1));
      packed[static_cast<size_t>(c)] = e;
      pack_for_cpu(packed[static_cast<size_t>(c)].q);
    }
    for (const int64_t M : row_counts) {
      if (M > 8 && s.out > 100000) continue;  // the logits matmul runs for one row per sequence
      std::vector<float> xv(static_cast<size_t>(M * s.in));
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
      const Tensor x = Tensor::from_floats(xv, {M, s.in});
      std::vector<std::pair<bool, cpu::Isa>> runs;
      for (cpu::Isa isa : isas) runs.push_back({false, isa});
      if (!int8_only) runs.push_back({true, cpu::active_isa()});
      const cpu::Isa default_isa = cpu::active_isa();
      for (const auto& [exact_path, isa] : runs) {
        cpu::set_isa_for_testing(isa);
        const std::vector<Weight>& ws = exact_path ? exact : packed;
        for (int c = 0; c < copies; ++c) linear(x, ws[static_cast<size_t>(c)]);  // warm up (page in)
        // About 0.3 s of work per line, never fewer than 3 calls.
        const auto t0 = Clock::now();
        linear(x, ws[0]);
        const int iters = std::max(M == 1 ? copies * 4 : 3, static_cast<int>(0.3 / std::max(1e-6, seconds_since(t0))));
        const auto t = Clock::now();
        const double c0 = cpu_seconds();
        for (int i = 0; i < iters; ++i) linear(x, ws[static_cast<size_t>(i % copies)]);
        const double sec = seconds_since(t) / iters, cpu = (cpu_seconds() - c0) / iters;
        const double gbs = static_cast<double>(bytes) / sec / 1e9;
        const double gmacs = static_cast<double>(M * s.out * s.in) / sec / 1e9;
        const std::string path = exact_path ? std::string("exact") : std::string("int8-") + cpu::isa_name(isa);
        cpu::set_isa_for_testing(default_isa);
        std::printf(
            "%-15s M=%-3ld %d-bit g%-3d [%6ld x %5ld]: %8.3f ms (cpu %8.3f ms) %6.1f GB/s (%3.0f%% of copy) %6.1f "
            "GMAC/s\n",
            path.c_str(), static_cast<long>(M), s.bits, s.group, static_cast<long>(s.out), static_cast<long>(s.in),
            sec * 1e3, cpu * 1e3, gbs, 100.0 * gbs / copy_gbs, gmacs);
        results.push_back({{"path", path},
                           {"M", M},
                           {"bits", s.bits},
                           {"group", s.group},
                           {"out", s.out},
                           {"in", s.in},
                           {"ms", sec * 1e3},
                           {"cpu_ms", cpu * 1e3},
                           {"gb_s", gbs},
                           {"gmac_s", gmacs},
                           {"pct_copy", 100.0 * gbs / copy_gbs}});
      }
    }
  }
  std::printf("%s\n",
              nlohmann::json{{"copy_gb_s", copy_gbs}, {"threads", num_threads()}, {"gemv", results}}.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_reporting_errors("cpu_qgemv", [&] { return run(argc, argv); });
}

// CPU decode attention benchmark: K/V bytes read per second by one decode step's attention (one query row per
// sequence, bf16 or f32 K/V in the cache's [tokens, kv_heads, head_dim] layout) at several context lengths, next
// to this machine's read bandwidth measured in the same run. Qwen3-0.6B's attention shape by default (16 query
// heads, 8 KV heads, head size 128). Each call reads a different layer's K/V out of a working set larger than
// the caches, as a decode step does. Prints a table and one JSON line.
// --prefill T,T..: also one causal prompt of T tokens per call (T query rows over T keys, as a prefill chunk from an
// empty cache): ms per call, query rows per second and GFLOP/s (2 flops per multiply-add of the scores and sums).
// Usage: cpu_attention [--contexts 512,2048,8192] [--kv f32|bf16] [--heads 16] [--kv-heads 8] [--head-dim 128]
//                      [--prefill 1024,4096]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_main.h"
#include "tensor/ops.h"
#include "tensor/thread_pool.h"

using namespace lathe;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Bytes read per second by all threads summing a buffer larger than the caches (best of five).
double read_bandwidth_gbs() {
  const size_t n = size_t{512} << 20;
  std::vector<float> a(n / sizeof(float), 1.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> sums(64, 0.0);
    const auto t = Clock::now();
    parallel_for(static_cast<int64_t>(a.size()), 1 << 18, [&](int64_t s, int64_t e) {
      float acc[16] = {};
      for (int64_t i = s; i + 16 <= e; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += a[static_cast<size_t>(i + l)];
      double tot = 0;
      for (float x : acc) tot += x;
      sums[static_cast<size_t>((s >> 18) % 64)] += tot;  // keeps the loop
    });
    best = std::max(best, static_cast<double>(n) / seconds_since(t) / 1e9);
    if (sums[0] < 0) std::printf("%f", sums[0]);
  }
  return best;
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  std::vector<int64_t> contexts = {512, 2048, 8192};
  std::string kv = "bf16";
  int64_t heads = 16, kv_heads = 8, head_dim = 128;
  std::vector<int64_t> prefills;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--contexts")
      contexts = parse_list(v);
    else if (a == "--kv")
      kv = v;
    else if (a == "--heads")
      heads = std::stoll(v);
    else if (a == "--kv-heads")
      kv_heads = std::stoll(v);
    else if (a == "--head-dim")
      head_dim = std::stoll(v);
    else if (a == "--prefill")
      prefills = parse_list(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const DType dt = kv == "f32" ? DType::F32 : DType::BF16;
  const double read_gbs = read_bandwidth_gbs();
  std::printf("threads: %d, read bandwidth: %.1f GB/s, K/V %s, %ld query heads, %ld KV heads, head size %ld\n",
              num_threads(), read_gbs, kv.c_str(), static_cast<long>(heads), static_cast<long>(kv_heads),
              static_cast<long>(head_dim));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  nlohmann::json results = nlohmann::json::array();
  for (const int64_t S : contexts) {
    const size_t layer_bytes = static_cast<size_t>(S * kv_heads * head_dim) * dtype_size(dt) * 2;
    const int layers = static_cast<int>(std::max<size_t>(4, (size_t{256} << 20) / layer_bytes));  // > the caches
    std::vector<Tensor> ks, vs;
    for (int l = 0; l < layers; ++l) {
      std::vector<float> kf(static_cast<size_t>(S * kv_heads * head_dim)), vf(kf.size());
      for (auto& x : kf) x = nd(rng);
      for (auto& x : vf) x = nd(rng);
      ks.push_back(Tensor::from_floats(kf, {S, kv_heads, head_dim}).to(dt));
      vs.push_back(Tensor::from_floats(vf, {S, kv_heads, head_dim}).to(dt));
    }
    std::vector<float> qf(static_cast<size_t>(heads * head_dim));
    for (auto& x : qf) x = nd(rng);
    const Tensor q = Tensor::from_floats(qf, {1, heads, head_dim});
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    p.q_pos0 = S - 1;
    const int calls = std::max(layers * 2, static_cast<int>((size_t{4} << 30) / layer_bytes));
    for (int l = 0; l < layers; ++l) (void)attention(q, ks[static_cast<size_t>(l)], vs[static_cast<size_t>(l)], p);
    const auto t = Clock::now();
    for (int c = 0; c < calls; ++c)
      (void)attention(q, ks[static_cast<size_t>(c % layers)], vs[static_cast<size_t>(c % layers)], p);
    const double sec = seconds_since(t) / calls;
    const double gbs = static_cast<double>(layer_bytes) / sec / 1e9;
    std::printf("context %6ld: %8.1f us per call, %6.1f GB/s of K/V (%3.0f%% of read bandwidth)\n",
                static_cast<long>(S), sec * 1e6, gbs, 100.0 * gbs / read_gbs);
    results.push_back({{"context", S}, {"us", sec * 1e6}, {"gb_s", gbs}, {"pct_read", 100.0 * gbs / read_gbs}});
  }
  nlohmann::json prefill_results = nlohmann::json::array();
  for (const int64_t T : prefills) {
    const auto random = [&](int64_t rows, int64_t hs) {
      std::vector<float> f(static_cast<size_t>(rows * hs * head_dim));
      for (auto& x : f) x = nd(rng);
      return Tensor::from_floats(f, {rows, hs, head_dim});
    };
    const Tensor q = random(T, heads), k = random(T, kv_heads).to(dt), v = random(T, kv_heads).to(dt);
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    (void)attention(q, k, v, p);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t = Clock::now();
      (void)attention(q, k, v, p);
      best = std::min(best, seconds_since(t));
    }
    const double flops =
        2.0 * 2.0 * static_cast<double>(heads * head_dim) * static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
    std::printf("prefill %6ld: %8.1f ms per call, %8.1f query rows/s, %6.1f GFLOP/s\n", static_cast<long>(T),
                best * 1e3, static_cast<double>(T) / best, flops / best / 1e9);
    prefill_results.push_back({{"tokens", T},
                               {"ms", best * 1e3},
                               {"rows_s", static_cast<double>(T) / best},
                               {"gflop_s", flops / best / 1e9}});
  }
  std::printf("%s\n", nlohmann::json{{"bench", "cpu_attention"},
                                     {"read_gb_s", read_gbs},
                                     {"threads", num_threads()},
                                     {"kv", kv},
                                     {"heads", heads},
                                     {"kv_heads", kv_heads},
                                     {"head_dim", head_dim},
                                     {"decode", results},
                                     {"prefill", prefill_results}}
                          .dump()
                          .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_reporting_errors("cpu_attention", [&] { return run(argc, argv); });
}

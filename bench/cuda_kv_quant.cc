// Quantized KV caches on CUDA for one checkpoint (a synthetic one from `lathe synth`): a random prompt is
// prefilled, then `steps` tokens of the same random sequence are fed one at a time (teacher forcing), once with
// unquantized KV and once per quantized setting. Reports per setting the next-token KL divergence from the
// unquantized-KV logits (mean / max over the steps and the prefill's last position), top-1 agreement, decode
// tok/s and the KV bytes per token (all layers, from the caches' exact state). Random weights give near-flat
// logits with many near-ties, so top-1 agreement is also reported over the positions whose unquantized top-1
// leads by ≥ kDecided logits. Prints one JSON object.
// Usage: cuda_kv_quant --model DIR [--dtype bf16|f32] [--ctx N] [--steps N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/model.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"

namespace {
using namespace lathe;
using Clock = std::chrono::steady_clock;
constexpr float kDecided = 0.1f;

float top2_gap(const std::vector<float>& x) {
  std::vector<float> t(x);
  std::partial_sort(t.begin(), t.begin() + 2, t.end(), std::greater<float>());
  return t[0] - t[1];
}

struct Run {
  std::vector<std::vector<float>> logits;  // one row per scored position
  double decode_tok_s = 0;
  double kv_bytes_per_token = 0;
};

Run run(Model& m, const std::vector<int32_t>& ids, size_t ctx, const CacheOptions& o) {
  Run r;
  CacheList caches = m.make_cache(o);
  r.logits.push_back(m.forward({ids.begin(), ids.begin() + static_cast<ptrdiff_t>(ctx)}, caches, false).to_floats());
  const auto t0 = Clock::now();
  for (size_t i = ctx; i < ids.size(); ++i) r.logits.push_back(m.forward({ids[i]}, caches, false).to_floats());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.decode_tok_s = static_cast<double>(ids.size() - ctx) / s;  // includes the logits read-back
  double bytes = 0;
  for (const auto& c : caches)
    for (const auto& [name, t] : c->state().tensors) bytes += static_cast<double>(t.nbytes());
  r.kv_bytes_per_token = bytes / static_cast<double>(caches.front()->offset());
  return r;
}

double kl(const std::vector<float>& p, const std::vector<float>& q) {
  auto lse = [](const std::vector<float>& x) {
    double mx = *std::max_element(x.begin(), x.end()), s = 0;
    for (float v : x) s += std::exp(v - mx);
    return mx + std::log(s);
  };
  const double lp = lse(p), lq = lse(q);
  double k = 0;
  for (size_t i = 0; i < p.size(); ++i) k += std::exp(p[i] - lp) * ((p[i] - lp) - (q[i] - lq));
  return std::max(k, 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, dtype = "bf16";
  size_t ctx = 512, steps = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    if (!std::strcmp(argv[i], "--ctx")) ctx = std::stoul(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoul(argv[i + 1]);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: cuda_kv_quant --model DIR [--dtype bf16|f32] [--ctx N] [--steps N]\n");
    return 2;
  }
  try {
    auto m = load_model(dir, LoadOptions{Device::CUDA, dtype == "f32" ? DType::F32 : DType::BF16});
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> d(
        0, static_cast<int32_t>(std::min<int64_t>(m->config().vocab_size, 100000) - 1));
    std::vector<int32_t> ids(ctx + steps);
    for (auto& x : ids) x = d(rng);
    const Run base = run(*m, ids, ctx, CacheOptions{});
    nlohmann::json out = {{"model", dir}, {"dtype", dtype}, {"ctx", ctx}, {"steps", steps}};
    out["kv"] = {{"kv_bytes_per_token", base.kv_bytes_per_token}, {"decode_tok_s", base.decode_tok_s}};
    for (int bits : {8, 4})
      for (int group : {64, 32}) {
        CacheOptions o;
        o.kv_bits = bits;
        o.kv_group_size = group;
        const Run q = run(*m, ids, ctx, o);
        double mean = 0, mx = 0;
        size_t agree = 0, decided = 0, decided_agree = 0;
        for (size_t i = 0; i < q.logits.size(); ++i) {
          const double k = kl(base.logits[i], q.logits[i]);
          mean += k / static_cast<double>(q.logits.size());
          mx = std::max(mx, k);
          const auto& a = base.logits[i];
          const auto& b = q.logits[i];
          const bool same =
              std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
          agree += same;
          if (top2_gap(a) >= kDecided) {
            ++decided;
            decided_agree += same;
          }
        }
        out["quantized_" + std::to_string(bits) + "bit_g" + std::to_string(group)] = {
            {"mean_kl", mean},
            {"max_kl", mx},
            {"top1_agreement", static_cast<double>(agree) / static_cast<double>(q.logits.size())},
            {"decided_positions", decided},
            {"top1_agreement_decided",
             decided ? static_cast<double>(decided_agree) / static_cast<double>(decided) : 1.0},
            {"kv_bytes_per_token", q.kv_bytes_per_token},
            {"decode_tok_s", q.decode_tok_s}};
      }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_kv_quant: %s\n", e.what());
    return 1;
  }
  return 0;
}

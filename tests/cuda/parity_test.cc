// Model parity on CUDA against the HF reference logits of every fixture the CPU backend supports:
// f32 activations within the CPU's bound (max |Δ| ≤ 1e-3·max(1, max|ref|), same argmax everywhere, same greedy
// continuation); bf16 activations with the same argmax at ≥ 98% of positions (or, on three near-tie fixtures,
// at least where HF transformers in bf16 keeps it), and identical greedy continuations for the bf16-weight
// fixtures. Also: no cudaMalloc inside the decode loop.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "cuda/cuda_test_util.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

const std::vector<std::string> kFixtures = {"llama-bf16",
                                            "llama-q4g64",
                                            "llama-q8g32",
                                            "llama-mixed",
                                            "qwen3-bf16",
                                            "qwen3-q4g64",
                                            "qwen3-q8g32",
                                            "qwen3-mixed",
                                            "gemma3-bf16",
                                            "gemma3-q4g64",
                                            "gemma3-q8g32",
                                            "gemma3-mixed",
                                            "qwen3-q4g64-sharded-legacy",
                                            "gemma3-q4g64-vlm",
                                            "gemma4-bf16",
                                            "gemma4-q4g64",
                                            "gemma4moe-bf16",
                                            "gemma4moe-q4g64",
                                            "qwen3_5-bf16",
                                            "qwen3_5-q4g64"};
const std::vector<std::string> kPrompts = {"chat", "long", "one", "chat_greedy"};

std::vector<int32_t> greedy_decode(Model& m, const std::vector<int32_t>& prompt, size_t n) {
  CacheList cache = m.make_cache();
  int32_t next = argmax_rows(m.forward(prompt, cache, false))[0];
  std::vector<int32_t> out;
  while (out.size() < n) {
    out.push_back(next);
    if (out.size() == n) break;
    next = argmax_rows(m.forward({next}, cache, false))[0];
  }
  return out;
}

// Fixtures where the reference implementation itself, run in bf16 (HF transformers + torch; the best of eager /
// sdpa attention and of both bf16 load paths: bench/peers/hf_bf16_agreement.py,
// bench/results/cuda-h200/hf_bf16_agreement_*.json), keeps the f32 argmax at fewer than 98% of the positions:
// their prompts have near-ties (reference top-2 gaps below 0.5% of max|logit|) that bf16 rounding flips. There
// the bound is that reference's own bf16 count of agreeing positions (of 119 / 123).
const std::map<std::string, int64_t> kReferenceBf16Agree = {
    {"gemma3-mixed", 115}, {"qwen3_5-bf16", 116}, {"qwen3_5-q4g64", 118}};
// Likewise for the greedy continuation: HF transformers in bf16 leaves the f32 reference's continuation of
// qwen3_5-bf16 after 5 tokens (bench/results/cuda-h200/hf_bf16_greedy_bf16_fixtures.json; it also leaves
// qwen3-bf16's at 0, llama-bf16's at 12 and gemma4moe-bf16's at 4, which this backend keeps in full).
const std::map<std::string, size_t> kReferenceBf16GreedyPrefix = {{"qwen3_5-bf16", 5}};

class CudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParity, F32MatchesReference) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference(GetParam());
  auto model = load_model(test::model_dir(GetParam()), LoadOptions{Device::CUDA, DType::F32});
  for (const auto& p : kPrompts) {
    CacheList cache = model->make_cache();
    const Tensor out = model->forward(ref.prompts.at(p), cache, true);
    ASSERT_EQ(out.device(), Device::CUDA);
    const Tensor want = ref.logits->get("logits_" + p);
    const test::Agreement a = test::compare_logits(out.to_floats(), want.to_floats(), want.dim(1));
    EXPECT_TRUE(a.within()) << GetParam() << " prompt " << p << ": max |Δ| " << a.max_abs_diff << ", max |ref| "
                            << a.max_abs_ref;
    EXPECT_EQ(a.argmax_mismatches, 0) << GetParam() << " prompt " << p;
  }
  EXPECT_EQ(greedy_decode(*model, ref.prompts.at("chat"), ref.greedy.size()), ref.greedy) << GetParam();
}

TEST_P(CudaParity, Bf16KeepsArgmax) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference(GetParam());
  auto model = load_model(test::model_dir(GetParam()), LoadOptions{Device::CUDA, DType::BF16});
  int64_t rows = 0, mismatches = 0;
  double max_rel = 0, widest_gap = 0;  // bf16 max |Δ| / max |ref|; the largest reference top-2 gap among misses
  for (const auto& p : kPrompts) {
    CacheList cache = model->make_cache();
    const Tensor want = ref.logits->get("logits_" + p);
    const std::vector<float> got = model->forward(ref.prompts.at(p), cache, true).to_floats(), w = want.to_floats();
    const test::Agreement a = test::compare_logits(got, w, want.dim(1));
    rows += a.rows;
    mismatches += a.argmax_mismatches;
    max_rel = std::max(max_rel, a.max_abs_diff / std::max(1.0, a.max_abs_ref));
    const int64_t V = want.dim(1);
    for (int64_t t = 0; t < a.rows; ++t) {
      const float* r = w.data() + t * V;
      const float* g = got.data() + t * V;
      if (std::max_element(r, r + V) - r == std::max_element(g, g + V) - g) continue;
      std::vector<float> top(r, r + V);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      widest_gap = std::max(widest_gap, static_cast<double>(top[0] - top[1]) / std::max(1.0, a.max_abs_ref));
    }
  }
  std::printf("[bf16] %-28s agree %lld/%lld, max |d|/max|ref| %.2e, widest missed ref gap/max|ref| %.2e\n",
              GetParam().c_str(), static_cast<long long>(rows - mismatches), static_cast<long long>(rows), max_rel,
              widest_gap);
  const double agree = 1.0 - static_cast<double>(mismatches) / static_cast<double>(rows);
  RecordProperty("argmax_agreement", std::to_string(agree));
  if (const auto it = kReferenceBf16Agree.find(GetParam()); it != kReferenceBf16Agree.end())
    EXPECT_GE(rows - mismatches, it->second)
        << GetParam() << ": " << rows - mismatches << "/" << rows << " positions agree, HF bf16 keeps " << it->second;
  else
    EXPECT_GE(agree, 0.98) << GetParam() << ": " << rows - mismatches << "/" << rows << " positions agree";
  const std::vector<int32_t> got = greedy_decode(*model, ref.prompts.at("chat"), ref.greedy.size());
  if (GetParam().find("-bf16") != std::string::npos) {
    if (const auto it = kReferenceBf16GreedyPrefix.find(GetParam()); it != kReferenceBf16GreedyPrefix.end()) {
      const auto n = static_cast<std::ptrdiff_t>(it->second);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + n),
                std::vector<int32_t>(ref.greedy.begin(), ref.greedy.begin() + n))
          << GetParam();
    } else {
      EXPECT_EQ(got, ref.greedy) << GetParam();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(CudaDecode, NoDeviceAllocationInsideTheDecodeLoop) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference("qwen3-q4g64");
  auto model = load_model(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  CacheList cache = model->make_cache();
  int32_t next = argmax_rows(model->forward(ref.prompts.at("chat"), cache, false))[0];
  for (int i = 0; i < 3; ++i) next = argmax_rows(model->forward({next}, cache, false))[0];  // warm the cache
  const uint64_t before = device_memory_stats().malloc_calls;
  for (int i = 0; i < 16; ++i) next = argmax_rows(model->forward({next}, cache, false))[0];
  EXPECT_EQ(device_memory_stats().malloc_calls, before);
}

TEST(CudaDecode, DeviceAndCpuCachesAgree) {
  LATHE_REQUIRE_GPU();
  // Sliding layers: the ring buffer wraps and attention gets explicit key positions.
  const test::Reference ref = test::load_reference("gemma3-q4g64");
  auto gpu = load_model(test::model_dir("gemma3-q4g64"), LoadOptions{Device::CUDA, DType::F32});
  auto cpu = load_model(test::model_dir("gemma3-q4g64"), LoadOptions{.exact = true});  // the reference kernels
  EXPECT_EQ(greedy_decode(*gpu, ref.prompts.at("long"), 24), greedy_decode(*cpu, ref.prompts.at("long"), 24));
}

}  // namespace
}  // namespace lathe

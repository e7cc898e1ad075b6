// CUDA parity for the newer families beyond the per-fixture reference checks in parity_test.cc: Gemma 4 (dense,
// MoE) and Qwen3.5 (Gated DeltaNet) cached step-by-step decode equal to the full forward, and quantized KV
// caches (4/8-bit) on the device against the CPU's quantized caches and against unquantized KV.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda/cuda_test_util.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

const std::vector<std::string> kNewFixtures = {"gemma4-bf16",     "gemma4-q4g64", "gemma4moe-bf16",
                                               "gemma4moe-q4g64", "qwen3_5-bf16", "qwen3_5-q4g64"};

std::string test_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// Prefill `prefill` tokens, then one token per step; all logits rows stacked [T, V] on the host.
std::vector<float> stepped_logits(Model& m, const std::vector<int32_t>& ids, size_t prefill, CacheList& caches) {
  std::vector<float> out =
      m.forward({ids.begin(), ids.begin() + static_cast<ptrdiff_t>(prefill)}, caches, true).to_floats();
  for (size_t i = prefill; i < ids.size(); ++i) {
    const std::vector<float> row = m.forward({ids[i]}, caches, false).to_floats();
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

class CudaNewArch : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaNewArch, CachedDecodeMatchesFullForward) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference(GetParam());
  auto model = load_model(test::model_dir(GetParam()), LoadOptions{Device::CUDA, DType::F32});
  for (const char* p : {"long", "chat_greedy"}) {
    const std::vector<int32_t>& ids = ref.prompts.at(p);
    CacheList full_caches = model->make_cache();
    const std::vector<float> full = model->forward(ids, full_caches, true).to_floats();
    CacheList caches = model->make_cache();
    const std::vector<float> stepped = stepped_logits(*model, ids, 3, caches);
    const Tensor want = ref.logits->get(std::string("logits_") + p);
    const int64_t V = want.dim(1);
    const test::Agreement vs_full = test::compare_logits(stepped, full, V);
    const test::Agreement vs_ref = test::compare_logits(stepped, want.to_floats(), V);
    EXPECT_TRUE(vs_full.within()) << GetParam() << " " << p << ": max |Δ| vs full " << vs_full.max_abs_diff;
    EXPECT_TRUE(vs_ref.within()) << GetParam() << " " << p << ": max |Δ| vs ref " << vs_ref.max_abs_diff;
    EXPECT_EQ(vs_ref.argmax_mismatches, 0) << GetParam() << " " << p;
  }
}

double kl(const float* p_logits, const float* q_logits, int64_t V) {
  auto lse = [V](const float* x) {
    double mx = x[0], s = 0;
    for (int64_t i = 1; i < V; ++i) mx = std::max(mx, static_cast<double>(x[i]));
    for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] - mx);
    return mx + std::log(s);
  };
  const double lp = lse(p_logits), lq = lse(q_logits);
  double k = 0;
  for (int64_t i = 0; i < V; ++i) k += std::exp(p_logits[i] - lp) * ((p_logits[i] - lp) - (q_logits[i] - lq));
  return k;
}

// Quantized KV on the device: the same codes as the CPU's quantized cache (f32 runs), so the logits agree with
// the CPU's to the f32 bound; and against unquantized KV, next-token KL and top-1 agreement (printed), 8-bit
// agreeing wherever the reference's top-1 leads by ≥ 0.01 (the fixtures have many near-ties).
TEST_P(CudaNewArch, QuantizedKvMatchesCpuAndStaysCloseToF32Kv) {
  LATHE_REQUIRE_GPU();
  const std::vector<int32_t> ids = test::load_reference(GetParam()).prompts.at("long");
  auto gpu = load_model(test::model_dir(GetParam()), LoadOptions{Device::CUDA, DType::F32});
  auto cpu = load_model(test::model_dir(GetParam()), LoadOptions{.exact = true});  // the reference kernels
  const size_t prefill = ids.size() / 2;
  CacheList plain = gpu->make_cache();
  const std::vector<float> ref = stepped_logits(*gpu, ids, prefill, plain);
  const int64_t V = static_cast<int64_t>(ref.size() / ids.size());
  for (int bits : {4, 8}) {
    CacheOptions o;
    o.kv_bits = bits;
    o.kv_group_size = 64;
    CacheList gc = gpu->make_cache(o), cc = cpu->make_cache(o);
    const std::vector<float> got = stepped_logits(*gpu, ids, prefill, gc);
    const std::vector<float> want = stepped_logits(*cpu, ids, prefill, cc);
    const test::Agreement vs_cpu = test::compare_logits(got, want, V);
    // A value on a rounding edge may land on the neighbouring code on one side (FMA contraction differs between
    // the compilers); at 4 bits one code step is 1/15 of a group's range, hence the looser bound there.
    EXPECT_TRUE(vs_cpu.within(bits == 8 ? 2e-3 : 1e-2))
        << GetParam() << " " << bits << "-bit KV: max |Δ| vs cpu " << vs_cpu.max_abs_diff;
    double mean_kl = 0;
    int64_t decided = 0, agree = 0, agree_all = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* r = ref.data() + static_cast<int64_t>(t) * V;
      const float* g = got.data() + static_cast<int64_t>(t) * V;
      mean_kl += kl(r, g, V) / static_cast<double>(ids.size());
      std::vector<float> top(r, r + V);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      const bool same = std::max_element(r, r + V) - r == std::max_element(g, g + V) - g;
      agree_all += same;
      if (top[0] - top[1] >= 1e-2f) {
        ++decided;
        agree += same;
      }
    }
    std::printf("[cuda kv] %-16s %d-bit: mean KL %.3g, top-1 %lld/%zu, decided %lld/%lld\n", GetParam().c_str(), bits,
                mean_kl, static_cast<long long>(agree_all), ids.size(), static_cast<long long>(agree),
                static_cast<long long>(decided));
    if (bits == 8) {
      EXPECT_EQ(agree, decided) << GetParam();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaNewArch, ::testing::ValuesIn(kNewFixtures), test_name);

}  // namespace
}  // namespace lathe

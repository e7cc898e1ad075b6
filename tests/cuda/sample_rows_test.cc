// Sampled rows on the device (engine/device_sampler.cc → tensor/cuda/sample_rows.cu) against the host Sampler:
// the same seed and step give the same token and logprob for every mix of temperature, top-p, min-p, top-k,
// logit_bias, grammar masks and XTC, over peaked, flat and tie-heavy (bf16-valued) rows of a real vocabulary
// size; and a row's token does not depend on the rows beside it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "cuda/cuda_test_util.h"
#include "engine/device_sampler.h"
#include "engine/sampler.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

struct OddTokensOnly : TokenConstraint {
  struct State : ConstraintState {
    void mask(std::span<float> logits) override {
      for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -INFINITY;
    }
    void accept(int32_t) override {}
  };
  std::unique_ptr<ConstraintState> start() const override { return std::make_unique<State>(); }
};

float round_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

// Logits of one row: kind 0 peaked (a few tokens hold most of the mass), 1 flat, 2 bf16 values (many ties).
std::vector<float> make_row(size_t V, int kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, kind == 1 ? 0.6f : 2.5f);
  std::vector<float> v(V);
  for (float& x : v) x = n(rng);
  if (kind == 0)
    for (int k = 0; k < 6; ++k) v[rng() % V] += 9.0f - static_cast<float>(k);
  if (kind == 2)
    for (float& x : v) x = round_to_bf16(x * 4.0f);
  return v;
}

std::vector<SamplingParams> settings_mix() {
  std::vector<SamplingParams> out;
  for (float t : {0.0f, 0.6f, 1.0f, 1.7f})
    for (float top_p : {1.0f, 0.9f, 0.35f})
      for (float min_p : {0.0f, 0.05f})
        for (int top_k : {0, 1, 40, 5000}) {
          SamplingParams p;
          p.temperature = t;
          p.top_p = top_p;
          p.min_p = min_p;
          p.top_k = top_k;
          out.push_back(p);
        }
  return out;
}

TEST(CudaSampleRows, EveryRowDrawsTheHostSamplersToken) {
  LATHE_REQUIRE_GPU();
  constexpr size_t V = 151936;
  const std::vector<SamplingParams> mix = settings_mix();
  // Extra settings: logit_bias with penalties, a grammar, XTC (served on the steps whose draw leaves it off).
  SamplingParams biased = mix[20];
  biased.temperature = 0.8f;
  biased.logit_bias[17] = 6.0f;
  biased.repetition_penalty = 1.2f;
  SamplingParams constrained = biased;
  constrained.constraint = std::make_shared<OddTokensOnly>();
  std::vector<const SamplingParams*> params;
  for (const auto& p : mix) params.push_back(&p);
  params.push_back(&biased);
  params.push_back(&constrained);
  const std::vector<int32_t> history = {3, 17, 17, 99, 1024};
  size_t checked = 0, sampled_differs_from_argmax = 0;
  for (int kind = 0; kind < 3; ++kind) {
    const size_t R = params.size();
    std::vector<float> host(R * V);
    for (size_t r = 0; r < R; ++r) {
      const std::vector<float> row = make_row(V, kind, static_cast<uint32_t>(1000 * kind + r));
      std::copy(row.begin(), row.end(), host.begin() + static_cast<std::ptrdiff_t>(r * V));
    }
    const Tensor logits =
        Tensor::from_floats(host, {static_cast<int64_t>(R), static_cast<int64_t>(V)}).to(Device::CUDA);
    for (uint64_t step : {0ull, 5ull, 123ull}) {
      std::vector<DeviceSampleRow> rows(R);
      std::vector<std::unique_ptr<ConstraintState>> states(R);
      for (size_t r = 0; r < R; ++r) {
        rows[r].params = params[r];
        rows[r].seed = 77 + r;
        rows[r].step = step;
        rows[r].history = history;
        rows[r].logprob = r % 2 == 0;
        if (params[r]->constraint) {
          states[r] = params[r]->constraint->start();
          rows[r].constraint = states[r].get();
        }
      }
      std::vector<SampleResult> out;
      ASSERT_TRUE(sample_on_device(logits, rows, out));
      for (size_t r = 0; r < R; ++r) {
        SamplingParams seeded = *params[r];
        seeded.seed = 77 + r;
        Sampler s(seeded);
        for (uint64_t k = 0; k < step; ++k) s.take(0);
        const SampleResult want = s.sample(std::span<const float>(host.data() + r * V, V), history);
        EXPECT_EQ(out[r].token, want.token)
            << "kind " << kind << " row " << r << " step " << step << " T " << params[r]->temperature << " top_p "
            << params[r]->top_p << " min_p " << params[r]->min_p << " top_k " << params[r]->top_k;
        if (rows[r].logprob) {
          EXPECT_NEAR(out[r].logprob, want.logprob, 1e-5f) << "row " << r;
        }
        if (params[r]->constraint) {
          EXPECT_EQ(out[r].token % 2, 1) << "the grammar's mask holds";
        }
        ++checked;
        const float* row = host.data() + r * V;
        if (params[r]->temperature > 0.0f && out[r].token != static_cast<int32_t>(std::max_element(row, row + V) - row))
          ++sampled_differs_from_argmax;
      }
    }
  }
  EXPECT_EQ(checked, 3u * 3u * params.size());
  EXPECT_GT(sampled_differs_from_argmax, checked / 10) << "the draws are random, not the argmax";
}

TEST(CudaSampleRows, XtcOnlyWhenItsDrawLeavesItOff) {
  LATHE_REQUIRE_GPU();
  constexpr size_t V = 4096;
  const std::vector<float> host = make_row(V, 0, 5);
  const Tensor logits = Tensor::from_floats(host, {1, static_cast<int64_t>(V)}).to(Device::CUDA);
  SamplingParams xtc;
  xtc.temperature = 1.0f;
  xtc.xtc_probability = 0.5f;
  xtc.xtc_threshold = 0.01f;
  int served = 0, declined = 0;
  for (uint64_t step = 0; step < 40; ++step) {
    DeviceSampleRow row;
    row.params = &xtc;
    row.seed = 9;
    row.step = step;
    std::vector<SampleResult> out;
    const bool on_device = sample_on_device(logits, std::span<const DeviceSampleRow>(&row, 1), out);
    EXPECT_EQ(on_device, xtc_draw(9, step) >= 0.5) << "step " << step;
    if (!on_device) {
      ++declined;
      continue;
    }
    ++served;
    SamplingParams seeded = xtc;
    seeded.seed = 9;
    Sampler s(seeded);
    for (uint64_t k = 0; k < step; ++k) s.take(0);
    EXPECT_EQ(out[0].token, s.sample(host, {}).token) << "step " << step;
  }
  EXPECT_GT(served, 5);
  EXPECT_GT(declined, 5);
}

TEST(CudaSampleRows, ARowsTokenDoesNotDependOnTheRowsBesideIt) {
  LATHE_REQUIRE_GPU();
  constexpr size_t V = 32000, R = 48;
  std::vector<float> host(R * V);
  for (size_t r = 0; r < R; ++r) {
    const std::vector<float> row = make_row(V, static_cast<int>(r % 3), static_cast<uint32_t>(r));
    std::copy(row.begin(), row.end(), host.begin() + static_cast<std::ptrdiff_t>(r * V));
  }
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.top_k = 50;
  std::vector<DeviceSampleRow> rows(R);
  for (size_t r = 0; r < R; ++r) {
    rows[r].params = &p;
    rows[r].seed = 1000 + r;
    rows[r].step = 3;
  }
  const Tensor all = Tensor::from_floats(host, {static_cast<int64_t>(R), static_cast<int64_t>(V)}).to(Device::CUDA);
  std::vector<SampleResult> batched;
  ASSERT_TRUE(sample_on_device(all, rows, batched));
  for (size_t r = 0; r < R; r += 7) {
    const std::vector<float> one_row(host.begin() + static_cast<std::ptrdiff_t>(r * V),
                                     host.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
    const Tensor one = Tensor::from_floats(one_row, {1, static_cast<int64_t>(V)}).to(Device::CUDA);
    std::vector<SampleResult> alone;
    ASSERT_TRUE(sample_on_device(one, std::span<const DeviceSampleRow>(&rows[r], 1), alone));
    EXPECT_EQ(alone[0].token, batched[r].token) << "row " << r;
  }
}

}  // namespace
}  // namespace lathe

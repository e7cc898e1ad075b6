// The CPU's Gated DeltaNet kernels (tensor/cpu/ssm.cc): the causal conv and the gated delta rule run a prompt at
// once and the same tokens one at a time to bitwise the same outputs and state (a prefill and the decode steps
// after it agree, so a row's output never depends on how its prompt was chunked), and both stay within float
// rounding of a plain double-precision evaluation of their formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/test_util.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

using testutil::random_floats;

bool ssm_same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

Tensor ssm_rows(const Tensor& t, int64_t r0, int64_t r1) { return t.slice(0, r0, r1).contiguous(); }

// C = 100 channels: 8-lane blocks and a 4-channel tail in every 16-channel range the pool hands out.
class CpuCausalConv : public ::testing::TestWithParam<bool> {};

TEST_P(CpuCausalConv, PromptAtOnceEqualsTokenByTokenAndReference) {
  const bool fast_exp = GetParam();
  constexpr int64_t T = 23, C = 100, K = 4;
  const Tensor x = Tensor::from_floats(random_floats(T * C, 1), {T, C});
  const Tensor w = Tensor::from_floats(random_floats(C * K, 2, 0.5f), {C, K});
  Tensor s_all = Tensor::zeros({K - 1, C}, DType::F32), s_step = Tensor::zeros({K - 1, C}, DType::F32);
  const Tensor all = causal_conv1d_silu(x, w, s_all, fast_exp);
  std::vector<Tensor> steps;
  for (int64_t t = 0; t < T; ++t) steps.push_back(causal_conv1d_silu(ssm_rows(x, t, t + 1), w, s_step, fast_exp));
  for (int64_t t = 0; t < T; ++t) ASSERT_TRUE(ssm_same_bits(ssm_rows(all, t, t + 1), steps[t])) << "token " << t;
  EXPECT_TRUE(ssm_same_bits(s_all, s_step));
  // Weights stored taps by channel (a [C, K] view of [K, C] storage, as models keep them) give the same bits.
  const Tensor by_channel = w.transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_FALSE(by_channel.is_contiguous());
  Tensor s_bc = Tensor::zeros({K - 1, C}, DType::F32);
  EXPECT_TRUE(ssm_same_bits(causal_conv1d_silu(x, by_channel, s_bc, fast_exp), all));
  EXPECT_TRUE(ssm_same_bits(s_bc, s_all));

  const std::vector<float> xv = x.to_floats(), wv = w.to_floats(), out = all.to_floats();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;  // taps j = 0..K-1 over inputs t - (K-1) + j, zeros before the first token
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += static_cast<double>(wv[c * K + j]) * xv[src * C + c];
      }
      const double ref = acc / (1.0 + std::exp(-acc));
      ASSERT_NEAR(out[t * C + c], ref, 1e-5 * (1.0 + std::fabs(ref))) << t << " " << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Exp, CpuCausalConv, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "polynomial" : "libm"); });

// Key head sizes: 28 (the 8-lane path's 16-lane step, 8-lane step and scalar tail) and 64 (the 16-lane path
// where the CPU has AVX-512); two value heads per key head.
class CpuGatedDeltaRule : public ::testing::TestWithParam<int64_t> {};

TEST_P(CpuGatedDeltaRule, PromptAtOnceEqualsTokenByTokenAndReference) {
  const int64_t Dk = GetParam();
  constexpr int64_t T = 9, Hk = 2, Hv = 4, Dv = 12;
  auto normed = [](std::vector<float> v, int64_t rows, int64_t d) {  // l2-normalised rows, as the model feeds them
    for (int64_t r = 0; r < rows; ++r) {
      double n = 0;
      for (int64_t i = 0; i < d; ++i) n += v[r * d + i] * static_cast<double>(v[r * d + i]);
      for (int64_t i = 0; i < d; ++i) v[r * d + i] = static_cast<float>(v[r * d + i] / std::sqrt(n));
    }
    return v;
  };
  const Tensor q = Tensor::from_floats(normed(random_floats(T * Hk * Dk, 3), T * Hk, Dk), {T, Hk, Dk});
  const Tensor k = Tensor::from_floats(normed(random_floats(T * Hk * Dk, 4), T * Hk, Dk), {T, Hk, Dk});
  const Tensor v = Tensor::from_floats(random_floats(T * Hv * Dv, 5), {T, Hv, Dv});
  std::vector<float> gv = random_floats(T * Hv, 6), bv = random_floats(T * Hv, 7);
  for (float& g : gv) g = -0.5f * std::fabs(g);          // log decay ≤ 0
  for (float& b : bv) b = 1.0f / (1.0f + std::exp(-b));  // step size in (0, 1)
  const Tensor g = Tensor::from_floats(gv, {T, Hv}), beta = Tensor::from_floats(bv, {T, Hv});

  Tensor s_all = Tensor::zeros({Hv, Dv, Dk}, DType::F32), s_step = Tensor::zeros({Hv, Dv, Dk}, DType::F32);
  const Tensor all = gated_delta_rule(q, k, v, g, beta, s_all);
  for (int64_t t = 0; t < T; ++t) {
    const Tensor y = gated_delta_rule(ssm_rows(q, t, t + 1), ssm_rows(k, t, t + 1), ssm_rows(v, t, t + 1),
                                      ssm_rows(g, t, t + 1), ssm_rows(beta, t, t + 1), s_step);
    ASSERT_TRUE(ssm_same_bits(ssm_rows(all, t, t + 1), y)) << "token " << t;
  }
  EXPECT_TRUE(ssm_same_bits(s_all, s_step));

  // S ← e^g · S;  S += β (v − S k) kᵀ;  y = S q  (per value head, S [Dv, Dk]), in double.
  const std::vector<float> qv = q.to_floats(), kv = k.to_floats(), vv = v.to_floats(), out = all.to_floats();
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = h / (Hv / Hk);
    std::vector<double> S(Dv * Dk, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const float* kt = kv.data() + (t * Hk + kh) * Dk;
      const float* qt = qv.data() + (t * Hk + kh) * Dk;
      const double decay = std::exp(static_cast<double>(gv[t * Hv + h])), b = bv[t * Hv + h];
      for (int64_t i = 0; i < Dv; ++i) {
        double sk = 0;
        for (int64_t j = 0; j < Dk; ++j) sk += (S[i * Dk + j] *= decay) * kt[j];
        const double delta = (vv[(t * Hv + h) * Dv + i] - sk) * b;
        double y = 0;
        for (int64_t j = 0; j < Dk; ++j) y += (S[i * Dk + j] += delta * kt[j]) * qt[j];
        ASSERT_NEAR(out[(t * Hv + h) * Dv + i], y, 1e-5 * (1.0 + std::fabs(y))) << t << " " << h << " " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KeyHeadSizes, CpuGatedDeltaRule, ::testing::Values(int64_t{28}, int64_t{64}));

}  // namespace
}  // namespace lathe

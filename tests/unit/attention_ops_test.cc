// Attention, RoPE and RMSNorm against direct formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "model/layers/rope.h"
#include "support/test_util.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

using testutil::random_floats;

// Naive attention with explicit positions for reference.
std::vector<float> naive(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                         int64_t T, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, const AttentionParams& p,
                         const std::vector<int64_t>& kpos) {
  std::vector<float> out(static_cast<size_t>(T * Hq * D), 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / (Hq / Hkv), qpos = p.q_pos0 + t;
      std::vector<double> s(static_cast<size_t>(S), -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        if (kpos[static_cast<size_t>(j)] > qpos || (p.window > 0 && qpos - kpos[static_cast<size_t>(j)] >= p.window))
          continue;
        double d = 0;
        for (int64_t i = 0; i < D; ++i)
          d += static_cast<double>(q[static_cast<size_t>((t * Hq + h) * D + i)]) *
               k[static_cast<size_t>((j * Hkv + kh) * D + i)];
        d *= p.scale;
        if (p.softcap > 0) d = std::tanh(d / p.softcap) * p.softcap;
        s[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < D; ++i)
          out[static_cast<size_t>((t * Hq + h) * D + i)] +=
              static_cast<float>(s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((j * Hkv + kh) * D + i)]);
    }
  return out;
}

TEST(Attention, CausalGqaWindowSoftcapAndRingPositions) {
  const int64_t T = 5, S = 12, Hq = 4, Hkv = 2, D = 8;
  const auto q = random_floats(static_cast<size_t>(T * Hq * D), 1);
  const auto k = random_floats(static_cast<size_t>(S * Hkv * D), 2);
  const auto v = random_floats(static_cast<size_t>(S * Hkv * D), 3);
  const Tensor qt = Tensor::from_floats(q, {T, Hq, D}), kt = Tensor::from_floats(k, {S, Hkv, D}),
               vt = Tensor::from_floats(v, {S, Hkv, D});
  for (int64_t window : {int64_t{0}, int64_t{4}})
    for (float softcap : {0.0f, 2.0f}) {
      AttentionParams p;
      p.scale = 0.35f;
      p.softcap = softcap;
      p.window = window;
      p.q_pos0 = 7;
      std::vector<int64_t> linear_pos(S), ring_pos(S);
      for (int64_t j = 0; j < S; ++j) {
        linear_pos[static_cast<size_t>(j)] = j;
        ring_pos[static_cast<size_t>(j)] = (j * 5) % S;  // a permutation, as a ring buffer would hold
      }
      const auto got = attention(qt, kt, vt, p).to_floats();
      const auto want = naive(q, k, v, T, S, Hq, Hkv, D, p, linear_pos);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "window " << window;
      p.k_pos = &ring_pos;
      const auto got_ring = attention(qt, kt, vt, p).to_floats();
      const auto want_ring = naive(q, k, v, T, S, Hq, Hkv, D, p, ring_pos);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got_ring[i], want_ring[i], 1e-5);
    }
}

TEST(Rope, DefaultRotatesPairsHalfApart) {
  RopeParams rp;
  rp.theta = 10000.0;
  const RopeTable table = make_rope(rp, 8);
  ASSERT_EQ(table.dims, 8);
  auto x = random_floats(2 * 1 * 8, 4);
  Tensor t = Tensor::from_floats(x, {2, 1, 8});
  rope_inplace(t, table, 3);
  const auto y = t.to_floats();
  for (int tok = 0; tok < 2; ++tok)
    for (int i = 0; i < 4; ++i) {
      const double ang = (3 + tok) / std::pow(10000.0, 2.0 * i / 8.0);
      const double a = x[static_cast<size_t>(tok * 8 + i)], b = x[static_cast<size_t>(tok * 8 + i + 4)];
      EXPECT_NEAR(y[static_cast<size_t>(tok * 8 + i)], a * std::cos(ang) - b * std::sin(ang), 1e-4);
      EXPECT_NEAR(y[static_cast<size_t>(tok * 8 + i + 4)], b * std::cos(ang) + a * std::sin(ang), 1e-4);
    }
}

TEST(Rope, PartialLeavesTailAndLinearScalesFrequency) {
  RopeParams rp;
  rp.partial_rotary_factor = 0.5;
  const RopeTable partial = make_rope(rp, 16);
  EXPECT_EQ(partial.dims, 8);
  auto x = random_floats(16, 5);
  Tensor t = Tensor::from_floats(x, {1, 1, 16});
  rope_inplace(t, partial, 9);
  const auto y = t.to_floats();
  for (int i = 8; i < 16; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)]);
  RopeParams lin;
  lin.type = "linear";
  lin.factor = 4;
  const RopeTable base = make_rope(RopeParams{}, 16), scaled = make_rope(lin, 16);
  for (size_t i = 0; i < base.inv_freq.size(); ++i) EXPECT_FLOAT_EQ(scaled.inv_freq[i], base.inv_freq[i] / 4);
  RopeParams unknown;
  unknown.type = "warp-drive";
  EXPECT_THROW(make_rope(unknown, 16), Error);
}

TEST(RmsNorm, PlainPlusOneAndWeightless) {
  const auto x = random_floats(3 * 16, 6);
  const auto w = random_floats(16, 7);
  const Tensor xt = Tensor::from_floats(x, {3, 16}), wt = Tensor::from_floats(w, {16});
  const auto plain = rms_norm(xt, wt, 1e-6f).to_floats();
  const auto plus = rms_norm(xt, wt, 1e-6f, true).to_floats();
  const auto bare = rms_norm(xt, Tensor(), 1e-6f).to_floats();
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 16; ++i) ss += x[static_cast<size_t>(r * 16 + i)] * x[static_cast<size_t>(r * 16 + i)];
    const double inv = 1.0 / std::sqrt(ss / 16 + 1e-6);
    for (int i = 0; i < 16; ++i) {
      const size_t j = static_cast<size_t>(r * 16 + i);
      EXPECT_NEAR(plain[j], x[j] * inv * w[static_cast<size_t>(i)], 1e-5);
      EXPECT_NEAR(plus[j], x[j] * inv * (1 + w[static_cast<size_t>(i)]), 1e-5);
      EXPECT_NEAR(bare[j], x[j] * inv, 1e-5);
    }
  }
}

TEST(Activations, SiluAndGeluTanh) {
  const Tensor g = Tensor::from_floats({-2.f, 0.f, 1.5f}, {1, 3}), u = Tensor::from_floats({1.f, 2.f, 3.f}, {1, 3});
  const auto s = silu_mul(g, u).to_floats(), e = gelu_tanh_mul(g, u).to_floats();
  EXPECT_NEAR(s[0], -2.0 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(s[2], 3 * 1.5 / (1 + std::exp(-1.5)), 1e-5);
  EXPECT_NEAR(e[2], 3 * 0.5 * 1.5 * (1 + std::tanh(0.7978845608 * (1.5 + 0.044715 * 3.375))), 1e-5);
  EXPECT_EQ(e[1], 0.0f);
}

// The default int8 path's silu (polynomial exp): within a few ulp of libm's across the range, saturating cleanly
// at the ends, NaN kept, and each element's value independent of where a parallel range ends (the tail is padded
// through the same vector arithmetic).
TEST(Activations, SiluFastExpMatchesLibmAndIgnoresRanges) {
  const int64_t n = 4096 + 13;  // a full 4096-element range, then a 13-element one with a 5-element tail
  std::vector<float> gv(static_cast<size_t>(n)), uv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    gv[static_cast<size_t>(i)] = -100.f + 200.f * static_cast<float>(i) / static_cast<float>(n);  // past ±88
    uv[static_cast<size_t>(i)] = 1.f + 0.001f * static_cast<float>(i % 7);
  }
  gv[17] = std::nanf("");
  const Tensor g = Tensor::from_floats(gv, {1, n}), u = Tensor::from_floats(uv, {1, n});
  const auto fast = silu_mul(g, u, true).to_floats(), exact = silu_mul(g, u, false).to_floats();
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    if (i == 17) {
      EXPECT_TRUE(std::isnan(fast[k]));
      continue;
    }
    EXPECT_NEAR(fast[k], exact[k], 4e-7 * std::fabs(exact[k]) + 1e-30) << "g " << gv[k];
  }
  // The first 21 elements alone: their vector blocks and padded tail give the same values as inside the big call.
  const std::vector<float> g21(gv.begin(), gv.begin() + 21), u21(uv.begin(), uv.begin() + 21);
  const auto few = silu_mul(Tensor::from_floats(g21, {1, 21}), Tensor::from_floats(u21, {1, 21}), true).to_floats();
  for (size_t k = 0; k < 21; ++k) {
    if (k == 17) continue;  // NaN
    EXPECT_EQ(few[k], fast[k]) << k;
  }
}

TEST(Argmax, FirstMaximumPerRow) {
  const Tensor x = Tensor::from_floats({1, 3, 3, 0, -1, -5, -1, -2}, {2, 4});
  EXPECT_EQ(argmax_rows(x), (std::vector<int32_t>{1, 0}));
}

}  // namespace
}  // namespace lathe

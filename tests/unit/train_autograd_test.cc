// Every backward of the training autograd (src/lab/train/autograd.h) against central finite differences of
// L = Σ y ⊙ R for a fixed random R, on small shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "lab/train/autograd.h"

namespace lathe::train::ag {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float s = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

struct In {
  int64_t rows, cols;
  std::vector<float> v;
};
using Build = std::function<Var(Tape&, const std::vector<Var>&)>;

double objective(const Build& f, const std::vector<In>& ins, const std::vector<float>& r) {
  Tape t(false);
  std::vector<Var> vs;
  for (const In& i : ins) vs.push_back(from_values(i.v, i.rows, i.cols, false));
  const Var y = f(t, vs);
  double s = 0;
  for (size_t i = 0; i < y->value.size(); ++i) s += static_cast<double>(y->value[i]) * r[i];
  return s;
}

// The worst |analytic - numeric| / (|numeric| + 1e-2 · scale) over every input element.
void expect_grads(const Build& f, std::vector<In> ins, double tol = 2e-2, float h = 1e-2f) {
  Tape t;
  std::vector<Var> vs;
  for (const In& i : ins) vs.push_back(from_values(i.v, i.rows, i.cols, true));
  const Var y = f(t, vs);
  const std::vector<float> r = randn(y->value.size(), 99);
  y->grad = r;
  t.backward();
  for (size_t k = 0; k < ins.size(); ++k) {
    double scale = 0;
    std::vector<double> num(ins[k].v.size());
    for (size_t e = 0; e < ins[k].v.size(); ++e) {
      const float x0 = ins[k].v[e];
      ins[k].v[e] = x0 + h;
      const double lp = objective(f, ins, r);
      ins[k].v[e] = x0 - h;
      const double lm = objective(f, ins, r);
      ins[k].v[e] = x0;
      num[e] = (lp - lm) / (2.0 * h);
      scale = std::max(scale, std::abs(num[e]));
    }
    ASSERT_GT(scale, 0.0) << "input " << k << " has no gradient at all";
    const std::vector<float>& g = vs[k]->grad;
    ASSERT_EQ(g.size(), num.size()) << "input " << k;
    double worst = 0;
    for (size_t e = 0; e < num.size(); ++e)
      worst = std::max(worst, std::abs(g[e] - num[e]) / (std::abs(num[e]) + 1e-2 * scale));
    EXPECT_LT(worst, tol) << "input " << k;
  }
}

Weight dense_weight(int64_t out, int64_t in, uint32_t seed) {
  Weight w;
  w.dense = Tensor::from_floats(randn(static_cast<size_t>(out * in), seed, 0.3f), {out, in});
  return w;
}

TEST(TrainAutograd, AddAndScale) {
  expect_grads([](Tape& t, const std::vector<Var>& v) { return scale(t, add(t, v[0], v[1]), 1.5f); },
               {{3, 4, randn(12, 1)}, {3, 4, randn(12, 2)}});
}

TEST(TrainAutograd, RmsNormRowsAndHeads) {
  const Tensor w = Tensor::from_floats(randn(8, 3, 0.5f), {8});
  const Tensor wh = Tensor::from_floats(randn(4, 4, 0.5f), {4});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return rms_norm(t, v[0], w, 1e-6f, false, 8); },
               {{3, 8, randn(24, 5)}});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return rms_norm(t, v[0], w, 1e-6f, true, 8); },
               {{3, 8, randn(24, 6)}});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return rms_norm(t, v[0], wh, 1e-6f, true, 4); },
               {{3, 8, randn(24, 7)}});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return rms_norm(t, v[0], Tensor(), 1e-6f, false, 8); },
               {{2, 8, randn(16, 8)}});
}

TEST(TrainAutograd, RopeFullAndPartial) {
  RopeTable full;
  full.dims = 8;
  full.inv_freq = {1.0f, 0.3f, 0.1f, 0.01f};
  RopeTable partial;
  partial.dims = 4;
  partial.inv_freq = {0.7f, 0.05f};
  partial.attention_scaling = 1.2f;
  const std::vector<int64_t> pos{0, 3, 7};
  for (const RopeTable* r : {&full, &partial})
    expect_grads([&](Tape& t, const std::vector<Var>& v) { return rope(t, v[0], *r, 8, pos); },
                 {{3, 16, randn(48, 9)}});
}

TEST(TrainAutograd, AttentionCausalGqaWindowSoftcap) {
  for (int variant = 0; variant < 3; ++variant) {
    AttnShape s;
    s.heads = 4;
    s.kv_heads = 2;
    s.head_dim = 4;
    s.scale = 0.5f;
    if (variant == 1) s.window = 3;
    if (variant == 2) s.softcap = 2.0f;
    const int64_t T = 5;
    expect_grads([&](Tape& t, const std::vector<Var>& v) { return attention(t, v[0], v[1], v[2], s); },
                 {{T, 16, randn(80, 10)}, {T, 8, randn(40, 11)}, {T, 8, randn(40, 12)}});
  }
}

TEST(TrainAutograd, GatedSiluAndGelu) {
  for (Gate g : {Gate::SiLU, Gate::GeluTanh})
    expect_grads([&](Tape& t, const std::vector<Var>& v) { return gated(t, v[0], v[1], g); },
                 {{2, 6, randn(12, 13, 2.0f)}, {2, 6, randn(12, 14)}});
}

TEST(TrainAutograd, LinearDenseWithBias) {
  const Weight w = dense_weight(5, 7, 15);
  const Tensor bias = Tensor::from_floats(randn(5, 16), {5});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return linear(t, v[0], w, &bias); }, {{3, 7, randn(21, 17)}});
}

TEST(TrainAutograd, LinearQuantizedMatchesItsDequantizedWeight) {
  // A 4-bit, group-32 matrix [3, 64] with random codes: backward must equal the dense path on the
  // dequantized weight, and match finite differences.
  const int64_t out = 3, in = 64;
  Weight q;
  q.quantized = true;
  q.q.bits = 4;
  q.q.group_size = 32;
  std::mt19937 g(18);
  Tensor words = Tensor::empty({out, in * 4 / 32}, DType::U32);
  for (int64_t i = 0; i < words.numel(); ++i) words.data<uint32_t>()[i] = g();
  q.q.w = words;
  q.q.scales = Tensor::from_floats(randn(static_cast<size_t>(out * 2), 19, 0.05f), {out, 2});
  q.q.biases = Tensor::from_floats(randn(static_cast<size_t>(out * 2), 20, 0.1f), {out, 2});
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return linear(t, v[0], q); }, {{2, in, randn(128, 21)}});
  Weight d;
  d.dense = weight_rows(q, 0, out);
  Tape t1, t2;
  const Var x1 = from_values(randn(128, 22), 2, in, true), x2 = from_values(x1->value, 2, in, true);
  const Var y1 = linear(t1, x1, q), y2 = linear(t2, x2, d);
  y1->grad = y2->grad = randn(6, 23);
  t1.backward();
  t2.backward();
  for (size_t i = 0; i < y1->value.size(); ++i) EXPECT_NEAR(y1->value[i], y2->value[i], 1e-4);
  for (size_t i = 0; i < x1->grad.size(); ++i) EXPECT_NEAR(x1->grad[i], x2->grad[i], 1e-4);
}

TEST(TrainAutograd, LoraResidualGradsOfInputAndFactors) {
  LoraParam p;
  p.module = "m";
  p.a = Tensor::from_floats(randn(3 * 6, 24), {3, 6});
  p.b = Tensor::from_floats(randn(5 * 3, 25), {5, 3});
  p.grad_a = Tensor::zeros({3, 6}, DType::F32);
  p.grad_b = Tensor::zeros({5, 3}, DType::F32);
  p.scale = 2.0f;
  const std::vector<float> xv = randn(4 * 6, 26);
  expect_grads([&](Tape& t, const std::vector<Var>& v) { return lora(t, v[0], p); }, {{4, 6, xv}});
  // The factors: the analytic grads (accumulated once more by expect_grads' tape) against finite differences.
  std::fill(p.grad_a.data<float>(), p.grad_a.data<float>() + 18, 0.0f);
  std::fill(p.grad_b.data<float>(), p.grad_b.data<float>() + 15, 0.0f);
  const std::vector<float> r = randn(20, 27);
  auto L = [&] {
    Tape t(false);
    const Var y = lora(t, from_values(xv, 4, 6, false), p);
    double s = 0;
    for (size_t i = 0; i < y->value.size(); ++i) s += static_cast<double>(y->value[i]) * r[i];
    return s;
  };
  {
    Tape t;
    const Var y = lora(t, from_values(xv, 4, 6, false), p);
    y->grad = r;
    t.backward();
  }
  for (Tensor* param : {&p.a, &p.b}) {
    const Tensor& grad = param == &p.a ? p.grad_a : p.grad_b;
    for (int64_t e = 0; e < param->numel(); ++e) {
      float& x = param->data<float>()[e];
      const float x0 = x;
      x = x0 + 1e-2f;
      const double lp = L();
      x = x0 - 1e-2f;
      const double lm = L();
      x = x0;
      EXPECT_NEAR(grad.data<float>()[e], (lp - lm) / 2e-2, 2e-2 * (1.0 + std::abs((lp - lm) / 2e-2)));
    }
  }
}

TEST(TrainAutograd, TargetLogprobsChunkedWithSoftcap) {
  const Weight head = dense_weight(11, 6, 28);
  const std::vector<int32_t> targets{3, -1, 10, 0};
  for (float cap : {0.0f, 3.0f})
    expect_grads([&](Tape& t, const std::vector<Var>& v) { return target_logprobs(t, v[0], head, targets, cap, 4); },
                 {{4, 6, randn(24, 29)}});
  // Chunking does not change the values: one block of the whole vocabulary gives the same log-probs.
  Tape t(false);
  const Var h = from_values(randn(24, 30), 4, 6, false);
  const Var a = target_logprobs(t, h, head, targets, 0.0f, 3), b = target_logprobs(t, h, head, targets, 0.0f, 64);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a->value[i], b->value[i], 1e-5);
  EXPECT_EQ(a->value[1], 0.0f);
  double total = 0;  // probabilities of every token at row 0 sum to 1
  for (int32_t id = 0; id < 11; ++id) {
    const Var one = target_logprobs(t, h, head, {id, -1, -1, -1}, 0.0f, 5);
    total += std::exp(static_cast<double>(one->value[0]));
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

}  // namespace
}  // namespace lathe::train::ag

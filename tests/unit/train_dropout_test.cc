// LoRA dropout ([train] #19): the keyed masks, the dropout LoRA branch against finite differences with a fixed
// mask, and the CPU engine on the tiny llama fixture: its backward recompute replays the forward's masks (finite
// differences of the dropout loss), p = 0 is bit-identical to no dropout, the same key gives the same loss and
// another seed another, and a forward without a pending dropout (validation) runs none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "lab/train/autograd.h"
#include "lab/train/lora_dropout.h"
#include "lab/train/lora_engine_cpu.h"
#include "model/model.h"
#include "support/fixtures.h"

namespace lathe::train {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(TrainDropout, MasksAreKeyedScaledAndBernoulli) {
  const LoraDropout d{0.25, 7, 3, 1};
  const auto m = dropout_mask(dropout_stream(d, 0, 2, 4), 20000, d.p);
  int64_t dropped = 0;
  for (float v : *m) {
    ASSERT_TRUE(v == 0.0f || v == static_cast<float>(1.0 / 0.75)) << v;
    dropped += v == 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / 20000.0, 0.25, 0.015);
  EXPECT_EQ(*m, *dropout_mask(dropout_stream(d, 0, 2, 4), 20000, d.p));  // same key, same mask
  // Every component of the key moves the mask.
  std::set<uint64_t> streams{dropout_stream(d, 0, 2, 4)};
  for (const LoraDropout& o : {LoraDropout{0.25, 8, 3, 1}, LoraDropout{0.25, 7, 4, 1}, LoraDropout{0.25, 7, 3, 0}})
    streams.insert(dropout_stream(o, 0, 2, 4));
  streams.insert(dropout_stream(d, 1, 2, 4));
  streams.insert(dropout_stream(d, 0, 3, 4));
  streams.insert(dropout_stream(d, 0, 2, 5));
  EXPECT_EQ(streams.size(), 7u);
  EXPECT_NE(*m, *dropout_mask(dropout_stream(d, 0, 2, 5), 20000, d.p));
}

// y = scale · b a (x ⊙ mask), mask from p = 0.5: analytic grads of x, a and b against central differences.
TEST(TrainDropout, LoraBranchMatchesFiniteDifferencesWithAFixedMask) {
  const int64_t T = 4, in = 6, r = 3, out = 5;
  LoraParam p;
  p.module = "m";
  p.a = Tensor::from_floats(randn(static_cast<size_t>(r * in), 31), {r, in});
  p.b = Tensor::from_floats(randn(static_cast<size_t>(out * r), 32), {out, r});
  p.grad_a = Tensor::zeros({r, in}, DType::F32);
  p.grad_b = Tensor::zeros({out, r}, DType::F32);
  p.scale = 1.5f;
  std::vector<float> xv = randn(static_cast<size_t>(T * in), 33);
  const std::vector<float> w = randn(static_cast<size_t>(T * out), 34);
  const auto mask = dropout_mask(dropout_stream({0.5, 1, 1, 0}, 0, 0, 0), T * in, 0.5);
  int64_t kept = 0;
  for (float v : *mask) kept += v != 0.0f;
  ASSERT_GT(kept, 4);
  ASSERT_LT(kept, T * in - 4);
  auto loss = [&] {
    ag::Tape t(false);
    const ag::Var y = ag::lora(t, ag::masked(t, ag::from_values(xv, T, in, false), mask), p);
    double s = 0;
    for (size_t i = 0; i < y->value.size(); ++i) s += static_cast<double>(y->value[i]) * w[i];
    return s;
  };
  ag::Tape t;
  const ag::Var x = ag::from_values(xv, T, in, true);
  const ag::Var y = ag::lora(t, ag::masked(t, x, mask), p);
  y->grad = w;
  t.backward();
  ASSERT_EQ(x->grad.size(), xv.size());
  auto check = [&](float* v, int64_t n, const float* grad, const char* what) {
    for (int64_t e = 0; e < n; ++e) {
      const float v0 = v[e];
      v[e] = v0 + 1e-2f;
      const double lp = loss();
      v[e] = v0 - 1e-2f;
      const double lm = loss();
      v[e] = v0;
      const double fd = (lp - lm) / 2e-2;
      EXPECT_NEAR(grad[e], fd, 1e-2 * (1.0 + std::abs(fd))) << what << "[" << e << "]";
    }
  };
  check(xv.data(), T * in, x->grad.data(), "x");
  check(p.a.data<float>(), r * in, p.grad_a.data<float>(), "a");
  check(p.b.data<float>(), out * r, p.grad_b.data<float>(), "b");
  // Only kept elements pass a gradient back.
  for (size_t i = 0; i < xv.size(); ++i) {
    if ((*mask)[i] == 0.0f) {
      EXPECT_EQ(x->grad[i], 0.0f) << i;
    }
  }
}

class EngineDropout : public ::testing::Test {
 protected:
  void SetUp() override {
    LoadOptions lo;
    lo.exact = true;
    model_ = load_model(test::model_dir("llama-bf16"), lo);
    const ModelConfig& c = model_->config();
    // q_proj and down_proj of every layer: the attention input and the MLP's inner width.
    const int64_t H = c.hidden_size, I = c.intermediate_size, qo = c.num_heads * c.head_dim;
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (int s = 0; s < 2; ++s) {
        const int64_t in = s == 0 ? H : I, out = s == 0 ? qo : H, r = 2;
        LoraParam p;
        p.module = "model.layers." + std::to_string(l) + (s == 0 ? ".self_attn.q_proj" : ".mlp.down_proj");
        std::vector<float> a(static_cast<size_t>(r * in)), b(static_cast<size_t>(out * r));
        for (float& x : a) x = nd(g) / std::sqrt(static_cast<float>(in));
        for (float& x : b) x = nd(g) * 0.3f;
        p.a = Tensor::from_floats(a, {r, in});
        p.b = Tensor::from_floats(b, {out, r});
        p.grad_a = Tensor::zeros(p.a.shape(), DType::F32);
        p.grad_b = Tensor::zeros(p.b.shape(), DType::F32);
        p.scale = 2.0f;
        params_.params.push_back(std::move(p));
      }
    engine_ = make_cpu_lora_gradient_engine(*model_, params_);
    std::mt19937 tg(3);
    std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size - 1));
    for (int len : {10, 6}) {
      TrainSequence s;
      for (int j = 0; j < len; ++j) s.ids.push_back(tok(tg));
      s.target.assign(static_cast<size_t>(len), 1);
      s.target[0] = 0;
      batch_.push_back(std::move(s));
    }
  }
  // w · sum_logp of the batch with (or, drop = nullptr, without) a dropout forward.
  double loss(const LoraDropout* drop) {
    if (drop) engine_->dropout_next(*drop);
    const SequenceLogProbs lp = engine_->forward(batch_, true);
    return -0.4 * lp.sum_logp[0] - 0.6 * lp.sum_logp[1];
  }
  std::vector<std::vector<float>> grads(const LoraDropout* drop) {
    zero_grads(params_);
    loss(drop);
    engine_->backward({-0.4, -0.6});
    std::vector<std::vector<float>> out;
    for (const LoraParam& p : params_.params)
      for (const Tensor* g : {&p.grad_a, &p.grad_b}) out.emplace_back(g->data<float>(), g->data<float>() + g->numel());
    return out;
  }

  std::unique_ptr<Model> model_;
  LoraParams params_;
  std::unique_ptr<LoraGradientEngine> engine_;
  std::vector<TrainSequence> batch_;
};

TEST_F(EngineDropout, BackwardReplaysTheForwardMasks) {
  const LoraDropout drop{0.5, 11, 4, 1};
  const auto g = grads(&drop);
  const float h = 1e-2f;
  size_t k = 0;
  for (LoraParam& p : params_.params)
    for (Tensor* v : {&p.a, &p.b}) {
      const std::vector<float>& gv = g[k++];
      size_t big = 0;
      for (size_t e = 0; e < gv.size(); ++e)
        if (std::abs(gv[e]) > std::abs(gv[big])) big = e;
      const double gmax = std::abs(gv[big]);
      ASSERT_GT(gmax, 0.0) << p.module;
      for (size_t e : {big, gv.size() / 3}) {
        float& x = v->data<float>()[e];
        const float x0 = x;
        x = x0 + h;
        const double lp = loss(&drop);
        x = x0 - h;
        const double lm = loss(&drop);
        x = x0;
        EXPECT_NEAR(gv[e], (lp - lm) / (2.0 * h), 1e-2 * gmax + 3e-4) << p.module << "[" << e << "]";
      }
    }
}

TEST_F(EngineDropout, ZeroIsNoDropoutAndTheKeyDecides) {
  const double plain = loss(nullptr);
  const auto plain_grads = grads(nullptr);
  const LoraDropout zero{0.0, 11, 4, 1};
  EXPECT_EQ(loss(&zero), plain);  // bit-identical
  EXPECT_EQ(grads(&zero), plain_grads);
  const LoraDropout drop{0.5, 11, 4, 1}, other_seed{0.5, 12, 4, 1}, other_step{0.5, 11, 5, 1};
  const double dropped = loss(&drop);
  EXPECT_NE(dropped, plain);
  EXPECT_EQ(loss(&drop), dropped);
  EXPECT_NE(loss(&other_seed), dropped);
  EXPECT_NE(loss(&other_step), dropped);
  // The dropout was for one forward: the next (validation's) runs none, and so does a base-only forward
  // that comes first (DPO's reference) without taking it.
  EXPECT_EQ(loss(nullptr), plain);
  engine_->dropout_next(drop);
  engine_->forward(batch_, false);
  EXPECT_EQ(loss(nullptr), dropped);
  EXPECT_EQ(loss(nullptr), plain);
}

}  // namespace
}  // namespace lathe::train

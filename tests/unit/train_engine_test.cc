// The CPU LoRA gradient engine end to end against finite differences of its own loss, with LoRA on all seven
// targets of every layer (the parity fixtures train q/v/down only) on llama (separate head, llama3 rope),
// qwen3 (4-bit base, q/k norms) and gemma3 (sandwich norms, sliding layers); plus its input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"
#include "lab/train/batch_grads.h"
#include "lab/train/lora_engine_cpu.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "support/lora_test_util.h"

namespace lathe::train {
namespace {

std::vector<TrainSequence> small_batch(int64_t vocab) {
  std::vector<TrainSequence> b(2);
  std::mt19937 g(3);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  for (int len : {12, 7}) {
    TrainSequence& s = b[len == 12 ? 0 : 1];
    for (int j = 0; j < len; ++j) s.ids.push_back(tok(g));
    s.target.assign(static_cast<size_t>(len), 0);
    for (int j = 2; j < len; ++j) s.target[static_cast<size_t>(j)] = 1;
  }
  return b;
}

class TrainEngineFd : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainEngineFd, AllSevenTargetsMatchFiniteDifferences) {
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(GetParam()), lo);
  LoraParams ps = all_targets(model->config(), 2, 5);
  auto engine = make_cpu_lora_gradient_engine(*model, ps);
  const auto batch = small_batch(model->config().vocab_size);
  const std::vector<double> w{-0.3, -0.7};
  auto loss = [&] {
    const SequenceLogProbs lp = engine->forward(batch, true);
    return w[0] * lp.sum_logp[0] + w[1] * lp.sum_logp[1];
  };
  loss();
  engine->backward(w);
  const float h = 1e-2f;
  std::mt19937 g(9);
  for (LoraParam& p : ps.params)
    for (int which = 0; which < 2; ++which) {
      Tensor& v = which == 0 ? p.a : p.b;
      const Tensor& grad = which == 0 ? p.grad_a : p.grad_b;
      const float* gp = grad.data<float>();
      int64_t big = 0;
      float gmax = 0;
      for (int64_t e = 0; e < grad.numel(); ++e)
        if (std::abs(gp[e]) > gmax) {
          gmax = std::abs(gp[e]);
          big = e;
        }
      ASSERT_GT(gmax, 0.0f) << p.module << (which ? " b" : " a") << " got no gradient";
      for (int64_t e : {big, static_cast<int64_t>(g() % static_cast<uint32_t>(v.numel()))}) {
        float& x = v.data<float>()[e];
        const float x0 = x;
        x = x0 + h;
        const double lp = loss();
        x = x0 - h;
        const double lm = loss();
        x = x0;
        const double fd = (lp - lm) / (2.0 * h);
        EXPECT_NEAR(gp[e], fd, 1e-2 * gmax + 3e-4) << p.module << (which ? ".lora_b[" : ".lora_a[") << e << "]";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainEngineFd, ::testing::Values("llama-bf16", "qwen3-q4g64", "gemma3-bf16"));

TEST(TrainEngine, RejectsBadParamsAndInput) {
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir("qwen3-q4g64"), lo);
  LoraParams ps = all_targets(model->config(), 2, 5);
  ps.params[0].module = "model.layers.9.self_attn.q_proj";
  EXPECT_THROW(make_cpu_lora_gradient_engine(*model, ps), Error);
  LoraParams ok = all_targets(model->config(), 2, 5);
  auto engine = make_cpu_lora_gradient_engine(*model, ok);
  EXPECT_THROW(engine->backward({-1.0}), Error);  // no forward yet
  auto batch = small_batch(model->config().vocab_size);
  batch[1].ids[3] = static_cast<int32_t>(model->config().vocab_size);
  EXPECT_THROW(engine->forward(batch, true), Error);
  batch = small_batch(model->config().vocab_size);
  batch[0].target[0] = 1;
  EXPECT_THROW(engine->forward(batch, true), Error);
  batch = small_batch(model->config().vocab_size);
  engine->forward(batch, true);
  EXPECT_THROW(engine->backward({-1.0}), Error);  // one weight for two sequences
}

TEST(TrainGradBatch, ParsesAndRejects) {
  const auto ok =
      parse_grad_batch(nlohmann::json::parse(R"({"batch": [[1, 2, 3], [4, 5]], "prompt_lens": [1, 2]})"), "b.json");
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[0].target, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(ok[1].target, (std::vector<uint8_t>{0, 0}));
  for (const char* bad : {R"([])", R"({"batch": [], "prompt_lens": []})", R"({"batch": [[1, 2]], "prompt_lens": [0]})",
                          R"({"batch": [[1, 2]], "prompt_lens": [3]})", R"({"batch": [[1, -2]], "prompt_lens": [1]})",
                          R"({"batch": [[1, 2]], "prompt_lens": [1, 1]})", R"({"batch": [["a"]], "prompt_lens": [1]})",
                          R"({"batch": [[1, 2]]})"}) {
    try {
      parse_grad_batch(nlohmann::json::parse(bad), "b.json");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("b.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lathe::train

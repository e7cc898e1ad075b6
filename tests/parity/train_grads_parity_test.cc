// Training parity: the loss and every LoRA gradient of one batch (what `lathe train grads` computes, through
// the same train::read_grad_batch / compute_batch_grads) against the PyTorch oracle's fixtures
// (tests/fixtures/training/*-lora-grads): loss within 1e-5 relative, each gradient within 1e-4 relative
// (max |diff| / max |ref| per tensor). Also: the engine's base forward gives the inference model's log-probs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/train/batch_grads.h"
#include "lab/train/lora_engine_cpu.h"
#include "model/model.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

std::string training_dir(const std::string& arch) { return test::fixtures_dir() + "/training/" + arch + "-lora-grads"; }

class TrainGradsParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainGradsParity, LossAndGradsMatchReference) {
  const std::string dir = training_dir(GetParam());
  const auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  const auto batch = train::read_grad_batch(dir + "/reference.json");
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
  const train::BatchGrads g = train::compute_batch_grads(
      *model, test::fixtures_dir() + "/adapters/" + ref["adapter"].get<std::string>(), batch);
  const double ref_loss = ref["loss"].get<double>();
  const double loss_rel = std::abs(g.loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LT(loss_rel, 1e-5) << "loss " << g.loss << " vs " << ref_loss;

  const auto grads = SafetensorsFile::open(dir + "/grads.safetensors");
  std::set<std::string> seen;
  double worst = 0;
  std::string worst_name;
  for (const train::NamedGrad& n : g.grads) {
    ASSERT_TRUE(grads->has(n.name)) << n.name << " is not in the reference";
    const Tensor r = grads->get(n.name);
    ASSERT_EQ(r.shape(), n.value.shape()) << n.name;
    const std::vector<float> a = n.value.to_floats(), b = r.to_floats();
    double md = 0, mr = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      md = std::max(md, static_cast<double>(std::abs(a[i] - b[i])));
      mr = std::max(mr, static_cast<double>(std::abs(b[i])));
    }
    ASSERT_GT(mr, 0.0) << n.name;
    EXPECT_LT(md / mr, 1e-4) << n.name;
    if (md / mr > worst) {
      worst = md / mr;
      worst_name = n.name;
    }
    seen.insert(n.name);
  }
  EXPECT_EQ(seen.size(), grads->tensors().size()) << "every reference gradient is computed";
  std::printf("[train grads %s] loss %.9g (ref %.9g, rel %.2e); worst grad rel %.2e at %s\n", GetParam().c_str(),
              g.loss, ref_loss, loss_rel, worst, worst_name.c_str());
}

// forward(with_adapter=false) is the inference model's log-probability of each next token.
TEST_P(TrainGradsParity, BaseForwardMatchesInferenceLogprobs) {
  const std::string dir = training_dir(GetParam());
  const auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  auto batch = train::read_grad_batch(dir + "/reference.json");
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
  train::LoraParams none;
  auto engine = train::make_cpu_lora_gradient_engine(*model, none);
  const train::SequenceLogProbs lp = engine->forward(batch, false);
  for (size_t s = 0; s < batch.size(); ++s) {
    CacheList caches = model->make_cache();
    const Tensor logits = model->forward(batch[s].ids, caches, true).contiguous();
    const int64_t V = logits.dim(1);
    const float* z = logits.data<float>();
    double sum = 0;
    for (size_t j = 1; j < batch[s].ids.size(); ++j) {
      if (!batch[s].target[j]) continue;
      const float* row = z + static_cast<int64_t>(j - 1) * V;
      double m = row[0], e = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(row[v]));
      for (int64_t v = 0; v < V; ++v) e += std::exp(row[v] - m);
      sum += row[batch[s].ids[j]] - m - std::log(e);
    }
    EXPECT_NEAR(lp.sum_logp[s], sum, 1e-4 * std::abs(sum)) << "sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainGradsParity, ::testing::Values("qwen3", "gemma3"));

}  // namespace
}  // namespace lathe

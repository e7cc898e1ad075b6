// Batched forward on the device (Model::forward(const Batch&)) against per-sequence forwards on the device:
// mixed prefill chunks and decode rows, a row that wants no logits, rows joining and leaving, for every fixture
// architecture. f32 activations within the parity bound (1e-3·max(1, max|solo|), same argmax); bf16 within a
// few bf16 steps of the logits' scale (the batched linears run the M-row kernels, the solo decode the GEMV).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda/cuda_test_util.h"
#include "engine/device_sampler.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

// A grammar stand-in for the device sampler: every third token allowed (and the largest logit most often not).
struct EveryThirdToken : TokenConstraint {
  struct State : ConstraintState {
    void mask(std::span<float> logits) override {
      for (size_t i = 0; i < logits.size(); ++i)
        if (i % 3 != 0) logits[i] = -INFINITY;
    }
    void accept(int32_t) override {}
  };
  std::unique_ptr<ConstraintState> start() const override { return std::make_unique<State>(); }
};

struct BatchedCase {
  std::string model;
  DType act = DType::F32;
};

std::string case_name(const ::testing::TestParamInfo<BatchedCase>& i) {
  std::string s = i.param.model + (i.param.act == DType::BF16 ? "_bf16act" : "_f32act");
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::vector<int32_t> part(const std::vector<int32_t>& v, size_t a, size_t b) {
  return {v.begin() + static_cast<std::ptrdiff_t>(a), v.begin() + static_cast<std::ptrdiff_t>(std::min(b, v.size()))};
}

class CudaBatched : public ::testing::TestWithParam<BatchedCase> {};

TEST_P(CudaBatched, MixedRowsEqualSoloForwards) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference(GetParam().model);
  auto model = load_model(test::model_dir(GetParam().model), LoadOptions{Device::CUDA, GetParam().act});
  const auto& chat = ref.prompts.at("chat");
  const auto& lng = ref.prompts.at("long");
  const auto& greedy = ref.prompts.at("chat_greedy");
  struct Step {
    std::vector<int32_t> ids;
    bool want = true;
  };
  const std::vector<std::vector<Step>> script = {
      {{chat}, {{7}}, {{11}}, {{3}}},
      {{part(lng, 0, 16), false}, {part(lng, 16, 40)}, {{5}}, {{9}}},
      {{}, {part(greedy, 0, 5)}, {part(greedy, 5, 60)}, {{2}}},
      {{{1}}, {{4}}, {}, {}},
  };
  std::vector<std::vector<std::vector<float>>> solo(script.size());
  for (size_t s = 0; s < script.size(); ++s) {
    CacheList caches = model->make_cache();
    for (const Step& st : script[s])
      solo[s].push_back(st.ids.empty() ? std::vector<float>() : model->forward(st.ids, caches, false).to_floats());
  }
  std::vector<CacheList> caches;
  for (size_t s = 0; s < script.size(); ++s) caches.push_back(model->make_cache());
  const double rel = GetParam().act == DType::F32 ? 1e-3 : 3e-2;
  double worst = 0;
  for (size_t k = 0; k < 4; ++k) {
    Batch batch;
    std::vector<size_t> order;
    for (size_t s = 0; s < script.size(); ++s)
      if (!script[s][k].ids.empty()) order.push_back(s);
    if (k % 2 == 1) std::reverse(order.begin(), order.end());
    for (size_t s : order) batch.rows.push_back({script[s][k].ids, &caches[s], script[s][k].want, -1});
    const Tensor logits = model->forward(batch);
    ASSERT_EQ(logits.device(), Device::CUDA);
    ASSERT_EQ(logits.dim(0), batch.logit_rows());
    const std::vector<float> all = logits.to_floats();
    const size_t V = static_cast<size_t>(logits.dim(1));
    size_t row = 0;
    for (size_t s : order) {
      if (!script[s][k].want) continue;
      const std::vector<float> got(all.begin() + static_cast<std::ptrdiff_t>(row * V),
                                   all.begin() + static_cast<std::ptrdiff_t>((row + 1) * V));
      ++row;
      const std::vector<float>& want = solo[s][k];
      const double scale = std::max(1.0f, max_abs(want)), d = max_abs_diff(got, want) / scale;
      worst = std::max(worst, d);
      EXPECT_LE(d, rel) << GetParam().model << " step " << k << " sequence " << s;
      if (GetParam().act == DType::F32) {
        EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
                  std::max_element(want.begin(), want.end()) - want.begin())
            << GetParam().model << " step " << k << " sequence " << s;
      }
    }
  }
  std::printf("[cuda batched] %-16s %s max|batched - solo| / scale %.3g\n", GetParam().model.c_str(),
              GetParam().act == DType::F32 ? "f32 " : "bf16", worst);
}

// Greedy rows sampled on the device give the host Sampler's tokens; rows it does not cover make it decline.
TEST(CudaDeviceSampler, GreedyRowsMatchTheHostSampler) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference("qwen3-bf16");
  auto model = load_model(test::model_dir("qwen3-bf16"), LoadOptions{Device::CUDA, DType::F32});
  CacheList a = model->make_cache(), b = model->make_cache(), c = model->make_cache();
  Batch batch;
  batch.rows.push_back({ref.prompts.at("chat"), &a, true, -1});
  batch.rows.push_back({ref.prompts.at("long"), &b, true, -1});
  batch.rows.push_back({ref.prompts.at("one"), &c, true, -1});
  const Tensor logits = model->forward(batch);
  SamplingParams greedy, penalised;
  penalised.repetition_penalty = 1.3f;
  std::vector<DeviceSampleRow> rows(3);
  for (auto& r : rows) r.params = &greedy;
  std::vector<SampleResult> out;
  ASSERT_TRUE(sample_on_device(logits, rows, out));
  ASSERT_EQ(out.size(), 3u);
  const std::vector<float> host = logits.to_floats();
  const size_t V = static_cast<size_t>(logits.dim(1));
  for (size_t i = 0; i < 3; ++i) {
    Sampler s(greedy);
    const std::span<const float> row(host.data() + i * V, V);
    EXPECT_EQ(out[i].token, s.sample(row, {}).token) << "row " << i;
  }
  // Logits processors on the device: each row's token equals the host Sampler's over the same history, with a
  // bias that moves the argmax and penalties over a history holding the unbiased winners.
  std::vector<int32_t> history;
  for (size_t i = 0; i < 3; ++i) history.push_back(out[i].token);
  history.push_back(out[0].token);  // twice: the frequency penalty applies per occurrence
  SamplingParams biased, all_of_them;
  biased.logit_bias[out[0].token] = -100.0f;
  biased.logit_bias[7] = 3.5f;
  all_of_them = biased;
  all_of_them.repetition_penalty = 1.3f;
  all_of_them.presence_penalty = 0.7f;
  all_of_them.frequency_penalty = 0.4f;
  const SamplingParams* kinds[] = {&biased, &penalised, &all_of_them};
  for (size_t i = 0; i < 3; ++i) {
    rows[i].params = kinds[i];
    rows[i].history = history;
  }
  std::vector<SampleResult> edited;
  ASSERT_TRUE(sample_on_device(logits, rows, edited));
  for (size_t i = 0; i < 3; ++i) {
    Sampler s(*kinds[i]);
    const std::span<const float> row(host.data() + i * V, V);
    EXPECT_EQ(edited[i].token, s.sample(row, history).token) << "processed row " << i;
  }
  EXPECT_NE(edited[0].token, out[0].token) << "a -100 bias moves row 0 off its winner";
  EXPECT_EQ(logits.to_floats(), host) << "the caller's logits are left as the model gave them";
  // Grammar rows (one with penalties too) beside a plain one: each masked on the device by its state's bits,
  // the token the host Sampler's full mask picks.
  SamplingParams constrained = greedy, constrained_edited = all_of_them;
  constrained.constraint = constrained_edited.constraint = std::make_shared<EveryThirdToken>();
  const SamplingParams* grammar_kinds[] = {&constrained, &greedy, &constrained_edited};
  std::vector<std::unique_ptr<ConstraintState>> states;
  for (size_t i = 0; i < 3; ++i) {
    rows[i].params = grammar_kinds[i];
    states.push_back(grammar_kinds[i]->constraint ? grammar_kinds[i]->constraint->start() : nullptr);
    rows[i].constraint = states.back().get();
  }
  std::vector<SampleResult> masked;
  ASSERT_TRUE(sample_on_device(logits, rows, masked));
  for (size_t i = 0; i < 3; ++i) {
    Sampler s(*grammar_kinds[i]);
    const std::span<const float> row(host.data() + i * V, V);
    EXPECT_EQ(masked[i].token, s.sample(row, history).token) << "grammar row " << i;
    if (grammar_kinds[i]->constraint) {
      EXPECT_EQ(masked[i].token % 3, 0) << "grammar row " << i;
    }
  }
  rows[0].constraint = nullptr;  // a grammar row without its live state is the host's
  EXPECT_FALSE(sample_on_device(logits, rows, masked));
  for (auto& r : rows) {
    r.params = &greedy;
    r.history = {};
    r.constraint = nullptr;
  }
  // A sampled row beside greedy ones: the host Sampler's token for the same seed and step (the kernel's own
  // cases are in sample_rows_test.cc).
  SamplingParams sampled;
  sampled.temperature = 0.7f;
  sampled.top_p = 0.9f;
  rows[1].params = &sampled;
  rows[1].seed = 42;
  rows[1].step = 2;
  std::vector<SampleResult> mixed;
  ASSERT_TRUE(sample_on_device(logits, rows, mixed));
  {
    SamplingParams seeded = sampled;
    seeded.seed = 42;
    Sampler s(seeded);
    s.take(0);
    s.take(0);
    EXPECT_EQ(mixed[1].token, s.sample(std::span<const float>(host.data() + V, V), {}).token);
    EXPECT_EQ(mixed[0].token, out[0].token) << "the greedy rows beside it keep their argmax";
  }
  std::vector<SampleResult> untouched;
  rows[1].params = &greedy;
  rows[2].top_logprobs = 2;
  EXPECT_FALSE(sample_on_device(logits, rows, untouched));
  rows[2].top_logprobs = 0;
  EXPECT_FALSE(sample_on_device(logits.to(Device::CPU), rows, untouched));  // host logits: the host samples
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBatched,
                         ::testing::Values(BatchedCase{"llama-q4g64"}, BatchedCase{"qwen3-bf16"},
                                           BatchedCase{"qwen3-q4g64"}, BatchedCase{"gemma3-q4g64"},
                                           BatchedCase{"gemma4-bf16"}, BatchedCase{"gemma4moe-q4g64"},
                                           BatchedCase{"qwen3_5-q4g64"}, BatchedCase{"qwen3-q4g64", DType::BF16},
                                           BatchedCase{"gemma3-q4g64", DType::BF16},
                                           BatchedCase{"qwen3_5-bf16", DType::BF16}),
                         case_name);

}  // namespace
}  // namespace lathe

// Parity against the HF transformers reference: every position of every reference prompt, full forward and
// prefill + one-token decode through the caches, and the greedy continuation.
#include <gtest/gtest.h>

#include <memory>

#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  static std::map<std::string, std::shared_ptr<Model>>& models() {
    static std::map<std::string, std::shared_ptr<Model>> m;
    return m;
  }
  Model& model() {
    auto& m = models()[GetParam()];
    if (!m) m = load_model(test::model_dir(GetParam()), LoadOptions{.exact = true});  // parity: the exact CPU path
    return *m;
  }
  const test::Reference& ref() {
    static std::map<std::string, test::Reference> refs;
    auto it = refs.find(GetParam());
    if (it == refs.end()) it = refs.emplace(GetParam(), test::load_reference(GetParam())).first;
    return it->second;
  }
  std::vector<float> ref_logits(const std::string& prompt) { return ref().logits->get("logits_" + prompt).to_floats(); }
  int64_t vocab() { return model().config().vocab_size; }

  void expect_agree(const std::vector<float>& got, const std::string& prompt, const std::string& how) {
    const auto r = ref_logits(prompt);
    ASSERT_EQ(got.size(), r.size()) << how;
    const auto a = test::compare_logits(got, r, vocab());
    EXPECT_TRUE(a.within()) << GetParam() << " " << prompt << " " << how << ": max|Δ| " << a.max_abs_diff
                            << " vs max|ref| " << a.max_abs_ref;
    EXPECT_EQ(a.argmax_mismatches, 0) << GetParam() << " " << prompt << " " << how;
  }
};

TEST_P(Parity, FullForwardMatchesReferenceAtEveryPosition) {
  for (const auto& [name, ids] : ref().prompts) {
    CacheList cache = model().make_cache();
    expect_agree(model().forward(ids, cache, true).to_floats(), name, "full forward");
  }
}

TEST_P(Parity, PrefillThenDecodeStepsMatchFullForward) {
  for (const std::string name : {"long", "chat_greedy"}) {
    const auto& ids = ref().prompts.at(name);
    for (size_t prefill : {size_t{1}, ids.size() / 3}) {
      CacheList cache = model().make_cache();
      std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prefill));
      std::vector<float> got = model().forward(head, cache, true).to_floats();
      for (size_t t = prefill; t < ids.size(); ++t) {
        const auto step = model().forward({ids[t]}, cache, true).to_floats();
        got.insert(got.end(), step.begin(), step.end());
      }
      expect_agree(got, name, "prefill " + std::to_string(prefill) + " + decode");
    }
  }
}

TEST_P(Parity, GreedyContinuationIsExact) {
  CacheList cache = model().make_cache();
  Tensor logits = model().forward(ref().prompts.at("chat"), cache, false);
  std::vector<int32_t> out;
  while (out.size() < ref().greedy.size()) {
    out.push_back(argmax_rows(logits)[0]);
    logits = model().forward({out.back()}, cache, false);
  }
  EXPECT_EQ(out, ref().greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Values("llama-bf16", "llama-q4g64", "llama-q8g32", "llama-mixed", "qwen3-bf16",
                                           "qwen3-q4g64", "qwen3-q8g32", "qwen3-mixed", "qwen3-q4g64-sharded-legacy",
                                           "gemma3-bf16", "gemma3-q4g64", "gemma3-q8g32", "gemma3-mixed",
                                           "gemma3-q4g64-vlm"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace lathe

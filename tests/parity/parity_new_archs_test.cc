// Parity of the Gemma 4 (dense, MoE) and Qwen3.5 (Gated DeltaNet hybrid) fixtures against the HF reference
// logits: every position of every prompt, cached step-by-step decode equal to the full forward, and the
// reference's greedy continuation reproduced exactly.
#include <cstdio>

#include <gtest/gtest.h>

#include "common/fixture_reference.h"
#include "model/model.h"

namespace lathe {
namespace {

using testing::compare_logits;
using testing::Diff;
using testing::Reference;

class NewArchParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = load_model(testing::fixture_dir(GetParam()), LoadOptions{.exact = true});  // the exact CPU path
    ref_ = Reference::load(GetParam());
  }
  void report(const char* what, const std::string& prompt, const Diff& d) {
    std::printf("[parity] %-16s %-12s %-12s max|d| %.3g (bound %.3g) argmax %lld/%lld\n", GetParam().c_str(), what,
                prompt.c_str(), d.max_abs, 1e-3 * std::max(1.0, d.max_ref), static_cast<long long>(d.argmax_agree),
                static_cast<long long>(d.rows));
  }
  std::unique_ptr<Model> model_;
  Reference ref_;
};

TEST_P(NewArchParity, EveryPositionOfEveryPrompt) {
  for (const char* p : {"chat", "long", "one", "chat_greedy"}) {
    CacheList caches = model_->make_cache();
    const Tensor logits = model_->forward(ref_.prompt(p), caches, true);
    const Diff d = compare_logits(logits, ref_.logits_of(p));
    report("full", p, d);
    EXPECT_TRUE(d.ok()) << GetParam() << " prompt " << p << ": max |d| " << d.max_abs << ", argmax " << d.argmax_agree
                        << "/" << d.rows;
  }
}

// Prefill a few tokens, then one token per step: the stitched logits must match the full forward (and so the
// reference). The long prompt runs past the sliding window, so ring buffers wrap.
TEST_P(NewArchParity, CachedDecodeMatchesFullForward) {
  for (const char* p : {"long", "chat_greedy"}) {
    const std::vector<int32_t> ids = ref_.prompt(p);
    CacheList full_caches = model_->make_cache();
    const Tensor full = model_->forward(ids, full_caches, true);
    CacheList caches = model_->make_cache();
    const size_t prefill = 3;
    std::vector<Tensor> rows{model_->forward({ids.begin(), ids.begin() + prefill}, caches, true)};
    for (size_t i = prefill; i < ids.size(); ++i) rows.push_back(model_->forward({ids[i]}, caches, false));
    const Tensor stepped = testing::stack_rows(rows);
    const Diff vs_full = compare_logits(stepped, full);
    const Diff vs_ref = compare_logits(stepped, ref_.logits_of(p));
    report("decode/full", p, vs_full);
    report("decode/ref", p, vs_ref);
    EXPECT_TRUE(vs_full.ok()) << GetParam() << " " << p << ": max |d| " << vs_full.max_abs;
    EXPECT_TRUE(vs_ref.ok()) << GetParam() << " " << p << ": max |d| " << vs_ref.max_abs;
  }
}

TEST_P(NewArchParity, GreedyContinuationExact) {
  const std::vector<int32_t> expected = ref_.greedy();
  CacheList caches = model_->make_cache();
  Tensor logits = model_->forward(ref_.prompt("chat"), caches, false);
  std::vector<int32_t> got;
  while (got.size() < expected.size()) {
    got.push_back(argmax_rows(logits)[0]);
    if (got.size() < expected.size()) logits = model_->forward({got.back()}, caches, false);
  }
  EXPECT_EQ(got, expected) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NewArchParity,
                         ::testing::Values("gemma4-bf16", "gemma4-q4g64", "gemma4moe-bf16", "gemma4moe-q4g64",
                                           "qwen3_5-bf16", "qwen3_5-q4g64"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace lathe

// ModelBundle::encode_chat_text: a prompt is counted exactly whatever the cap, its first ids are the ones kept,
// BOS is added once where the tokenizer wants it, and no more ids than the cap are ever held (a prompt past the
// context costs O(context) ids, not O(prompt)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/model_bundle.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

void expect_capped_prompt(const ModelBundle& bundle, const std::string& text, const std::vector<int32_t>& all) {
  for (size_t cap : {size_t{1}, size_t{2}, size_t{5}, all.size() - 1, all.size(), all.size() + 1, size_t{64} << 20}) {
    const ModelBundle::ChatTokens t = bundle.encode_chat_text(text, cap);
    EXPECT_EQ(t.count, all.size()) << cap;
    const size_t kept = std::min(cap, all.size());
    EXPECT_EQ(t.ids, std::vector<int32_t>(all.begin(), all.begin() + static_cast<ptrdiff_t>(kept))) << cap;
    EXPECT_LE(t.ids.capacity(), cap) << cap;
  }
  const ModelBundle::ChatTokens none = bundle.encode_chat_text(text, 0);
  EXPECT_EQ(none.count, all.size());
  EXPECT_TRUE(none.ids.empty());
}

std::string long_chat_text(const std::string& turn_start, const std::string& turn_end) {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += turn_start + (i % 2 ? "assistant\n" : "user\n") + "hello world, how are you? " + turn_end + "\n";
  return text;
}

TEST(ModelBundleChatText, CappedIdsAreThePrefixAndTheCountIsExact) {
  const ModelBundle bundle(test::model_dir("qwen3-q4g64"));
  ASSERT_FALSE(bundle.tokenizer().special_tokens().add_bos_token);
  const std::string text = long_chat_text("<|im_start|>", "<|im_end|>");
  const std::vector<int32_t> all = bundle.tokenizer().encode(text);
  ASSERT_GT(all.size(), 2000u);
  EXPECT_EQ(bundle.encode_chat_text(text).ids, all);
  expect_capped_prompt(bundle, text, all);
}

TEST(ModelBundleChatText, BosAddedOnceAndCountedUnderTheCap) {
  const ModelBundle bundle(test::model_dir("gemma3-q4g64"));
  ASSERT_TRUE(bundle.tokenizer().special_tokens().add_bos_token);
  const int32_t bos = bundle.tokenizer().bos_id().value();
  const std::string text = long_chat_text("<start_of_turn>", "<end_of_turn>");
  std::vector<int32_t> all = bundle.tokenizer().encode(text);
  ASSERT_NE(all.front(), bos);
  all.insert(all.begin(), bos);  // the text lacks BOS: it is added, and counted
  EXPECT_EQ(bundle.encode_chat_text(text).ids, all);
  expect_capped_prompt(bundle, text, all);
  // The template wrote BOS itself: not added again.
  const std::vector<int32_t> with_bos = bundle.tokenizer().encode("<bos>" + text);
  ASSERT_EQ(with_bos, all);
  expect_capped_prompt(bundle, "<bos>" + text, all);
}

}  // namespace
}  // namespace lathe

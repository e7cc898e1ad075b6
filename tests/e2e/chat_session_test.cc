// ChatSession: a second turn that reuses the cached conversation prefix must produce exactly what a fresh
// session produces from the whole conversation.
#include <gtest/gtest.h>

#include "engine/chat_session.h"

namespace lathe {
namespace {

TEST(ChatSession, PrefixReuseAcrossTurnsEqualsFreshGeneration) {
  const std::string demo = std::string(LATHE_SOURCE_DIR) + "/models/demo";
  GenerateOptions o;
  o.max_tokens = 24;
  nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "hello world"}}};
  ChatSession warm(demo);
  const GenerateResult first = warm.generate(warm.chat_prompt(messages), o, {});
  EXPECT_EQ(first.text, "HELLO WORLD");
  messages.push_back({{"role", "assistant"}, {"content", first.text}});
  messages.push_back({{"role", "user"}, {"content", "second message here"}});
  const GenerateResult reused = warm.generate(warm.chat_prompt(messages), o, {});
  ChatSession fresh(demo);
  const GenerateResult cold = fresh.generate(fresh.chat_prompt(messages), o, {});
  EXPECT_EQ(reused.tokens, cold.tokens);
  EXPECT_EQ(reused.text, cold.text);
}

}  // namespace
}  // namespace lathe

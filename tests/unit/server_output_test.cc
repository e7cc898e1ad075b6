// The server's output routing: reasoning vs content while streaming, content held back once tool markup
// starts, parsed calls at the end, and markup that does not parse returned to content — streamed text always
// adds up to the final message.
#include <gtest/gtest.h>

#include "server/output_router.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");

struct Streamed {
  std::string reasoning, content;
};

// Feeds text one character at a time, the worst case for held-back tags.
Streamed feed(OutputRouter& r, const std::string& text) {
  Streamed s;
  for (char c : text) {
    const OutputDelta d = r.push(std::string(1, c));
    s.reasoning += d.reasoning;
    s.content += d.content;
  }
  const OutputDelta d = r.finish();
  s.reasoning += d.reasoning;
  s.content += d.content;
  return s;
}

TEST(ServerOutput, ThinkBlockGoesToReasoning) {
  OutputRouter r(/*think_tags=*/true, /*start_in_reasoning=*/false, nullptr);
  const Streamed s = feed(r, "<think>plan it</think>\n\nHELLO");
  EXPECT_EQ(s.reasoning, "plan it");
  EXPECT_EQ(s.content, "HELLO");
  EXPECT_EQ(r.result().content, "HELLO");
  EXPECT_EQ(r.result().reasoning, "plan it");
}

TEST(ServerOutput, PromptEndingInsideThinkStartsInReasoning) {
  OutputRouter r(true, true, nullptr);
  const Streamed s = feed(r, "still thinking</think>answer");
  EXPECT_EQ(s.reasoning, "still thinking");
  EXPECT_EQ(s.content, "answer");
}

TEST(ServerOutput, WithoutThinkTagsEverythingIsContent) {
  OutputRouter r(false, false, nullptr);
  const Streamed s = feed(r, "<think>x</think>y");
  EXPECT_EQ(s.content, "<think>x</think>y");
  EXPECT_TRUE(s.reasoning.empty());
}

TEST(ServerOutput, ToolCallIsParsedAndItsMarkupNeverStreamed) {
  OutputRouter r(true, false, kTools);
  const Streamed s = feed(
      r, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(s.content.find("<tool_call>"), std::string::npos);
  ASSERT_EQ(r.result().tool_calls.size(), 1u);
  EXPECT_EQ(r.result().tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.result().tool_calls[0].arguments)["city"], "Paris");
  EXPECT_EQ(r.result().content, "Checking.");
}

TEST(ServerOutput, UnparseableMarkupFallsBackToContentInFull) {
  const std::string text = "Sure <tool_call>{not json}</tool_call> done";
  OutputRouter r(false, false, kTools);
  const Streamed s = feed(r, text);
  EXPECT_TRUE(r.result().tool_calls.empty());
  EXPECT_EQ(s.content, text);  // what was held back is released at the end, nothing lost
  EXPECT_EQ(r.result().content, text);
}

TEST(ServerOutput, UnknownToolNameFallsBackToContent) {
  const std::string text = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
  OutputRouter r(false, false, kTools);
  const Streamed s = feed(r, text);
  EXPECT_TRUE(r.result().tool_calls.empty());
  EXPECT_EQ(s.content, text);
}

TEST(ServerOutput, NoToolsMeansMarkupIsPlainText) {
  const std::string text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
  OutputRouter r(false, false, nullptr);
  const Streamed s = feed(r, text);
  EXPECT_EQ(s.content, text);
  EXPECT_TRUE(r.result().tool_calls.empty());
}

}  // namespace
}  // namespace lathe::server

// ReasoningSplitter: <think> / </think> splitting, streaming hold-back, and the prompt/template probes.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "chat/reasoning_splitter.h"

namespace lathe {
namespace {

struct Split {
  std::string reasoning;
  std::string content;
};

void add(Split& s, const ReasoningDelta& d) {
  s.reasoning += d.reasoning;
  s.content += d.content;
}

// Feeds `chunks` in order, then flushes.
Split run(const std::vector<std::string>& chunks, bool start_in_reasoning = false) {
  ReasoningSplitter splitter(start_in_reasoning);
  Split out;
  for (const std::string& c : chunks) add(out, splitter.push(c));
  add(out, splitter.flush());
  return out;
}

Split run_bytes(const std::string& text, bool start_in_reasoning = false) {
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  return run(bytes, start_in_reasoning);
}

TEST(ReasoningSplitter, PlainTextIsContent) {
  const Split s = run({"Hello, world."});
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Hello, world.");
}

TEST(ReasoningSplitter, SplitsThinkBlock) {
  const Split s = run({"<think>\nLet me see.\n</think>\n\nThe answer is 4."});
  EXPECT_EQ(s.reasoning, "\nLet me see.\n");
  EXPECT_EQ(s.content, "The answer is 4.");
}

TEST(ReasoningSplitter, StartInReasoningNeedsOnlyTheCloseTag) {
  const Split s = run({"thinking hard</think>\n\nDone."}, true);
  EXPECT_EQ(s.reasoning, "thinking hard");
  EXPECT_EQ(s.content, "Done.");
}

TEST(ReasoningSplitter, InReasoningTracksMode) {
  ReasoningSplitter splitter;
  EXPECT_FALSE(splitter.in_reasoning());
  splitter.push("<think>a");
  EXPECT_TRUE(splitter.in_reasoning());
  splitter.push("</think>b");
  EXPECT_FALSE(splitter.in_reasoning());
  EXPECT_TRUE(ReasoningSplitter(true).in_reasoning());
}

TEST(ReasoningSplitter, UnterminatedBlockFlushesToReasoning) {
  const Split s = run({"<think>still thinking when max_tokens hit </thi"});
  EXPECT_EQ(s.reasoning, "still thinking when max_tokens hit </thi");
  EXPECT_EQ(s.content, "");
}

TEST(ReasoningSplitter, HoldsPartialTagAcrossPushes) {
  ReasoningSplitter splitter;
  ReasoningDelta d = splitter.push("Hi <thi");
  EXPECT_EQ(d.content, "Hi ");
  EXPECT_EQ(d.reasoning, "");
  d = splitter.push("nk>deep");
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(d.reasoning, "deep");
  d = splitter.push("</");
  EXPECT_EQ(d.reasoning, "");
  d = splitter.push("think>ok");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "ok");
}

TEST(ReasoningSplitter, ReleasesTextThatTurnsOutNotToBeATag) {
  ReasoningSplitter splitter;
  EXPECT_EQ(splitter.push("a <").content, "a ");
  EXPECT_EQ(splitter.push("b").content, "<b");
  EXPECT_EQ(splitter.push("<thin").content, "");
  EXPECT_EQ(splitter.push("g>").content, "<thing>");
}

TEST(ReasoningSplitter, FlushReleasesHeldPartialTagAsContent) {
  ReasoningSplitter splitter;
  EXPECT_EQ(splitter.push("x <think").content, "x ");
  const ReasoningDelta d = splitter.flush();
  EXPECT_EQ(d.content, "<think");
  EXPECT_EQ(d.reasoning, "");
}

TEST(ReasoningSplitter, ByteAtATimeMatchesWholeText) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {"<think>\nplan\n</think>\n\nanswer <b>bold</b> <", false},
      {"r1</think>\r\n \tc1<think>r2</think>c2", true},
      {"<<think>>x</think></think>y<think>", false},
      {"no tags at all < / > </thin", false},
      {"</think>   ", true},
      {"", true},
  };
  for (const auto& [text, start] : cases) {
    const Split whole = run({text}, start);
    const Split bytes = run_bytes(text, start);
    EXPECT_EQ(bytes.reasoning, whole.reasoning) << text;
    EXPECT_EQ(bytes.content, whole.content) << text;
  }
}

TEST(ReasoningSplitter, ArbitraryChunkingMatchesWholeText) {
  const std::string text = "<think>\nstep 1 <tag> </thin\n</think>\n\nresult </think> <think>more</think>end";
  const Split whole = run({text});
  EXPECT_EQ(whole.reasoning, "\nstep 1 <tag> </thin\nmore");
  EXPECT_EQ(whole.content, "result end");
  for (size_t cut = 1; cut < text.size(); ++cut) {
    for (size_t cut2 = cut; cut2 < text.size(); cut2 += 3) {
      const Split s = run({text.substr(0, cut), text.substr(cut, cut2 - cut), text.substr(cut2)});
      ASSERT_EQ(s.reasoning, whole.reasoning) << cut << "," << cut2;
      ASSERT_EQ(s.content, whole.content) << cut << "," << cut2;
    }
  }
}

TEST(ReasoningSplitter, StripsOnlyWhitespaceRightAfterCloseTag) {
  EXPECT_EQ(run({"<think>r</think>\n\n  Answer\n\nmore  "}).content, "Answer\n\nmore  ");
  // Leading whitespace of an answer without a think block is the model's own.
  EXPECT_EQ(run({"\n  Answer"}).content, "\n  Answer");
  // Stripping spans pushes: the whitespace may arrive alone.
  EXPECT_EQ(run({"<think>r</think>", "\n", "\n", "A"}).content, "A");
  EXPECT_EQ(run({"<think>r</think>", "\n\n"}).content, "");
}

TEST(ReasoningSplitter, TagsNeverReachEitherChannel) {
  // A repeated open tag inside reasoning and a stray close tag in content are markup, not text.
  const Split s = run({"<think>a<think>b</think>c</think>d"});
  EXPECT_EQ(s.reasoning, "ab");
  EXPECT_EQ(s.content, "cd");
}

TEST(ReasoningSplitter, ContentBeforeThinkStaysContent) {
  const Split s = run({"Intro <think>why</think> outro"});
  EXPECT_EQ(s.content, "Intro outro");
  EXPECT_EQ(s.reasoning, "why");
}

TEST(ReasoningSplitter, EmptyThinkBlock) {
  const Split s = run({"<think>\n\n</think>\n\nHi"});
  EXPECT_EQ(s.reasoning, "\n\n");
  EXPECT_EQ(s.content, "Hi");
}

TEST(ReasoningSplitter, MultibyteTextPassesThrough) {
  const std::string text = "<think>für 数学</think>\n答え: 4 🎉";
  const Split s = run_bytes(text);
  EXPECT_EQ(s.reasoning, "für 数学");
  EXPECT_EQ(s.content, "答え: 4 🎉");
}

TEST(ReasoningSplitterPrompt, EndsInsideThink) {
  EXPECT_TRUE(prompt_ends_inside_think("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_ends_inside_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_ends_inside_think("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_ends_inside_think(""));
  // Earlier turns' closed blocks don't matter; only the last open/close pair does.
  EXPECT_TRUE(prompt_ends_inside_think("<think>a</think>b<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_ends_inside_think("<think>a</think>b<think>c</think>"));
  // A close tag with no open tag at all is not "inside".
  EXPECT_FALSE(prompt_ends_inside_think("x</think>y"));
}

TEST(ReasoningSplitterPrompt, TemplateUsesThinkTags) {
  EXPECT_TRUE(template_uses_think_tags(
      "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"));
  EXPECT_FALSE(template_uses_think_tags("{{ '<think>' }} without the switch"));
  EXPECT_FALSE(template_uses_think_tags("{% if enable_thinking %}<|channel>thought{% endif %}"));
  EXPECT_FALSE(template_uses_think_tags(""));
}

}  // namespace
}  // namespace lathe

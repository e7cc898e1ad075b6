// ChatTemplate: where templates come from, which variables they see, and the `lathe template` verb.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "common/error.h"

namespace lathe {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// A scratch checkpoint directory, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("lathe_chat_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

ChatTemplateInput user_says(const std::string& text) {
  ChatTemplateInput in;
  in.messages = json::array({{{"role", "user"}, {"content", text}}});
  return in;
}

TEST(ChatTemplate, ReadsStringTemplateAndSpecialTokensFromTokenizerConfig) {
  TempDir dir;
  const json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                       {"eos_token", "</s>"},
                       {"pad_token", nullptr},
                       {"chat_template",
                        "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                        "{{ eos_token }}{% endfor %}{{ pad_token is defined }}"}};
  dir.write("tokenizer_config.json", config.dump());
  const ChatTemplate chat = ChatTemplate::from_dir(dir.str());
  EXPECT_EQ(chat.render(user_says("hi")), "<s>[user]hi</s>False");
}

TEST(ChatTemplate, ChatTemplateJinjaFileWins) {
  TempDir dir;
  dir.write("tokenizer_config.json", json{{"chat_template", "from config"}}.dump());
  dir.write("chat_template.jinja", "from file: {{ messages[0].content }}\n");
  EXPECT_EQ(ChatTemplate::from_dir(dir.str()).render(user_says("x")), "from file: x");
}

TEST(ChatTemplate, NamedTemplatesPickToolUseOnlyWithTools) {
  TempDir dir;
  const json config = {
      {"chat_template", json::array({{{"name", "default"}, {"template", "plain"}},
                                     {{"name", "tool_use"}, {"template", "tools={{ tools | length }}"}}})}};
  dir.write("tokenizer_config.json", config.dump());
  const ChatTemplate chat = ChatTemplate::from_dir(dir.str());
  ChatTemplateInput in = user_says("x");
  EXPECT_EQ(chat.render(in), "plain");
  in.tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(chat.render(in), "tools=1");
}

TEST(ChatTemplate, MissingOrBrokenTemplateIsAnError) {
  TempDir dir;
  dir.write("tokenizer_config.json", json{{"eos_token", "</s>"}}.dump());
  EXPECT_THROW(ChatTemplate::from_dir(dir.str()), Error);
  dir.write("tokenizer_config.json", json{{"chat_template", "{% for m in messages %}"}}.dump());
  try {
    ChatTemplate::from_dir(dir.str());
    FAIL() << "an unclosed 'for' must not parse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'for'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1:4"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, VariablesKwargsAndGenerationPrompt) {
  const ChatTemplate chat(
      "{{ messages | length }}|{{ tools is none }}|{{ add_generation_prompt }}|{{ enable_thinking | default('unset') }}"
      "|{{ extra }}");
  ChatTemplateInput in = user_says("x");
  EXPECT_EQ(chat.render(in), "1|True|False|unset|");
  in.add_generation_prompt = true;
  in.kwargs = {{"enable_thinking", false}, {"extra", "E"}};
  EXPECT_EQ(chat.render(in), "1|True|True|False|E");
}

TEST(ChatTemplate, PartsContentAndToolCallArgumentsAsObjectOrString) {
  const ChatTemplate chat(
      "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m.content %}<{{ p.type }}:{{ p.text }}>{% endfor %}{% endif %}"
      "{% for c in m.tool_calls | default([]) %}{{ c.function.name }}"
      "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}"
      "{% endfor %}{% endfor %}");
  ChatTemplateInput in;
  in.messages = json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": "é"}}},
      {"type": "function", "function": {"name": "g", "arguments": "{\"raw\": true}"}}]}])");
  EXPECT_EQ(chat.render(in), R"(<text:a><text:b>f{"z": 1, "a": "é"}g{"raw": true})");
}

TEST(ChatTemplate, RaiseExceptionGivesTheTemplatesMessage) {
  const ChatTemplate chat(
      "{% if messages[0].role != 'system' %}{{ raise_exception('First message must be "
      "system, got ' + messages[0].role) }}{% endif %}ok");
  try {
    chat.render(user_says("x"));
    FAIL() << "expected raise_exception to throw";
  } catch (const jinja::TemplateRaised& e) {
    EXPECT_STREQ(e.what(), "First message must be system, got user");
  }
}

TEST(ChatTemplate, StrftimeNowReadsTheGivenClock) {
  const ChatTemplate chat("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}");
  ChatTemplateInput in = user_says("x");
  in.now = 1721995200;  // 2024-07-26T12:00:00Z
  EXPECT_EQ(chat.render(in), "2024-07-26|26 Jul 2024");
}

std::string run_cli(const std::string& args) {
  const std::string cmd = std::string(LATHE_BINARY) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  ::pclose(pipe);
  return out;
}

TEST(TemplateVerb, PrintsThePromptExactly) {
  TempDir dir;
  const std::string messages = dir.write("messages.json", R"([{"role": "user", "content": "Hi!"}])");
  const std::string tokenizer = std::string(LATHE_FIXTURES_DIR) + "/tokenizers/bytebpe";  // the real Qwen3 template
  EXPECT_EQ(run_cli("template --tokenizer " + tokenizer + " --messages " + messages + " --add-generation-prompt"),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(run_cli("template --tokenizer " + tokenizer + " --messages " + messages +
                    " --add-generation-prompt --kwargs '{\"enable_thinking\": false}'"),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(TemplateVerb, ReportsTheTemplatesOwnError) {
  TempDir dir;
  const std::string messages =
      dir.write("messages.json", R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  const std::string tokenizer = std::string(LATHE_FIXTURES_DIR) + "/tokenizers/spbpe";
  const std::string out = run_cli("template --tokenizer " + tokenizer + " --messages " + messages);
  EXPECT_NE(out.find("lathe: error: Conversation roles must alternate user/assistant"), std::string::npos) << out;
  const std::string missing = run_cli("template --tokenizer " + dir.str() + " --messages " + messages);
  EXPECT_NE(missing.find("lathe: error:"), std::string::npos) << missing;
}

}  // namespace
}  // namespace lathe

// Parity with transformers' apply_chat_template: every oracle case renders byte-identical text, or raises
// where the reference raised.
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "common/error.h"

namespace lathe {
namespace {

using json = nlohmann::ordered_json;

const std::string kFixtures = LATHE_FIXTURES_DIR;
// The oracles were rendered on 2026-11-29; templates that print strftime_now() need that day. Noon UTC keeps the
// local date the same in every time zone within ±11 hours.
constexpr std::time_t kOracleDay = 1795953600;  // 2026-11-29T12:00:00Z

json load(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Tally {
  int passed = 0;
  int total = 0;
};

// Renders one oracle case and compares; returns true on parity. `where` names the case in failure messages.
bool check_case(const ChatTemplate& chat, const json& c, const std::string& where) {
  ChatTemplateInput input;
  input.messages = c["messages"];
  input.tools = c["tools"];
  input.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  input.kwargs = c["kwargs"];
  input.now = kOracleDay;
  std::string rendered;
  try {
    rendered = chat.render(input);
  } catch (const Error& e) {
    if (c.contains("error")) {
      const std::string expected = c["error"].get<std::string>();
      const bool same = std::string(e.what()).find(expected) != std::string::npos;
      EXPECT_TRUE(same) << where << ": raised '" << e.what() << "', reference raised '" << expected << "'";
      return same;
    }
    ADD_FAILURE() << where << ": raised '" << e.what() << "' where the reference rendered";
    return false;
  }
  if (c.contains("error")) {
    ADD_FAILURE() << where << ": rendered where the reference raised '" << c["error"].get<std::string>() << "'";
    return false;
  }
  const std::string expected = c["rendered"].get<std::string>();
  EXPECT_EQ(rendered, expected) << where;
  return rendered == expected;
}

// The real tokenizers' configs are stored gzip-compressed (shared with the tokenizer tests); this loads the
// template from a scratch checkpoint directory holding the decompressed tokenizer_config.json.
ChatTemplate from_tokenizer_fixture(const std::string& name) {
  const std::string dir = kFixtures + "/tokenizers/" + name;
  if (std::filesystem::exists(dir + "/tokenizer_config.json")) return ChatTemplate::from_dir(dir);
  gzFile gz = gzopen((dir + "/tokenizer_config.json.gz").c_str(), "rb");
  EXPECT_NE(gz, nullptr) << dir;
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while (gz && (n = gzread(gz, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  if (gz) gzclose(gz);
  const auto scratch = std::filesystem::temp_directory_path() / ("lathe_oracle_" + std::to_string(::getpid()) + name);
  std::filesystem::create_directories(scratch);
  std::ofstream(scratch / "tokenizer_config.json", std::ios::binary) << text;
  ChatTemplate chat = ChatTemplate::from_dir(scratch.string());
  std::filesystem::remove_all(scratch);
  return chat;
}

void check_tokenizer_oracle(const std::string& oracle, const std::string& tokenizer_dir) {
  const ChatTemplate chat = from_tokenizer_fixture(tokenizer_dir);
  const json cases = load(kFixtures + "/oracles/" + oracle + ".template.json");
  Tally tally;
  for (size_t i = 0; i < cases.size(); ++i) {
    ++tally.total;
    tally.passed += check_case(chat, cases[i], oracle + " case " + std::to_string(i));
  }
  EXPECT_GT(tally.total, 0);
  EXPECT_EQ(tally.passed, tally.total) << oracle;
}

TEST(ChatTemplateOracle, Bytebpe) { check_tokenizer_oracle("bytebpe", "bytebpe"); }
TEST(ChatTemplateOracle, Spbpe) { check_tokenizer_oracle("spbpe", "spbpe"); }
TEST(ChatTemplateOracle, Qwen3Real) { check_tokenizer_oracle("qwen3", "qwen3-real"); }
TEST(ChatTemplateOracle, Gemma3Real) { check_tokenizer_oracle("gemma3", "gemma3-real"); }

TEST(ChatTemplateOracle, TwentyTemplates) {
  const json oracle = load(kFixtures + "/oracles/templates.json");
  const json special = oracle["meta"]["special_tokens"];
  Tally tally;
  for (const auto& [name, cases] : oracle["templates"].items()) {
    const ChatTemplate chat(read_text(kFixtures + "/templates/" + name + ".jinja"), special);
    for (size_t i = 0; i < cases.size(); ++i) {
      ++tally.total;
      tally.passed += check_case(chat, cases[i], name + " case " + std::to_string(i));
    }
  }
  EXPECT_EQ(tally.total, 474);
  EXPECT_EQ(tally.passed, tally.total);
}

}  // namespace
}  // namespace lathe

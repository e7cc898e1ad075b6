// Turns a conversation into the prompt text a model was trained on, by rendering the checkpoint's chat template
// the way transformers' apply_chat_template does (same variables, same Jinja settings).
#pragma once
#include <atomic>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"

namespace lathe {

struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content (string or parts), ...}]
  nlohmann::ordered_json tools;                                       // null, or a list of tool schemas
  bool add_generation_prompt = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra variables: enable_thinking, ...
  std::optional<std::time_t> now;             // the clock strftime_now() reads; unset means the current time
  const std::atomic<bool>* cancel = nullptr;  // set: the render stops with an error (server shutdown)
};

class ChatTemplate {
 public:
  // One template, or several named ones ("default", "tool_use", ...). special_tokens maps names such as
  // bos_token/eos_token to their text; they become template variables. Throws on template syntax errors.
  explicit ChatTemplate(const std::string& source,
                        nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  ChatTemplate(const std::vector<std::pair<std::string, std::string>>& named_sources,
               nlohmann::ordered_json special_tokens);

  // Reads chat_template.jinja if the directory has one, else tokenizer_config.json's `chat_template` (a string,
  // or a list of {name, template}); special tokens come from tokenizer_config.json.
  static ChatTemplate from_dir(const std::string& dir);

  // The prompt text. Throws Error(InvalidArgument) for runtime template errors; jinja::TemplateRaised (what()
  // is the template's own message) when the template calls raise_exception.
  std::string render(const ChatTemplateInput& input) const;
  // The same text; the messages' and tools' strings move into the template's values instead of being copied
  // (input.messages and input.tools are spent). The values are released before this returns.
  std::string render(ChatTemplateInput&& input) const;

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // Every named template's source, concatenated: for feature detection (does it know enable_thinking?).
  const std::string& source_text() const { return source_text_; }

 private:
  // transformers' choice: "tool_use" when tools are given and it exists, else "default", else the first.
  const jinja::Template& pick(bool has_tools) const;
  std::string render_values(const ChatTemplateInput& input, jinja::Value messages, jinja::Value tools,
                            std::optional<bool> has_tools = std::nullopt) const;

  std::vector<std::pair<std::string, jinja::Template>> templates_;
  nlohmann::ordered_json special_tokens_;
  std::string source_text_;
};

// The special-token variables transformers passes to templates, from a parsed tokenizer_config.json:
// bos/eos/unk/sep/pad/cls/mask tokens (string or {"content": ...}), additional_special_tokens, extra_special_tokens.
nlohmann::ordered_json special_tokens_from_config(const nlohmann::ordered_json& tokenizer_config);

}  // namespace lathe

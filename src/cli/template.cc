// lathe template: render a conversation with a checkpoint's chat template and print the prompt exactly.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "cli/verbs.h"
#include "common/error.h"

namespace lathe::cli {
namespace {

using json = nlohmann::ordered_json;

struct TemplateOptions {
  std::string tokenizer;
  std::string messages;
  std::string tools;
  bool add_generation_prompt = false;
  std::string kwargs;
};

json read_json_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::NotFound, std::string(what) + ": cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(ErrorKind::InvalidArgument, std::string(what) + ": " + path + " is not valid JSON: " + e.what());
  }
}

int run_template(const TemplateOptions& o) {
  ChatTemplate chat = ChatTemplate::from_dir(o.tokenizer);
  ChatTemplateInput input;
  // The messages file holds the message list, or an object with "messages" (and optionally "tools").
  json messages = read_json_file(o.messages, "--messages");
  if (messages.is_object() && messages.contains("messages")) {
    if (messages.contains("tools")) input.tools = messages["tools"];
    messages = json(messages["messages"]);
  }
  if (!messages.is_array()) throw Error(ErrorKind::InvalidArgument, "--messages: expected a JSON list of messages");
  input.messages = std::move(messages);
  if (!o.tools.empty()) input.tools = read_json_file(o.tools, "--tools");
  input.add_generation_prompt = o.add_generation_prompt;
  if (!o.kwargs.empty()) {
    try {
      input.kwargs = json::parse(o.kwargs);
    } catch (const json::exception& e) {
      throw Error(ErrorKind::InvalidArgument, std::string("--kwargs: not valid JSON: ") + e.what());
    }
    if (!input.kwargs.is_object()) throw Error(ErrorKind::InvalidArgument, "--kwargs: expected a JSON object");
  }
  const std::string prompt = chat.render(input);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

Verb add_template(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* cmd = app.add_subcommand("template", "render a conversation with the checkpoint's chat template");
  cmd->add_option("--tokenizer", o->tokenizer, "directory with tokenizer_config.json or chat_template.jinja")
      ->required();
  cmd->add_option("--messages", o->messages, "JSON file: a list of messages (or {\"messages\": [...]})")->required();
  cmd->add_option("--tools", o->tools, "JSON file: a list of tool schemas");
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt, "end with the assistant turn's header");
  cmd->add_option("--kwargs", o->kwargs, "JSON object of extra template variables, e.g. {\"enable_thinking\": false}");
  return {cmd, [o] { return run_template(*o); }};
}

}  // namespace lathe::cli

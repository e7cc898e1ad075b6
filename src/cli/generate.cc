// lathe generate: one prompt in, streamed text out, prompt and generation speed at the end.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/adapter_flags.h"
#include "cli/device_flags.h"
#include "cli/sampling_flags.h"
#include "cli/verbs.h"
#include "engine/chat_session.h"

namespace lathe::cli {
namespace {

struct GenerateFlags {
  std::string model, prompt, system;
  bool chat = false;
  int max_tokens = 256;
  SamplingFlags sampling;
  DeviceFlags where;
  AdapterFlags adapters;
  std::vector<std::string> stop;
};

int run_generate(const GenerateFlags& f) {
  ChatSession session(f.model, f.where.load(), f.where.cache());
  f.where.apply_dense_weights_one_sequence(session.model().config());
  lora::Selection selection;
  const auto adapters = f.adapters.mount(session.model(), &selection);
  const lora::ForwardContext lora_ctx = selection.context();
  const lora::ScopedContext lora_scope(selection.slot >= 0 ? &lora_ctx : nullptr);
  std::vector<int32_t> prompt;
  if (f.chat) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
    messages.push_back({{"role", "user"}, {"content", f.prompt}});
    prompt = session.chat_prompt(messages);
  } else {
    prompt = session.text_prompt(f.prompt);
  }
  GenerateOptions o;
  o.max_tokens = f.max_tokens;
  o.sampling = f.sampling.resolve(session.default_sampling());
  o.stop = f.stop;
  const GenerateResult r = session.generate(prompt, o, [](const GeneratedToken& t) {
    std::fwrite(t.text.data(), 1, t.text.size(), stdout);
    std::fflush(stdout);
  });
  std::fprintf(stderr, "\n==========\nprompt: %d tokens, %.1f tok/s\ngeneration: %zu tokens, %.1f tok/s (%s)\n",
               r.prompt_tokens, r.prompt_tps(), r.tokens.size(), r.generation_tps(), r.finish_reason.c_str());
  return 0;
}

}  // namespace

Verb add_generate(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a prompt, streaming to stdout");
  cmd->add_option("--model", f->model, "checkpoint directory")->required();
  cmd->add_option("--prompt", f->prompt, "the prompt (a user message with --chat)")->required();
  cmd->add_flag("--chat", f->chat, "wrap the prompt in the model's chat template");
  cmd->add_option("--system", f->system, "system message (with --chat)");
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--stop", f->stop, "stop string (repeatable)");
  f->sampling.add_to(cmd);
  f->where.add_to(cmd);
  f->adapters.add_to(cmd);
  return {cmd, [f] { return run_generate(*f); }};
}

}  // namespace lathe::cli

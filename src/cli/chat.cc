// lathe chat: an interactive multi-turn REPL. /reset clears the conversation, /system TEXT sets the system
// message, /quit leaves; Ctrl-C stops the answer being generated, not the program. Each turn reuses the KV
// cache for the conversation so far.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/adapter_flags.h"
#include "cli/device_flags.h"
#include "cli/sampling_flags.h"
#include "cli/verbs.h"
#include "common/error.h"
#include "engine/chat_session.h"

namespace lathe::cli {
namespace {

std::atomic<bool> g_interrupt{false};
extern "C" void on_sigint(int) { g_interrupt.store(true); }

struct ChatFlags {
  std::string model, system;
  int max_tokens = 1024;
  SamplingFlags sampling;
  DeviceFlags where;
  AdapterFlags adapters;
};

int run_chat(const ChatFlags& f) {
  ChatSession session(f.model, f.where.load(), f.where.cache());
  f.where.apply_dense_weights_one_sequence(session.model().config());
  lora::Selection selection;
  const auto adapters = f.adapters.mount(session.model(), &selection);
  const lora::ForwardContext lora_ctx = selection.context();
  const lora::ScopedContext lora_scope(selection.slot >= 0 ? &lora_ctx : nullptr);
  const SamplingParams sampling = f.sampling.resolve(session.default_sampling());
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  std::string system = f.system;
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  std::fprintf(stderr, "lathe chat: %s — /reset, /system TEXT, /quit; Ctrl-C stops an answer\n", f.model.c_str());
  std::string line;
  for (;;) {
    std::fprintf(stdout, ">> ");
    std::fflush(stdout);
    g_interrupt.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupt.load() && !std::cin.eof()) {  // Ctrl-C at the prompt: clear the line, keep going
        std::cin.clear();
        std::fprintf(stdout, "\n");
        continue;
      }
      break;
    }
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      history = nlohmann::ordered_json::array();
      session.reset_cache();
      std::fprintf(stdout, "(conversation cleared)\n");
      continue;
    }
    if (line.rfind("/system", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : "";
      history = nlohmann::ordered_json::array();
      std::fprintf(stdout, "(system message set; conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({{"role", "user"}, {"content", line}});
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    for (const auto& m : history) messages.push_back(m);
    GenerateOptions o;
    o.max_tokens = f.max_tokens;
    o.sampling = sampling;
    o.cancel = &g_interrupt;
    try {
      const GenerateResult r = session.generate(session.chat_prompt(messages), o, [](const GeneratedToken& t) {
        std::fwrite(t.text.data(), 1, t.text.size(), stdout);
        std::fflush(stdout);
      });
      std::fprintf(stdout, "%s\n", r.finish_reason == "cancelled" ? " [stopped]" : "");
      history.push_back({{"role", "assistant"}, {"content", r.text}});
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      history.erase(history.end() - 1);
    }
  }
  return 0;
}

}  // namespace

Verb add_chat(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("chat", "interactive multi-turn chat in the terminal");
  cmd->add_option("--model", f->model, "checkpoint directory")->required();
  cmd->add_option("--system", f->system, "system message");
  cmd->add_option("--max-tokens", f->max_tokens, "tokens per answer")->capture_default_str();
  f->sampling.add_to(cmd);
  f->where.add_to(cmd);
  f->adapters.add_to(cmd);
  return {cmd, [f] { return run_chat(*f); }};
}

}  // namespace lathe::cli

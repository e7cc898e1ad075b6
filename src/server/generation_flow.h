// The surface-independent path of a generation request: render + tokenize (in the HTTP thread), queue on the
// engine, then drain tokens into reasoning/content deltas, logprobs and a final outcome. OpenAI and Anthropic
// routes differ only in how they translate requests in and results out.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/engine_service.h"
#include "server/generation_settings.h"
#include "server/output_router.h"
#include "server/server_context.h"

namespace lathe::server {

// A chat request after surface translation: OpenAI-shaped messages ready for the template.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when none, or when tool_choice is "none"
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  GenerationSettings settings;
  bool continue_final = false;  // prefill: the last (assistant) message is continued, not answered
  // OpenAI's deprecated `functions` / `function_call` spelling was used: answer with message.function_call and
  // finish_reason "function_call", as OpenAI does for such a request.
  bool legacy_functions = false;
};

struct PreparedGeneration {
  std::vector<int32_t> prompt;
  GenerationSettings settings;
  bool think_tags = false;
  bool start_in_reasoning = false;
  nlohmann::ordered_json tools;
  int64_t prompt_count = 0;  // the prompt's whole length (`prompt` holds at most a context's worth of its ids)
};

struct GenerationOutcome {
  FinalOutput output;
  std::string finish_reason;  // stop | length | tool_calls | cancelled
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  nlohmann::ordered_json logprobs;  // mlx_lm.server's {content:[…]} shape; null when not requested
};

// Renders and tokenizes the request; its messages move into the template (callers std::move a request they
// are done with, so a large conversation is not copied on the way).
// A prompt that does not fit the context is a 400, unless `fit_context` is false (counting only).
PreparedGeneration prepare_chat(ServerContext& ctx, ChatRequest request, bool fit_context = true);
// prompt: text (tokenized with the tokenizer's special tokens) or an array of token ids (used as given).
PreparedGeneration prepare_completion(ServerContext& ctx, const nlohmann::ordered_json& prompt,
                                      GenerationSettings settings);

std::shared_ptr<GenerationJob> submit(ServerContext& ctx, const PreparedGeneration& prepared,
                                      const std::string& request_id);

// Drains the job: on_delta gets each streamable piece (returning false cancels: the client is gone);
// client_gone is polled while waiting. flush (optional) runs after each wake's pieces and after the last one,
// so a stream can send all a wake brought in one write (returning false cancels too). Rethrows an engine failure.
GenerationOutcome drive(ServerContext& ctx, GenerationJob& job, const PreparedGeneration& prepared,
                        const std::function<bool(const OutputDelta&)>& on_delta,
                        const std::function<bool()>& client_gone, const std::function<bool()>& flush = nullptr);

// Random lowercase hex of n digits, for response and tool-call ids.
std::string random_hex(size_t n);
int64_t unix_now();

}  // namespace lathe::server

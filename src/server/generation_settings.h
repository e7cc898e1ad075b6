// The generation fields shared by /v1/chat/completions, /v1/completions and /v1/messages: token budget,
// sampling, stop strings, logprobs, stream. Precedence: the request, then serve's flags, then
// generation_config.json (already folded into ServerDefaults).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling_params.h"

namespace lathe::server {

// OpenAI's logprobs shapes, or mlx_lm.server's (--logprobs-format mlx).
enum class LogprobsFormat { OpenAI, Mlx };

struct ServerDefaults {
  SamplingParams sampling;  // serve flags over generation_config.json
  int max_tokens = 512;
  LogprobsFormat logprobs_format = LogprobsFormat::OpenAI;
  int64_t vocab_size = 0;  // logit_bias ids must be below it (0: not checked)
};

// What the output must parse as (enforced by a grammar mask each step; server/structured_output.h).
struct StructuredOutput {
  enum class Kind { None, Gbnf, JsonSchema, JsonObject, ToolCall };
  Kind kind = Kind::None;
  std::string gbnf;               // Gbnf
  nlohmann::ordered_json schema;  // JsonSchema
  std::string tool_name;          // ToolCall: the named function, or "" for any of the request's tools
  std::string field;              // the request field it came from (errors name it)
};

struct GenerationSettings {
  int max_tokens = 512;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool logprobs = false;  // the sampled token's logprob per token
  int top_logprobs = 0;   // > 0: the k most likely tokens per position
  LogprobsFormat logprobs_format = LogprobsFormat::OpenAI;
  bool stream = false;
  int n = 1;                   // OpenAI: choices per request (each its own row of the engine's batch)
  std::string adapter, model;  // [lora] the request's `adapter` spec and `model` (an adapter id selects it)
  StructuredOutput structured;
  std::string cache_salt;   // [cache] prompt-cache entries are shared only among requests with the same salt
  bool ignore_eos = false;  // as vLLM and llama-server: end-of-sequence tokens neither stop nor add text
};

enum class ApiSurface { OpenAI, Anthropic };

// Throws ApiError(400) naming the field for wrong types and out-of-range values.
GenerationSettings parse_generation_settings(const nlohmann::ordered_json& body, const ServerDefaults& defaults,
                                             ApiSurface surface);

}  // namespace lathe::server

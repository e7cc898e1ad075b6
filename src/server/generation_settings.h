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

struct ServerDefaults {
  SamplingParams sampling;  // serve flags over generation_config.json
  int max_tokens = 512;
  int64_t vocab_size = 0;  // logit_bias ids must be below it (0: not checked)
};

struct GenerationSettings {
  int max_tokens = 512;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool logprobs = false;  // the sampled token's logprob per token
  int top_logprobs = 0;   // > 0: the k most likely tokens per position (mlx_lm.server's shape)
  bool stream = false;
};

enum class ApiSurface { OpenAI, Anthropic };

// Throws ApiError(400) naming the field for wrong types and out-of-range values.
GenerationSettings parse_generation_settings(const nlohmann::ordered_json& body, const ServerDefaults& defaults,
                                             ApiSurface surface);

}  // namespace lathe::server

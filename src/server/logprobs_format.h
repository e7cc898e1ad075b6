// Logprobs in OpenAI's shapes: chat's {token, logprob, bytes, top_logprobs:[{token, logprob, bytes}]} per
// sampled token (token = the decoded text, bytes = its UTF-8), and completions' legacy {tokens, token_logprobs,
// top_logprobs:[{token: logprob}], text_offset}. `--logprobs-format mlx` keeps mlx_lm.server's shape instead.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lathe::server {

// One chat content entry for the sampled token `id`, with up to `top` alternatives from s.top.
nlohmann::ordered_json openai_logprob_entry(const Tokenizer& tok, int32_t id, const SampleResult& s, int top);

// Chat content entries → the completions endpoint's legacy object (offsets count bytes from the completion start).
// `offset` is where the first entry's text starts, and is advanced past the last (for streamed chunks).
nlohmann::ordered_json legacy_completion_logprobs(const nlohmann::ordered_json& content, size_t& offset);

}  // namespace lathe::server

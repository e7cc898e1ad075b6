// The generation loop: chunked prefill, then sample → decode step until EOS, a stop string, max_tokens or
// cancellation. Text comes from an incremental detokenizer and passes through the stop matcher, so callers
// stream exactly the text a client should see.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "lora/forward_context.h"
#include "model/model.h"

namespace lathe {

// Turns ids into text incrementally, never splitting a UTF-8 character (implemented by the tokenizer).
class IncrementalDecoder {
 public:
  virtual ~IncrementalDecoder() = default;
  virtual std::string push(int32_t id) = 0;
  virtual std::string flush() = 0;
};

struct GenerateOptions {
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  bool ignore_eos = false;  // eos_ids neither stop the sequence nor add text (benchmarks: fixed output lengths)
  std::vector<std::string> stop;
  int top_logprobs = 0;
  bool logprob = true;  // the chosen token's logprob is wanted (false lets a greedy constrained step skip its mask)
  int prefill_chunk = 2048;
  const std::atomic<bool>* cancel = nullptr;             // set by another thread to stop at the next token
  std::shared_ptr<const lora::ForwardContext> adapters;  // [lora] the request's pinned adapter set; null = none
  std::string cache_salt;  // [cache] requests with different salts never share prompt-cache entries
};

struct GeneratedToken {
  int32_t id;
  std::string text;  // text released by this token (may be empty while a stop string might be forming)
  SampleResult sample;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;  // "stop" (EOS or stop string), "length", "cancelled"
  std::string stop_sequence;  // the stop string that ended generation, if one did
  int prompt_tokens = 0;
  int cached_tokens = 0;  // prompt tokens whose KV was reused from an earlier request
  double prefill_seconds = 0, decode_seconds = 0, ttft_seconds = 0;
  double prompt_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double generation_tps() const {
    return decode_seconds > 0 && tokens.size() > 1 ? (tokens.size() - 1) / decode_seconds : 0;
  }
};

// Runs after whatever `cache` already holds. on_token (optional) sees every sampled token in order.
GenerateResult generate(Model& model, CacheList& cache, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        IncrementalDecoder& decoder, const std::function<void(const GeneratedToken&)>& on_token = {});

}  // namespace lathe

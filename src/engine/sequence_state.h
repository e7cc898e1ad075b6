// One sequence's own state, apart from its KV cache: prompt + generated history, its sampler (its own random
// stream), stop matcher, streaming detokenizer and cancellation. accept() turns a sampled token into the text a
// client may see and decides whether the sequence has ended (EOS, stop string, max_tokens). The generation
// loop (engine/generate.h) and the scheduler (engine/scheduler.h) both drive sequences through it.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/stop_matcher.h"

namespace lathe {

class ModelBundle;

class SequenceState {
 public:
  // Throws InvalidArgument on an empty prompt or max_tokens < 0. An unseeded request gets a random seed here,
  // so the host sampler and the device sampler draw the same stream.
  SequenceState(std::vector<int32_t> prompt, GenerateOptions options, std::unique_ptr<IncrementalDecoder> decoder);
  // EOS ids from the bundle where options has none; text from the bundle's tokenizer (special tokens skipped).
  SequenceState(const ModelBundle& bundle, std::vector<int32_t> prompt, GenerateOptions options);

  const GenerateOptions& options() const { return options_; }
  const std::vector<int32_t>& history() const { return history_; }  // prompt + generated
  size_t prompt_size() const { return prompt_size_; }
  bool cancel_requested() const;
  uint64_t seed() const { return seed_; }
  uint64_t steps() const { return steps_; }  // tokens sampled so far (the next draw's step)

  // Samples on the host from this sequence's stream.
  SampleResult sample(std::span<const float> logits);
  // The sampler's grammar state (null without a constraint), for the device sampler's mask.
  ConstraintState* constraint() { return sampler_.constraint(); }
  // Takes the token sampled at step steps() (host or device) and returns what it releases.
  GeneratedToken accept(const SampleResult& s);
  bool done() const { return !result_.finish_reason.empty(); }
  // Ends the sequence with `reason` unless it already ended, then flushes held-back text (none once a stop
  // string matched). Returns the flushed text as a token event with id -1, if any.
  std::optional<GeneratedToken> finish(const std::string& reason);
  GenerateResult& result() { return result_; }

 private:
  GenerateOptions options_;
  std::unique_ptr<IncrementalDecoder> decoder_;
  std::vector<int32_t> history_;
  size_t prompt_size_;
  uint64_t seed_;
  Sampler sampler_;
  uint64_t steps_ = 0;
  bool host_drew_ = false;  // sample() chose the token accept() takes next (else the device did)
  StopMatcher stops_;
  bool flushed_ = false;
  GenerateResult result_;
};

}  // namespace lathe

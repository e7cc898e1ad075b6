// Turns one step's logits into a token: processors, the constraint's mask (structured output), log-softmax (where
// logprobs are taken), then greedy or top-p → min-p → XTC → top-k → categorical(logprobs / T), as mlx-lm orders them.
// Randomness is a pure function of (seed, step), with independent streams for XTC and the categorical draw, so a seeded
// request reproduces.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace lathe {

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // of the chosen token, after processors, before temperature/filters (0 if unwanted)
  std::vector<TokenLogprob> top;  // the top_logprobs most likely tokens at that point
};

class Sampler {
 public:
  // xtc_exempt: tokens XTC never removes (EOS ids, newline).
  explicit Sampler(SamplingParams params, std::vector<int32_t> xtc_exempt = {});

  // want_logprob false: SampleResult::logprob may be left 0, which lets a greedy step under a constraint check
  // only the token it picks instead of building the whole mask (same token either way).
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> history, int top_logprobs = 0,
                      bool want_logprob = true);
  const SamplingParams& params() const { return p_; }
  // The constraint's live state (null without one): a device sampler asks it for the step's mask.
  ConstraintState* constraint() { return constraint_.get(); }
  // A token chosen elsewhere (the device sampler) for this step: the step count and the constraint move on as
  // if sample() had chosen it, so the host can take the next step.
  void take(int32_t token);

 private:
  SamplingParams p_;
  std::vector<int32_t> xtc_exempt_;
  uint64_t seed_;
  uint64_t step_ = 0;
  std::unique_ptr<ConstraintState> constraint_;  // from p_.constraint; advanced with each sampled token
};

// The draws a Sampler seeded `seed` makes at step `step`, in [0, 1): the categorical's and XTC's (whether it
// applies that step). The device sampler draws the same numbers for the rows it serves.
double categorical_draw(uint64_t seed, uint64_t step);
double xtc_draw(uint64_t seed, uint64_t step);

// Filters over log-probabilities; removed entries become -inf. Exposed for tests.
void filter_top_p(std::vector<float>& logprobs, float top_p);
void filter_min_p(std::vector<float>& logprobs, float min_p);
void filter_top_k(std::vector<float>& logprobs, int k);
void filter_xtc(std::vector<float>& logprobs, float threshold, std::span<const int32_t> exempt);

}  // namespace lathe

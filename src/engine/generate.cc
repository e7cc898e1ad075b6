#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/stop_matcher.h"

namespace lathe {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

GenerateResult generate(Model& model, CacheList& cache, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        IncrementalDecoder& decoder, const std::function<void(const GeneratedToken&)>& on_token) {
  if (prompt.empty()) throw Error(ErrorKind::InvalidArgument, "the prompt is empty");
  if (opt.max_tokens < 0) throw Error(ErrorKind::InvalidArgument, "max_tokens must be ≥ 0");
  GenerateResult res;
  res.prompt_tokens = static_cast<int>(prompt.size());
  Sampler sampler(opt.sampling, opt.eos_ids);
  StopMatcher stops(opt.stop);
  std::vector<int32_t> history = prompt;
  auto cancelled = [&] { return opt.cancel && opt.cancel->load(std::memory_order_relaxed); };

  const auto t0 = Clock::now();
  Tensor logits;
  const size_t chunk = static_cast<size_t>(std::max(1, opt.prefill_chunk));
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    if (cancelled()) {
      res.finish_reason = "cancelled";
      return res;
    }
    const size_t end = std::min(prompt.size(), start + chunk);
    logits = model.forward(std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(start),
                                                prompt.begin() + static_cast<std::ptrdiff_t>(end)),
                           cache, false);
  }
  res.prefill_seconds = since(t0);
  if (opt.max_tokens == 0) {
    res.finish_reason = "length";
    return res;
  }

  const auto t_decode = Clock::now();
  for (;;) {
    const std::vector<float> row = logits.to_floats();
    GeneratedToken tok;
    tok.sample = sampler.sample(row, history, opt.top_logprobs);
    tok.id = tok.sample.token;
    if (res.tokens.empty()) res.ttft_seconds = since(t0);
    res.tokens.push_back(tok.id);
    history.push_back(tok.id);
    const bool eos = std::find(opt.eos_ids.begin(), opt.eos_ids.end(), tok.id) != opt.eos_ids.end();
    if (!eos) tok.text = stops.push(decoder.push(tok.id));
    res.text += tok.text;
    if (on_token) on_token(tok);
    if (eos || stops.stopped()) {
      res.finish_reason = "stop";
      res.stop_sequence = stops.matched();
      break;
    }
    if (static_cast<int>(res.tokens.size()) >= opt.max_tokens) {
      res.finish_reason = "length";
      break;
    }
    if (cancelled()) {
      res.finish_reason = "cancelled";
      break;
    }
    logits = model.forward({tok.id}, cache, false);
  }
  res.decode_seconds = since(t_decode) - (res.ttft_seconds - res.prefill_seconds);
  if (!stops.stopped()) {
    std::string tail = stops.push(decoder.flush());
    tail += stops.flush();
    if (!tail.empty()) {
      res.text += tail;
      if (on_token) on_token(GeneratedToken{-1, tail, {}});
    }
  }
  return res;
}

}  // namespace lathe

#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "engine/sequence_state.h"

namespace lathe {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The caller keeps its decoder; the sequence only borrows it.
class Borrowed : public IncrementalDecoder {
 public:
  explicit Borrowed(IncrementalDecoder& d) : d_(d) {}
  std::string push(int32_t id) override { return d_.push(id); }
  std::string flush() override { return d_.flush(); }

 private:
  IncrementalDecoder& d_;
};

}  // namespace

GenerateResult generate(Model& model, CacheList& cache, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        IncrementalDecoder& decoder, const std::function<void(const GeneratedToken&)>& on_token) {
  SequenceState seq(prompt, opt, std::make_unique<Borrowed>(decoder));
  GenerateResult& res = seq.result();

  const auto t0 = Clock::now();
  Tensor logits;
  const size_t chunk = static_cast<size_t>(std::max(1, opt.prefill_chunk));
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    if (seq.cancel_requested()) {
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
    const GeneratedToken tok = seq.accept(seq.sample(row));
    if (res.tokens.size() == 1) res.ttft_seconds = since(t0);
    if (on_token) on_token(tok);
    if (seq.done()) break;
    if (seq.cancel_requested()) {
      res.finish_reason = "cancelled";
      break;
    }
    logits = model.forward({tok.id}, cache, false);
  }
  res.decode_seconds = since(t_decode) - (res.ttft_seconds - res.prefill_seconds);
  if (auto tail = seq.finish(res.finish_reason); tail && on_token) on_token(*tail);
  return std::move(res);
}

}  // namespace lathe

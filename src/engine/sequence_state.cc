#include "engine/sequence_state.h"

#include <algorithm>
#include <random>

#include "common/error.h"
#include "engine/model_bundle.h"
#include "tokenizer/stream_decoder.h"

namespace lathe {
namespace {

class TokenizerText : public IncrementalDecoder {
 public:
  explicit TokenizerText(const Tokenizer& t) : dec_(t, /*skip_special=*/true) {}
  std::string push(int32_t id) override { return dec_.push(id); }
  std::string flush() override { return dec_.finish(); }

 private:
  StreamDecoder dec_;
};

GenerateOptions checked(GenerateOptions o, const std::vector<int32_t>& prompt) {
  if (prompt.empty()) throw Error(ErrorKind::InvalidArgument, "the prompt is empty");
  if (o.max_tokens < 0) throw Error(ErrorKind::InvalidArgument, "max_tokens must be ≥ 0");
  if (!o.sampling.seed) o.sampling.seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
  return o;
}

}  // namespace

SequenceState::SequenceState(std::vector<int32_t> prompt, GenerateOptions options,
                             std::unique_ptr<IncrementalDecoder> decoder)
    : options_(checked(std::move(options), prompt)),
      decoder_(std::move(decoder)),
      history_(std::move(prompt)),
      prompt_size_(history_.size()),
      seed_(*options_.sampling.seed),
      sampler_(options_.sampling, options_.eos_ids),
      stops_(options_.stop) {
  result_.prompt_tokens = static_cast<int>(prompt_size_);
}

static GenerateOptions with_bundle_eos(GenerateOptions o, const ModelBundle& b) {
  if (o.eos_ids.empty()) o.eos_ids = b.eos_ids();
  return o;
}

SequenceState::SequenceState(const ModelBundle& bundle, std::vector<int32_t> prompt, GenerateOptions options)
    : SequenceState(std::move(prompt), with_bundle_eos(std::move(options), bundle),
                    std::make_unique<TokenizerText>(bundle.tokenizer())) {}

bool SequenceState::cancel_requested() const {
  return options_.cancel && options_.cancel->load(std::memory_order_relaxed);
}

SampleResult SequenceState::sample(std::span<const float> logits) {
  host_drew_ = true;
  return sampler_.sample(logits, history_, options_.top_logprobs, options_.logprob);
}

GeneratedToken SequenceState::accept(const SampleResult& s) {
  GeneratedToken tok;
  tok.sample = s;
  tok.id = s.token;
  // A device-chosen token moves the host Sampler's step and grammar state too, so either side can take the next
  // step (a batch falls back to the host when a row joins that the device does not serve).
  if (!host_drew_) sampler_.take(tok.id);
  host_drew_ = false;
  ++steps_;
  result_.tokens.push_back(tok.id);
  history_.push_back(tok.id);
  const auto& eos = options_.eos_ids;
  const bool is_eos = std::find(eos.begin(), eos.end(), tok.id) != eos.end();
  if (!is_eos) tok.text = stops_.push(decoder_->push(tok.id));
  result_.text += tok.text;
  if ((is_eos && !options_.ignore_eos) || stops_.stopped()) {
    result_.finish_reason = "stop";
    result_.stop_sequence = stops_.matched();
  } else if (static_cast<int>(result_.tokens.size()) >= options_.max_tokens) {
    result_.finish_reason = "length";
  }
  return tok;
}

std::optional<GeneratedToken> SequenceState::finish(const std::string& reason) {
  if (result_.finish_reason.empty()) result_.finish_reason = reason;
  if (flushed_ || stops_.stopped()) return std::nullopt;
  flushed_ = true;
  std::string tail = stops_.push(decoder_->flush());
  tail += stops_.flush();
  if (tail.empty()) return std::nullopt;
  result_.text += tail;
  return GeneratedToken{-1, tail, {}};
}

}  // namespace lathe

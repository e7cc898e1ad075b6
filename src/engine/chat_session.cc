#include "engine/chat_session.h"

#include "tokenizer/stream_decoder.h"

namespace lathe {
namespace {

class StreamAdapter : public IncrementalDecoder {
 public:
  explicit StreamAdapter(const Tokenizer& t) : dec_(t, /*skip_special=*/true) {}
  std::string push(int32_t id) override { return dec_.push(id); }
  std::string flush() override { return dec_.finish(); }

 private:
  StreamDecoder dec_;
};

}  // namespace

ChatSession::ChatSession(const std::string& dir, const LoadOptions& load, const CacheOptions& cache)
    : ModelBundle(dir, load, cache), cache_(make_cache()) {}

void ChatSession::reset_cache() {
  cache_ = make_cache();
  cached_tokens_.clear();
}

GenerateResult ChatSession::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                     const std::function<void(const GeneratedToken&)>& on_token) {
  // KV computed under another adapter set is not this prompt's prefix ([lora]).
  const std::string adapters = opt.adapters ? opt.adapters->key : std::string();
  if (adapters != cached_adapters_) reset_cache();
  cached_adapters_ = adapters;
  // Reuse the longest common prefix (keeping at least one prompt token to run).
  size_t common = 0;
  while (common < cached_tokens_.size() && common + 1 < prompt.size() && cached_tokens_[common] == prompt[common])
    ++common;
  const int64_t drop = static_cast<int64_t>(cached_tokens_.size() - common);
  bool trimmed = true;
  for (const auto& c : cache_) trimmed = trimmed && c->can_trim(drop);
  if (trimmed) {
    for (const auto& c : cache_) c->trim(drop);
  } else {
    reset_cache();
    common = 0;
  }
  cached_tokens_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(common));
  const std::vector<int32_t> suffix(prompt.begin() + static_cast<std::ptrdiff_t>(common), prompt.end());
  StreamAdapter dec(tokenizer());
  GenerateOptions o = opt;
  if (o.eos_ids.empty()) o.eos_ids = eos_ids();
  const lora::ScopedContext lora_scope(opt.adapters && opt.adapters->table ? opt.adapters.get()
                                                                           : lora::current_context());
  GenerateResult r = lathe::generate(model(), cache_, suffix, o, dec, on_token);
  r.prompt_tokens = static_cast<int>(prompt.size());
  r.cached_tokens = static_cast<int>(common);
  if (r.tokens.empty() && r.finish_reason == "cancelled") {  // stopped mid-prefill: the cache is partial
    reset_cache();
    return r;
  }
  cached_tokens_.insert(cached_tokens_.end(), suffix.begin(), suffix.end());
  // The cache holds every generated token but the last (it was sampled, never fed).
  if (!r.tokens.empty()) cached_tokens_.insert(cached_tokens_.end(), r.tokens.begin(), r.tokens.end() - 1);
  return r;
}

}  // namespace lathe

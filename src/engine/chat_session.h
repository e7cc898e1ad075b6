// What `generate` and `chat` share: a model with its tokenizer, chat template and generation defaults, the
// end-of-sequence set, prompt building that never adds BOS twice, and prefix reuse of the KV cache.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "engine/generate.h"
#include "model/model.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

class ChatSession {
 public:
  explicit ChatSession(const std::string& model_dir, const LoadOptions& load = {}, const CacheOptions& cache = {});

  Model& model() { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // EOS ids from config.json, generation_config.json, tokenizer_config.json and the template's end-of-turn.
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  // generation_config.json sampling defaults (temperature, top_p, top_k, min_p) applied to `p` where unset.
  SamplingParams default_sampling() const;

  // Renders messages with the chat template (generation prompt added) and tokenizes without adding BOS again.
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;
  // Tokenizes text rendered by the chat template (BOS added only when the tokenizer wants one and it is missing).
  std::vector<int32_t> encode_chat_text(const std::string& text) const;
  const ChatTemplate* chat_template() const { return template_ ? &*template_ : nullptr; }
  const std::string& model_dir() const { return dir_; }
  // Replaces the checkpoint's chat template (serve --chat-template).
  void set_chat_template(ChatTemplate t) { template_.emplace(std::move(t)); }

  // Plain text with the tokenizer's special tokens (BOS where the tokenizer adds one).
  std::vector<int32_t> text_prompt(const std::string& text) const;

  // Generates after reusing the longest cached prefix of `prompt` (trimming the cache where the kind allows).
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                          const std::function<void(const GeneratedToken&)>& on_token);
  void reset_cache();

 private:
  std::string dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> template_;
  nlohmann::json generation_config_;
  std::vector<int32_t> eos_;
  CacheOptions cache_options_;
  CacheList cache_;
  std::vector<int32_t> cached_tokens_;
  std::string cached_adapters_;  // the lora::ForwardContext key the cached KV was computed under
};

}  // namespace lathe

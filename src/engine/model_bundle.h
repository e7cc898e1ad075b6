// What every sequence served from one checkpoint shares, read-only once loaded: the model, its tokenizer, chat
// template and generation defaults, the end-of-sequence set, and prompt building that never adds BOS twice.
// Per-sequence state (history, sampler, stops, detokenizer, KV cache) lives in engine/sequence_state.h.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "engine/sampling_params.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

class ModelBundle {
 public:
  explicit ModelBundle(const std::string& model_dir, const LoadOptions& load = {}, const CacheOptions& cache = {});
  virtual ~ModelBundle() = default;
  ModelBundle(const ModelBundle&) = delete;
  ModelBundle& operator=(const ModelBundle&) = delete;

  // forward() advances only the caches it is handed; the weights are shared by every row.
  Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const CacheOptions& cache_options() const { return cache_options_; }
  CacheList make_cache() const { return model_->make_cache(cache_options_); }
  // EOS ids from config.json, generation_config.json, tokenizer_config.json and the template's end-of-turn.
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  // generation_config.json sampling defaults (temperature, top_p, top_k, min_p) applied to `p` where unset.
  SamplingParams default_sampling() const;

  // Renders messages with the chat template (generation prompt added) and tokenizes without adding BOS again.
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;
  // Tokenizes text rendered by the chat template (BOS added only when the tokenizer wants one and it is missing).
  // Keeps at most `max_ids` ids (BOS included), the text's first ones, and counts the rest: a prompt longer than
  // the context is sized exactly, in O(max_ids) memory, and refused on that count.
  struct ChatTokens {
    std::vector<int32_t> ids;  // the first min(count, max_ids) ids
    size_t count = 0;          // the whole prompt's
  };
  ChatTokens encode_chat_text(const std::string& text, size_t max_ids = SIZE_MAX) const;
  const ChatTemplate* chat_template() const { return template_ ? &*template_ : nullptr; }
  const std::string& model_dir() const { return dir_; }
  // Replaces the checkpoint's chat template (serve --chat-template); before any sequence runs.
  void set_chat_template(ChatTemplate t) { template_.emplace(std::move(t)); }

  // Plain text with the tokenizer's special tokens (BOS where the tokenizer adds one).
  std::vector<int32_t> text_prompt(const std::string& text) const;
  // The same, capped as encode_chat_text is: a string prompt longer than the context is counted, not kept.
  ChatTokens text_prompt(const std::string& text, size_t max_ids) const;

 private:
  std::string dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> template_;
  nlohmann::json generation_config_;
  std::vector<int32_t> eos_;
  CacheOptions cache_options_;
};

}  // namespace lathe

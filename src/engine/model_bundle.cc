#include "engine/model_bundle.h"

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

void add_ids(const nlohmann::json& v, std::vector<int32_t>& out) {
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  if (v.is_array())
    for (const auto& x : v)
      if (x.is_number_integer()) out.push_back(x.get<int32_t>());
}

}  // namespace

ModelBundle::ModelBundle(const std::string& dir, const LoadOptions& load, const CacheOptions& cache)
    : dir_(dir), cache_options_(cache) {
  validate_cache_options(cache);
  model_ = load_model(dir, load);
  tokenizer_ = Tokenizer::load(dir);
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "generation_config.json")) {
    generation_config_ = io::parse_json_checked(read_text_file(dir + "/generation_config.json"), io::file_json_limits(),
                                                ErrorKind::Corrupt, dir + "/generation_config.json: not valid JSON");
  }
  try {
    template_.emplace(ChatTemplate::from_dir(dir));
  } catch (const Error& e) {
    // A missing template is fine (completions still work); a broken one is a load error, not a silent
    // "no chat template" that every chat request would discover later.
    if (e.kind() != ErrorKind::NotFound) throw;
    log::debug(std::string("no chat template: ") + e.what());
  }
  eos_ = model_->config().eos_token_ids;
  if (generation_config_.is_object() && generation_config_.contains("eos_token_id"))
    add_ids(generation_config_["eos_token_id"], eos_);
  if (auto id = tokenizer_->eos_id()) eos_.push_back(*id);
  for (const char* end_of_turn : {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"})
    if (auto id = tokenizer_->token_to_id(end_of_turn)) eos_.push_back(*id);
  std::sort(eos_.begin(), eos_.end());
  eos_.erase(std::unique(eos_.begin(), eos_.end()), eos_.end());
}

SamplingParams ModelBundle::default_sampling() const {
  SamplingParams p;
  const auto& g = generation_config_;
  if (!g.is_object()) return p;
  if (g.contains("temperature") && g["temperature"].is_number()) p.temperature = g["temperature"].get<float>();
  if (g.contains("top_p") && g["top_p"].is_number()) p.top_p = g["top_p"].get<float>();
  if (g.contains("top_k") && g["top_k"].is_number_integer()) p.top_k = g["top_k"].get<int>();
  if (g.contains("min_p") && g["min_p"].is_number()) p.min_p = g["min_p"].get<float>();
  if (g.contains("do_sample") && g["do_sample"].is_boolean() && !g["do_sample"].get<bool>()) p.temperature = 0;
  return p;
}

std::vector<int32_t> ModelBundle::chat_prompt(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& kwargs) const {
  if (!template_)
    throw Error(ErrorKind::NotFound, "this model has no chat template (tokenizer_config.json or chat_template.jinja)");
  ChatTemplateInput in;
  in.messages = messages;
  in.add_generation_prompt = true;
  in.kwargs = kwargs;
  return encode_chat_text(template_->render(in)).ids;
}

ModelBundle::ChatTokens ModelBundle::encode_chat_text(const std::string& text, size_t max_ids) const {
  ChatTokens t;
  // At least the first id is kept: whether BOS is missing depends on it.
  t.count = tokenizer_->encode_capped(text, std::max<size_t>(max_ids, 1), t.ids);
  // The template normally writes BOS itself; add it only when the tokenizer wants one and the text lacks it.
  const auto bos = tokenizer_->bos_id();
  if (bos && tokenizer_->special_tokens().add_bos_token && (t.ids.empty() || t.ids.front() != *bos)) {
    ++t.count;
    if (max_ids > 0) {
      if (t.ids.size() == max_ids)
        t.ids.pop_back();  // BOS takes the last kept id's place
      else if (t.ids.size() == t.ids.capacity())
        t.ids.reserve(t.ids.size() + 1);  // not the doubling insert() would do: never past max_ids
      t.ids.insert(t.ids.begin(), *bos);
    }
  }
  if (max_ids == 0) t.ids.clear();
  return t;
}

std::vector<int32_t> ModelBundle::text_prompt(const std::string& text) const { return text_prompt(text, SIZE_MAX).ids; }

ModelBundle::ChatTokens ModelBundle::text_prompt(const std::string& text, size_t max_ids) const {
  ChatTokens t;
  t.count = tokenizer_->encode_special_capped(text, max_ids, t.ids);
  return t;
}

}  // namespace lathe

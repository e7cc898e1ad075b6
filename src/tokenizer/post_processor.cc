#include "tokenizer/post_processor.h"

#include <string>
#include <unordered_map>

namespace lathe {
namespace {

// A single-sequence template: each item is either the sequence itself or a run of special token ids.
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplatePostProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Item& it : items_)
      out.insert(out.end(), it.is_sequence ? ids.begin() : it.ids.begin(), it.is_sequence ? ids.end() : it.ids.end());
    return out;
  }

 private:
  std::vector<Item> items_;
};

class IdentityPostProcessor : public PostProcessor {
 public:
  std::vector<int32_t> process(std::vector<int32_t> ids) const override { return ids; }
};

class PostProcessorSequence : public PostProcessor {
 public:
  explicit PostProcessorSequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    for (const auto& s : steps_) ids = s->process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_template(const JsonAt& spec) {
  std::unordered_map<std::string, std::vector<int32_t>> specials;
  if (spec.has("special_tokens")) {
    const JsonAt map = spec.at("special_tokens");
    if (!map.value().is_object()) map.fail("expected an object");
    for (const auto& [name, entry] : map.value().items()) {
      const JsonAt e(entry, map.path() + "." + name);
      const JsonAt ids = e.at("ids");
      std::vector<int32_t>& out = specials[name];
      for (size_t i = 0; i < ids.size(); ++i) out.push_back(static_cast<int32_t>(ids.at(i).integer()));
    }
  }
  const JsonAt single = spec.at("single");
  std::vector<TemplatePostProcessor::Item> items;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonAt piece = single.at(i);
    std::string special_name;
    if (piece.value().is_string()) {  // the compact "$A" / "[CLS]:0" spelling
      const std::string s = piece.str();
      if (!s.empty() && s[0] == '$') {
        items.push_back({true, {}});
        continue;
      }
      special_name = s.substr(0, s.rfind(':') == std::string::npos ? s.size() : s.rfind(':'));
    } else if (piece.has("Sequence")) {
      items.push_back({true, {}});
      continue;
    } else if (piece.has("SpecialToken")) {
      special_name = piece.at("SpecialToken").str("id");
    } else {
      piece.fail("a template piece must be a Sequence or a SpecialToken");
    }
    const auto it = specials.find(special_name);
    if (it == specials.end()) piece.fail("special token '" + special_name + "' is not in special_tokens");
    items.push_back({false, it->second});
  }
  return std::make_unique<TemplatePostProcessor>(std::move(items));
}

// RobertaProcessing / BertProcessing: cls + sequence + sep, tokens given as ["text", id].
std::unique_ptr<PostProcessor> make_cls_sep(const JsonAt& spec) {
  auto id_of = [&](const char* key) { return static_cast<int32_t>(spec.at(key).at(size_t{1}).integer()); };
  std::vector<TemplatePostProcessor::Item> items = {{false, {id_of("cls")}}, {true, {}}, {false, {id_of("sep")}}};
  return std::make_unique<TemplatePostProcessor>(std::move(items));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const JsonAt& spec) {
  if (spec.value().is_null()) return nullptr;
  const std::string type = spec.str("type");
  if (type == "TemplateProcessing") return make_template(spec);
  if (type == "ByteLevel")
    return std::make_unique<IdentityPostProcessor>();  // only trims offsets, which lathe does not track
  if (type == "RobertaProcessing" || type == "BertProcessing") return make_cls_sep(spec);
  if (type == "Sequence") {
    const JsonAt list = spec.at("processors");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto p = make_post_processor(list.at(i))) steps.push_back(std::move(p));
    return std::make_unique<PostProcessorSequence>(std::move(steps));
  }
  spec.at("type").unsupported("unknown post-processor type '" + type + "'");
}

}  // namespace lathe

#include "tokenizer/pre_tokenizer.h"

#include <functional>
#include <optional>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

// GPT-2's word regex, used by ByteLevel when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Every character satisfying `pred` is a match of its own.
void for_each_char_span(std::string_view text, bool (*pred)(char32_t), FunctionRef<void(const Span&)> fn) {
  if (text.empty()) {
    fn(Span{0, 0, false});
    return;
  }
  size_t prev = 0, i = 0;
  while (i < text.size()) {
    const size_t b = i;
    if (pred(utf8::next(text, i))) {
      if (prev != b) fn(Span{prev, b, false});
      fn(Span{b, i, true});
      prev = i;
    }
  }
  if (prev != text.size()) fn(Span{prev, text.size(), false});
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void split(std::string_view text, bool, WordSink emit) const override {
    SpanSplitter splitter(text, behavior_, invert_, emit);
    pattern_.for_each_span(text, [&](const Span& s) { splitter.add(s); });
    splitter.finish();
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharClassSplitPreTokenizer : public PreTokenizer {
 public:
  CharClassSplitPreTokenizer(bool (*pred)(char32_t), SplitBehavior behavior) : pred_(pred), behavior_(behavior) {}
  void split(std::string_view text, bool, WordSink emit) const override {
    SpanSplitter splitter(text, behavior_, false, emit);
    for_each_char_span(text, pred_, [&](const Span& s) { splitter.add(s); });
    splitter.finish();
  }

 private:
  bool (*pred_)(char32_t);
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_.emplace(Pattern::regex(kGpt2Pattern, "ByteLevel regex"));
  }
  void split(std::string_view text, bool, WordSink emit) const override {
    std::string prefixed;
    if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    std::string mapped;
    auto emit_mapped = [&](std::string_view word) {
      byte_level::encode_into(word, mapped);
      emit(mapped);
    };
    if (!regex_) {
      if (!text.empty()) emit_mapped(text);
      return;
    }
    SpanSplitter splitter(text, SplitBehavior::Isolated, false, emit_mapped);
    regex_->for_each_span(text, [&](const Span& s) { splitter.add(s); });
    splitter.finish();
  }

 private:
  bool add_prefix_space_;
  std::optional<Pattern> regex_;
};

enum class PrependScheme { Always, Never, First };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split_words)
      : replacement_(std::move(replacement)),
        space_(Pattern::literal(" ")),
        rep_(Pattern::literal(replacement_)),
        scheme_(scheme),
        split_(split_words) {}
  void split(std::string_view text, bool at_text_start, WordSink emit) const override {
    std::string s = space_.replace_all(text, replacement_);
    const bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && at_text_start)))
      s = replacement_ + s;
    if (!split_) {
      if (!s.empty()) emit(s);
      return;
    }
    SpanSplitter splitter(s, SplitBehavior::MergedWithNext, false, emit);
    rep_.for_each_span(s, [&](const Span& sp) { splitter.add(sp); });
    splitter.finish();
  }

 private:
  std::string replacement_;
  Pattern space_, rep_;
  PrependScheme scheme_;
  bool split_;
};

class PreTokenizerSequence : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::string_view text, bool at_text_start, WordSink emit) const override {
    run(0, text, at_text_start, emit);
  }

 private:
  // Feeds every piece of step k into step k + 1; only the first piece keeps `at_text_start`.
  void run(size_t k, std::string_view text, bool at_text_start, WordSink emit) const {
    if (k == steps_.size()) {
      emit(text);
      return;
    }
    bool first = at_text_start;
    steps_[k]->split(text, at_text_start, [&](std::string_view piece) {
      run(k + 1, piece, first, emit);
      first = false;
    });
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }

PrependScheme parse_prepend_scheme(const JsonAt& spec) {
  if (spec.has("prepend_scheme")) {
    const JsonAt v = spec.at("prepend_scheme");
    const std::string s = v.str();
    if (s == "always") return PrependScheme::Always;
    if (s == "never") return PrependScheme::Never;
    if (s == "first") return PrependScheme::First;
    v.fail("unknown prepend_scheme '" + s + "'");
  }
  return spec.boolean_or("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;  // legacy form
}

std::string metaspace_replacement(const JsonAt& spec) {
  const JsonAt v = spec.at("replacement");
  const std::string r = v.str();
  size_t i = 0;
  if (r.empty() || (utf8::next(r, i), i != r.size())) v.fail("replacement must be a single character");
  return r;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& spec) {
  if (spec.value().is_null()) return nullptr;
  const std::string type = spec.str("type");
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(Pattern(spec.at("pattern")), parse_split_behavior(spec.at("behavior")),
                                               spec.boolean_or("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(spec.boolean_or("add_prefix_space", true),
                                                   spec.boolean_or("use_regex", true));
  if (type == "Metaspace")
    return std::make_unique<MetaspacePreTokenizer>(metaspace_replacement(spec), parse_prepend_scheme(spec),
                                                   spec.boolean_or("split", true));
  if (type == "Digits")
    return std::make_unique<CharClassSplitPreTokenizer>(is_ascii_digit, spec.boolean_or("individual_digits", false)
                                                                            ? SplitBehavior::Isolated
                                                                            : SplitBehavior::Contiguous);
  if (type == "Punctuation") {
    const SplitBehavior b = spec.has("behavior") ? parse_split_behavior(spec.at("behavior")) : SplitBehavior::Isolated;
    return std::make_unique<CharClassSplitPreTokenizer>(unicode::is_punctuation, b);
  }
  if (type == "Whitespace")  // keeps runs of word characters and runs of other non-space characters
    return std::make_unique<SplitPreTokenizer>(Pattern::regex(R"(\w+|[^\w\s]+)", "Whitespace regex"),
                                               SplitBehavior::Removed, true);
  if (type == "WhitespaceSplit")
    return std::make_unique<CharClassSplitPreTokenizer>(unicode::is_whitespace, SplitBehavior::Removed);
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(std::make_unique<CharClassSplitPreTokenizer>(unicode::is_whitespace, SplitBehavior::Removed));
    steps.push_back(std::make_unique<CharClassSplitPreTokenizer>(unicode::is_punctuation, SplitBehavior::Isolated));
    return std::make_unique<PreTokenizerSequence>(std::move(steps));
  }
  if (type == "Sequence") {
    const JsonAt list = spec.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto p = make_pre_tokenizer(list.at(i))) steps.push_back(std::move(p));
    return std::make_unique<PreTokenizerSequence>(std::move(steps));
  }
  spec.at("type").unsupported("unknown pre-tokenizer type '" + type + "'");
}

}  // namespace lathe
